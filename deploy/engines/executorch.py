"""ExecuTorch: a kernel library (`lib<name>.so`) registering deploy's ops as `deploy::<op>.out`,
and a host (`executorch-host`) that runs a `.pte` with it.

Each op the library serves is compiled for the shapes it is called with into a bundle named by
deploy (`et<i>_<op>`, docs/bundles.md), and the bundles are linked with `executorch_kernel.cc`
and its table (`executorch_table.h`, written here: the kernel names as escaped literals) into one
shared library, which registers its kernels when it is loaded. ExecuTorch's headers and
libraries come from the `executorch` wheel (x86_64), its aarch64 libraries from the same
release's aarch64 wheel, which ci/setup.sh unpacks into deploy's cache; both are copied into
the plugin's `lib/`, so that the directory runs wherever it is copied.

A model is a `torch.export` program (`.pt2`) calling `deploy::<op>` (defined by
`deploy.engines.executorch_ops`). `test` lowers it to a `.pte` (to_edge, to_executorch), runs it
in the host and compares every output with the same program run eagerly by torch, in which each
deploy op runs its numpy reference.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from deploy.base.ctext import IDENTIFIER, c_identifier, c_string, c_word
from deploy.base.errors import DeployError, UsageError, printable, reason
from deploy.base.files import fresh_directory
from deploy.base.paths import cache_root
from deploy.compiler.bundle import run_tool
from deploy.engines import Engine, engine_source, register
from deploy.ops.spec import BoundOp, TensorType
from deploy.ops.tolerance import Rule, combined, op_rule

VERSION = "1.5.1"
"""The ExecuTorch release whose headers, libraries and exporter deploy uses."""
NAMESPACE = "deploy"
"""The operator namespace of deploy's ops in torch and ExecuTorch: `deploy::leaky_relu.out`."""
ENGINE_ALIGNMENT = 16
"""What the kernels assume of ExecuTorch's buffers: its memory planner aligns to 16 bytes."""
ARCHES = {"x86_64": "x86", "aarch64": "arm"}
"""The CPUs ExecuTorch's wheels are built for, and their targets."""
RUNTIME_LIBRARIES = ("libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_threadpool.so")
"""The wheel's libraries the host needs: the runtime (with Module), its kernels of ATen ops."""
DIR_VARIABLE = "DEPLOY_EXECUTORCH_DIR"
"""Names a directory laid out as the wheel's `executorch/` (include/, lib/) to use instead."""
AARCH64_VARIABLE = "DEPLOY_EXECUTORCH_AARCH64_LIB"
"""Names the directory of the aarch64 wheel's libraries to use instead of deploy's cache's."""
CXXFLAGS = ("-std=c++17", "-O2", "-Wall", "-fPIC", "-fvisibility=hidden")
C10_MACROS = "-DC10_USING_CUSTOM_GENERATED_MACROS"
"""What ExecuTorch's c10 headers need outside its own build (no generated cmake_macros.h)."""
PLUGIN_JSON = "plugin.json"
HOST = "executorch-host"
SCALAR_TYPES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
    11: "bool",
}  # fmt: skip
"""ExecuTorch's ScalarType numbers, as the host names its outputs' dtypes."""
SUMMING = {"aten::linear": -1, "aten::mm": -1, "aten::matmul": -1, "aten::bmm": -1, "aten::addmm": -1}
"""ATen ops of an exported model that sum over their first input's last dim (the rest: conv)."""
CONVOLUTIONS = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution")
HOST_SECONDS = 300


def torch_name(op_name: str) -> str:
    """The name of deploy op `op_name` in torch and ExecuTorch (`deploy::<it>`): letters,
    digits and `_` (a registered op's name as it is, in practice), checked."""
    name = c_word(op_name, 62)
    name = f"t_{name}" if name[0].isdigit() else name
    assert IDENTIFIER.fullmatch(name), name
    return name


@dataclass(frozen=True)
class Runtime:
    """ExecuTorch for one CPU: its headers (any CPU's) and its libraries."""

    include: Path
    lib: Path


