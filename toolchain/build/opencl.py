"""OpenCL plans (`kernels.cl` + `launch.json`): the kernels' OpenCL C and the launch plan a runner
needs without TVM; a graph's kernels go in one plan, in the order they run, the tensors between
them as scratch buffers the runner allocates.

The launch configuration is not in TVM's compiled module, so the PrimFunc is lowered the way
`tvm.tirx.build` does (bind target, default pipeline, split host/device): each device kernel's
`thread_extent`s give its work-group size and count, its parameters name the buffers it takes,
and the host function's launches give the kernel order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import DeployError
from base.files import sha256_file
from toolchain.build.artifacts import ArtifactKind

if TYPE_CHECKING:
    from ops.graph import BoundGraph
    from toolchain.build.compile import ScheduledKernel
    from toolchain.build.targets import Target

DIMS = "xyz"
SOURCE_FILE = "kernels.cl"
PLAN_FILE = "launch.json"


@dataclass(frozen=True)
class OpenClProgram:
    """OpenCL C source and its launch plan (JSON-able)."""

    source: str
    plan: dict[str, Any]


def _thread_extents(stmt: Any, found: dict[str, int]) -> None:
    """Collect `thread_extent` attributes (tag -> extent) anywhere in a kernel body."""
    import tvm

    if isinstance(stmt, tvm.tirx.AttrStmt) and stmt.attr_key == "thread_extent":
        found[str(stmt.node.thread_tag)] = int(stmt.value)
    for field in ("body", "then_case", "else_case", "block"):
        child = getattr(stmt, field, None)
        if isinstance(child, tvm.tirx.Stmt):
            _thread_extents(child, found)
    for child in getattr(stmt, "seq", None) or []:
        _thread_extents(child, found)


def _lower(mod: Any, target: Any) -> tuple[Any, dict[Any, Any]]:
    """Host module and finalized device modules, as `tvm.tirx.build` lowers them."""
    import tvm
    from tvm.tirx.build import split_host_device_mods

    lowered = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    host, devices = split_host_device_mods(pipeline(lowered))
    return finalize_host()(host), {t: finalize_device()(m) for t, m in devices.items()}


def _buffer(param: Any) -> dict[str, Any]:
    """A PrimFunc parameter as a plan buffer: name, shape, dtype."""
    return {
        "name": str(param.name),
        "shape": [int(dim) for dim in param.ty.shape],
        "dtype": str(param.ty.dtype),
    }


Resolve = Callable[[str, str], dict[str, Any]]
"""(buffer a kernel takes, the kernel's name) -> the argument: {"buffer", "index", "role"}."""


def _arguments(
    func: Any, roles: dict[str, tuple[str, int]], scratch: list[dict[str, Any]], prefix: str
) -> Resolve:
    """How the kernels of PrimFunc `func` find their arguments: a parameter named in `roles` is
    that (role, index); one of the function's own intermediates is scratch (added on first use,
    named `prefix` + its name)."""
    intermediates = {str(b.name): b for b in func.body.block.alloc_buffers}

    def resolve(buffer: str, kernel: str) -> dict[str, Any]:
        if buffer in roles:
            role, index = roles[buffer]
            return {"buffer": buffer, "index": index, "role": role}
        if buffer not in intermediates:
            raise DeployError(f"kernel {kernel} takes {buffer}: neither a parameter nor an intermediate")
        b = intermediates[buffer]
        entry = {"buffer": prefix + buffer, "dtype": str(b.dtype), "shape": [int(dim) for dim in b.shape]}
        return {"buffer": buffer, "index": _scratch_index(entry, scratch), "role": "scratch"}

    return resolve


def _scratch_index(entry: dict[str, Any], scratch: list[dict[str, Any]]) -> int:
    """Index of the scratch buffer `entry` in the plan's scratch list (added on first use)."""
    for index, known in enumerate(scratch):
        if known["buffer"] == entry["buffer"]:
            return index
    scratch.append(entry)
    return len(scratch) - 1


def _kernels(host: Any, devices: dict[Any, Any], symbol: str, resolve: Resolve) -> list[dict[str, Any]]:
    """The kernels host function `symbol` launches, in order, each with its arguments (`resolve`)
    and global/local sizes."""
    order = [
        name
        for name in re.findall(r'call_packed_lowered\("(\w+)"', host[symbol].script())
        if not name.startswith("__tvm")
    ]
    found = {gvar.name_hint: func for m in devices.values() for gvar, func in m.functions.items()}
    kernels = []
    for name in order:
        func = found[name]
        extents: dict[str, int] = {}
        _thread_extents(func.body, extents)
        local = [extents.get(f"threadIdx.{d}", 1) for d in DIMS]
        groups = [extents.get(f"blockIdx.{d}", 1) for d in DIMS]
        kernels.append(
            {
                "name": name,
                "args": [resolve(str(param.name).removesuffix("_ptr"), name) for param in func.params],
                "global": [g * item for g, item in zip(groups, local, strict=True)],
                "local": local,
            }
        )
    return kernels


def launch_plan(mod: Any, host: Any, devices: dict[Any, Any], n_inputs: int) -> dict[str, Any]:
    """Kernels in launch order, each with its arguments and global/local sizes. An argument is
    main's buffer `index` (role input or output: main's parameters are the inputs, then the
    output) or `scratch[index]`, an intermediate the runner allocates (role scratch). The plan
    lists main's buffers with their shapes and dtypes, which the runner checks its arrays
    against. `mod` is the scheduled module; `host` and `devices` its lowering (`_lower`)."""
    main = mod["main"]
    buffers = [_buffer(param) for param in main.params]
    roles = {b["name"]: ("input" if i < n_inputs else "output", i) for i, b in enumerate(buffers)}
    scratch: list[dict[str, Any]] = []
    kernels = _kernels(host, devices, "main", _arguments(main, roles, scratch, ""))
    return {"kernels": kernels, "buffers": buffers, "scratch": scratch}


def graph_plan(
    graph: BoundGraph, functions: list[tuple[str, Any, ScheduledKernel]], host: Any, devices: dict[Any, Any]
) -> dict[str, Any]:
    """One plan for a graph's kernels (`functions`: each kernel's name in the lowered module, its
    PrimFunc, and what it computes, in the order they run). The graph's inputs and output are the
    plan's buffers; a tensor between two kernels is scratch, like each kernel's intermediates."""
    names = [*graph.input_names, graph.graph.output]
    types = [*graph.inputs, graph.output]
    buffers = [
        {"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in zip(names, types, strict=True)
    ]
    scratch: list[dict[str, Any]] = []
    kernels = []
    for symbol, func, item in functions:
        roles = {}
        tensors = [*item.kernel.reads, item.kernel.writes]
        for param, tensor in zip(func.params, tensors, strict=True):
            if tensor in names:
                index = names.index(tensor)
                roles[str(param.name)] = ("input" if index < len(graph.inputs) else "output", index)
            else:
                t = graph.types[tensor]
                entry = {"buffer": f"tensor {tensor}", "dtype": t.dtype, "shape": list(t.shape)}
                roles[str(param.name)] = ("scratch", _scratch_index(entry, scratch))
        kernels += _kernels(host, devices, symbol, _arguments(func, roles, scratch, f"{symbol}."))
    return {"kernels": kernels, "buffers": buffers, "scratch": scratch}


def _source(mod: Any, target: Any) -> tuple[Any, dict[Any, Any], str]:
    """Lowered host module, device modules and the OpenCL C of every kernel of `mod`."""
    import tvm
    from tvm.tirx.build import codegen_build

    with tvm.transform.PassContext(opt_level=3):
        host, devices = _lower(mod, target)
        devices = {t: m for t, m in devices.items() if len(m.functions)}
        if not devices:
            raise DeployError("the schedule bound no work-items: TVM produced no OpenCL kernel")
        source = "\n".join(str(codegen_build(m, t).inspect_source()) for t, m in devices.items())
    return host, devices, source


def compile_opencl(mod: Any, target: Any, n_inputs: int) -> OpenClProgram:
    """OpenCL C and launch plan for a scheduled IRModule (work-items bound to threads), both from
    one lowering, so the plan describes exactly the kernels in the source."""
    host, devices, source = _source(mod, target)
    return OpenClProgram(source, launch_plan(mod, host, devices, n_inputs))


def compile_opencl_graph(graph: BoundGraph, kernels: list[ScheduledKernel], target: Any) -> OpenClProgram:
    """OpenCL C of every kernel of a graph (each scheduled PrimFunc named by `ScheduledKernel.function`,
    lowered together) and one plan that launches them in order."""
    import tvm

    functions = [(*k.function(i), k) for i, k in enumerate(kernels)]
    mod = tvm.IRModule({symbol: func for symbol, func, _ in functions})
    host, devices, source = _source(mod, target)
    return OpenClProgram(source, graph_plan(graph, functions, host, devices))


@dataclass(frozen=True)
class OpenClPlan(ArtifactKind):
    """OpenCL C kernels and the plan that launches them (GPU targets; no TVM on the device)."""

    def tvm_target(self, spec: dict[str, Any]) -> Any:
        import tvm

        return tvm.target.Target(spec, host={"kind": "llvm"})

    def compile(self, mod: Any, target: Target, n_inputs: int) -> OpenClProgram:
        return compile_opencl(mod, target.tvm_target(), n_inputs)

    def compile_graph(
        self, graph: BoundGraph, kernels: list[ScheduledKernel], target: Target
    ) -> OpenClProgram:
        return compile_opencl_graph(graph, kernels, target.tvm_target())

    def files(self, module: str) -> tuple[str, ...]:
        return (module, SOURCE_FILE)

    def write(self, compiled: OpenClProgram, staging: Path, target: Target) -> Path:
        """kernels.cl and launch.json, which pins the source by sha256 (the manifest pins the plan)."""
        source = staging / SOURCE_FILE
        source.write_text(compiled.source)
        plan = staging / PLAN_FILE
        body = {"source": SOURCE_FILE, "source_sha256": sha256_file(source), **compiled.plan}
        plan.write_text(json.dumps(body, indent=2) + "\n")
        return plan


OPENCL_PLAN = OpenClPlan(
    "opencl",
    splits_for_cores=False,
    builds_unscheduled=False,
    bundles=False,
    graph_entry="function",
    symbolic_batch=False,
)
