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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.base.errors import DeployError
from deploy.base.files import sha256_file
from deploy.compiler.artifacts import ArtifactKind
from deploy.compiler.constants import BLOB, write_blob
from deploy.compiler.plan import constant_offsets

if TYPE_CHECKING:
    from deploy.compiler.compile import ScheduledKernel
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import Target
    from deploy.ops.graph import BoundGraph, Constant
    from deploy.ops.spec import TensorType

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


def _launched(host: Any, symbol: str) -> list[str]:
    """The device kernels host function `symbol` launches, in order."""
    calls = re.findall(r'call_packed_lowered\("(\w+)"', host[symbol].script())
    return [name for name in calls if not name.startswith("__tvm")]


def _kernels(host: Any, devices: dict[Any, Any], symbol: str, resolve: Resolve) -> list[dict[str, Any]]:
    """The kernels host function `symbol` launches, in order, each with its arguments (`resolve`)
    and global/local sizes."""
    order = _launched(host, symbol)
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


def _half_storage(func: Any, halves: set[str]) -> Any:
    """Device kernel `func` with its parameters named in `halves` (by buffer name) taken as half
    pointers: each load becomes `vload_half` (a float) and each store `vstore_half`, OpenCL 1.2
    core, so the kernel computes in float32 and needs no cl_khr_fp16."""
    import tvm
    import tvm.sym.analyzer
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx import stmt

    analyzer = tvm.sym.analyzer.Analyzer()
    params = []
    for param in func.params:
        if str(param.name).removesuffix("_ptr") in halves:
            param = tirx.Var(str(param.name), tvm.ir.PointerType(tvm.ir.PrimType("float16"), "global"))
        params.append(param)
    by_name = {str(p.name): p for p in params}
    pointers: dict[str, Any] = {}  # buffer name -> its half pointer

    def declared(node: Any) -> Any:
        data = getattr(node.data, "name", None)
        if data is not None and str(data).removesuffix("_ptr") in halves:
            pointers[str(node.buffer.name)] = by_name[str(data)]
        return node

    tvm_ffi.structural_map(func.body, [(stmt.DeclBuffer, declared)])

    def load(node: Any) -> Any:
        pointer = pointers.get(str(node.source.name))
        if pointer is None:
            return node
        (index,) = node.indices
        if index.ty.dtype.lanes > 1 and not _contiguous(index, analyzer):
            return _gathered(index, pointer)
        name, lanes, offset = _half_access(node.indices, analyzer)
        return tirx.call_pure_extern(
            f"float32x{lanes}" if lanes > 1 else "float32", f"vload_{name}", offset, pointer
        )

    def store(node: Any) -> Any:
        pointer = pointers.get(str(node.buffer.name))
        if pointer is None:
            return node
        name, _, offset = _half_access(node.indices, analyzer)
        return tirx.Evaluate(tirx.call_extern("void", f"vstore_{name}", node.value, offset, pointer))

    def undeclared(node: Any) -> Any:
        return tirx.Evaluate(0) if str(node.buffer.name) in pointers else node

    rules = [(tvm.ir.TensorLoad, load), (stmt.BufferStore, store), (stmt.DeclBuffer, undeclared)]
    return tirx.PrimFunc(params, tvm_ffi.structural_map(func.body, rules), func.ret_type, func.attrs)


def _contiguous(index: Any, analyzer: Any) -> bool:
    """Whether a vector index is N contiguous elements from a multiple of N (N = 2, 3, 4, 8, 16):
    what `vload_halfN` / `vstore_halfN` take."""
    from tvm import tirx

    if not isinstance(index, tirx.Ramp):
        return False
    lanes = int(index.lanes)
    aligned = analyzer.modular_set(index.base)
    return (
        lanes in (2, 3, 4, 8, 16)
        and isinstance(index.stride, tirx.IntImm)
        and int(index.stride) == 1
        and aligned.coeff % lanes == 0
        and aligned.base % lanes == 0
    )