def aarch64_lib() -> Path:
    """Where the aarch64 wheel's lib/ is: $DEPLOY_EXECUTORCH_AARCH64_LIB, else where ci/setup.sh
    unpacks it in deploy's cache."""
    given = os.environ.get(AARCH64_VARIABLE)
    return Path(given) if given else cache_root() / "executorch" / VERSION / "aarch64" / "lib"


def require_runtime(arch: str) -> Runtime:
    """ExecuTorch's headers and `arch`'s libraries, or a one-line DeployError naming what is
    missing and where it was looked for."""
    given = os.environ.get(DIR_VARIABLE)
    if given:
        wheel = Path(given)
    else:
        spec = importlib.util.find_spec("executorch")
        if spec is None or not spec.submodule_search_locations:
            raise DeployError(
                f"ExecuTorch not found: no executorch package in {printable(str(Path(os.__file__).parent))}"
                f" (pip install executorch=={VERSION}, or ci/setup.sh; or ${DIR_VARIABLE})"
            )
        wheel = Path(next(iter(spec.submodule_search_locations)))
        found = importlib.metadata.version("executorch")
        if found != VERSION:
            raise DeployError(f"ExecuTorch {found} found in {wheel}: deploy builds against {VERSION}")
    header = wheel / "include/executorch/runtime/kernel/operator_registry.h"
    if not header.is_file():
        raise DeployError(f"ExecuTorch's headers not found: no {printable(str(header))}")
    lib = wheel / "lib" if arch == "x86_64" else aarch64_lib()
    for name in RUNTIME_LIBRARIES:
        if not (lib / name).is_file():
            how = "" if arch == "x86_64" else f" (ci/setup.sh unpacks the {arch} wheel's lib/ there)"
            missing = printable(str(lib / name))
            raise DeployError(f"ExecuTorch's {arch} libraries not found: no {missing}{how}")
    return Runtime(wheel / "include", lib)


def kernel_table(names: list[str], prefixes: list[str]) -> str:
    """executorch_table.h: the bundles' headers, each kernel's name (an escaped literal) and its
    bundle's functions (prefixes deploy made), and DEPLOY_ET_FOR_EACH over the entries."""
    lines = [f'#include "{prefix}.h"\n' for prefix in prefixes]
    lines.append("static const EtOp kEtOps[] = {\n")
    for name, prefix in zip(names, prefixes, strict=True):
        literal = c_string(f"{NAMESPACE}::{name}.out")
        lines.append(
            f"    {{{literal}, {prefix}_run, {prefix}_last_error,"
            f" {prefix.upper()}_NUM_INPUTS + {prefix.upper()}_NUM_OUTPUTS}},\n"
        )
    lines.append("};\n")
    each = " ".join(f"X({i})" for i in range(len(names)))
    lines.append(f"#define DEPLOY_ET_FOR_EACH(X) {each}\n")
    return "".join(lines)


def _check_served(served: dict[str, BoundOp]) -> None:
    for name, bound in served.items():
        if len(bound.outputs) != 1:
            raise UsageError(f"{NAMESPACE}::{name}: ExecuTorch's out variant here takes one output")


