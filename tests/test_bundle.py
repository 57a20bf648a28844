"""C libraries (`deploy build --bundle`): every op x dtype x case of the matrix built as a bundle
for x86 and for aarch64, run by its statically linked `deploy-run` (aarch64 under qemu without
a sysroot: nothing but the runner itself) and by one C program that links every bundle of the
matrix at once; the example graphs (a YAML graph, the ONNX model with a custom op and its
symbolic-batch twin) alike; bundles of two ops and of one op at two sizes in one process,
statically and through dlopen; the C API's checks of every tensor, its threads, the engine's
parallel hook, two application threads at once; the refusals (names, runtime symbols); the C program
of docs/bundles.md; tampered bundles and bad .npy files refused with one line; SHA-256 in C++ against
hashlib."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from deploy.base.ctext import C_KEYWORDS
from deploy.base.errors import DeployError, UsageError
from deploy.base.files import sha256_file
from deploy.base.threads import host_cpus
from deploy.compiler.bundle import check_symbols, signature, write_bundle
from deploy.compiler.compile import Compiled, CompiledGraph, compile_graph, compile_op
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.runtime import ABI, ABI_HEADER, SHARED, SOURCES
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.platforms import get_platform
from deploy.model import load_model
from deploy.ops import TensorType, bind, get_op
from deploy.ops.graph import BoundGraph, bind_graph
from deploy.ops.spec import BoundOp, batch_sizes
from deploy.verify.compare import compare, random_input
from deploy.verify.matrix import SYMBOLIC_SIZES, PlannedCase
from tests.conftest import REPO, invoke
from tests.test_ops_matrix import MATRIX as PLANNED

ARM = get_platform("aarch64")
X86 = get_platform("x86_64")
QEMU = ARM.emulator_command()
DLPACK_KINDS = {"f": "kDLFloat", "i": "kDLInt", "u": "kDLUInt"}


def c_dtype(dtype: str) -> str:
    """The DLDataType initializer of `dtype`: `{kDLInt, 16, 1}`."""
    found = np.dtype(dtype)
    return f"{{{DLPACK_KINDS[found.kind]}, {found.itemsize * 8}, 1}}"


TARGETS = {"x86": X86, "arm": ARM, "armv7": get_platform("armv7l"), "riscv64": get_platform("riscv64")}
"""The bundle targets the matrix runs on: natively, and the runner under qemu (no sysroot). armv7
and riscv64 have no TVM runtime: their bundles are all that runs there (#38)."""
EMULATED = ("arm", "armv7", "riscv64")


def needs(target: str) -> pytest.MarkDecorator:
    """Skip unless this host has `target`'s cross tools and its qemu."""
    platform = TARGETS[target]
    tools = (platform.gxx, platform.tool("gcc"), platform.tool("objcopy"), platform.qemu or "")
    return pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in tools),
        reason=f"needs {platform.gxx} ({platform.gxx_package}, {platform.gcc_package},"
        f" {platform.binutils_package}) and {platform.qemu} ({platform.qemu_package})",
    )


def on_targets(*names: str) -> pytest.MarkDecorator:
    """Parametrize `target` over `names`: the emulated ones marked `emulator` and skipped here
    without their tools."""
    return pytest.mark.parametrize(
        "target",
        [pytest.param(t, marks=[pytest.mark.emulator, needs(t)] if t in EMULATED else []) for t in names],
    )


def x86_runs_here() -> None:
    if missing := get_device("local").missing_cpu_flags(get_target("x86").cpu_flags):
        pytest.skip(f"this CPU lacks {', '.join(missing)}")


def runs(target: str) -> list[str]:
    """The words that run a program of `target`'s bundles here (qemu and its CPU options)."""
    return TARGETS[target].emulator_command()


def compiled_for(item: BoundOp | BoundGraph, target: str) -> Compiled | CompiledGraph:
    t, options = get_target(target), BuildOptions(cores=2)
    return compile_graph(item, t, options) if isinstance(item, BoundGraph) else compile_op(item, t, options)


def bundle(item: BoundOp | BoundGraph, target: str, directory: Path, name: str | None = None) -> Path:
    """`item` built for `target` as a bundle in `directory`, prefixed `name`."""
    export(compiled_for(item, target), directory, bundle=True, name=name)
    return directory


def deploy_run(
    directory: Path, inputs: list[Path], output: Path, target: str = "arm"
) -> subprocess.CompletedProcess[str]:
    command = [*runs(target), str(directory / "deploy-run"), str(directory)]
    for path in inputs:
        command += ["-i", str(path)]
    return subprocess.run([*command, "-o", str(output)], capture_output=True, text=True, timeout=300)


def saved(arrays: list[np.ndarray], work: Path, prefix: str = "in") -> list[Path]:
    paths = []
    for index, array in enumerate(arrays):
        paths.append(work / f"{prefix}{index}.npy")
        np.save(paths[-1], array)
    return paths


