"""What a tuner is: the interface each artifact kind's tuner implements (`tuners.py` maps kinds to
tuners), the result of a run, the callbacks a run reports its progress through, and how every
tuner judges what it found against the hand schedule."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deploy.base.errors import reason
from deploy.base.stopping import raise_if_stopped
from deploy.compiler.compile import Compiled, CompiledGraph, compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.devices import Device, Session
from deploy.ops.spec import BoundOp, TensorType, require_static
from deploy.verify.measure import Checked, check, time_interleaved

ACCEPT_ROUNDS = 9
"""Interleaved timed runs of the hand schedule and each contender when a search ends."""


@dataclass(frozen=True)
class TuneResult:
    directory: Path
    trials: int
    """Records of the task now (earlier runs included)."""
    new_trials: int
    valid: int
    best_ms: float | None
    accepted: dict[str, Any] | None
    rejected: list[str]


@dataclass(frozen=True)
class Progress:
    """Callbacks of a tuning run: `started(records, best_s)` once with what earlier runs left;
    `trial(seconds or None)` after each new trial; `stopping()` when Ctrl-C asked to stop after
    the running batch; `waiting(task directory)` when another run tunes the task and this one
    waits for it to finish."""

    started: Callable[[int, float | None], None] = lambda records, best_s: None
    trial: Callable[[float | None], None] = lambda secs: None
    stopping: Callable[[], None] = lambda: None
    waiting: Callable[[Path], None] = lambda directory: None


class Tuner(Protocol):
    """Searches one artifact kind's schedules for an op on a device, keeping its records in a task
    directory, and rebuilds the schedule it accepted."""

    searches_structures: bool
    """Whether the search covers every structure the target's strategy may pick
    (`deploy.schedules.registry.every_structure`), not only the hand's."""

    def search(
        self, bound: BoundOp, target: Target, options: BuildOptions, device: Device, directory: Path,
        trials: int, timeout_s: float, progress: Progress,
    ) -> TuneResult:  # fmt: skip
        """Measure until the task holds `trials` records, then judge the fastest (`decide`); the
        candidates built with `options` as the device asks (`for_device`)."""
        ...

    def trial_ms(
        self, directory: Path, bound: BoundOp, target: Target, options: BuildOptions
    ) -> list[float | None]:
        """Milliseconds of each trial in the order they ran (None for a failed one)."""
        ...

    def schedule(
        self, directory: Path, entry: dict[str, Any], bound: BoundOp, target: Target, options: BuildOptions
    ) -> Any:
        """The op's IRModule scheduled as the accepted `entry` says; a UsageError says why not
        (it no longer applies, or the records fail a check: they are data read from disk)."""
        ...


def check_static(what: str, types: tuple[TensorType, ...]) -> None:
    """Tuning needs static shapes: MetaSchedule refuses loops of symbolic extent
    (`DisallowDynamicLoop`), and a record is kept per shape."""
    require_static(types, what, "MetaSchedule tunes no loop of symbolic extent: tune the batch you deploy")


def judge(session: Session, hand: Checked, contenders: dict[str, Checked]) -> dict[str, Any]:
    """The verdict on a search's best finds (record name -> build checked against numpy): timed
    with the hand schedule, interleaved in one session, the fastest that beats the hand
    schedule by more than the spread of either is accepted ({"record": name, "ms", ...});
    otherwise the hand schedule stays ({"record": None, "kept": "hand", ...}). Both times go in."""
    timed = time_interleaved(session, [hand, *contenders.values()], ACCEPT_ROUNDS)
    hand_time, times = timed[0], dict(zip(contenders, timed[1:], strict=True))
    common = {"hand_ms": hand_time.ms, "hand_spread_ms": hand_time.spread}
    winners = sorted((m.ms, name) for name, m in times.items() if m.beats(hand_time))
    if winners:
        name = winners[0][1]
        best = times[name]
        return {"record": name, "ms": best.ms, "spread_ms": best.spread, "max_error": best.max_error} | common
    fastest = min((m.ms for m in times.values()), default=None)
    return {"record": None, "kept": "hand", "best_tuned_ms": fastest, **common}


def decide(
    session: Session,
    bound: BoundOp,
    target: Target,
    options: BuildOptions,
    contenders: Mapping[str, Callable[[], Compiled]],
    workdir: Path,
) -> dict[str, Any]:
    """The verdict on a search's best finds (name -> how to build it as `--tuned` builds) against
    the hand schedule (`judge_built`)."""
    hand = check(
        session, compile_scheduled(bound, target, options, *hand_schedule(bound, target, options)), workdir
    )
    return judge_built(session, hand, contenders, workdir)


def judge_built(
    session: Session,
    hand: Checked,
    contenders: Mapping[str, Callable[[], Compiled | CompiledGraph]],
    workdir: Path,
) -> dict[str, Any]:
    """Each contender (name -> how to build it) built and checked against numpy (one that fails
    is rejected, with why, in "rejected"), then the rest judged against `hand` (`judge`)."""
    checked: dict[str, Checked] = {}
    rejected: list[str] = []
    for name, build in contenders.items():
        try:
            checked[name] = check(session, build(), workdir)
        except Exception as exc:  # a mismatch (DeployError) or a record TVM cannot apply or build
            raise_if_stopped()
            rejected.append(f"{name}: {reason(exc)}")
    return judge(session, hand, checked) | {"rejected": rejected}
