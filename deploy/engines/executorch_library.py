"""ExecuTorch's side of deploy, without torch: a kernel library (`lib<name>.so`) registering
deploy's ops as `deploy::<op>.out`, the host (`executorch-host`) that runs a `.pte` with it, and
the names both use.

Each op the library serves is compiled for the shapes it is called with into a bundle named by
deploy (`et<i>_<op>`, docs/bundles.md), and the bundles are linked with `executorch_kernel.cc`
and its table (`executorch_table.h`, written here: the kernel names as escaped literals) into one
shared library, which registers its kernels when it is loaded. ExecuTorch's headers and
libraries come from the `executorch` wheel (x86_64), its aarch64 libraries from the same
release's aarch64 wheel, which ci/setup.sh unpacks into deploy's cache; both are copied into
the plugin's `lib/`, so that the directory runs wherever it is copied.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deploy.base.ctext import IDENTIFIER, c_string, c_word
from deploy.base.errors import DeployError, UsageError, printable, reason
from deploy.base.files import replacing_directory
from deploy.base.paths import cache_root
from deploy.compiler.bundle import run_tool
from deploy.engines import engine_source, write_bundles
from deploy.ops import bind
from deploy.ops.attrs import Attr, Bool, Float, Int
from deploy.ops.spec import BoundOp, Op, TensorType

if TYPE_CHECKING:
    from deploy.devices.boards import Board

VERSION = "1.5.1"
"""The ExecuTorch release whose headers, libraries and exporter deploy uses."""
NAMESPACE = "deploy"
"""The operator namespace of deploy's ops in torch and ExecuTorch: `deploy::leaky_relu.out`."""
ENGINE_ALIGNMENT = 16
"""What the kernels assume of ExecuTorch's buffers: its memory planner aligns to 16 bytes."""
ARCHES = {"x86_64": "x86", "aarch64": "arm"}
"""The CPUs ExecuTorch's wheels are built for, and their targets."""
RUNTIME_LIBRARIES = ("libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_threadpool.so")
"""The wheel's libraries the host needs: the runtime (with Module), its kernels of ATen ops, the
threadpool both its kernels and deploy's run their parallel loops on."""
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
                f"ExecuTorch not found: no executorch package on {printable(sys.executable)}'s path"
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


ATTR_KINDS = {Float: ("float", 0), Int: ("int", 1), Bool: ("bool", 2)}
"""The attribute kinds a torch schema takes (their torch type) and the kernel checks (its code in
executorch_kernel.cc's EtAttr): numbers and flags; an op's other attributes keep its defaults."""


def schema_attrs(op: Op) -> list[Attr]:
    """The attributes of `op` its torch schema takes, keyword-only and optional (None: the op's
    default): those of a kind in ATTR_KINDS with a default, named as an identifier no schema or
    Python word takes."""
    return [
        a
        for a in op.attrs
        if type(a.kind) in ATTR_KINDS
        and a.default is not None
        and IDENTIFIER.fullmatch(a.name)
        and not keyword.iskeyword(a.name)
        and a.name != "out"
        and not re.fullmatch(r"x\d+", a.name)
    ]