def _gathered(index: Any, pointer: Any) -> Any:
    """A float vector of half elements at a vector index that is not contiguous (a broadcast
    operand, a layout's transpose): one `vload_half` per lane, each bound to a name once, put in
    place by vector selects (TVM prints a vector built of scalars as `float4(...)`, which OpenCL
    C rejects); a broadcast index is one load, broadcast."""
    from tvm import tirx

    count = index.ty.dtype.lanes
    if isinstance(index, tirx.Broadcast):
        return tirx.Broadcast(tirx.call_pure_extern("float32", "vload_half", index.value, pointer), count)
    names = [tirx.Var(f"lane{lane}", "float32") for lane in range(count)]
    lanes = tirx.Ramp(tirx.const(0, "int32"), tirx.const(1, "int32"), count)
    vector = tirx.Broadcast(names[-1], count)
    for lane in reversed(range(count - 1)):
        chosen = tirx.EQ(lanes, tirx.Broadcast(tirx.const(lane, "int32"), count))
        vector = tirx.Select(chosen, tirx.Broadcast(names[lane], count), vector)
    for lane in reversed(range(count)):
        loaded = tirx.call_pure_extern("float32", "vload_half", _lane(index, lane), pointer)
        vector = tirx.Let(names[lane], loaded, vector)
    return vector


def _lane(index: Any, lane: int) -> Any:
    """The element index of one lane of a vector index (a gather's)."""
    from tvm import tirx

    if isinstance(index, tirx.Ramp):
        return index.base + index.stride * lane
    return tirx.Shuffle([index], [tirx.IntImm("int32", lane)])


def _half_access(indices: Any, analyzer: Any) -> tuple[str, int, Any]:
    """(`half` or `halfN`, lanes, offset) of a half load or store at a flat index: a scalar at
    element i is `vload_half(i, p)`; a vector of N contiguous elements from i is
    `vload_halfN(i / N, p)`, which needs i a multiple of N (the GPU schedule's vectors start at
    multiples of their lanes; a load that gathers is read lane by lane before it gets here)."""
    from tvm import tirx

    (index,) = indices
    if index.ty.dtype.lanes == 1:
        return "half", 1, index
    if not _contiguous(index, analyzer):
        raise DeployError(f"a half vector stored at {index} is not contiguous from a multiple of its lanes")
    lanes = int(index.lanes)
    offset = analyzer.simplify(tirx.truncdiv(index.base, lanes))  # i >= 0: truncation is floor
    return f"half{lanes}", lanes, offset


HALF_PREAMBLE = re.compile(r"#ifdef cl_khr_fp16\n.*?#endif\n", re.S)
"""What TVM's OpenCL C starts with once a half type appears: enable cl_khr_fp16, else #error. A
kernel that keeps half in memory only needs neither."""


def _stored_half(func: Any, stored: Sequence[TensorType]) -> set[str]:
    """Parameters of PrimFunc `func` that are float16 in memory (`stored`, in parameter order)
    but computed as another dtype (`BuildOptions.fp16_storage`): the kernels load and store them as half."""
    pairs = zip(func.params, stored, strict=True)
    return {str(p.name) for p, t in pairs if t.dtype == "float16" and str(p.ty.dtype) != "float16"}


def _float16(plan: dict[str, Any], halves: dict[str, set[str]]) -> dict[str, str]:
    """How a plan with float16 buffers computes them, for the runner and whoever reads
    launch.json: in half (`native`: the device needs cl_khr_fp16) or in float32 with the buffers
    `halves` names kept half in memory (`storage`)."""
    if all(b["dtype"] != "float16" for b in (*plan["buffers"], *plan["scratch"])):
        return {}
    return {"float16": "storage" if any(halves.values()) else "native"}