def build_library(served: dict[str, BoundOp], target: Any, options: Any, directory: Path, name: str) -> Path:
    """Compile each served op (by torch name) as a bundle, link them with the glue into
    `directory`/lib`name`.so, build the host beside it and copy ExecuTorch's libraries into
    `directory`/lib (written whole, or not at all); returns the directory."""
    from deploy.compiler.bundle import write_bundle
    from deploy.compiler.compile import compile_op
    from deploy.compiler.export import check_destination
    from deploy.devices.native import require_tool
    from deploy.devices.platforms import get_platform

    _check_served(served)
    runtime = require_runtime(target.arch)
    platform = get_platform(target.arch)
    gxx = require_tool(platform, "g++", platform.gxx_package)
    place = check_destination(directory)
    ours = {f"lib{name}.so", HOST, PLUGIN_JSON, "lib"}
    if place.exists() and any(p.name not in ours for p in place.iterdir()):
        raise UsageError(f"output {directory} holds other files than a plugin's: not replacing it")
    options = replace(options, alignment=ENGINE_ALIGNMENT)
    taken: set[str] = set()
    prefixes = [c_identifier(f"et{i}_{c_word(op, 24)}", taken) for i, op in enumerate(served)]
    includes = [f"-I{runtime.include}", f"-I{runtime.include}/executorch/runtime/core/portable_type/c10"]
    place.parent.mkdir(parents=True, exist_ok=True)
    staging = fresh_directory(place.parent, f".{place.name}.")
    try:
        with tempfile.TemporaryDirectory(prefix="deploy-et-") as scratch:
            work = Path(scratch)
            archives = []
            for bound, prefix in zip(served.values(), prefixes, strict=True):
                bundle = work / prefix
                bundle.mkdir()
                write_bundle(compile_op(bound, target, options), bundle, prefix)
                archives.append(str(bundle / f"lib{prefix}.a"))
                includes += [f"-I{bundle}", f"-I{bundle / 'include'}"]
            (work / "executorch_table.h").write_text(kernel_table(list(served), prefixes))
            glue = engine_source("executorch_kernel.cc")
            (staging / "lib").mkdir()
            for library in RUNTIME_LIBRARIES:
                shutil.copy2(runtime.lib / library, staging / "lib" / library)
            lib = staging / "lib"
            run_tool(
                [gxx, *CXXFLAGS, C10_MACROS, f"-I{work}", *includes, "-shared", str(glue), *archives,
                 f"-Wl,-soname,lib{name}.so", f"-L{lib}", "-lexecutorch", "-Wl,-rpath,$ORIGIN/lib",
                 "-o", str(staging / f"lib{name}.so")],
                f"{gxx} on {glue.name}",
            )  # fmt: skip
            source = engine_source("executorch_host.cc")
            run_tool(
                [gxx, *CXXFLAGS, C10_MACROS, *includes, str(source), "-o", str(staging / HOST),
                 "-Wl,--no-as-needed",
                 str(staging / f"lib{name}.so"), f"-L{lib}", "-lexecutorch", "-lexecutorch_kernels_optimized",
                 "-Wl,--as-needed", f"-Wl,-rpath-link,{lib}", "-Wl,-rpath,$ORIGIN:$ORIGIN/lib"],
                f"{gxx} on {source.name}",
            )  # fmt: skip
        listing = [
            {"kernel": f"{NAMESPACE}::{op}.out", "op": bound.op.name, "attrs": _attrs_json(bound),
             "inputs": [t.dims() for t in bound.inputs], "dtypes": [t.dtype for t in bound.inputs],
             "bundle": prefix}
            for (op, bound), prefix in zip(served.items(), prefixes, strict=True)
        ]  # fmt: skip
        plugin = {"library": f"lib{name}.so", "host": HOST, "target": target.name, "kernels": listing}
        (staging / PLUGIN_JSON).write_text(json.dumps(plugin, indent=1))
        if place.exists():
            shutil.rmtree(place)
        os.replace(staging, place)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return place


def _attrs_json(bound: BoundOp) -> dict[str, Any]:
    """The op's attributes as plugin.json lists them (a value JSON cannot say: its repr)."""
    return {k: v if isinstance(v, int | float | str) else repr(v) for k, v in bound.attrs.items()}


def load_program(model: Path) -> Any:
    """The torch.export program saved in `model` (.pt2), deploy's ops defined first; one-line
    errors for a missing torch or a file that is none."""
    try:
        import torch

        import deploy.engines.executorch_ops  # noqa: F401  (defines deploy::<op> for loading)
    except ImportError as exc:
        raise DeployError(f"--engine executorch needs torch for a model: {reason(exc)}") from None
    if not model.is_file():
        raise UsageError(f"--model {printable(str(model))}: no such file")
    try:
        return torch.export.load(str(model))
    except Exception as exc:
        raise UsageError(
            f"--model {printable(str(model))}: expected a torch.export program (.pt2): {reason(exc)}"
        ) from None