def kernel_table(served: dict[str, BoundOp], prefixes: list[str]) -> str:
    """executorch_table.h: the bundles' headers, each kernel's name (an escaped literal), its
    bundle's functions (prefixes deploy made), its inputs and the attributes its schema takes
    (name as an escaped literal, kind, the value built for and the op's default, as exact hex
    floats), and DEPLOY_ET_FOR_EACH over the entries."""
    lines = [f'#include "{prefix}.h"\n' for prefix in prefixes]
    for i, bound in enumerate(served.values()):
        rows = [
            f"{{{c_string(a.name)}, {ATTR_KINDS[type(a.kind)][1]}, {float(bound.attrs[a.name]).hex()},"
            f" {float(a.default).hex()}}}"
            for a in schema_attrs(bound.op)
        ]
        lines.append(f"static const EtAttr kEtAttrs{i}[] = {{{', '.join(rows) or '{nullptr, 0, 0, 0}'}}};\n")
    lines.append("static const EtOp kEtOps[] = {\n")
    for i, ((name, bound), prefix) in enumerate(zip(served.items(), prefixes, strict=True)):
        literal = c_string(f"{NAMESPACE}::{name}.out")
        count = len(schema_attrs(bound.op))
        lines.append(
            f"    {{{literal}, {prefix}_run, {prefix}_last_error, {prefix}_set_parallel_for,"
            f" {prefix.upper()}_NUM_INPUTS, kEtAttrs{i}, {count}}},\n"
        )
    lines.append("};\n")
    each = " ".join(f"X({i})" for i in range(len(served)))
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
    includes = [f"-I{runtime.include}", f"-I{runtime.include}/executorch/runtime/core/portable_type/c10"]
    with replacing_directory(place) as staging:
        with tempfile.TemporaryDirectory(prefix="deploy-et-") as scratch:
            work = Path(scratch)
            bundles = write_bundles(list(served.values()), "et", target, options, work)
            prefixes = [prefix for prefix, _ in bundles]
            archives = [str(bundle / f"lib{prefix}.a") for prefix, bundle in bundles]
            includes += [flag for _, bundle in bundles for flag in (f"-I{bundle}", f"-I{bundle / 'include'}")]
            (work / "executorch_table.h").write_text(kernel_table(served, prefixes))
            glue = engine_source("executorch_kernel.cc")
            (staging / "lib").mkdir()
            for library in RUNTIME_LIBRARIES:
                shutil.copy2(runtime.lib / library, staging / "lib" / library)
            lib = staging / "lib"
            run_tool(
                [gxx, *CXXFLAGS, C10_MACROS, f"-I{work}", *includes, "-shared", str(glue), *archives,
                 f"-Wl,-soname,lib{name}.so", f"-L{lib}", "-lexecutorch", "-lexecutorch_threadpool",
                 "-Wl,-rpath,$ORIGIN/lib",
                 "-o", str(staging / f"lib{name}.so")],
                f"{gxx} on {glue.name}",
            )  # fmt: skip
            source = engine_source("executorch_host.cc")
            run_tool(
                [gxx, *CXXFLAGS, C10_MACROS, *includes, str(source), "-o", str(staging / HOST),
                 "-Wl,--no-as-needed",
                 str(staging / f"lib{name}.so"), f"-L{lib}", "-lexecutorch", "-lexecutorch_kernels_optimized",
                 "-lexecutorch_threadpool", "-Wl,--as-needed", f"-Wl,-rpath-link,{lib}",
                 "-Wl,-rpath,$ORIGIN:$ORIGIN/lib"],
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
    return place


def _attrs_json(bound: BoundOp) -> dict[str, Any]:
    """The op's attributes as plugin.json lists them (a value JSON cannot say: its repr)."""
    return {k: v if isinstance(v, int | float | str) else repr(v) for k, v in bound.attrs.items()}


def library_name(stem: str) -> str:
    """The kernel library's name, lib<it>.so: the model's or op's name as letters, digits and _,
    then `_executorch` (no system library's name: `m.pt2` makes no second libm.so)."""
    return f"{c_word(stem, 40)}_executorch"


def shown_types(bound: BoundOp) -> str:
    return ", ".join(f"{t.dtype}{list(t.shape)}" for t in bound.inputs)


def shown_call(bound: BoundOp) -> str:
    """A call as messages show it: its inputs' types, then the attributes its schema takes."""
    attrs = [f"{a.name}={bound.attrs[a.name]!r}" for a in schema_attrs(bound.op)]
    return ", ".join([shown_types(bound), *attrs])


def run_host(
    directory: Path, pte: Path, arrays: list[np.ndarray], count: int, arch: str, board: Board | None = None
) -> list[np.ndarray]:
    """The .pte's `count` outputs for `arrays`, run by the plugin's host (under `arch`'s emulator
    where it is not this machine's; on `board`, with the directory and the .pte pushed
    there, when one is given). A failed run is one line: the kernel's own reason where
    ExecuTorch logged one, else the host's."""
    from deploy.devices.platforms import get_platform

    platform = get_platform(arch)
    if board is None:
        platform.require_emulator()
    with tempfile.TemporaryDirectory(prefix="deploy-et-run-") as scratch:
        work = Path(scratch)
        files = []  # the host's -i and -o files, named in `work`
        for i, array in enumerate(arrays):
            np.ascontiguousarray(array).tofile(work / f"in{i}.bin")
            files += ["-i", f"in{i}.bin"]
        outputs = [work / f"out{i}.bin" for i in range(count)]
        files += [word for path in outputs for word in ("-o", path.name)]
        try:
            if board is None:
                paths = [word if word.startswith("-") else str(work / word) for word in files]
                command = [*platform.emulator_command(), str(directory / HOST), str(pte), *paths]
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=HOST_SECONDS, check=False
                )
            else:
                from deploy.engines.board import run_on_board

                pushed = {str(p.relative_to(directory)): p for p in directory.rglob("*") if p.is_file()}
                pushed[pte.name] = pte
                inputs = [work / f"in{i}.bin" for i in range(len(arrays))]

                def args(remote: str) -> list[str]:  # run in the call's directory, holding the files
                    return [f"{remote}/{HOST}", f"{remote}/{pte.name}", *files]

                done = run_on_board(board, pushed, HOST, args, inputs, work, HOST_SECONDS)
        except subprocess.TimeoutExpired:
            raise DeployError(f"ExecuTorch: {HOST} ran past {HOST_SECONDS} s") from None
        if done.returncode != 0:
            raise _host_error(done.returncode, done.stderr)
        results = []
        listing = done.stdout  # the host's line per output
        for line in listing.splitlines():
            words = line.split()
            shape = tuple(int(d) for d in words[3].split("x")) if len(words) > 3 else ()
            data = np.fromfile(outputs[int(words[1])], dtype=SCALAR_TYPES[int(words[2])])
            results.append(data.reshape(shape))
        return results


def _host_error(code: int, stderr: str) -> DeployError:
    """The one line a failed host run ends in (the host's: what failed and ExecuTorch's first
    error, a kernel's own reason where one failed); exit 2 for what it refused as bad input."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    text = lines[-1].removeprefix(f"{HOST}: ") if lines else f"{HOST} exited with {code}"
    return (UsageError if code == 2 else DeployError)(f"ExecuTorch: {printable(text)}")


def bound_call(op: Op, name: str, tensors: tuple[Any, ...], attrs: dict[str, Any]) -> BoundOp:
    """`op` (`deploy::name`) bound to the tensors it is called with (real or fake tensors, or
    anything with a shape and a torch dtype) and the attributes given (None: the op's default);
    a one-line UsageError where they do not fit it (a wrong rank, a dtype it does not take, a
    symbolic size, a value out of range)."""
    types = []
    for i, tensor in enumerate(tensors):
        if not all(isinstance(size, int) for size in tensor.shape):
            raise UsageError(f"{NAMESPACE}::{name}: input x{i} has a symbolic shape; deploy's are static")
        types.append(TensorType(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
    try:
        return bind(op, {key: value for key, value in attrs.items() if value is not None}, types)
    except UsageError as exc:
        raise UsageError(f"{NAMESPACE}::{name}: {reason(exc)}") from None
