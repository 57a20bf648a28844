"""The schedule registry: (family, op name) -> a strategy: the function that schedules that op's
PrimFunc, paired with the computation it schedules (the op's own, or a variant of it that the
family's hardware runs better, as TVM's strategy tables pair compute and schedule).

A target lists its families in lookup order (x86: "x86", then "cpu"); an op without a hand
schedule in any of them gets the family's generic schedule, registered under op name "*".

A schedule makes its choices (split factors, unroll depth, which structure) through
`ctx.choices`, and so may a family's computation (which structure): the hand schedule takes each
default (`Choices`), a tuner's search space samples them (`deploy/schedules/space.py`) and enumerates
every structure (`every_structure`), so every strategy is also the search space `deploy tune`
explores, with the hand schedule as one point of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from deploy.ops.spec import BoundOp
from deploy.schedules.cpu_models import CpuModel

GENERIC = "*"
T = TypeVar("T")
R = TypeVar("R")


class Choices:
    """The choices a schedule makes, each with the value the hand schedule takes. This class
    takes the defaults; `deploy.schedules.space.SampledChoices` samples them for a tuner."""

    def split(self, sch: Any, loop: Any, default: int, most: int) -> tuple[Any, Any | None]:
        """`loop` split into (outer, inner) where the inner extent divides the loop's: `default`
        iterations here (no split when 1: (loop, None)), up to `most` in a search."""
        if default == 1:
            return loop, None
        outer, inner = sch.split(loop, factors=[None, default])
        return outer, inner

    def unroll(self, sch: Any, loop: Any, default: int) -> None:
        """Let lowering unroll the loops under `loop`, the outermost loop of the function's
        blocks, up to `default` steps (0: none here)."""
        if default:
            sch.annotate(loop, "pragma_auto_unroll_max_step", default)
            sch.annotate(loop, "pragma_unroll_explicit", 1)

    def annotate(self, sch: Any, loops: list[Any], key: str, default: int, options: Sequence[int]) -> None:
        """Annotate each of `loops` with `key`: `default` here, one of `options` in a search (a
        value the lowering reads, so one design space holds every option)."""
        for loop in loops:
            sch.annotate(loop, key, default)

    def pick(self, name: str, options: Sequence[T], default: T) -> T:
        """A choice the schedule's structure depends on (Python branches on it): `default` here;
        in a search every option is tried (a design space of its own; for a pick the
        computation makes, a MetaSchedule task of its own)."""
        return default


HAND = Choices()


class Picked(Choices):
    """The hand's choices except the structural picks named in `picks`; every pick made is
    recorded in `seen` as (name, options, value taken), so a caller can enumerate the others."""

    def __init__(self, picks: dict[str, Any] | None = None) -> None:
        self.picks = dict(picks or {})
        self.seen: list[tuple[str, tuple[Any, ...], Any]] = []

    def pick(self, name: str, options: Sequence[T], default: T) -> T:
        taken = self.picks.get(name, default)
        if not any(name == seen for seen, _, _ in self.seen):
            self.seen.append((name, tuple(options), taken))
        return taken


def every_structure(
    run: Callable[[dict[str, Any]], tuple[Picked, R]], most: int = 64
) -> list[tuple[dict[str, Any], R]]:
    """`run(picks)` once per combination of the structural picks it makes (at most `most`), the
    defaults first; `run` returns the Picked choices it made them with, and its result. A pick
    made only under some earlier one (a stage's placement, when the stage exists) is enumerated
    only there. Returns (every pick taken, result) per run."""
    done: list[tuple[dict[str, Any], R]] = []
    todo: list[dict[str, Any]] = [{}]
    while todo and len(done) < most:
        picks = todo.pop(0)
        choices, result = run(picks)
        done.append(({name: taken for name, _, taken in choices.seen}, result))
        for i, (name, options, taken) in enumerate(choices.seen):
            if name in picks:
                continue
            before = {earlier: value for earlier, _, value in choices.seen[:i]}
            todo += [{**before, name: option} for option in options if option != taken]
    return done


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule may depend on: the bound op, vector bits, the core count and, for GPU
    targets, the work-items per work-group."""

    bound: BoundOp
    vector_bits: int
    cores: int
    """Threads the device runs parallel loops on (the device's, not the build host's)."""
    threads: int = 64
    choices: Choices = field(default=HAND, compare=False)
    """How choices are made: the hand schedule's defaults, or sampled by a search space."""
    scalar_dtypes: tuple[str, ...] = ()
    """Dtypes the target's vector unit lacks, whose loops stay scalar (`Target.scalar_dtypes`)."""
    predicated_vectors: bool = True
    """TVM builds a vector with some lanes masked off for the target (`Target.predicated_vectors`)."""
    prefetch_level: int = 1
    """The cache level software prefetches fill (`Target.prefetch_level`)."""
    streaming_store_bytes: int | None = None
    """An output of at least this many bytes is written with streaming stores
    (`Target.streaming_store_bytes`; None: the target has none)."""
    fused: bool = False
    """The function is a fused group's (`deploy/schedules/fused.py`), its anchor's schedule applied
    after the group's producers were inlined where they could be: the stages left must stay."""
    cpu_model: CpuModel | None = None
    """The device's CPU where its hand defaults differ from those measured on Intel
    (`deploy/schedules/cpu_models.py`); None: those."""

    def lanes(self, dtype: str) -> int:
        if dtype in self.scalar_dtypes:
            return 1
        bits = int("".join(ch for ch in dtype if ch.isdigit()) or 8)
        return max(1, self.vector_bits // bits)


class Report(Protocol):
    """What a schedule may return besides scheduling in place: the lines the build prints once
    about its choices (a rule that did not fit and why). It may also name a symbolic dim whose
    size 1 at run time takes a kernel of its own (`at_one`, a str: the build schedules the
    function again with that dim 1 and branches on it), and so does each size up to `few_rows`
    (an int, 0: none past 1): optional attributes (`run_time_sizes`), which a user's schedule
    need not have."""

    @property
    def notes(self) -> tuple[str, ...]: ...


def run_time_sizes(report: Report | None) -> tuple[str, int]:
    """(`at_one`, `few_rows`) of a schedule's `report`: ("", 0) where it names none."""
    return str(getattr(report, "at_one", "") or ""), int(getattr(report, "few_rows", 0) or 0)


ScheduleFn = Callable[[Any, ScheduleContext], Report | None]
"""Schedules `sch` (a tvm.s_tir.Schedule of the op's PrimFunc) in place; what it says of its
choices, if anything, it returns (`Report`), for the build to record."""
ComputeFn = Callable[..., Any]
"""compute(ctx, *placeholders) -> the output te.Tensor: a family's variant of `ctx.bound`'s op, a
named function that calls the op's computation with the building blocks it takes as arguments
(`deploy.ops.library.pooling.max_pool_compute`'s window max) or computes it in another form
(`deploy.ops.library.argmax_compute`), its structural choices made through `ctx.choices`."""
S = TypeVar("S", bound=ScheduleFn)


@dataclass(frozen=True)
class Strategy:
    """What a target family builds for an op: `schedule` applied to `compute`'s PrimFunc (None:
    the op's own computation). `label` names it in manifests and `deploy ops`."""

    label: str
    schedule: ScheduleFn
    compute: ComputeFn | None = None


def computed_module(ctx: ScheduleContext, compute: ComputeFn | None) -> Any:
    """`ctx.bound` as an IRModule with one PrimFunc `main(inputs..., out)`, computed by `compute`
    (a family's variant; None: the op's own computation)."""
    import tvm
    from tvm import te

    bound = ctx.bound
    placeholders = [
        te.placeholder(t.shape, t.dtype, name=spec.name)
        for spec, t in zip(bound.op.inputs, bound.inputs, strict=True)
    ]
    if compute is not None:
        out = bound.computed(compute(ctx, *placeholders))
    else:
        out = bound.computed(bound.op.compute(bound.attrs, bound.output, *placeholders))
    return tvm.IRModule({"main": te.create_prim_func([*placeholders, out])})


_STRATEGIES: dict[tuple[str, str], tuple[ScheduleFn, ComputeFn | None]] = {}


def register_schedule(
    family: str, op_name: str = GENERIC, compute: ComputeFn | None = None
) -> Callable[[S], S]:
    """Register a schedule for (family, op), with the compute variant it schedules if any."""

    def add(fn: S) -> S:
        _STRATEGIES[(family, op_name)] = (fn, compute)
        return fn

    return add


def strategy_modules() -> set[str]:
    """The modules that define a registered schedule or compute variant: a user's schedule in a
    file of its own decides what an op builds to as much as the op's file does (the build key
    hashes both)."""
    functions = [fn for pair in _STRATEGIES.values() for fn in pair if fn is not None]
    return {getattr(fn, "func", fn).__module__ for fn in functions}  # a partial: its function's


def find_schedule(families: tuple[str, ...], op_name: str, generic: bool = True) -> Strategy | None:
    """The first hand strategy for `op_name` in `families`, else (with `generic`) the first
    generic one."""
    for name in (op_name, GENERIC) if generic else (op_name,):
        for family in families:
            if (family, name) in _STRATEGIES:
                schedule, compute = _STRATEGIES[(family, name)]
                return Strategy(f"{family}/{'generic' if name == GENERIC else name}", schedule, compute)
    return None
