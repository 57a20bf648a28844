"""Compile an op for a target: TE -> PrimFunc -> schedule (the target's strategy, or an accepted
tuning record) -> the compiled form of the target's artifact kind."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from deploy.base.errors import UsageError
from deploy.base.stopping import interruptible
from deploy.compiler.fusion import Kernel, kernels
from deploy.compiler.options import KEPT_HAND, REFUSED, BuildOptions
from deploy.compiler.plan import Plan
from deploy.compiler.targets import Target
from deploy.ops.graph import BoundGraph, Constant, bind_graph
from deploy.ops.layouts import LAYOUTS, NCHW, Layout
from deploy.ops.relayout import relayout
from deploy.ops.spec import OUTPUT, BoundOp, TensorType, bind, require_static, symbols_of
from deploy.schedules import ScheduleContext, Strategy, strategy_for
from deploy.schedules.cpu_models import CPU_MODELS
from deploy.schedules.registry import HAND, Choices, computed_module, run_time_sizes
from deploy.schedules.vector_math import libm_in_vector_loops, lower_math

if TYPE_CHECKING:
    from deploy.compiler.bundle import BundleSignature


def context(
    bound: BoundOp, target: Target, options: BuildOptions, choices: Choices = HAND
) -> ScheduleContext:
    """What the target's strategy sees: the op, vector width, the device's cores (`options`),
    work-group size, and how it makes its choices (the hand's defaults unless a tuner's or a test's)."""
    return ScheduleContext(
        bound,
        target.vector_bits,
        options.build_cores(),
        target.work_group,
        choices,
        target.scalar_dtypes,
        target.predicated_vectors,
        target.prefetch_level,
        target.streaming_store_bytes,
        cpu_model=CPU_MODELS.get(options.cpu_model or ""),
    )


def strategy(bound: BoundOp, target: Target, options: BuildOptions) -> Strategy | None:
    """The target's strategy for the op (a fused group's: composed from its nodes')."""
    return strategy_for(target.schedules, context(bound, target, options))


def prim_module(bound: BoundOp, target: Target, options: BuildOptions, choices: Choices = HAND) -> Any:
    """The op as an IRModule with one PrimFunc `main(inputs..., out)`: the computation the target's
    strategy pairs with its schedule (the op's own unless the family has a variant; `choices`
    picks among the variant's structures), over the types the build computes in (`as_computed`)."""
    return _computed(bound, target, options, choices)[0]


def _computed(
    bound: BoundOp, target: Target, options: BuildOptions, choices: Choices
) -> tuple[Any, ScheduleContext, Strategy | None]:
    """`prim_module`, with the context and strategy that schedule it."""
    bound = as_computed(bound, options)
    found = strategy(bound, target, options)
    ctx = context(bound, target, options, choices)
    return computed_module(ctx, found.compute if found is not None else None), ctx, found


def as_computed(bound: BoundOp, options: BuildOptions) -> BoundOp:
    """The op as the build computes it: its float16 tensors as float32 where the build keeps
    float16 in memory only (`BuildOptions.fp16_storage`; the artifact loads and stores them as half)."""
    types = (*bound.inputs, bound.output)
    if not options.fp16_storage or all(t.dtype != "float16" for t in types):
        return bound
    if bound.op.parts() != (bound.op,):  # a fused group is widened with its graph (`compile_graph`)
        raise UsageError(
            f"kernel {bound.name}: float16 on a device without half arithmetic is computed in float32;"
            " tune the model with float32 inputs, whose records its float16 build uses"
        )
    return bind(bound.op, bound.attrs, [_wide(t) for t in bound.inputs])


def _wide(t: TensorType) -> TensorType:
    """`t` as computed under `BuildOptions.fp16_storage`: float16 as float32."""
    return TensorType(t.shape, "float32") if t.dtype == "float16" else t


def as_computed_graph(graph: BoundGraph, options: BuildOptions) -> BoundGraph:
    """The graph as the build computes it (`as_computed`): its float16 inputs and constants as
    float32."""
    if not options.fp16_storage or all(t.dtype != "float16" for t in graph.types.values()):
        return graph
    inputs = tuple((name, _wide(t)) for name, t in graph.graph.inputs)
    constants = tuple(_wide_constant(c) for c in graph.graph.constants)
    return bind_graph(replace(graph.graph, inputs=inputs, constants=constants))


def _wide_constant(constant: Constant) -> Constant:
    """`constant` as computed under `BuildOptions.fp16_storage`: float16 as float32 (its kernels read
    it as half, as the inputs)."""
    if constant.type.dtype != "float16":
        return constant
    return Constant.of(constant.name, constant.array().astype(np.float32))


def hand_schedule(
    bound: BoundOp, target: Target, options: BuildOptions, choices: Choices = HAND
) -> tuple[Any, str]:
    """The op computed and scheduled by the target's strategy (or left as is: "default"), with
    its label; `choices` other than the hand's make the strategy take other structures."""
    scheduled = hand_scheduled(bound, target, options, choices)
    return scheduled.mod, scheduled.schedule


def hand_scheduled(
    bound: BoundOp, target: Target, options: BuildOptions, choices: Choices = HAND
) -> Scheduled:
    """`hand_schedule`, with the notes the build prints: what the strategy said of its choices
    (`registry.Report`: a rule that fell through) and the libm calls left in vector loops."""
    import tvm

    mod, ctx, found = _computed(bound, target, options, choices)
    sch = tvm.s_tir.Schedule(mod)
    if found is None:
        return Scheduled(sch.mod, "default", notes=libm_notes(sch.mod, target))
    report = found.schedule(sch, ctx)
    said = report.notes if report is not None else ()
    scheduled = sch.mod
    symbol, few_rows = run_time_sizes(report)
    if symbol and symbols_of(bound.inputs) == (symbol,):
        sizes = range(1, max(few_rows, 1) + 1)
        sized = [(size, context_at(bound, {symbol: size}, target, options, choices)) for size in sizes]
        scheduled, more = branched_by_size(mod, scheduled, symbol, found, sized)
        said = tuple(dict.fromkeys((*said, *more)))
    return Scheduled(scheduled, found.label, notes=(*said, *libm_notes(scheduled, target)))


def context_at(
    bound: BoundOp, sizes: dict[str, int], target: Target, options: BuildOptions, choices: Choices
) -> ScheduleContext:
    """The schedule's context of `bound` with its symbolic dims at `sizes`."""
    at = bind(bound.op, bound.attrs, [t.at(sizes) for t in bound.inputs])
    return context(as_computed(at, options), target, options, choices)


def branched_by_size(
    computed: Any, scheduled: Any, symbol: str, found: Strategy, sized: list[tuple[int, ScheduleContext]]
) -> tuple[Any, tuple[str, ...]]:
    """`scheduled` (the strategy's schedule of `computed`, `main(inputs..., out)` with the
    symbolic dim `symbol`) as `if symbol == 1: <computed scheduled with that dim 1> elif symbol
    == 2: ... else: <it>`, a branch for each (size, its context) of `sized`: the run time picks
    the kernel by size. A dot product's single row streams b, where its tiles would pad it to
    four rows and read b's panels in place (8.7x onnxruntime's time for 1x768 @ 768x3072, 1.15x
    so); 2 to 6 rows by a b past the cache stream it too, their rows unrolled (4.8-7.7x
    onnxruntime's time in tiles, 1.24-1.71x as a loop over the rows). The tensors with that dim
    are the same memory, declared in each branch at its size (`DeclBuffer` over each parameter's
    data). With the module, the notes those schedules return."""
    import tvm
    from tvm import tirx

    func = computed["main"]
    dim = next(d for p in func.params for d in p.shape if isinstance(d, tirx.Var) and d.name == symbol)
    rows = [p for p in func.params if any(d.same_as(dim) for d in p.shape)]
    general = scheduled["main"]
    body, reports = general.body, []
    for size, ctx in reversed(sized):
        views = {
            p: tirx.decl_buffer(
                [size if d.same_as(dim) else d for d in p.shape], p.dtype, name=p.name, data=p.data
            )
            for p in rows
        }
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func.specialize(views)}))
        reports.append(found.schedule(sch, ctx))
        special = sch.mod["main"]
        declared = [
            tirx.DeclBuffer(q, data=p.data)
            for p, q in zip(func.params, special.params, strict=True)
            if any(p.same_as(r) for r in rows)
        ]
        body = tirx.IfThenElse(dim == size, tirx.SeqStmt([*declared, special.body]), body)
    notes = tuple(line for report in reversed(reports) if report is not None for line in report.notes)
    return tvm.IRModule({"main": general.with_body(body)}), notes


