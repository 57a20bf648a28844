"""Shared objects (`module.so`), the artifact kind of CPU targets: a module compiled through the
deploy-cpu TIR pipeline (`tir_passes.py`), its buffers assumed aligned as the target says, and
linked with the target's (cross) compiler.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.base.errors import NO_ROOM, DeployError, clipped, printable
from deploy.base.forked import ChildDied, in_child
from deploy.compiler.artifacts import ArtifactKind
from deploy.compiler.constants import constants_object
from deploy.compiler.fusion import Call
from deploy.compiler.plan import Plan, plan_arena, plan_module
from deploy.compiler.streaming import streamed_name, streams, with_streaming_stores
from deploy.compiler.tir_passes import compile_cpu

if TYPE_CHECKING:
    from deploy.compiler.compile import ScheduledKernel
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import Target
    from deploy.ops.graph import BoundGraph, Constant
    from deploy.ops.spec import TensorType

MODULE_FILE = "module.so"


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


def streaming_from(target: Target, t: TensorType) -> bool:
    """Whether an output of type `t` that no later kernel reads is written with streaming stores
    on `target` (`streaming.py`): at least `streaming_store_bytes` (at a symbolic batch of 1)."""
    limit = target.streaming_store_bytes
    return limit is not None and t.nbytes() >= limit


def _calls(graph: BoundGraph, kernels: list[ScheduledKernel], target: Target, alignment: int) -> list[Call]:
    """The kernels as a plan calls them: (unique name, PrimFunc, tensors read, tensor written),
    each assuming `alignment` bytes of its buffers; a kernel writing a large output of the graph
    that no later kernel reads streams its stores (`streaming_from`)."""
    calls = []
    last_read = {t: index for index, k in enumerate(kernels) for t in k.kernel.reads}
    for index, k in enumerate(kernels):
        name, func = k.function(index)
        written = k.kernel.writes
        streamed = (
            written in graph.graph.outputs
            and last_read.get(written, -1) <= index
            and streaming_from(target, graph.types[written])
        )
        output = {len(k.kernel.reads)} if streamed else set()
        calls.append((name, aligned(func, alignment, output), k.kernel.reads, written))
    return calls


def aligned(func: Any, alignment: int, streamed: set[int] | None = None) -> Any:
    """`func` with its parameter buffers assumed `alignment`-byte aligned: TVM's kernels assume
    ALIGNMENT (abi.h; the loads are `vmovaps`, an unaligned buffer a crash); less makes them
    unaligned loads. The buffers of the parameters at the indices `streamed` are named to
    stream their stores (`streaming.py`), unless a buffer's name already holds the mark."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    names = [p.name for p in func.params]
    streamed = streamed if streamed and streams(names) else set()
    if all(p.data_alignment == alignment for p in func.params) and not streamed:
        return func
    new = {
        p: tirx.decl_buffer(
            p.shape,
            p.dtype,
            streamed_name(p.name) if index in streamed else p.name,
            elem_offset=p.elem_offset,
            data_alignment=alignment,
            offset_factor=p.offset_factor,
            strides=p.strides,
        )
        for index, p in enumerate(func.params)
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

        output = {len(stored) - 1} if streaming_from(target, stored[-1]) else set()
        functions = {
            gvar.name_hint: aligned(func, options.alignment, output if gvar.name_hint == "main" else None)
            for gvar, func in mod.functions.items()
        }
        executable = compile_cpu(tvm.IRModule(functions), target.tvm_target(), target.two_vector_shuffles)
        return with_streaming_stores(executable) if output else executable  # IR read only then

    def compile_graph(
        self, graph: BoundGraph, kernels: list[ScheduledKernel], target: Target, options: BuildOptions
    ) -> Any:
        calls = _calls(graph, kernels, target, options.alignment)
        planned = plan_module(graph, calls, options.alignment)
        executable = compile_cpu(planned, target.tvm_target(), target.two_vector_shuffles)
        marked = any(not streams([p.name for p in func.params]) for _, func, _, _ in calls)
        return with_streaming_stores(executable) if marked else executable  # IR read only then

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