def model_ops(program: Any, model: Path) -> dict[str, BoundOp]:
    """Each deploy op the program calls, by torch name, bound to the shapes it is called with
    (one kernel per op: a second shape of the same op is refused in one line)."""
    from deploy.engines.executorch_ops import bound_call

    served: dict[str, BoundOp] = {}
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or getattr(target, "namespace", None) != NAMESPACE:
            continue
        name = target._schema.name.split("::", 1)[1]
        bound = bound_call(name, tuple(arg.meta["val"] for arg in node.args))
        if name in served and served[name].inputs != bound.inputs:
            raise UsageError(
                f"model {printable(str(model))}: {NAMESPACE}::{name} is called with {_types(served[name])}"
                f" and with {_types(bound)}: one kernel per op (export one shape)"
            )
        served[name] = bound
    if not served:
        raise UsageError(f"model {printable(str(model))}: it calls no {NAMESPACE}:: op: nothing to serve")
    _check_served(served)
    return served


def library_name(stem: str) -> str:
    """The kernel library's name, lib<it>.so: the model's or op's name as letters, digits and _,
    then `_executorch` (no system library's name: `m.pt2` makes no second libm.so)."""
    return f"{c_word(stem, 40)}_executorch"


def _types(bound: BoundOp) -> str:
    return ", ".join(f"{t.dtype}{list(t.shape)}" for t in bound.inputs)


def build(bound: BoundOp | None, model: Path | None, target: Any, options: Any, directory: Path) -> list[str]:
    """`deploy build --engine executorch`: the kernel library of an op (`bound`) or of the deploy
    ops a `.pt2` program calls."""
    _check_arch(target)
    if model is not None:
        served = model_ops(load_program(model), model)
    else:
        assert bound is not None
        served = {torch_name(bound.op.name): bound}
    name = library_name(model.stem if model is not None else next(iter(served)))
    place = build_library(served, target, options, directory, name)
    lines = [f"built {place / f'lib{name}.so'} for ExecuTorch on {target.name}: {len(served)} kernel(s)"]
    lines += [f"  {NAMESPACE}::{op}.out: op {b.op.name} {_types(b)}" for op, b in served.items()]
    lines.append(f"  run a .pte with it: {place / HOST} MODEL.pte -i INPUT.bin ... -o OUTPUT.bin ...")
    return lines


def _check_arch(target: Any) -> None:
    if target.arch not in ARCHES:
        raise UsageError(
            f"--engine executorch: --target {target.name}: expected {' or '.join(ARCHES.values())}"
            " (the CPUs of ExecuTorch's wheels)"
        )


def lower(program: Any, model: Path) -> bytes:
    """The program as a .pte: to_edge (deploy's ops are not core ATen: no IR check), to_executorch."""
    from executorch.exir import EdgeCompileConfig, to_edge

    try:
        edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        return bytes(edge.to_executorch().buffer)
    except Exception as exc:
        shown = printable(str(model))
        raise UsageError(f"model {shown}: ExecuTorch cannot lower it: {reason(exc)}") from None


