"""A schedule as a search space: the same schedule function, its choices sampled.

`design_spaces` runs a strategy's schedule once per combination of its structural picks (each
run a MetaSchedule design space: a trace whose sampling instructions the search re-samples and
mutates); split factors become `sample_perfect_tile` and unroll depths `sample_categorical`,
each with the hand value as its recorded decision. The first design space, every default taken,
is the hand schedule itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from schedules.registry import Choices, ScheduleContext, ScheduleFn, T

UNROLL_STEPS = (0, 16, 64, 512)
"""Unroll depths a search tries (`pragma_auto_unroll_max_step`), as MetaSchedule's CPU rules do."""
MAX_SPACES = 16
"""Design spaces one schedule may enumerate: its structural picks multiply."""


class SampledChoices(Choices):
    """Choices sampled into the schedule's trace; structural picks taken from `picks` (the
    defaults otherwise), each recorded in `seen` as (name, options, value taken)."""

    def __init__(self, picks: dict[str, Any]) -> None:
        self.picks = picks
        self.seen: list[tuple[str, tuple[Any, ...], Any]] = []

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
        steps = sorted({*UNROLL_STEPS, default})
        chosen = sch.sample_categorical(steps, [1 / len(steps)] * len(steps), decision=steps.index(default))
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", chosen)

    def pick(self, name: str, options: Sequence[T], default: T) -> T:
        taken = self.picks.get(name, default)
        if not any(name == seen for seen, _, _ in self.seen):
            self.seen.append((name, tuple(options), taken))
        return taken


def design_spaces(schedule: ScheduleFn, ctx: ScheduleContext) -> Callable[[Any], list[Any]]:
    """MetaSchedule's space function for `schedule`: given the traced schedule of the op's
    PrimFunc, one scheduled copy per combination of structural picks, the hand one first."""

    def generate(sch: Any) -> list[Any]:
        spaces: list[Any] = []
        todo: list[dict[str, Any]] = [{}]
        while todo and len(spaces) < MAX_SPACES:
            picks = todo.pop(0)
            space = sch.copy()
            choices = SampledChoices(picks)
            schedule(space, replace(ctx, choices=choices))
            spaces.append(space)
            for i, (name, options, taken) in enumerate(choices.seen):
                if name in picks:
                    continue
                before = {earlier: value for earlier, _, value in choices.seen[:i]}
                todo += [{**before, name: option} for option in options if option != taken]
        return spaces

    return generate
