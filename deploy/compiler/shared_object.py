"""Shared objects (`module.so`): CPU code through TVM's default TIR pipeline plus strided vector
loads made contiguous and the schedules' software prefetches, linked with the target's (cross)
compiler.

TVM turns a vector load with stride 2 (a stride-2 pooling window along W) into one scalar load
and insert per lane. `deinterleave_stride2` loads the 2*lanes elements those lanes span as two
contiguous vectors and picks every other lane with a shuffle, which LLVM lowers to vector loads
plus shuffles (`vshufps`/`vpermpd` on x86, `uzp` on AArch64). `software_prefetch` lowers the
loops a schedule annotated with `deploy.schedules.cpu.PREFETCH` (TVM has no prefetch step for them).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.base.errors import NO_ROOM, DeployError, clipped, printable
from deploy.base.forked import FORK_LOCK, ChildDied, in_child
from deploy.compiler.artifacts import ArtifactKind
from deploy.compiler.constants import constants_object
from deploy.compiler.fusion import Call
from deploy.compiler.plan import Plan, plan_arena, plan_module
from deploy.schedules.cpu import CACHE_LINE, PREFETCH

if TYPE_CHECKING:
    from deploy.compiler.compile import ScheduledKernel
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import Target
    from deploy.ops.graph import BoundGraph, Constant
    from deploy.ops.spec import TensorType

MODULE_FILE = "module.so"
PIPELINE = "deploy-cpu"
CONFIG = {"tirx.disable_cse_tir": True}
"""TVM's common-subexpression pass would hide a load's index behind a variable whose parity the
rewrite cannot see; it runs after the rewrite instead (see `_pipeline`)."""


def _stride2_to_shuffle(load: Any, analyzer: Any) -> Any:
    """`a[ramp(b, 2, n)]` -> `shuffle(a[ramp(b', 1, n)], a[ramp(b' + n, 1, n)])` with b' = b
    rounded down to even. Reads the aligned pairs holding the wanted elements, so it stays inside
    the buffer when the buffer's length is even (for a symbolic batch: a multiple of an even
    size); other loads are returned unchanged."""
    from tvm import tirx

    (index,) = load.indices if len(load.indices) == 1 else (None,)
    if not isinstance(index, tirx.Ramp):
        return load
    stride, lanes, extent = index.stride, index.lanes, load.source.shape
    if not (isinstance(stride, tirx.IntImm) and int(stride) == 2 and isinstance(lanes, tirx.IntImm)):
        return load
    size = analyzer.modular_set(extent[0]) if len(extent) == 1 else None  # N * plane: even if the plane is
    if size is None or size.coeff % 2 or size.base % 2:
        return load
    parity = analyzer.modular_set(index.base)
    if parity.coeff % 2:
        return load
    odd, n = parity.base % 2, int(lanes)
    start = index.base - odd
    low = tirx.BufferLoad(load.source, [tirx.Ramp(start, 1, n)])
    high = tirx.BufferLoad(load.source, [tirx.Ramp(start + n, 1, n)])
    return tirx.Shuffle([low, high], [tirx.IntImm("int32", odd + 2 * lane) for lane in range(n)])


def deinterleave_stride2() -> Any:
    """A PrimFunc pass applying `_stride2_to_shuffle` to every load."""
    import tvm
    import tvm.sym.analyzer
    import tvm_ffi

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="DeinterleaveStride2")
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        analyzer = tvm.sym.analyzer.Analyzer()
        return tvm_ffi.structural_map(
            func, [(tvm.ir.TensorLoad, lambda load: _stride2_to_shuffle(load, analyzer))]
        )

    return rewrite


WINDOW_STEPS = 4
"""Most steps apart two loads of one stream may be for one prefetch to serve both (a pooling
window's taps along the loop: 1 or 2 steps)."""


def _line_starts(loop: Any, local: list[Any]) -> list[tuple[Any, Any]]:
    """(buffer, flat index) where the loads in the body of `loop` of a function's inputs start (a
    vector's first element), one per stream: an index a constant less than a line from one kept
    is left out, and so is one a few whole steps of the loop from it (a sliding window's next
    tap: the kept one's prefetch reaches it that many steps later). So are buffers in `local`
    (stages the function allocates, in cache already), an index with a variable bound inside
    the body or a load in it (it would be read outside its guard), and what is only addressed
    (an inner loop's own prefetches)."""
    import tvm
    import tvm.sym.analyzer
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    analyzer = tvm.sym.analyzer.Analyzer()
    body, var = loop.body, loop.loop_var
    outside = undefined_vars(body, [])
    address_of = tvm.ir.Op.get("tirx.address_of")
    addressed: list[Any] = []
    starts: list[tuple[Any, Any]] = []

    def note_addressed(call: Any) -> Any:
        if call.op.same_as(address_of):
            addressed.append(call.args[0])
        return call

    def plain(start: Any) -> bool:
        """Only variables from outside `body`, no loads."""
        loads: list[Any] = []
        tvm_ffi.structural_map(start, [(tvm.ir.TensorLoad, lambda inner: loads.append(inner) or inner)])
        free = undefined_vars(start, [])
        return not loads and all(any(v.same_as(o) for o in outside) for v in free)

    steps = loop.extent if isinstance(loop.extent, tirx.IntImm) else None

    def near(start: Any, other: Any, bits: int) -> bool:
        apart = analyzer.simplify(start - other)
        if not isinstance(apart, tirx.IntImm):
            return False
        if abs(int(apart)) * bits < CACHE_LINE * 8:
            return True
        advanced = tvm_ffi.structural_map(start, [(tirx.Var, lambda v: v + 1 if v.same_as(var) else v)])
        step = analyzer.simplify(advanced - start)
        if not isinstance(step, tirx.IntImm) or int(step) <= 0 or steps is None:
            return False
        behind, rest = divmod(abs(int(apart)), int(step))
        return rest == 0 and behind < min(WINDOW_STEPS, int(steps))

    def same_line(buffer: Any, start: Any) -> bool:
        return any(kept.same_as(buffer) and near(start, other, buffer.dtype.bits) for kept, other in starts)

    def load(node: Any) -> Any:
        index = node.indices[0] if len(node.indices) == 1 else None
        start = index.base if isinstance(index, tirx.Ramp) else index
        if (
            start is not None
            and start.ty.dtype.lanes == 1
            and not any(node.same_as(a) for a in addressed)
            and not any(node.source.same_as(b) for b in local)
            and plain(start)
            and not same_line(node.source, start)
        ):
            starts.append((node.source, start))
        return node

    tvm_ffi.structural_map(body, [(tvm.ir.Call, note_addressed)])
    tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, load)])
    return starts