def launch_plan(mod: Any, host: Any, devices: dict[Any, Any], n_inputs: int) -> dict[str, Any]:
    """Kernels in launch order, each with its arguments and global/local sizes. An argument is
    main's buffer `index` (role input or output: main's parameters are the inputs, then the
    outputs, `outputs` of them) or `scratch[index]`, an intermediate the runner allocates (role
    scratch). The plan lists main's buffers with their shapes and dtypes, which the runner
    checks its arrays against. `mod` is the scheduled module; `host` and `devices` its lowering
    (`_lower`)."""
    main = mod["main"]
    buffers = [_buffer(param) for param in main.params]
    roles = {b["name"]: ("input" if i < n_inputs else "output", i) for i, b in enumerate(buffers)}
    scratch: list[dict[str, Any]] = []
    kernels = _kernels(host, devices, "main", _arguments(main, roles, scratch, ""))
    return {"kernels": kernels, "buffers": buffers, "outputs": len(buffers) - n_inputs, "scratch": scratch}


def graph_plan(
    graph: BoundGraph, functions: list[tuple[str, Any, ScheduledKernel]], host: Any, devices: dict[Any, Any]
) -> dict[str, Any]:
    """One plan for a graph's kernels (`functions`: each kernel's name in the lowered module, its
    PrimFunc, and what it computes, in the order they run). The graph's inputs and outputs are
    the plan's buffers; its constants are `constants[index]`, each at its offset in the constants
    file (`constants.py`); a tensor between two kernels is scratch, like each kernel's
    intermediates."""
    outputs = graph.graph.outputs
    written = {k.kernel.writes for _, _, k in functions}
    for name in outputs:
        if name not in written:  # an input or a constant passed through
            raise DeployError(
                f"target opencl: output {name!r} is no kernel's (an input or a constant passed through);"
                " CPU targets copy it"
            )
    names = [*graph.input_names, *outputs]
    at = {name: index for index, name in enumerate(graph.input_names)}
    at.update({name: len(graph.inputs) + k for k, name in enumerate(outputs)})
    constants = {c.name: index for index, c in enumerate(graph.graph.constants)}
    types = [*graph.inputs, *graph.outputs]
    buffers = [
        {"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in zip(names, types, strict=True)
    ]
    scratch: list[dict[str, Any]] = []
    kernels = []
    for symbol, func, item in functions:
        roles = {}
        tensors = [*item.kernel.reads, item.kernel.writes]
        for param, tensor in zip(func.params, tensors, strict=True):
            if tensor in at:
                index = at[tensor]
                roles[str(param.name)] = ("input" if index < len(graph.inputs) else "output", index)
            elif tensor in constants:
                roles[str(param.name)] = ("constant", constants[tensor])
            else:
                t = graph.types[tensor]
                entry = {"buffer": f"tensor {tensor}", "dtype": t.dtype, "shape": list(t.shape)}
                roles[str(param.name)] = ("scratch", _scratch_index(entry, scratch))
        kernels += _kernels(host, devices, symbol, _arguments(func, roles, scratch, f"{symbol}."))
    offsets = constant_offsets(graph.graph.constants)
    stored = [
        {"name": c.name, "shape": list(c.type.shape), "dtype": c.type.dtype, "offset": offset}
        for c, offset in zip(graph.graph.constants, offsets, strict=True)
    ]
    return {
        "kernels": kernels,
        "buffers": buffers,
        "outputs": len(outputs),
        "scratch": scratch,
        "constants": stored,
    }


def _source(mod: Any, target: Any, halves: dict[str, set[str]]) -> tuple[Any, dict[Any, Any], str]:
    """Lowered host module, device modules and the OpenCL C of every kernel of `mod`; the
    kernels each host function launches take its buffers named in `halves` as half storage
    (`_half_storage`)."""
    import tvm
    from tvm.tirx.build import codegen_build

    with tvm.transform.PassContext(opt_level=3):
        host, devices = _lower(mod, target)
        devices = {t: m for t, m in devices.items() if len(m.functions)}
        if not devices:
            raise DeployError("the schedule bound no work-items: TVM produced no OpenCL kernel")
        stored = {
            kernel: names for symbol, names in halves.items() if names for kernel in _launched(host, symbol)
        }
        if stored:
            devices = {
                t: tvm.IRModule(
                    {
                        g: _half_storage(f, stored[g.name_hint]) if g.name_hint in stored else f
                        for g, f in m.functions.items()
                    }
                )
                for t, m in devices.items()
            }
        source = "\n".join(str(codegen_build(m, t).inspect_source()) for t, m in devices.items())
    return host, devices, HALF_PREAMBLE.sub("", source) if stored else source


def compile_opencl(mod: Any, target: Any, stored: tuple[TensorType, ...]) -> OpenClProgram:
    """OpenCL C and launch plan for a scheduled IRModule (work-items bound to threads), both from
    one lowering, so the plan describes exactly the kernels in the source. `main`'s parameters
    are `stored` so in memory: one `main` computes as float32 and the plan says float16 is
    loaded and stored as half."""
    halves = {"main": _stored_half(mod["main"], stored)}
    host, devices, source = _source(mod, target, halves)
    plan = launch_plan(mod, host, devices, len(stored) - 1)
    for buffer, t in zip(plan["buffers"], stored, strict=True):
        buffer["dtype"] = t.dtype
    return OpenClProgram(source, {**plan, **_float16(plan, halves)})


def compile_opencl_graph(graph: BoundGraph, kernels: list[ScheduledKernel], target: Any) -> OpenClProgram:
    """OpenCL C of every kernel of a graph (each scheduled PrimFunc named by `ScheduledKernel.function`,
    lowered together) and one plan that launches them in order."""
    import tvm

    functions = [(*k.function(i), k) for i, k in enumerate(kernels)]
    mod = tvm.IRModule({symbol: func for symbol, func, _ in functions})
    halves = {
        symbol: _stored_half(func, [graph.types[t] for t in (*k.kernel.reads, k.kernel.writes)])
        for symbol, func, k in functions
    }
    host, devices, source = _source(mod, target, halves)
    plan = graph_plan(graph, functions, host, devices)
    return OpenClProgram(source, {**plan, **_float16(plan, halves)})


@dataclass(frozen=True)
class OpenClPlan(ArtifactKind):
    """OpenCL C kernels and the plan that launches them (GPU targets; no TVM on the device)."""

    def tvm_target(self, spec: dict[str, Any]) -> Any:
        import tvm

        return tvm.target.Target(spec, host={"kind": "llvm"})

    def compile(
        self, mod: Any, target: Target, options: BuildOptions, stored: tuple[TensorType, ...]
    ) -> OpenClProgram:
        return compile_opencl(mod, target.tvm_target(), stored)

    def compile_graph(
        self, graph: BoundGraph, kernels: list[ScheduledKernel], target: Target, options: BuildOptions
    ) -> OpenClProgram:
        return compile_opencl_graph(graph, kernels, target.tvm_target())

    def files(self, module: str) -> tuple[str, ...]:
        return (module, SOURCE_FILE, BLOB)

    def whole(self, directory: Path, module: str) -> bool:
        """kernels.cl, and constants.bin where the graph has constants, as launch.json pins them."""
        try:
            plan = json.loads((directory / module).read_text())
            pinned = [(SOURCE_FILE, plan["source_sha256"])]
            if plan.get("constants"):
                pinned.append((BLOB, plan["constants_sha256"]))
            return all(sha256_file(directory / name) == sha for name, sha in pinned)
        except (OSError, ValueError, TypeError, KeyError):
            return False

    def write(
        self, compiled: OpenClProgram, staging: Path, target: Target, constants: tuple[Constant, ...]
    ) -> Path:
        """kernels.cl, constants.bin for a graph with constants, and launch.json, which pins both by
        sha256 (the manifest pins the plan)."""
        source = staging / SOURCE_FILE
        source.write_text(compiled.source)
        plan = staging / PLAN_FILE
        body = {"source": SOURCE_FILE, "source_sha256": sha256_file(source), **compiled.plan}
        if constants:
            write_blob(constants, staging / BLOB)
            body.update(constants_file=BLOB, constants_sha256=sha256_file(staging / BLOB))
        plan.write_text(json.dumps(body, indent=2) + "\n")
        return plan


OPENCL_PLAN = OpenClPlan(
    "opencl",
    splits_for_cores=False,
    builds_unscheduled=False,
    bundles=True,
    graph_entry="function",
    symbolic_batch=False,
    machine_code=False,
    fp16_choice=True,
    bundle_host="x86_64",
)