def check_against_numpy(item: BoundOp | BoundGraph, arrays: list[np.ndarray], actual: np.ndarray) -> None:
    """`actual`, an op's or a single-output graph's output, against numpy."""
    with np.errstate(invalid="ignore", over="ignore"):
        (expected,) = item.references(*arrays)
    result = compare(np.asarray(expected), actual, item.exact)
    assert result.ok, result.detail


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("deploy-run: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def case_inputs(planned: PlannedCase, sizes: dict[str, int]) -> list[np.ndarray]:
    """Seeded inputs of a matrix case at `sizes`: NaN, infinities and repeated maxima planted,
    every other case rounded so ties abound (as `deploy test` draws them)."""
    rng = np.random.default_rng(
        zlib.crc32(f"{planned.op.name}/{planned.dtype}/{planned.index}/{sizes}".encode())
    )
    bound = planned.bind()
    return [random_input(t.at(sizes), rng, ties=planned.index % 2 == 1, specials=True) for t in bound.inputs]


class MatrixBundles:
    """The bundles of the matrix's cases, each prefixed m<index>, built once per module: on a
    target's first use, every case of it that this run's selected tests call, side by side: the
    compiles here, one after another; the bundles (the compilers, binutils and linkers they
    run, most of a bundle's time) in `host_cpus()` threads, each into a directory of its own,
    while the next compiles. Each directory holds the bundle alone (`write_bundle`): these tests
    call its runner and its library, never the artifact's module (tests/test_ops_matrix.py and
    deploy build's tests write those)."""

    def __init__(self, root: Path, needed: dict[str, set[int]]) -> None:
        self.root, self.needed = root, needed
        self.built: dict[tuple[str, int], Path] = {}

    def __call__(self, target: str, index: int) -> Path:
        """The directory of case `index`'s bundle for `target`."""
        if (target, index) not in self.built:
            todo = sorted(self.needed.get(target, set()) | {index})
            places = [self.root / f"{target}-m{i}" / "bundle" for i in todo]
            for place in places:
                place.mkdir(parents=True)
            with ThreadPoolExecutor(host_cpus()) as pool:
                exports = [
                    pool.submit(write_bundle, compiled_for(PLANNED[i].bind(), target), place, f"m{i}")
                    for i, place in zip(todo, places, strict=True)
                ]
            for i, place, done in zip(todo, places, exports, strict=True):
                done.result()
                self.built[(target, i)] = place
        return self.built[(target, index)]


def needed_cases(items: list[pytest.Item]) -> dict[str, set[int]]:
    """target -> the indices in PLANNED that `items` (the run's selected tests) build bundles of."""
    needed: dict[str, set[int]] = {}
    for item in items:
        params = getattr(item, "callspec", None)
        name = getattr(item, "originalname", "")
        if params is None or getattr(item, "module", None) is not sys.modules[__name__]:
            continue
        if name == "test_matrix_through_deploy_run":
            needed.setdefault(params.params["target"], set()).add(params.params["index"])
        elif name == "test_matrix_through_one_c_program":
            needed.setdefault(params.params["target"], set()).update(range(len(PLANNED)))
    return needed


@pytest.fixture(scope="module")
def matrix_bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> MatrixBundles:
    return MatrixBundles(tmp_path_factory.mktemp("matrix"), needed_cases(request.session.items))


def through_the_runner(target: str, planned: PlannedCase) -> bool:
    """The cases run through `deploy-run`: every x86 case; on the emulators, where each run is a
    qemu process, the symbolic-batch ones (the batch read from the arrays) and on arm each op and
    dtype's first case too (every case is called in `test_matrix_through_one_c_program`, from the
    same bundles; armv7 and riscv64 run every op's edge cases through the runner in
    test_ops_matrix.py)."""
    return target not in EMULATED or planned.symbolic or (target == "arm" and planned.index == 0)


MATRIX = [
    pytest.param(target, index, marks=[pytest.mark.emulator, needs(target)] if target in EMULATED else [],
                 id=f"{target}-{p.op.name}-{p.dtype}-{p.index}")
    for target in TARGETS for index, p in enumerate(PLANNED) if through_the_runner(target, p)
]  # fmt: skip


@pytest.mark.parametrize(("target", "index"), MATRIX)
def test_matrix_through_deploy_run(
    target: str, index: int, matrix_bundle: MatrixBundles, tmp_path: Path
) -> None:
    """Cases through their bundle's runner (`through_the_runner`), a symbolic batch at N = 1, 3 and
    32 from one build."""
    if target == "x86":
        x86_runs_here()
    planned = PLANNED[index]
    directory = matrix_bundle(target, index)
    bound = planned.bind()
    for sizes in batch_sizes(bound.inputs, SYMBOLIC_SIZES):
        arrays = case_inputs(planned, sizes)
        proc = deploy_run(directory, saved(arrays, tmp_path), tmp_path / "out.npy", target)
        assert proc.returncode == 0, proc.stderr
        check_against_numpy(bound, arrays, np.load(tmp_path / "out.npy"))


def c_tensor(name: str, t: TensorType, data: str) -> str:
    dims = ", ".join(map(str, t.shape)) or "0"
    fields = f"{data}, {{kDLCPU, 0}}, {len(t.shape)}, {c_dtype(t.dtype)}, shape_{name}, NULL, 0"
    return f"  static int64_t shape_{name}[] = {{{dims}}};\n  DLTensor {name} = {{{fields}}};"


def nbytes(t: TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


C_PROGRAM = """/* Generated by tests/test_bundle.py: bundles called on raw little-endian files. */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
{includes}

static void* aligned(size_t bytes) {{
  void* data = NULL;
  if (posix_memalign(&data, 64, bytes + 64) != 0) exit(3);
  return data;
}}

static void* load(const char* dir, const char* name, size_t bytes) {{
  char path[4096];
  void* data = aligned(bytes);
  FILE* file;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  file = fopen(path, "rb");
  if (file == NULL || fread(data, 1, bytes, file) != bytes) {{
    fprintf(stderr, "cannot read %s\\n", path);
    exit(3);
  }}
  fclose(file);
  return data;
}}

static int save(const char* dir, const void* data, size_t bytes) {{
  char path[4096];
  FILE* file;
  snprintf(path, sizeof(path), "%s/out.bin", dir);
  file = fopen(path, "wb");
  if (file == NULL || fwrite(data, 1, bytes, file) != bytes) return 3;
  fclose(file);
  return 0;
}}
{functions}
/* argv: one directory per call, in order, each with in0.bin ... (raw data) to write out.bin in. */
int main(int argc, char** argv) {{
  int (*calls[])(const char*) = {{{calls}}};
  int i, failed = 0;
  if (argc != {count} + 1) return 3;
  for (i = 0; i < {count}; ++i) failed |= calls[i](argv[i + 1]);
  return failed;
}}
"""

C_FUNCTION = """
static int call_{index}(const char* dir) {{
{tensors}
{listed}  if ({name}({args}) != 0{also}) {{
    fprintf(stderr, "%s: %s\\n", dir, {name}_last_error());
    return 1;
  }}
  return save(dir, out.data, {out_bytes});
}}
"""


def c_function(index: int, name: str, inputs: list[TensorType], out: TensorType, via_run: bool) -> str:
    """`call_INDEX(dir)`: NAME() on the inputs in `dir`, then (`via_run`) NAME_run() too."""
    names = [f"t{i}" for i in range(len(inputs))]
    tensors = [
        c_tensor(n, t, f'load(dir, "in{i}.bin", {nbytes(t)})')
        for i, (n, t) in enumerate(zip(names, inputs, strict=True))
    ]
    tensors.append(c_tensor("out", out, f"aligned({nbytes(out)})"))
    args = ", ".join(f"&{n}" for n in [*names, "out"])
    listed = f"  DLTensor* all[] = {{{args}}};\n" if via_run else ""
    also = f" || {name}_run(all, {len(names) + 1}) != 0" if via_run else ""
    return C_FUNCTION.format(
        index=index, name=name, tensors="\n".join(tensors), args=args, listed=listed, also=also,
        out_bytes=nbytes(out),
    )  # fmt: skip


STATIC = ("-lm", "-lpthread", "-static")
"""How a CPU bundle's test program links: static, as deploy-run is."""


def c_program(
    calls: list[tuple[str, Path, list[TensorType], TensorType]],
    program: Path,
    target: str,
    via_run: bool = False,
    libs: tuple[str, ...] = STATIC,
) -> Path:
    """One C program calling each (bundle name, directory, input types, output type) in turn, by
    NAME() and (`via_run`) NAME_run(), linked with every bundle's static library and `libs`
    (warnings are errors)."""
    includes = "\n".join(f'#include "{name}.h"' for name in dict.fromkeys(c[0] for c in calls))
    functions = "".join(
        c_function(i, name, inputs, out, via_run) for i, (name, _, inputs, out) in enumerate(calls)
    )
    source = C_PROGRAM.format(
        includes=includes, functions=functions, calls=", ".join(f"call_{i}" for i in range(len(calls))),
        count=len(calls),
    )  # fmt: skip
    program.with_suffix(".c").write_text(source)
    bundles = dict.fromkeys((c[1], c[0]) for c in calls)  # each call's NAME is its bundle's
    flags = [f for d, _ in bundles for f in (f"-I{d}", f"-I{d / 'include'}")]
    libraries = [str(d / f"lib{name}.a") for d, name in bundles]
    cmd = [TARGETS[target].tool("gcc"), "-std=c99", "-Wall", "-Wextra", "-Werror", *flags,
           str(program.with_suffix(".c")), *libraries, *libs, "-o", str(program)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[:3000]
    return program


def run_calls(program: Path, work: list[Path], target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*runs(target), str(program), *map(str, work)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def raw_inputs(arrays: list[np.ndarray], work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    for index, array in enumerate(arrays):
        (work / f"in{index}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
    return work


def raw_output(work: Path, out: TensorType) -> np.ndarray:
    return np.frombuffer((work / "out.bin").read_bytes(), dtype=out.dtype).reshape(out.shape)


@on_targets(*TARGETS)
def test_matrix_through_one_c_program(target: str, matrix_bundle: MatrixBundles, tmp_path: Path) -> None:
    """Every case's bundle linked into one static C program (hundreds of libraries, each with its
    own runtime: only their NAME_* symbols are global), each called once (a symbolic batch at
    N = 3) on its own inputs, in one process."""
    if target == "x86":
        x86_runs_here()
    calls, cases = [], []
    for index, planned in enumerate(PLANNED):
        directory = matrix_bundle(target, index)
        bound = planned.bind()
        sizes = batch_sizes(bound.inputs, (3,))[0]
        inputs, out = [t.at(sizes) for t in bound.inputs], bound.outputs[0].at(sizes)
        arrays = case_inputs(planned, sizes)
        cases.append((bound, arrays, raw_inputs(arrays, tmp_path / f"c{index}"), out))
        calls.append((f"m{index}", directory, inputs, out))
    program = c_program(calls, tmp_path / "matrix", target)
    proc = run_calls(program, [case[2] for case in cases], target)
    assert proc.returncode == 0, proc.stderr[:3000]
    for bound, arrays, work, out in cases:
        check_against_numpy(bound, arrays, raw_output(work, out))


EXAMPLES = REPO / "examples"


def example_graphs() -> list[tuple[str, BoundGraph, tuple[int, ...]]]:
    """(name, graph, the batch sizes to run it at) of each example model: the YAML graph, the ONNX
    model with a custom-domain op (its op from deploy/ops/examples), its symbolic-batch twin, and the
    model with constants (an initializer and a Constant node, linked into its bundle)."""
    return [
        ("maxpool_add", bind_graph(load_model(EXAMPLES / "maxpool_add.yaml")), (0,)),
        ("htanh", bind_graph(load_model(EXAMPLES / "pool_add_leaky_htanh.onnx")), (0,)),
        ("htanh_n", bind_graph(load_model(EXAMPLES / "pool_add_leaky_htanh_n.onnx")), SYMBOLIC_SIZES),
        ("bias_n", bind_graph(load_model(EXAMPLES / "pool_bias_leaky.onnx")), SYMBOLIC_SIZES),
    ]


@on_targets(*TARGETS)
def test_example_graphs_through_bundles(target: str, example_ops, tmp_path: Path) -> None:
    """Each example graph's plan (kernels in order, the tensors between them in the arena) through
    its runner at every batch size, and the four bundles linked into one C program."""
    if target == "x86":
        x86_runs_here()
    rng = np.random.default_rng(7)
    calls, cases = [], []
    for name, graph, sizes_list in example_graphs():
        directory = bundle(graph, target, tmp_path / name, name)
        for size in sizes_list:
            sizes = dict.fromkeys(graph.graph.inputs[0][1].symbols, size)
            arrays = [random_input(t.at(sizes), rng, specials=True) for t in graph.inputs]
            proc = deploy_run(directory, saved(arrays, tmp_path, name), tmp_path / "out.npy", target)
            assert proc.returncode == 0, proc.stderr
            check_against_numpy(graph, arrays, np.load(tmp_path / "out.npy"))
        sizes = dict.fromkeys(graph.graph.inputs[0][1].symbols, 3)
        arrays = [random_input(t.at(sizes), rng, ties=True) for t in graph.inputs]
        out = graph.outputs[0].at(sizes)
        cases.append((graph, arrays, raw_inputs(arrays, tmp_path / f"c-{name}"), out))
        calls.append((name, directory, [t.at(sizes) for t in graph.inputs], out))
    proc = run_calls(c_program(calls, tmp_path / "graphs", target), [c[2] for c in cases], target)
    assert proc.returncode == 0, proc.stderr
    for graph, arrays, work, out in cases:
        check_against_numpy(graph, arrays, raw_output(work, out))
    manifest = Manifest.read(tmp_path / "htanh_n")
    assert manifest.entry == "plan" and manifest.bundle["name"] == "htanh_n"


TWO_OPS = """#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "add4.h"
#include "add8.h"
#include "leaky_relu.h"

typedef int (*Add)(const DLTensor*, const DLTensor*, DLTensor*);
typedef const char* (*LastError)(void);

static _Alignas(64) float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {10, 20, 30, 40, 50, 60, 70, 80}, out[8];

static DLTensor tensor(float* data, int64_t* shape) {
  DLTensor t = {data, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  return t;
}

/* add4 and add8 by dlopen (argv[1], argv[2]: their libraries), each RTLD_LOCAL: a symbol of one
 * never answers for the other. */
static int by_dlopen(const char* add4_library, const char* add8_library) {
  int64_t four[1] = {4}, eight[1] = {8};
  void* first = dlopen(add4_library, RTLD_NOW | RTLD_LOCAL);
  void* second = dlopen(add8_library, RTLD_NOW | RTLD_LOCAL);
  DLTensor ta4 = tensor(a, four), tb4 = tensor(b, four), to4 = tensor(out, four);
  DLTensor ta8 = tensor(a, eight), tb8 = tensor(b, eight), to8 = tensor(out, eight);
  Add add_4, add_8;
  if (first == NULL || second == NULL) return printf("dlopen %s\\n", dlerror()), 1;
  add_4 = (Add)dlsym(first, "add4");
  add_8 = (Add)dlsym(second, "add8");
  if (add_4 == NULL || add_8 == NULL || dlsym(first, "add8") != NULL) return printf("dlsym\\n"), 1;
  LastError error_4 = (LastError)dlsym(first, "add4_last_error");
  LastError error_8 = (LastError)dlsym(second, "add8_last_error");
  if (add_8(&ta8, &tb8, &to8) != 0) return printf("add8 %s\\n", error_8()), 1;
  printf("dlopen add8 %g %g\\n", out[0], out[7]);
  if (add_4(&ta4, &tb4, &to4) != 0) return printf("add4 %s\\n", error_4()), 1;
  printf("dlopen add4 %g %g\\n", out[0], out[3]);
  printf("dlopen add4 on 8: %d ", add_4(&ta8, &tb8, &to8));
  printf("%s\\n", error_4());
  dlclose(first);
  dlclose(second);
  return 0;
}

int main(int argc, char** argv) {
  int64_t four[1] = {4}, eight[1] = {8};
  DLTensor ta4 = tensor(a, four), tb4 = tensor(b, four), to4 = tensor(out, four);
  DLTensor ta8 = tensor(a, eight), tb8 = tensor(b, eight), to8 = tensor(out, eight);
  if (argc != 3) return 3;
  if (add4(&ta4, &tb4, &to4) != 0) return printf("%s\\n", add4_last_error()), 1;
  printf("add4 %g %g\\n", out[0], out[3]);
  if (add8(&ta8, &tb8, &to8) != 0) return printf("%s\\n", add8_last_error()), 1;
  printf("add8 %g %g\\n", out[0], out[7]);
  if (leaky_relu(&ta8, &to8) != 0) return printf("%s\\n", leaky_relu_last_error()), 1;
  printf("leaky_relu %g %g\\n", out[0], out[7]);
  printf("add4 on 8: %d %s\\n", add4(&ta8, &tb8, &to8), add4_last_error());
  return by_dlopen(argv[1], argv[2]);
}
"""


def test_two_bundles_of_one_op_live_in_one_process(tmp_path: Path) -> None:
    """add at two sizes (prefixed add4 and add8) and leaky_relu: linked statically into one
    program, and add4 and add8 dlopen()ed beside them; each does its own job, and each library
    exports its NAME_* functions and, weak, the runtime's shared ones, nothing else."""
    x86_runs_here()
    add, leaky = get_op("add"), get_op("leaky_relu")
    dirs = {
        "add4": bundle(bind(add, {}, [TensorType((4,), "float32")] * 2), "x86", tmp_path / "add4", "add4"),
        "add8": bundle(bind(add, {}, [TensorType((8,), "float32")] * 2), "x86", tmp_path / "add8", "add8"),
        "leaky_relu": bundle(bind(leaky, {}, [TensorType((8,), "float32")]), "x86", tmp_path / "lr"),
    }
    for name, directory in dirs.items():
        listed = subprocess.run(["nm", "-g", "--defined-only", str(directory / f"lib{name}.a")],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        exported = subprocess.run(["nm", "-D", "--defined-only", str(directory / f"lib{name}.so")],
                                  capture_output=True, text=True, check=True).stdout  # fmt: skip
        for text in (listed, exported):
            kinds = {
                line.split()[-1]: line.split()[-2]
                for line in text.splitlines()
                if line.strip() and ":" not in line
            }
            api = {n for n in kinds if n == name or n.startswith(f"{name}_")}
            assert api and {n: kinds[n] for n in set(kinds) - api} == dict.fromkeys(SHARED, "W"), kinds
    source = tmp_path / "two.c"
    source.write_text(TWO_OPS)
    flags = [f for d in dirs.values() for f in (f"-I{d}", f"-I{d / 'include'}")]
    libraries = [str(d / f"lib{n}.a") for n, d in dirs.items()]
    cmd = ["gcc", "-std=c11", "-Wall", "-Werror", *flags, str(source), *libraries, "-ldl", "-lm", "-lpthread",
           "-o", str(tmp_path / "two")]  # fmt: skip
    subprocess.run(cmd, check=True)
    libraries = [str(dirs["add4"] / "libadd4.so"), str(dirs["add8"] / "libadd8.so")]
    proc = subprocess.run([str(tmp_path / "two"), *libraries],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "add4 11 44",
        "add8 11 88",
        "leaky_relu 1 8",
        "add4 on 8: -1 add4: a has shape [8], expected [4]",
        "dlopen add8 11 88",
        "dlopen add4 11 44",
        "dlopen add4 on 8: -1 add4: a has shape [8], expected [4]",
    ]


THREAD_COUNT = """
static int threads_now(void) {  /* this process's threads: /proc/self/task has one entry each */
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  struct dirent* entry;
  if (tasks == NULL) return -1;
  while ((entry = readdir(tasks)) != NULL) count += entry->d_name[0] != '.';
  closedir(tasks);
  return count;
}

static int threads_settled(int want) {  /* a joined thread's entry can outlive the join briefly */
  struct timespec millisecond = {0, 1000000};
  int tries, count = threads_now();
  for (tries = 0; count != want && tries < 2000; ++tries, count = threads_now()) {
    nanosleep(&millisecond, NULL);
  }
  return count;
}
"""
"""C: the threads of the calling process, and that count once it settles (for the pool tests)."""


ONE_POOL = (
    """#define _POSIX_C_SOURCE 200112L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "p1.h"
#include "p2.h"
#include "p3.h"

enum { SIZE = 64 * 56 * 56 };
static int64_t shape[4] = {1, 64, 56, 56};

static DLTensor tensor(float* data) {
  DLTensor t = {data, {kDLCPU, 0}, 4, {kDLFloat, 32, 1}, shape, NULL, 0};
  return t;
}

"""
    + THREAD_COUNT
    + """
int main(void) {
  float *a, *b, *out;
  DLTensor ta, tb, tout;
  int i, status = 0, right = 1, running, stopped;
  if (posix_memalign((void**)&a, 64, SIZE * 4) || posix_memalign((void**)&b, 64, SIZE * 4) ||
      posix_memalign((void**)&out, 64, SIZE * 4)) return 3;
  for (i = 0; i < SIZE; ++i) a[i] = (float)(i % 7), b[i] = (float)(i % 5);
  ta = tensor(a), tb = tensor(b), tout = tensor(out);
  p1_set_num_threads(3);
  printf("threads %d %d %d\\n", p1_num_threads(), p2_num_threads(), p3_num_threads());
  status |= p1(&ta, &tb, &tout) | p2(&ta, &tb, &tout) | p3(&ta, &tb, &tout);
  for (i = 0; i < SIZE; ++i) right &= out[i] == (float)(i % 7 + i % 5);
  running = threads_now();
  stopped = p2_stop_threads();
  printf("ran %d %d %d %d %d\\n", status, right, running, stopped, threads_settled(1));
  return 0;
}
"""
)


def test_the_bundles_of_one_program_share_one_runtime(tmp_path: Path) -> None:
    """Three bundles linked into one program bind to one runtime (runtime.h): the thread count set
    through one is every one's, their parallel loops run on one pool (beside the
    main thread: two workers, not two per bundle), and any of them stops it."""
    x86_runs_here()
    add = get_op("add")
    names = ("p1", "p2", "p3")
    dirs = [
        bundle(bind(add, {}, [TensorType((1, 64, 56, 56), "float32")] * 2), "x86", tmp_path / n, n)
        for n in names
    ]
    extra = tuple(
        f for d, n in zip(dirs[1:], names[1:], strict=True) for f in (f"-I{d}", str(d / f"lib{n}.a"))
    )
    program = build_c(ONE_POOL, dirs[0], tmp_path / "one_pool", extra=extra)
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["threads 3 3 3", "ran 0 1 3 2 1"]


POOL_LAUNCHES = """#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include "runtime.h"

enum { MOST = 8 };

typedef struct {
  atomic_int runs[MOST];
  atomic_int wrong;
  int barriers;
} Launch;

static int task(int index, deploy_rt1_group* group, void* data) {
  Launch* launch = (Launch*)data;
  int i;
  if (index < 0 || index >= group->num_task || group->num_task > MOST) atomic_fetch_add(&launch->wrong, 1);
  else atomic_fetch_add(&launch->runs[index], 1);
  for (i = 0; i < launch->barriers; ++i) deploy_rt1_parallel_barrier(index, group);
  return 0;
}

/* 1500 launches of 1..MOST tasks with 0..3 barriers each; the main thread also changes the
 * pool's size now and then. Counts the launches where a task ran twice, out of range or none ran. */
static void* launches(void* main_thread) {
  long bad = 0;
  int round, i, ran;
  for (round = 0; round < 1500; ++round) {
    Launch launch = {.barriers = round % 4};
    if (main_thread != NULL && round % 100 == 0) deploy_rt1_set_num_threads(1 + round / 100 % 4);
    if (deploy_rt1_parallel_launch(task, &launch, 1 + round / 7 % MOST) != 0) ++bad;
    for (i = 0, ran = 0; i < MOST; ++i) ran += atomic_load(&launch.runs[i]), bad += launch.runs[i] > 1;
    bad += atomic_load(&launch.wrong) + (ran == 0);
  }
  return (void*)bad;
}

int main(void) {
  pthread_t other;
  void* bad[2];
  pthread_create(&other, NULL, launches, NULL);
  bad[0] = launches(&other);
  pthread_join(other, &bad[1]);
  printf("bad %ld %ld\\n", (long)bad[0], (long)bad[1]);
  return 0;
}
"""


def test_the_pool_runs_each_task_of_a_launch_once_through_barriers(tmp_path: Path) -> None:
    """The runtime's pool alone (runtime.c compiled into a C program): every task of 3000 launches
    (1500 from each of two application threads; the second's run on it while the first's hold
    the pool) runs once, at 1-4 threads on this machine's cores, with up to three barriers a
    task. A waiting task that ran another task inside its wait hung at the second barrier."""
    source = tmp_path / "pool.c"
    source.write_text(POOL_LAUNCHES)
    program = tmp_path / "pool"
    cmd = ["gcc", "-std=c11", "-O2", "-Wall", "-Werror", f"-I{SOURCES}", str(source),
           str(SOURCES / "runtime.c"), "-lpthread", "-o", str(program)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "bad 0 0\n"), proc.stderr


BAD_CALLS = """#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include "add.h"

static void report(const char* what, int status) {
  printf("%s %d %s\\n", what, status, add_last_error());
}

int main(void) {
  float* data[3];
  int64_t shape[1] = {4}, wrong[1] = {5}, strides[1] = {1}, gapped[1] = {2};
  DLTensor t[3], bad;
  DLTensor* args[3] = {&t[0], &t[1], &t[2]};
  int i;
  for (i = 0; i < 3; ++i) {
    if (posix_memalign((void**)&data[i], 64, 256) != 0) return 3;
    data[i][0] = data[i][1] = data[i][2] = data[i][3] = (float)i;
    t[i].data = data[i];
    t[i].device.device_type = kDLCPU;
    t[i].device.device_id = 0;
    t[i].ndim = 1;
    t[i].dtype.code = kDLFloat;
    t[i].dtype.bits = 32;
    t[i].dtype.lanes = 1;
    t[i].shape = shape;
    t[i].strides = NULL;
    t[i].byte_offset = 0;
  }
  report("good", add(&t[0], &t[1], &t[2]));
  bad = t[0]; bad.shape = wrong; report("shape", add(&bad, &t[1], &t[2]));
  report("cleared", add(&t[0], &t[1], &t[2]));
  bad = t[0]; bad.ndim = 2; report("rank", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.ndim = 2147483647; report("huge-rank", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.shape = NULL; report("no-shape", add(&bad, &t[1], &t[2]));
  bad = t[1]; bad.dtype.bits = 64; report("dtype", add(&t[0], &bad, &t[2]));
  bad = t[2]; bad.device.device_type = kDLCUDA; report("device", add(&t[0], &t[1], &bad));
  bad = t[0]; bad.device.device_id = 7; report("device-id", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.data = data[0] + 1; report("aligned", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.strides = gapped; report("strides", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.data = NULL; report("data", add(&bad, &t[1], &t[2]));
  report("null", add(NULL, &t[1], &t[2]));
  report("count", add_run(args, 2));
  report("no-args", add_run(NULL, 3));
  bad = t[0]; bad.strides = strides; bad.data = data[0] - 16; bad.byte_offset = 64;
  report("offset", add(&bad, &t[1], &t[2]));
  printf("out %g %g\\n", data[2][0], data[2][3]);
  bad = t[0]; bad.byte_offset = (uint64_t)0 - 64; report("wrap", add(&bad, &t[1], &t[2]));
  bad = t[0]; bad.data = (void*)(UINTPTR_MAX & ~(uintptr_t)63); bad.byte_offset = 56;
  report("wrap-end", add(&bad, &t[1], &t[2]));
  report("run", add_run(args, 3));
  report("workspace", add_with_workspace(&t[0], &t[1], &t[2], NULL, 0));
  printf("size %zu\\n", add_workspace_size());
  return 0;
}
"""

EXPECTED_BAD_CALLS = {
    "good": "0 ",
    "shape": "-1 add: a has shape [5], expected [4]",
    "cleared": "0 ",  # a good call clears the last error
    "rank": "-1 add: a has 2 dims, expected [4]",  # read past its shape array before
    "huge-rank": "-1 add: a has 2147483647 dims, expected [4]",  # a segfault before
    "no-shape": "-1 add: a.shape is NULL, expected [4]",
    "dtype": "-1 add: b is float64, expected float32",
    "device": "-1 add: out is on device (type 2, id 0): this bundle runs on the CPU (kDLCPU, id 0)",
    "device-id": "-1 add: a is on device (type 1, id 7): this bundle runs on the CPU (kDLCPU, id 0)",
    "aligned": "-1 add: a.data + byte_offset is not 64-byte aligned",
    "strides": "-1 add: a is not compact (C order)",
    "data": "-1 add: a.data is NULL",
    "null": "-1 add: a is NULL",
    "count": "-1 add: expected 2 inputs and 1 output (3 tensors), got 2",
    "no-args": "-1 add: args is NULL: expected an array of the inputs and the outputs",
    "offset": "0 ",
    "out": "1 1",
    "wrap": "-1 add: a.byte_offset 18446744073709551552 wraps past the end of memory: expected the offset"
    " of the tensor in data",  # -64: read the 64 bytes before the buffer
    "wrap-end": "-1 add: a.byte_offset 56 wraps past the end of memory: expected the offset of the tensor"
    " in data",
    "run": "0 ",
    "workspace": "0 ",  # an op takes no workspace: NULL and 0 do
    "size": "0",
}


def build_c(
    source: str, directory: Path, program: Path, target: str = "x86", extra: tuple[str, ...] = ()
) -> Path:
    """A C program linked with the static library of the bundle in `directory` (warnings are errors)."""
    program.with_suffix(".c").write_text(source)
    name = Manifest.read(directory).bundle["name"]
    cmd = [TARGETS[target].tool("gcc"), "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{directory}",
           f"-I{directory / 'include'}", str(program.with_suffix(".c")), str(directory / f"lib{name}.a"),
           *extra,
           "-lm", "-lpthread", "-o", str(program)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return program


def test_the_library_checks_every_tensor(tmp_path: Path) -> None:
    x86_runs_here()
    directory = bundle(bind(get_op("add"), {}, [TensorType((4,), "float32")] * 2), "x86", tmp_path / "add")
    program = build_c(BAD_CALLS, directory, tmp_path / "bad")
    proc = subprocess.run([str(program)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert {what: line.rstrip() for what, line in lines.items()} == {
        what: line.rstrip() for what, line in EXPECTED_BAD_CALLS.items()
    }


GRAPH_CALLS = (
    """#define _POSIX_C_SOURCE 200112L
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "g.h"

enum { N = 3, A = N * 16 * 32 * 32, B = N * 16 * 16, OUT = N * 16 * 16 };
static float* a;
static float* b;
static int64_t* want;
static int64_t sa[4] = {N, 16, 32, 32}, sb[4] = {N, 1, 16, 16}, so[3] = {N, 16, 16};

static void* aligned(size_t bytes) {
  void* data = NULL;
  if (posix_memalign(&data, 64, bytes + 64) != 0) exit(3);
  return data;
}

static DLTensor tensor(void* data, int ndim, int64_t* shape, int bits, int code) {
  DLTensor t = {data, {kDLCPU, 0}, ndim, {code, bits, 1}, shape, NULL, 0};
  return t;
}

static void report(const char* what, int status) { printf("%s %d %s\\n", what, status, g_last_error()); }

static int hook_calls;

static int serial_hook(void* user, g_task task, void* context, int count) {
  int i, failed = 0;
  if (user != NULL) *(int*)user += 1;
  for (i = 0; i < count; ++i) failed |= task(i, context);  /* an engine's pool, one thread here */
  return failed;
}

static int same(const int64_t* got) { return memcmp(got, want, OUT * sizeof(int64_t)) == 0; }

static int hooking = 1;

static void* toggler(void* unused) {  /* an engine setting its hook and taking it back meanwhile */
  (void)unused;
  while (__atomic_load_n(&hooking, __ATOMIC_RELAXED)) {
    g_set_parallel_for(serial_hook, NULL);
    g_set_parallel_for(NULL, NULL);
  }
  return NULL;
}

"""
    + THREAD_COUNT
    + """
static void* caller(void* unused) {  /* an application thread calling g over and over */
  int64_t* out = aligned(OUT * sizeof(int64_t));
  DLTensor ta = tensor(a, 4, sa, 32, kDLFloat), tb = tensor(b, 4, sb, 32, kDLFloat);
  DLTensor tout = tensor(out, 3, so, 64, kDLInt);
  int i;
  (void)unused;
  for (i = 0; i < 200; ++i) {
    memset(out, 0, OUT * sizeof(int64_t));
    if (g(&ta, &tb, &tout) != 0 || !same(out)) return (void*)1;
  }
  free(out);
  return NULL;
}

int main(void) {
  int64_t* out;
  int64_t two[4] = {2, 1, 16, 16}, zero[4] = {0, 16, 32, 32}, four[3] = {4, 16, 16};
  DLTensor ta, tb, tout, bad;
  size_t size;
  char* workspace;
  pthread_t threads[2], toggle;
  void* failed[2];
  int i, running, stopped;
  a = aligned(A * sizeof(float));
  b = aligned(B * sizeof(float));
  want = aligned(OUT * sizeof(int64_t));
  out = aligned(OUT * sizeof(int64_t));
  for (i = 0; i < A; ++i) a[i] = (float)((i * 7919) % 101) - 50.0f;
  for (i = 0; i < B; ++i) b[i] = (float)((i * 31) % 13) - 6.0f;
  ta = tensor(a, 4, sa, 32, kDLFloat);
  tb = tensor(b, 4, sb, 32, kDLFloat);
  tout = tensor(want, 3, so, 64, kDLInt);
  report("own-arena", g(&ta, &tb, &tout));
  size = g_workspace_size(N);
  printf("sizes %d %d %d\\n", size > 0, g_workspace_size(1) < size, (int)g_workspace_size(0));
  workspace = aligned(size + 64);
  tout = tensor(out, 3, so, 64, kDLInt);
  report("workspace", g_with_workspace(&ta, &tb, &tout, workspace, size));
  printf("same %d\\n", same(out));
  report("small", g_with_workspace(&ta, &tb, &tout, workspace, size - 1));
  report("no-workspace", g_with_workspace(&ta, &tb, &tout, NULL, 0));
  report("unaligned", g_with_workspace(&ta, &tb, &tout, workspace + 8, size));
  bad = tb; bad.shape = two; report("disagree", g(&ta, &bad, &tout));
  bad = ta; bad.shape = zero; report("zero", g(&bad, &tb, &tout));
  bad = tout; bad.shape = four; report("out", g(&ta, &tb, &bad));
  i = g_set_num_threads(3);
  printf("threads %d %d ", i, g_num_threads());
  i = g_set_num_threads(0);
  printf("%d %d\\n", i, g_num_threads() >= 1);
  printf("hook %d\\n", g_set_parallel_for(serial_hook, &hook_calls) == NULL);
  memset(out, 0, OUT * sizeof(int64_t));
  g_set_num_threads(2);
  report("hooked", g(&ta, &tb, &tout));
  printf("hooked-same %d %d\\n", same(out), hook_calls > 0);
  printf("unhooked %d\\n", g_set_parallel_for(NULL, NULL) == serial_hook);
  for (i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, caller, NULL);
  for (i = 0; i < 2; ++i) pthread_join(threads[i], &failed[i]);
  printf("two-threads %d\\n", failed[0] == NULL && failed[1] == NULL);
  pthread_create(&toggle, NULL, toggler, NULL);
  for (i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, caller, NULL);
  for (i = 0; i < 2; ++i) pthread_join(threads[i], &failed[i]);
  __atomic_store_n(&hooking, 0, __ATOMIC_RELAXED);
  pthread_join(toggle, NULL);
  printf("while-hooking %d\\n", failed[0] == NULL && failed[1] == NULL);
  g_set_parallel_for(NULL, NULL);
  report("pooled", g(&ta, &tb, &tout));
  running = threads_now();
  stopped = g_stop_threads();
  printf("stopped %d %d %d\\n", running, stopped, threads_settled(1));
  memset(out, 0, OUT * sizeof(int64_t));
  report("restarted", g(&ta, &tb, &tout));
  running = threads_now();
  stopped = g_stop_threads();
  printf("restarted-same %d %d %d\\n", same(out), running, stopped);
  return 0;
}
"""
)

SMALL_GRAPH = """name: g
inputs:
  a: {shape: [N, 16, 32, 32]}
  b: {shape: [N, 1, 16, 16]}
nodes:
  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}
  - {name: sum, op: add, inputs: [pool, b]}
  - {name: lr, op: leaky_relu, inputs: [sum]}
  - {name: am, op: argmax, attrs: {axis: 1}, inputs: [lr]}
output: am
"""


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[BoundGraph, Path]:
    """A graph of two kernels (max_pool2d, in parallel; add, leaky_relu and argmax fused) with a
    symbolic batch: its pooled tensor lives in the arena."""
    work = tmp_path_factory.mktemp("small-graph")
    (work / "g.yaml").write_text(SMALL_GRAPH)
    graph = bind_graph(load_model(work / "g.yaml"))
    return graph, bundle(graph, "x86", work / "g")


def test_a_graph_library_on_its_arena_threads_and_hook(small_graph, tmp_path: Path) -> None:
    """The arena from the thread's cache and from the caller, each checked; N read from the
    tensors and checked; the thread count; an engine's parallel-for, also set and unset by another
    thread while two application threads call; the pool's threads stopped, and started again by
    the next call."""
    x86_runs_here()
    _, directory = small_graph
    manifest = Manifest.read(directory)
    assert manifest.arena == [{"bytes": 16 * 16 * 16 * 4, "times": ["N"], "tensors": ["pool"]}]
    assert len(manifest.graph["kernels"]) == 2
    program = build_c(GRAPH_CALLS, directory, tmp_path / "calls")
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    need = 16 * 16 * 16 * 4 * 3
    assert lines == {
        "own-arena": "0 ",
        "sizes": "1 1 0",
        "workspace": "0 ",
        "same": "1",
        "small": f"-1 g: workspace has {need - 1} bytes, this call needs {need} (g_workspace_size)",
        "no-workspace": f"-1 g: workspace is NULL: expected {need} bytes",
        "unaligned": "-1 g: workspace is not 64-byte aligned",
        "disagree": "-1 g: b has N = 2 (shape [2, 1, 16, 16]), but a has N = 3",
        "zero": "-1 g: a has shape [0, 16, 32, 32]: N = 0, expected 1 <= N <= 2147483647",
        "out": "-1 g: out has N = 4 (shape [4, 16, 16]), but a has N = 3",
        "threads": "0 3 3 1",
        "hook": "1",
        "hooked": "0 ",
        "hooked-same": "1 1",
        "unhooked": "1",
        "two-threads": "1",
        "while-hooking": "1",
        "pooled": "0 ",
        "stopped": "2 1 1",
        "restarted": "0 ",
        "restarted-same": "1 2 1",
    }


CHANNELS_ARGMAX = """
name: channels_argmax
inputs:
  x: {shape: [2, 64, 56, 56]}
nodes:
  - {name: best, op: argmax, attrs: {axis: 1}, inputs: [x]}
output: best
"""


def test_a_graph_kernel_with_buffers_beyond_the_stack(tmp_path: Path) -> None:
    """Argmax over the channels keeps a running value and position per output in buffers of its
    own, each task's too big for the stack: a graph's kernel allocates them through the runtime
    (its lowering once failed with 'Unknown device id in current IR')."""
    x86_runs_here()
    (tmp_path / "g.yaml").write_text(CHANNELS_ARGMAX)
    graph = bind_graph(load_model(tmp_path / "g.yaml"))
    directory = bundle(graph, "x86", tmp_path / "g")
    x = random_input(graph.inputs[0], np.random.default_rng(0))
    done = deploy_run(directory, saved([x], tmp_path), tmp_path / "out.npy", target="x86")
    assert done.returncode == 0, done.stderr
    check_against_numpy(graph, [x], np.load(tmp_path / "out.npy"))


def test_a_kernel_needing_what_the_runtime_lacks_is_refused_by_name() -> None:
    """`nm` of the linked object: a weak pointer left NULL (`V`), or a TVM function left undefined,
    would crash or fail to link on the device; libc's and libm's are the linker's to find."""
    check_symbols("0000000000000000 D __TVMBackendParallelLaunch\n                 U expf\n", "ok")
    for line in ("0000000000000008 V __TVMBackendGetFuncFromEnv", "                 U TVMBackendAnythingNew"):
        with pytest.raises(
            DeployError, match=f"bundle k: its kernels need {line.split()[-1]}, which deploy's C"
        ):
            check_symbols(line + "\n", "k")


def test_names_become_c_identifiers(tmp_path: Path) -> None:
    """Model inputs named as exporters name them become C parameters (the header says which);
    a prefix is refused when it is no C identifier or a keyword."""
    (tmp_path / "m.yaml").write_text(
        "name: m\ninputs:\n  input.1: {shape: [4]}\n  out: {shape: [4]}\n  Out: {shape: [4]}\n"
        "nodes:\n  - {name: s, op: add, inputs: [input.1, out]}\n"
        "  - {name: t, op: add, inputs: [s, Out]}\noutput: t\n"
    )
    graph = bind_graph(load_model(tmp_path / "m.yaml"))
    compiled = compile_graph(graph, get_target("x86"), BuildOptions())
    sig = signature(compiled, None)
    assert [c for c, _, _ in sig.params] == ["input_1", "out_2", "Out_3", "out"]
    for bad in ("int", "3d", "a-b", "", "x" * 64, *sorted(C_KEYWORDS)[:3]):
        with pytest.raises(UsageError, match="cannot prefix a bundle"):
            signature(compiled, bad)
    export(compiled, tmp_path / "b", bundle=True)
    header = (tmp_path / "b" / "m.h").read_text()
    assert (
        "int m(const DLTensor* input_1, const DLTensor* out_2, const DLTensor* Out_3, DLTensor* out);"
        in header
    )
    assert 'input_1  float32  [4]  (model input "input.1")' in header


def bundles_page() -> str:
    """docs/bundles.md, whose commands and C program the tests run."""
    return (REPO / "docs" / "bundles.md").read_text()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with the bundle of docs/bundles.md, built by its command."""
    command = next(line for line in bundles_page().splitlines() if line.startswith("deploy build"))
    work = tmp_path_factory.mktemp("readme")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("deploy")), *shlex.split(command)[1:]], cwd=work,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "bundle:" in proc.stdout
    return work


@pytest.mark.emulator
@needs("arm")
def test_the_docs_c_program(example: Path) -> None:
    section = bundles_page()
    source = re.search(r"```c\n(.*?)```", section, re.S).group(1)
    (compile_line,) = [line for line in section.splitlines() if line.startswith("aarch64-linux-gnu-gcc")]
    (example / "add_example.c").write_text(source)
    proc = subprocess.run(["bash", "-c", compile_line], cwd=example, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run(
        ["qemu-aarch64", "./add_example"], cwd=example, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "11 22 33 44\n"
    assert "# prints 11 22 33 44" in section


@needs("arm")
def test_manifest_pins_the_bundle_and_it_needs_nothing(example: Path) -> None:
    """SHA256SUMS lists every file; the runner is static (no interpreter, no library: any
    aarch64 Linux), the shared library needs libc and libm alone; the op's library is small."""
    directory = example / "add-arm"
    manifest = Manifest.read(directory)
    assert manifest.bundle == {
        "name": "add", "header": "add.h", "library": "libadd.so", "static_library": "libadd.a",
        "runner": "deploy-run", "sha256sums": sha256_file(directory / "SHA256SUMS"),
    }  # fmt: skip
    listed = sorted(line.split("  ", 1)[1] for line in (directory / "SHA256SUMS").read_text().splitlines())
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    assert listed == [f for f in files if f not in ("SHA256SUMS", "manifest.json")]
    assert listed == ["add.h", "deploy-run", "include/dlpack/dlpack.h", "libadd.a", "libadd.so", "module.so"]
    if shutil.which("sha256sum"):
        assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=directory).returncode == 0
    header = (directory / "add.h").read_text()
    assert "int add(const DLTensor* a, const DLTensor* b, DLTensor* out);" in header
    assert "float32  [4]" in header and "//" not in header
    dynamic = subprocess.run([ARM.tool("readelf"), "-d", "-l", str(directory / "deploy-run")],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "INTERP" not in dynamic and "NEEDED" not in dynamic
    needed = subprocess.run([ARM.tool("readelf"), "-d", str(directory / "libadd.so")],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert set(re.findall(r"Shared library: \[(.+?)\]", needed)) <= {"libc.so.6", "libm.so.6"}
    assert (directory / "libadd.a").stat().st_size < 100_000
    old = json.loads((directory / "manifest.json").read_text())
    del old["bundle"]
    (directory.parent / "old").mkdir()
    (directory.parent / "old" / "manifest.json").write_text(json.dumps(old))
    assert Manifest.read(directory.parent / "old").bundle is None


@pytest.fixture(scope="module")
def x86_add(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An x86 bundle of add on float32 [4]."""
    x86_runs_here()
    return bundle(bind(get_op("add"), {}, [TensorType((4,), "float32")] * 2), "x86",
                  tmp_path_factory.mktemp("x86-add") / "add")  # fmt: skip


@pytest.fixture
def copy_of(x86_add: Path, tmp_path: Path) -> Path:
    """A copy of the x86 add bundle to tamper with, and its inputs a.npy and b.npy in tmp_path."""
    directory = tmp_path / "bundle"
    shutil.copytree(x86_add, directory)
    np.save(tmp_path / "a.npy", np.arange(4, dtype=np.float32))
    np.save(tmp_path / "b.npy", np.ones(4, dtype=np.float32))
    return directory


def rewrite_sums(directory: Path) -> None:
    """What an attacker who edits a file does next: SHA256SUMS made to match again."""
    names = [line.split("  ", 1)[1] for line in (directory / "SHA256SUMS").read_text().splitlines()]
    (directory / "SHA256SUMS").write_text("".join(f"{sha256_file(directory / n)}  {n}\n" for n in names))


def tamper(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


@pytest.mark.parametrize(
    ("victim", "message"),
    [
        ("libadd.a", "libadd.a' does not match SHA256SUMS"),
        ("deploy-run", "deploy-run' does not match SHA256SUMS"),
        ("missing", "cannot read"),
        ("no-sums", "SHA256SUMS': not a bundle directory"),
        ("unlisted", "SHA256SUMS' does not list libadd.a"),
        ("fifo", "add.h' as a file"),  # the reader blocked on it forever
        ("endless", "add.h' as a file"),  # a link to /dev/zero: hashed forever
        ("outside", "SHA256SUMS' names '../x', outside the bundle"),
        ("sums-fifo", "SHA256SUMS' is not a regular file"),  # deploy-run blocked on it before any check
        ("sums-dir", "SHA256SUMS' is not a regular file"),
    ],
)
def test_tampered_bundle_is_refused(copy_of: Path, tmp_path: Path, victim: str, message: str) -> None:
    if victim == "missing":
        (copy_of / "libadd.so").unlink()
    elif victim == "no-sums":
        (copy_of / "SHA256SUMS").unlink()
    elif victim == "unlisted":
        sums = copy_of / "SHA256SUMS"
        sums.write_text(
            "".join(line + "\n" for line in sums.read_text().splitlines() if "libadd.a" not in line)
        )
    elif victim == "fifo":
        (copy_of / "add.h").unlink()
        os.mkfifo(copy_of / "add.h")
    elif victim == "endless":
        (copy_of / "add.h").unlink()
        (copy_of / "add.h").symlink_to("/dev/zero")
    elif victim in ("sums-fifo", "sums-dir"):
        (copy_of / "SHA256SUMS").unlink()
        (os.mkfifo if victim == "sums-fifo" else os.mkdir)(copy_of / "SHA256SUMS")
    elif victim == "outside":
        with (copy_of / "SHA256SUMS").open("a") as stream:
            stream.write(f"{'0' * 64}  ../x\n")
    else:
        tamper(copy_of / victim)
    proc = deploy_run(copy_of, [tmp_path / "a.npy", tmp_path / "b.npy"], tmp_path / "out.npy", "x86")
    one_line_error(proc, 2, message)
    assert not (tmp_path / "out.npy").exists()


def bad_npy(kind: str, path: Path) -> None:
    """Write an input that deploy-run must refuse, for an op that takes float32 [4]."""
    good = np.arange(4, dtype=np.float32)
    if kind == "fortran":
        np.save(path, np.asfortranarray(np.ones((4, 4), dtype=np.float32)))
        header = path.read_bytes()  # a (4,) array is never saved Fortran-ordered: edit the flag
        path.write_bytes(header.replace(b"'shape': (4, 4)", b"'shape': (4,)  ").replace(b"False", b"True "))
    elif kind == "object":
        np.save(path, np.array([1, "x", None, 2.0], dtype=object), allow_pickle=True)
    elif kind == "truncated":
        np.save(path, good)
        path.write_bytes(path.read_bytes()[:-3])
    elif kind == "truncated-header":
        np.save(path, good)
        path.write_bytes(path.read_bytes()[:40])
    elif kind == "not-npy":
        path.write_bytes(b"hello, world\n")
    elif kind == "big-endian":
        np.save(path, good.astype(">f4"))
    elif kind == "wrong-shape":
        np.save(path, np.arange(5, dtype=np.float32))
    elif kind == "wrong-dtype":
        np.save(path, good.astype(np.float64))
    elif kind == "structured":
        np.save(path, np.zeros(4, dtype=[("x", "<f4")]))
    elif kind == "trailing":
        np.save(path, good)
        path.write_bytes(path.read_bytes() + b"\0\0\0\0")
    elif kind in HEADERS:  # numpy reads these as another array than a first-match reader would
        header = HEADERS[kind].encode()
        header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
        path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + good.tobytes())


HEADERS = {
    "repeated-order": "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'fortran_order': True, }",
    "repeated-descr": "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'descr': '<i4', }",
    "extra-key": "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 'descr', }",
    "nul-padded": "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\0\0",
    "shape-garbage": "{'descr': '<f4', 'fortran_order': False, 'shape': (4)(5), }",
}


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fortran", "is Fortran-ordered"),
        ("object", "has object dtype"),
        ("truncated", "is truncated: 13 of 16 data bytes"),
        ("truncated-header", "is truncated (header)"),
        ("not-npy", "is not a .npy file"),
        ("big-endian", "is big-endian"),
        ("wrong-shape", "is float32 [5], expected float32 [4]"),
        ("wrong-dtype", "is float64 [4], expected float32 [4]"),
        ("structured", "has a structured dtype"),
        ("trailing", "has bytes after its data"),
        ("repeated-order", "malformed .npy header ('fortran_order' given twice)"),
        ("repeated-descr", "malformed .npy header ('descr' given twice)"),
        ("extra-key", "malformed .npy header (unexpected key 'x')"),
        ("nul-padded", "malformed .npy header (bytes after the dict)"),
        ("shape-garbage", "malformed .npy shape (4)(5)"),
    ],
)
def test_bad_npy_is_refused(copy_of: Path, tmp_path: Path, kind: str, message: str) -> None:
    bad_npy(kind, tmp_path / "bad.npy")
    proc = deploy_run(copy_of, [tmp_path / "bad.npy", tmp_path / "b.npy"], tmp_path / "out.npy", "x86")
    one_line_error(proc, 2, message)


def test_a_symbolic_batch_through_the_runner_is_checked(small_graph, tmp_path: Path) -> None:
    """The runner reads N from the arrays: inputs that disagree on it, or N = 0, are refused."""
    x86_runs_here()
    _, directory = small_graph
    np.save(tmp_path / "a.npy", np.zeros((3, 16, 32, 32), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((2, 1, 16, 16), np.float32))
    np.save(tmp_path / "a0.npy", np.zeros((0, 16, 32, 32), np.float32))
    proc = deploy_run(directory, [tmp_path / "a.npy", tmp_path / "b.npy"], tmp_path / "o.npy", "x86")
    one_line_error(proc, 2, "input b", "is float32 [2, 1, 16, 16]: its N is 2, an earlier input's 3")
    proc = deploy_run(directory, [tmp_path / "a0.npy", tmp_path / "b.npy"], tmp_path / "o.npy", "x86")
    one_line_error(proc, 2, "input a", "N must be 1 to 2147483647")


def test_deploy_run_writes_its_output_as_deploy_run_o_does(x86_add: Path, tmp_path: Path) -> None:
    """A FIFO is written in place, a symlink stays and its file is replaced, a file keeps its
    mode, a directory is refused."""
    inputs = [tmp_path / "a.npy", tmp_path / "b.npy"]
    np.save(inputs[0], np.arange(4, dtype=np.float32))
    np.save(inputs[1], np.ones(4, dtype=np.float32))
    expected = np.arange(4) + 1
    command = [str(x86_add / "deploy-run"), str(x86_add), "-i", str(inputs[0]), "-i", str(inputs[1]), "-o"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()))
    reader.start()
    assert subprocess.run([*command, str(fifo)], timeout=60).returncode == 0
    reader.join(60)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    np.testing.assert_array_equal(np.load(io.BytesIO(read[0])), expected)
    (tmp_path / "named.txt").write_text("before")
    (tmp_path / "link.npy").symlink_to("named.txt")
    (tmp_path / "kept.npy").write_text("before")
    (tmp_path / "kept.npy").chmod(0o640)
    for name in ("link.npy", "kept.npy"):
        assert subprocess.run([*command, str(tmp_path / name)], timeout=60).returncode == 0
    assert (tmp_path / "link.npy").is_symlink()
    np.testing.assert_array_equal(np.load(tmp_path / "named.txt"), expected)
    assert stat.S_IMODE((tmp_path / "kept.npy").stat().st_mode) == 0o640
    one_line_error(subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=60),
                   2, "is a directory")  # fmt: skip
    (tmp_path / "log").write_bytes(b"kept\n")
    with (tmp_path / "log").open("ab") as log:  # -o /dev/stdout writes to the shell's file, not over it
        assert subprocess.run([*command, "/dev/stdout"], stdout=log, timeout=60).returncode == 0
    written = (tmp_path / "log").read_bytes()
    assert written.startswith(b"kept\n")
    np.testing.assert_array_equal(np.load(io.BytesIO(written[5:])), expected)
    # a link to nothing yet: its file is made and the link stays; into no directory, or to
    # /proc/self/fd/1 with stdout closed, it is refused (the link itself was replaced by a file)
    (tmp_path / "new.npy").symlink_to("made.npy")
    (tmp_path / "lost.npy").symlink_to(tmp_path / "nowhere" / "x.npy")
    (tmp_path / "closed.npy").symlink_to("/proc/self/fd/1")
    assert subprocess.run([*command, str(tmp_path / "new.npy")], timeout=60).returncode == 0
    assert (tmp_path / "new.npy").is_symlink()
    np.testing.assert_array_equal(np.load(tmp_path / "made.npy"), expected)
    lost = subprocess.run([*command, str(tmp_path / "lost.npy")], capture_output=True, text=True, timeout=60)
    one_line_error(lost, 2, "lost.npy': it links to", "no file can be written")
    closed = subprocess.run([*command, str(tmp_path / "closed.npy")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, timeout=60,
                            preexec_fn=lambda: os.close(1))  # fmt: skip
    assert closed.returncode == 2 and (tmp_path / "closed.npy").is_symlink(), closed.stderr
    assert (tmp_path / "lost.npy").is_symlink() and not (tmp_path / "nowhere").exists()
    long = "o" * 250 + ".npy"  # 254 bytes: a temporary named after it would be too long (#37)
    assert subprocess.run([*command, str(tmp_path / long)], timeout=60).returncode == 0
    np.testing.assert_array_equal(np.load(tmp_path / long), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a.npy", "b.npy", "fifo", "named.txt", "link.npy", "kept.npy", "log", "new.npy", "made.npy",
         "lost.npy", "closed.npy", long]
    ), "no temporary file left"  # fmt: skip


def test_runner_reads_v2_v3_and_checks_the_count(copy_of: Path, tmp_path: Path) -> None:
    inputs, out = [tmp_path / "a.npy", tmp_path / "b.npy"], tmp_path / "out.npy"
    with (tmp_path / "a3.npy").open("wb") as stream:
        np.lib.format.write_array(stream, np.arange(4, dtype=np.float32), version=(3, 0))
    with (tmp_path / "b2.npy").open("wb") as stream:
        np.lib.format.write_array(stream, np.ones(4, dtype=np.float32), version=(2, 0))
    assert deploy_run(copy_of, [tmp_path / "a3.npy", tmp_path / "b2.npy"], out, "x86").returncode == 0
    np.testing.assert_array_equal(np.load(out), np.arange(4) + 1)
    one_line_error(deploy_run(copy_of, inputs[:1], out, "x86"), 2, "add takes 2 inputs (a, b), got 1")
    one_line_error(deploy_run(copy_of, inputs * 2, out, "x86"), 2, "got 4")
    one_line_error(
        deploy_run(copy_of, [tmp_path / "none.npy", inputs[1]], out, "x86"), 2, "cannot read input"
    )
    one_line_error(deploy_run(copy_of, inputs, tmp_path / "no" / "out.npy", "x86"), 2, "cannot write output")


def test_host_arch_is_an_opencl_bundles_alone(tmp_path: Path) -> None:
    result = invoke("build", "--op", "add", "--target", "x86", "--shape", "4", "--shape", "4", "--bundle",
                    "--host-arch", "aarch64", "-o", str(tmp_path / "b"))  # fmt: skip
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line == "error: --host-arch applies to OpenCL bundles: x86 bundles run on x86_64"
    assert not (tmp_path / "b").exists()


def test_failed_bundle_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its intermediate files are inside the artifact being written: removed with it."""
    import deploy.compiler.bundle

    def broken(*args: object, **kwargs: object) -> None:
        raise DeployError("gcc failed")

    monkeypatch.setattr(deploy.compiler.bundle, "run_tool", broken)
    bound = bind(get_op("add"), {}, [TensorType((4,), "float32")] * 2)
    with pytest.raises(DeployError, match="gcc failed"):
        export(compile_op(bound, get_target("x86"), BuildOptions()), tmp_path / "b", bundle=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_python_reads_abi_h_as_c_compiles_it(tmp_path: Path) -> None:
    """abi.h spells each constant of the runtime once: every DEPLOY_ macro it defines (gcc -dM) is
    one Python read (`ABI`), with the value C gives it."""
    macros = subprocess.run(["gcc", "-dM", "-E", str(ABI_HEADER)], capture_output=True, text=True, check=True)
    names = sorted(set(re.findall(r"^#define DEPLOY_(\w+) ", macros.stdout, re.M)) - {"ABI_H_"})
    prints = "".join(f'  printf("{name} %lld\\n", (long long)DEPLOY_{name});\n' for name in names)
    (tmp_path / "abi.c").write_text(f'#include <stdio.h>\n#include "abi.h"\nint main(void) {{\n{prints}}}\n')
    subprocess.run(["gcc", f"-I{SOURCES}", str(tmp_path / "abi.c"), "-o", str(tmp_path / "abi")], check=True)
    printed = subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True).stdout
    assert {name: int(value) for name, value in map(str.split, printed.splitlines())} == ABI


SHA_MAIN = """#include <cstdio>
#include "sha256.h"
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) std::printf("%s\\n", deploy::Sha256File(argv[i]).c_str());
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_sha256_matches_hashlib(tmp_path: Path) -> None:
    (tmp_path / "main.cc").write_text(SHA_MAIN)
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Werror", f"-I{SOURCES}",
           str(tmp_path / "main.cc"), "-o", str(tmp_path / "sha")]  # fmt: skip
    subprocess.run(cmd, check=True)
    rng = np.random.default_rng(0)
    sizes = [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 1000, (1 << 16) + 3, 1 << 20]
    paths = []
    for size in sizes:
        paths.append(tmp_path / f"f{size}")
        paths[-1].write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    out = subprocess.run(
        [str(tmp_path / "sha"), *map(str, paths), str(tmp_path / "missing")], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert out.stdout.split("\n") == [*expected, "", ""]


ALIGNED_16 = """#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include "{name}.h"

/* Each buffer 16 bytes past a 64-byte boundary (what ncnn's allocator may give on ARM). */
static float* off16(size_t count) {{
  char* base = NULL;
  if (posix_memalign((void**)&base, 64, count * sizeof(float) + 64) != 0) exit(3);
  return (float*)(base + 16);
}}

int main(void) {{
  int64_t shape_a[4] = {{2, 16, 32, 32}}, shape_b[4] = {{2, 1, 16, 16}}, shape_out[4] = {{2, 16, 16, 16}};
  float* a = off16(2 * 16 * 32 * 32);
  float* b = off16(2 * 16 * 16);
  float* out = off16(2 * 16 * 16 * 16);
  DLTensor ta = {{a, {{kDLCPU, 0}}, 4, {{kDLFloat, 32, 1}}, shape_a, NULL, 0}};
  DLTensor tb = {{b, {{kDLCPU, 0}}, 4, {{kDLFloat, 32, 1}}, shape_b, NULL, 0}};
  DLTensor tout = {{out, {{kDLCPU, 0}}, 4, {{kDLFloat, 32, 1}}, shape_out, NULL, 0}};
  int i, status;
  for (i = 0; i < 2 * 16 * 32 * 32; ++i) a[i] = (float)(i % 97);
  for (i = 0; i < 2 * 16 * 16; ++i) b[i] = (float)(i % 5);
  status = {name}(&ta, &tb, &tout);
  printf("%d %s %g %g\\n", status, {name}_last_error(), out[0], out[2 * 16 * 16 * 16 - 1]);
  ta.data = (char*)a + 8;
  printf("%d %s\\n", {name}(&ta, &tb, &tout), {name}_last_error());
  return 0;
}}
"""


def test_a_bundle_built_for_16_byte_alignment_takes_such_buffers(tmp_path: Path) -> None:
    """`--alignment 16`: the graph's kernels load unaligned (a 64-byte build's aligned loads on
    such a buffer would crash), the library checks 16 and says so."""
    x86_runs_here()
    (tmp_path / "g.yaml").write_text(
        "name: pa\ninputs:\n  a: {shape: [N, 16, 32, 32]}\n  b: {shape: [N, 1, 16, 16]}\nnodes:\n"
        "  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}\n"
        "  - {name: sum, op: add, inputs: [pool, b]}\noutput: sum\n"
    )
    build = ["build", "--target", "x86", "--cores", "2", "--bundle", "--alignment", "16"]
    result = invoke(*build, "--model", str(tmp_path / "g.yaml"), "-o", str(tmp_path / "pa"))
    assert result.exit_code == 0, result.output
    assert Manifest.read(tmp_path / "pa").alignment == 16
    assert "#define PA_ALIGNMENT 16" in (tmp_path / "pa" / "pa.h").read_text()
    program = build_c(ALIGNED_16.format(name="pa"), tmp_path / "pa", tmp_path / "aligned16")
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    graph = bind_graph(load_model(tmp_path / "g.yaml"))
    a = (np.arange(2 * 16 * 32 * 32) % 97).astype(np.float32).reshape(2, 16, 32, 32)
    b = (np.arange(2 * 16 * 16) % 5).astype(np.float32).reshape(2, 1, 16, 16)
    (expected,) = graph.references(a, b)
    assert proc.stdout.splitlines() == [
        f"0  {expected.flat[0]:g} {expected.flat[-1]:g}",
        "-1 pa: a.data + byte_offset is not 16-byte aligned",
    ]
    refused = invoke("build", "--op", "add", "--target", "opencl", "--shape", "4", "--shape", "4",
                     "--alignment", "16", "-o", str(tmp_path / "cl"))  # fmt: skip
    assert refused.exit_code == 2 and "--alignment applies to CPU targets" in refused.output
