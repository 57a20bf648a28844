"""Compile an op for a target: TE -> PrimFunc -> schedule (the target's strategy, or an accepted
tuning record) -> the compiled form of the target's artifact kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops.spec import BoundOp
from schedules import ScheduleContext, find_schedule
from schedules.registry import HAND, Choices
from toolchain.build.targets import KEPT_HAND, REFUSED, Target


def context(bound: BoundOp, target: Target, choices: Choices = HAND) -> ScheduleContext:
    """What the target's strategy sees: the op, vector width, the device's cores, work-group size,
    and how it makes its choices (the hand's defaults unless a tuner's or a test's)."""
    return ScheduleContext(bound, target.vector_bits, target.build_cores(), target.work_group, choices)


def prim_module(bound: BoundOp, target: Target, choices: Choices = HAND) -> Any:
    """The op as an IRModule with one PrimFunc `main(inputs..., out)`: the computation the target's
    strategy pairs with its schedule (the op's own unless the family has a variant; `choices`
    picks among the variant's structures)."""
    import tvm
    from tvm import te

    placeholders = [
        te.placeholder(t.shape, t.dtype, name=spec.name)
        for spec, t in zip(bound.op.inputs, bound.inputs, strict=True)
    ]
    strategy = find_schedule(target.schedules, bound.op.name)
    if strategy is not None and strategy.compute is not None:
        out = strategy.compute(context(bound, target, choices), *placeholders)
    else:
        out = bound.op.compute(bound.attrs, bound.output, *placeholders)
    return tvm.IRModule({"main": te.create_prim_func([*placeholders, out])})


def hand_schedule(bound: BoundOp, target: Target, choices: Choices = HAND) -> tuple[Any, str]:
    """The op computed and scheduled by the target's strategy (or left as is: "default"), with
    its label; `choices` other than the hand's make the strategy take other structures."""
    import tvm

    sch = tvm.s_tir.Schedule(prim_module(bound, target, choices))
    strategy = find_schedule(target.schedules, bound.op.name)
    if strategy is None:
        return sch.mod, "default"
    strategy.schedule(sch, context(bound, target, choices))
    return sch.mod, strategy.label


@dataclass
class Compiled:
    """A compiled op: the artifact kind's compiled form (a TVM executable, an OpenCL program), the
    schedule it was built with and, for a tuned schedule, the tuning record's id."""

    bound: BoundOp
    target: Target
    executable: Any
    schedule: str
    tuning_record: str | None = None
    tuning: str | None = None
    """Why a `--tuned` build uses the hand schedule: KEPT_HAND (tuning found nothing faster) or
    REFUSED (the accepted record failed its checks)."""


def compile_op(bound: BoundOp, target: Target) -> Compiled:
    """Schedule (the record tuning accepted for the target, else its strategy) and compile: a
    TVM executable, or for OpenCL targets the source and launch plan."""
    if target.tuned is not None:
        tuned = target.tuned.schedule(bound, target)
        if tuned is not None:
            return compile_scheduled(bound, target, tuned[0], "tuned", tuned[1])
    compiled = compile_scheduled(bound, target, *hand_schedule(bound, target))
    verdict = target.tuned.verdict(bound, target) if target.tuned is not None else None
    if verdict is not None:  # tuning kept the hand schedule, or its record failed the checks
        compiled.tuning = KEPT_HAND if verdict == KEPT_HAND else REFUSED
    return compiled


def compile_scheduled(
    bound: BoundOp, target: Target, mod: Any, name: str, record: str | None = None
) -> Compiled:
    """Compile an already scheduled IRModule of `bound` for `target` (its artifact kind's way)."""
    return Compiled(bound, target, target.artifact.compile(mod, target, len(bound.inputs)), name, record)