def libm_notes(mod: Any, target: Target) -> tuple[str, ...]:
    """The line a build prints when a machine-code target's scheduled `mod` still calls a scalar
    libm function inside a vector loop (one call per lane: the loop vectorized in name only)."""
    calls = libm_in_vector_loops(lower_math(mod["main"])) if target.artifact.machine_code else []
    return (f"scalar libm calls inside a vector loop, one per lane: {', '.join(calls)}",) if calls else ()


@dataclass
class Compiled:
    """A compiled op: the artifact kind's compiled form (a TVM executable, an OpenCL program), the
    schedule it was built with and, for a tuned schedule, the tuning record's id."""

    bound: BoundOp
    target: Target
    options: BuildOptions
    """The choices it was built with (the artifact's cores, alignment and bundle follow them)."""
    executable: Any
    schedule: str
    tuning_record: str | None = None
    tuning: str | None = None
    """Why a `--tuned` build uses the hand schedule: KEPT_HAND (tuning found nothing faster) or
    REFUSED (the accepted record failed its checks)."""
    notes: tuple[str, ...] = ()
    """What the build says of its schedule, a line each (`Scheduled.notes`)."""

    @property
    def item(self) -> BoundOp:
        """What was compiled."""
        return self.bound

    @property
    def constants(self) -> tuple[()]:
        return self.bound.constants

    def describe(self) -> dict[str, Any]:
        """The manifest's fields that say what was compiled."""
        bound = self.bound
        inputs = zip(bound.op.inputs, bound.inputs, strict=True)
        return {
            "op": bound.op.name,
            "attrs": bound.key()["attrs"],
            "inputs": [{"name": spec.name, **t.to_json()} for spec, t in inputs],
            "outputs": [{"name": OUTPUT, **bound.output.to_json()}],
            "schedule": self.schedule,
            "tuning_record": self.tuning_record,
            "tuning": self.tuning,
            "notes": list(self.notes) or None,
        }

    def bundle_signature(self) -> BundleSignature:
        """What a C bundle of the op calls: `main(inputs..., out)`, no arena."""
        inputs = [(spec.name, t) for spec, t in zip(self.bound.op.inputs, self.bound.inputs, strict=True)]
        return self.bound.op.name, inputs, [(OUTPUT, self.bound.output)], None