def run_host(directory: Path, pte: Path, arrays: list[np.ndarray], count: int, arch: str) -> list[np.ndarray]:
    """The .pte's `count` outputs for `arrays`, run by the plugin's host (under `arch`'s emulator
    where it is not this machine's). A failed run is one line: the kernel's own reason where
    ExecuTorch logged one, else the host's."""
    from deploy.devices.platforms import get_platform

    platform = get_platform(arch)
    platform.require_emulator()
    with tempfile.TemporaryDirectory(prefix="deploy-et-run-") as scratch:
        work = Path(scratch)
        command = [*platform.emulator_command(), str(directory / HOST), str(pte)]
        for i, array in enumerate(arrays):
            np.ascontiguousarray(array).tofile(work / f"in{i}.bin")
            command += ["-i", str(work / f"in{i}.bin")]
        outputs = [work / f"out{i}.bin" for i in range(count)]
        for path in outputs:
            command += ["-o", str(path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=HOST_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise DeployError(f"ExecuTorch: {HOST} ran past {HOST_SECONDS} s") from None
        if done.returncode != 0:
            raise _host_error(done.returncode, done.stderr)
        results = []
        for line in done.stdout.splitlines():
            words = line.split()
            shape = tuple(int(d) for d in words[3].split("x")) if len(words) > 3 else ()
            data = np.fromfile(outputs[int(words[1])], dtype=SCALAR_TYPES[int(words[2])])
            results.append(data.reshape(shape))
        return results


def _host_error(code: int, stderr: str) -> DeployError:
    """The one line a failed host run ends in: the kernel's reason (the line ExecuTorch logged,
    after its `E time file:line] ` prefix) where there is one, else the host's last line; exit
    2 for what the host refused as bad input."""
    lines = [line.split("] ", 1)[-1] for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith(f"{NAMESPACE}::")]
    text = ours[0] if ours else lines[-1] if lines else f"{HOST} exited with {code}"
    return (UsageError if code == 2 else DeployError)(f"ExecuTorch: {printable(text)}")


def _tensor_type(value: Any) -> TensorType:
    """A fake tensor's shape and dtype, as deploy types a tensor."""
    return TensorType(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))


def summed_terms(program: Any) -> int:
    """The most terms a sum of the program's ATen ops adds (a linear's or matmul's inner dim, a
    convolution's weight's in-channels x kernel): the summation part of its tolerance."""
    most = 0
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        if schema.name in SUMMING:
            first = node.args[1] if schema.name == "aten::addmm" else node.args[0]
            most = max(most, int(first.meta["val"].shape[-1]))
        elif schema.name in CONVOLUTIONS:
            most = max(most, math.prod(int(d) for d in node.args[1].meta["val"].shape[1:]))
    return most


def eager(program: Any, arrays: list[np.ndarray], magnitude: bool = False) -> list[np.ndarray]:
    """The program run by torch (deploy's ops by their numpy reference); with `magnitude`, on
    |inputs| with |parameters| (the per-term part of the tolerance: sum |terms| of every sum)."""
    import torch

    module = program.module()
    tensors = [torch.from_numpy(np.abs(a) if magnitude else a) for a in arrays]
    if magnitude:
        module = copy.deepcopy(module)
        with torch.no_grad():
            for value in [*module.parameters(), *module.buffers()]:
                value.abs_()
    with torch.no_grad():
        result = module(*tensors)
    results = result if isinstance(result, tuple | list) else [result]
    return [r.detach().numpy() for r in results]


def test(model: Path, directory: Path, target: Any, options: Any) -> list[str]:
    """`deploy test --model M.pt2 --engine executorch`: build the kernel library of the deploy ops
    the program calls into `directory`, lower the program to a .pte beside it, run it in the host
    on random inputs (plain, ties, and with NaN and infinities planted) and compare every output
    with the program run eagerly (`eager`) under the ops' rules and the program's sums'."""
    from deploy.verify.compare import INPUT_SETS, compare_all, random_input

    _check_arch(target)
    program = load_program(model)
    served = model_ops(program, model)
    place = build_library(served, target, options, directory, library_name(model.stem))
    pte = place / f"{c_word(model.stem, 40)}.pte"
    pte.write_bytes(lower(program, model))
    users = set(program.graph_signature.user_inputs)
    inputs = [
        _tensor_type(n.meta["val"]) for n in program.graph.nodes if n.op == "placeholder" and n.name in users
    ]
    terms = summed_terms(program)
    rule: Rule = combined([b.rule() for b in served.values()] + [op_rule("the model", False, None, terms)])
    exact = all(b.exact for b in served.values()) and terms == 0
    rng = np.random.default_rng(0)
    lines = []
    for inputs_set in INPUT_SETS:
        arrays = [random_input(t, rng, inputs_set.ties, inputs_set.specials) for t in inputs]
        want = eager(program, arrays)
        got = run_host(place, pte, arrays, len(want), target.arch)
        names = [f"output{i}" for i in range(len(want))]
        result = compare_all(want, got, exact, names, rule, eager(program, arrays, magnitude=True))
        if not result.ok:
            raise DeployError(f"ExecuTorch with deploy's kernels: {inputs_set.label} inputs: {result.detail}")
        error = f"max error {result.max_error:.3g}"
        lines.append(f"  {len(want)} output(s) on {inputs_set.label} inputs: ok ({error})")
    kernels = ", ".join(f"{NAMESPACE}::{op}.out" for op in served)
    lines.insert(0, f"{model} in ExecuTorch on {target.name} with {kernels} from deploy: ok")
    return lines


ENGINE = register(Engine("executorch", "a kernel library (deploy::<op>.out kernels)", build, test))
