"""A schedule as a search space: the same schedule function, its choices sampled.

`design_spaces` runs a strategy's schedule once per combination of its structural picks (each
run a MetaSchedule design space: a trace whose sampling instructions the search re-samples and
mutates); split factors become `sample_perfect_tile`, unroll depths and annotated values (how
far ahead to prefetch) `sample_categorical`, each with the hand value as its recorded decision.
The first design space, every default taken, is the hand schedule itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from deploy.schedules.registry import Picked, ScheduleContext, ScheduleFn, every_structure

UNROLL_STEPS = (0, 16, 64, 512)
"""Unroll depths a search tries (`pragma_auto_unroll_max_step`), as MetaSchedule's CPU rules do."""
MAX_SPACES = 16
"""Design spaces one schedule may enumerate: its structural picks multiply."""


class SampledChoices(Picked):
    """Choices sampled into the schedule's trace; structural picks taken from `picks` (the
    defaults otherwise), each recorded in `seen`."""

    def split(self, sch: Any, loop: Any, default: int, most: int) -> tuple[Any, Any | None]:
        extent = int(sch.get(loop).extent)
        hand = [extent // default, default] if extent % default == 0 and default <= most else None
        factors = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=most, decision=hand)
        outer, inner = sch.split(loop, factors=factors)
        return outer, inner

    def unroll(self, sch: Any, loop: Any, default: int) -> None:
        """As MetaSchedule's own rules ask for it (an annotation of the root block, which its
        postprocessor turns into the pragma on each block's outermost loop: `loop` here), so
        that its unroll mutator explores the depth."""
        chosen = sampled(sch, UNROLL_STEPS, default)
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", chosen)

    def annotate(self, sch: Any, loops: list[Any], key: str, default: int, options: Sequence[int]) -> None:
        chosen = sampled(sch, options, default)
        for loop in loops:
            sch.annotate(loop, key, chosen)


def sampled(sch: Any, options: Sequence[int], default: int) -> Any:
    """A `sample_categorical` over `options` and `default`, uniform, `default` its decision."""
    values = sorted({*options, default})
    return sch.sample_categorical(values, [1 / len(values)] * len(values), decision=values.index(default))


def design_spaces(schedule: ScheduleFn, ctx: ScheduleContext) -> Callable[[Any], list[Any]]:
    """MetaSchedule's space function for `schedule`: given the traced schedule of the op's
    PrimFunc, one scheduled copy per combination of structural picks, the hand one first."""

    def generate(sch: Any) -> list[Any]:
        def run(picks: dict[str, Any]) -> tuple[Picked, Any]:
            space, choices = sch.copy(), SampledChoices(picks)
            schedule(space, replace(ctx, choices=choices))
            return choices, space

        return [space for _, space in every_structure(run, MAX_SPACES)]

    return generate