@dataclass(frozen=True)
class Scheduled:
    """An op's IRModule scheduled for a target: by the record tuning accepted ("tuned", with the
    record's id) or by the target's strategy (its label), and for a `--tuned` build on the hand
    schedule, why (KEPT_HAND or REFUSED)."""

    mod: Any
    schedule: str
    tuning_record: str | None = None
    tuning: str | None = None
    notes: tuple[str, ...] = ()
    """What the build says of the schedule, a line each: a rule of the strategy that fell
    through, libm calls left in vector loops."""


def schedule_op(bound: BoundOp, target: Target, options: BuildOptions) -> Scheduled:
    """The record tuning accepted for the target (`options.tuned`), else the target's strategy."""
    if options.tuned is not None:
        tuned = options.tuned.schedule(bound, target, options)
        if tuned is not None:
            return Scheduled(tuned[0], "tuned", tuned[1], notes=libm_notes(tuned[0], target))
    scheduled = hand_scheduled(bound, target, options)
    verdict = options.tuned.verdict(bound, target) if options.tuned is not None else None
    if verdict is None:
        return scheduled
    return replace(scheduled, tuning=KEPT_HAND if verdict == KEPT_HAND else REFUSED)


def check_symbolic(inputs: tuple[TensorType, ...], target: Target) -> None:
    """A symbolic batch only for a target whose artifact runs every size from one module."""
    if not target.artifact.symbolic_batch:
        why = f"its {target.artifact.name} kernels' launch sizes are fixed when built"
        require_static(inputs, f"target {target.name}", why)