def _prefetched(loop: Any, local: list[Any]) -> Any:
    """`loop` (annotated PREFETCH: bytes ahead, 0: none) with its body led by one `llvm.prefetch`
    (a read, kept in every cache level) of that many bytes past each of `_line_starts`. Near the
    end of a buffer the address lies past it: a prefetch never faults (x86 `prefetcht0`, AArch64
    `prfm`), and LLVM's takes any address (its pointer is not `noundef`)."""
    from tvm import tirx

    ahead = int(loop.annotations[PREFETCH])
    fetches = []
    for buffer, start in _line_starts(loop, local) if ahead > 0 else []:
        elements = max(1, ahead * 8 // buffer.dtype.bits)
        address = tirx.address_of(tirx.BufferLoad(buffer, [start + elements]))
        read, keep, data = (tirx.const(v, "int32") for v in (0, 3, 1))
        fetches.append(
            tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch", address, read, keep, data))
        )
    body = tirx.SeqStmt([*fetches, loop.body]) if fetches else loop.body
    annotations = {k: v for k, v in loop.annotations.items() if k != PREFETCH}
    return tirx.For(
        loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations, loop.step
    )


def software_prefetch() -> Any:
    """A PrimFunc pass applying `_prefetched` to every loop annotated PREFETCH. It runs after
    the loops are vectorized (a step is then a vector or more) and before common subexpressions
    are bound (they would hide the indices behind variables bound inside the body)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="SoftwarePrefetch")
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        local: list[Any] = []
        tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, lambda a: local.append(a.buffer) or a)])

        def lower(loop: Any) -> Any:
            return _prefetched(loop, local) if PREFETCH in loop.annotations else loop

        return tvm_ffi.structural_map(func, [(tirx.For, lower)])

    return rewrite


CPU_DEVICE = 1
"""DLPack's kDLCPU: the device type a graph's kernels say they run on."""


def subroutines_on_cpu() -> Any:
    """A PrimFunc pass saying that each private subroutine (a graph's kernel, `plan_module`)
    runs on the CPU, as MakePackedAPI says of an entry: a buffer of a kernel too big for the
    stack is allocated through TVMBackendAllocWorkspace, which needs the device. It runs once the
    buffers are placed: the default pipeline puts a kernel's own buffers at the top of its body,
    outside anything the body was wrapped in before (argmax's slices of 2x64x56x56 failed to
    lower with 'Unknown device id in current IR')."""
    import tvm
    from tvm import tirx

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="SubroutinesOnCpu")
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        if func.attrs is not None and "global_symbol" in func.attrs:
            return func
        body = func.body
        for key, value in (("device_type", CPU_DEVICE), ("device_id", 0)):
            body = tirx.AttrStmt(tvm.ir.StringImm("default"), key, tirx.const(value, "int32"), body)
        return func.with_body(body)

    return rewrite


def _pipeline(**kwargs: Any) -> tuple[Any, Any, Any]:
    import tvm
    from tvm.tirx import compilation_pipeline

    default, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("default", **kwargs)
    passes = [
        default,
        deinterleave_stride2(),
        software_prefetch(),
        tvm.tirx.transform.CommonSubexprElim(),
        subroutines_on_cpu(),
    ]
    return tvm.transform.Sequential(passes, name="deploy_cpu"), finalize_host, finalize_device


def compile_cpu(mod: Any, target: Any) -> Any:
    """`tvm.compile` at opt level 3 through the deploy-cpu pipeline."""
    import tvm
    from tvm.tirx import compilation_pipeline

    compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline)
    with FORK_LOCK, tvm.transform.PassContext(opt_level=3, config=CONFIG):  # no fork mid-LLVM
        return tvm.compile(mod, target=target, tir_pipeline=PIPELINE)


CAUSES = (": error:", "cannot find", "undefined reference", "No such file", *NO_ROOM)
"""What marks the line of a compiler's or linker's output that says why it failed."""


def compiler(target: Target) -> str:
    """The compiler that links for `target`: this host's, which TVM finds as $CXX, $CC or the
    first of g++, gcc, clang++ ... on PATH, or the target's cross compiler; checked here, since
    TVM would pass on a None or a missing file and fail with a TypeError or a FileNotFoundError."""
    from tvm.support import cc

    if target.cross_compiler is None:
        host = cc.get_cc()
        if host is None or shutil.which(host) is None:
            said = f"CXX or CC is {host!r}, not a program" if host else "no g++, gcc or clang++ on PATH"
            raise DeployError(f"no C++ compiler to link for target {target.name}: {said} (Debian: g++)")
        return host
    if shutil.which(target.cross_compiler) is None:
        raise DeployError(
            f"cross compiler {target.cross_compiler} for target {target.name} not found:"
            f" install the Debian package {target.cross_package}"
        )
    return target.cross_compiler


def linker(target: Target) -> Any:
    """The `fcompile` that links for `target` (None: this host's compiler, as TVM finds it)."""
    from tvm.support import cc

    program = compiler(target)
    return None if target.cross_compiler is None else cc.cross_compiler(program)


def emitting(action: Callable[[], None], what: str, target: Target) -> None:
    """`action()`, which has LLVM emit object code (`export_library`), in a child process: LLVM
    aborts or exits the process on what it cannot select (`in_child`), which is then one line
    naming `what` and `target`. A bundle's `write_to_file` of the same module runs in-process: the
    module's export always precedes it and emits the same code, so it has failed already."""
    try:
        in_child(action)
    except ChildDied as exc:
        said = next((line for line in exc.said.splitlines() if "LLVM ERROR:" in line), None)
        why = f"LLVM aborted: {said.split('LLVM ERROR:', 1)[1].strip()}" if said else f"the compiler {exc}"
        raise DeployError(
            f"compiling {what} for target {target.name}: {printable(clipped(why, 200))}"
        ) from None


def export_module(executable: Any, path: Path, target: Target, addons: tuple[Path, ...] = ()) -> None:
    """Link a compiled module, and the objects `addons`, into the shared object `path` with the
    target's linker."""
    fcompile = linker(target)
    extra = {"addons": [str(a) for a in addons]} if addons else {}
    if fcompile is not None:
        extra["fcompile"] = fcompile
    try:
        emitting(lambda: executable.export_library(str(path), **extra), path.name, target)
    except RuntimeError as exc:  # the compiler's output follows TVM's first line: name its error
        text = str(exc)
        if not text.startswith("Compilation error"):
            raise
        lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        lines = [line for line in lines if not line.startswith("Command line:")]
        said = next(  # the cause, not the driver's `collect2: error: ld returned 1 exit status`
            (line for line in lines if any(mark in line for mark in CAUSES)),
            next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no output"),
        )
        raise DeployError(f"linking {path.name} for target {target.name} failed: {printable(said)}") from None


def _calls(kernels: list[ScheduledKernel], alignment: int) -> list[Call]:
    """The kernels as a plan calls them: (unique name, PrimFunc, tensors read, tensor written),
    each assuming `alignment` bytes of its buffers."""
    calls = []
    for index, k in enumerate(kernels):
        name, func = k.function(index)
        calls.append((name, aligned(func, alignment), k.kernel.reads, k.kernel.writes))
    return calls


def aligned(func: Any, alignment: int) -> Any:
    """`func` with its parameter buffers assumed `alignment`-byte aligned: TVM's kernels assume
    64 (the loads are `vmovaps`, an unaligned buffer a crash); less makes them unaligned loads."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    if all(p.data_alignment == alignment for p in func.params):
        return func
    new = {
        p: tirx.decl_buffer(
            p.shape,
            p.dtype,
            p.name,
            elem_offset=p.elem_offset,
            data_alignment=alignment,
            offset_factor=p.offset_factor,
            strides=p.strides,
        )
        for p in func.params
    }

    def swap(var: Any) -> Any:
        return next((n for old, n in new.items() if var.same_as(old)), var)

    body = tvm_ffi.structural_map(func.body, [(tvm.ir.expr.Var, swap)])
    result = tirx.PrimFunc(list(new.values()), body, ret_type=func.ret_type)
    return result.with_attrs(dict(func.attrs)) if func.attrs else result


@dataclass(frozen=True)
class SharedObject(ArtifactKind):
    """A TVM module as a shared object a TVM runtime loads (CPU targets); a graph's is its plan
    (`plan.py`): its kernels and the `main` that runs them on an arena."""

    def compile(self, mod: Any, target: Target, options: BuildOptions, stored: tuple[TensorType, ...]) -> Any:
        import tvm

        functions = {gvar.name_hint: aligned(func, options.alignment) for gvar, func in mod.functions.items()}
        return compile_cpu(tvm.IRModule(functions), target.tvm_target())

    def compile_graph(
        self, graph: BoundGraph, kernels: list[ScheduledKernel], target: Target, options: BuildOptions
    ) -> Any:
        plan = plan_module(graph, _calls(kernels, options.alignment), options.alignment)
        return compile_cpu(plan, target.tvm_target())

    def graph_plan(self, graph: BoundGraph, kernels: list[ScheduledKernel]) -> Plan:
        return plan_arena(graph, [(k.kernel.reads, k.kernel.writes) for k in kernels])

    def write(self, compiled: Any, staging: Path, target: Target, constants: tuple[Constant, ...]) -> Path:
        module = staging / MODULE_FILE
        if not constants:
            export_module(compiled, module, target)
            return module
        work = staging / ".constants"
        work.mkdir()
        export_module(compiled, module, target, (constants_object(constants, compiler(target), work),))
        shutil.rmtree(work)
        return module


SHARED_OBJECT = SharedObject(
    "shared-object",
    splits_for_cores=True,
    builds_unscheduled=True,
    bundles=True,
    graph_entry="plan",
    symbolic_batch=True,
    machine_code=True,
)