def compile_op(bound: BoundOp, target: Target, options: BuildOptions) -> Compiled:
    """Schedule (`schedule_op`) and compile: a TVM executable, or for OpenCL targets the source and
    launch plan."""
    check_symbolic(bound.inputs, target)
    scheduled = schedule_op(bound, target, options)
    compiled = compile_scheduled(
        bound, target, options, scheduled.mod, scheduled.schedule, scheduled.tuning_record
    )
    compiled.tuning = scheduled.tuning
    compiled.notes = scheduled.notes
    return compiled


def compile_scheduled(
    bound: BoundOp, target: Target, options: BuildOptions, mod: Any, name: str, record: str | None = None
) -> Compiled:
    """Compile an already scheduled IRModule of `bound` for `target` (its artifact kind's way)."""
    stored = (*bound.inputs, bound.output)
    executable = interruptible(lambda: target.artifact.compile(mod, target, options, stored))
    return Compiled(bound, target, options, executable, name, record)


@dataclass(frozen=True)
class ScheduledKernel:
    """One kernel of a graph (`fusion.Kernel`) with its scheduled IRModule."""

    kernel: Kernel
    scheduled: Scheduled

    def function(self, index: int) -> tuple[str, Any]:
        """(name, scheduled PrimFunc named so) of the kernel at `index` of a graph's kernels: the
        name is unique among them, and OpenCL kernels and VM functions are called by it."""
        symbol = f"k{index}_{self.kernel.name}"
        return symbol, self.scheduled.mod["main"].with_attr("global_symbol", symbol)

    def describe(self) -> dict[str, Any]:
        """What the manifest lists per kernel."""
        entry = {
            "name": self.kernel.name,
            "nodes": list(self.kernel.nodes),
            "schedule": self.scheduled.schedule,
        }
        if self.kernel.layouts:
            entry["layout"] = ", ".join(self.kernel.layouts)
        if self.scheduled.tuning_record:
            entry["tuning_record"] = self.scheduled.tuning_record
        if self.scheduled.tuning:
            entry["tuning"] = self.scheduled.tuning
        return entry


@dataclass
class CompiledGraph:
    """A compiled graph: its kernels (fused by `fusion.kernels`, each scheduled like an op) in the
    artifact kind's compiled form of a graph (a CPU plan: `plan.py`; an OpenCL plan)."""

    graph: BoundGraph
    """As laid out (`layout`): its conversions among its nodes."""
    target: Target
    options: BuildOptions
    """The choices it was built with (the artifact's cores, alignment and bundle follow them)."""
    executable: Any
    kernels: list[ScheduledKernel]
    layout: str
    """The layout the layout pass moved its pooling to (`LaidOut.layout`)."""
    plan: Plan | None = None
    """The arena of the tensors between its kernels, where its entry takes one (`plan.py`)."""

    @property
    def schedule(self) -> str:
        """The kernels' schedules in the order first used, each once with how many kernels use it
        when more than one does: `cpu/max_pool2d + cpu/generic (24 kernels)`, not 25 labels; `no
        kernel` for a graph whose output is an input (an ONNX pass-through)."""
        counts = Counter(k.scheduled.schedule for k in self.kernels)
        labels = (label if n == 1 else f"{label} ({n} kernels)" for label, n in counts.items())
        return " + ".join(labels) or "no kernel"

    @property
    def notes(self) -> tuple[str, ...]:
        """Its kernels' notes (`Scheduled.notes`), each line naming its kernel."""
        return tuple(f"kernel {k.kernel.name}: {note}" for k in self.kernels for note in k.scheduled.notes)

    @property
    def item(self) -> BoundGraph:
        """What was compiled."""
        return self.graph

    @property
    def constants(self) -> tuple[Constant, ...]:
        """Its constants as the model gives them, which the artifact stores (float16 too: where the
        kernels compute it as float32, they load it as half, as the graph's inputs)."""
        return self.graph.constants

    def describe(self) -> dict[str, Any]:
        """The manifest's fields that say what was compiled: the graph as laid out (`--layout`,
        its conversions among its nodes), its nodes and kernels."""
        graph = self.graph
        return {
            "op": graph.name,
            "attrs": {},
            "inputs": [{"name": name, **t.to_json()} for name, t in graph.graph.inputs],
            "outputs": [{"name": name, **graph.types[name].to_json()} for name in graph.graph.outputs],
            "constants": [c.to_json() for c in graph.graph.constants] or None,
            "schedule": self.schedule,
            "notes": list(self.notes) or None,
            "entry": self.target.artifact.graph_entry,
            "arena": self.plan.to_json() if self.plan is not None else None,
            "graph": {
                "layout": self.layout,
                "nodes": graph.key()["nodes"],
                "outputs": list(graph.graph.outputs),
                "kernels": [k.describe() for k in self.kernels],
            },
        }

    def bundle_signature(self) -> BundleSignature:
        """What a C bundle of the graph calls: its plan's `main(inputs..., outputs..., arena)`."""
        outputs = [(name, self.graph.types[name]) for name in self.graph.graph.outputs]
        return self.graph.name, list(self.graph.graph.inputs), outputs, self.plan


@dataclass(frozen=True)
class LaidOut:
    """A graph as the target runs it: what a build compiles, its cache key holds and a tuner tunes."""

    graph: BoundGraph
    """With its pooling in `layout` and the conversions that needs (`relayout`)."""
    layout: Layout
    """The layout its pooling moved to: `--layout`, else the one tuning measured fastest for the
    graph (`--tuned`); NCHW when nothing moved."""
    kernels: list[Kernel]
    """Its kernels as the build computes them (`as_computed_graph`, `fusion.kernels`)."""


def lay_out(graph: BoundGraph, target: Target, options: BuildOptions) -> LaidOut:
    """`graph` laid out for `target` as `options` say and fused into kernels (the tuned verdict
    read once)."""
    tuned = options.tuned
    name = options.layout or (tuned.layout(graph, target) if tuned is not None else None)
    laid = relayout(graph, LAYOUTS[name] if name else NCHW)
    layout = LAYOUTS[name] if name and laid is not graph else NCHW
    return LaidOut(laid, layout, kernels(as_computed_graph(laid, options)))


def compile_graph(
    graph: BoundGraph, target: Target, options: BuildOptions, laid: LaidOut | None = None
) -> CompiledGraph:
    """Lay the graph out for the target (unless `laid` is `lay_out`'s result already), fuse it
    into kernels, schedule each (`schedule_op`: tuned records apply per fused kernel) and compile
    them together in the artifact kind's way."""
    check_symbolic(graph.inputs, target)
    laid = laid or lay_out(graph, target, options)
    scheduled = [ScheduledKernel(k, schedule_op(k.bound, target, options)) for k in laid.kernels]
    executable = interruptible(lambda: target.artifact.compile_graph(laid.graph, scheduled, target, options))
    plan = target.artifact.graph_plan(laid.graph, scheduled)
    return CompiledGraph(laid.graph, target, options, executable, scheduled, laid.layout.name, plan)
