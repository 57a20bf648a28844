"""What a tuner is: the interface each artifact kind's tuner implements (`tuners.py` maps kinds to
tuners), the result of a run, the callbacks a run reports its progress through, and how every
tuner judges what it found against the hand schedule."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from deploy.base.errors import DeployError, reason
from deploy.base.stopping import raise_if_stopped
from deploy.compiler.compile import Compiled, CompiledGraph, compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.devices import Device, Session
from deploy.ops.spec import BoundOp, TensorType, require_static
from deploy.verify.measure import Answers, Checked, check, time_interleaved

T = TypeVar("T")

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
    default_checked: Callable[[DefaultCheck], None] = lambda checked: None
    """Told, before the search, how the default build's check against numpy went."""


@dataclass(frozen=True)
class DefaultCheck:
    """The default build (the hand schedule `deploy build` uses) checked against numpy:
    `checked` where it passed, else `failure` says how it differs."""

    checked: Checked | None
    failure: str | None = None


def check_default(
    session: Session, bound: BoundOp, target: Target, options: BuildOptions, workdir: Path
) -> DefaultCheck:
    """Build the default schedule and check it against numpy on the session, before any search
    (seconds, where a search takes minutes). A wrong answer is returned, not raised: the search
    may still find a verified record to build instead; a build that fails raises."""
    compiled = compile_scheduled(bound, target, options, *hand_schedule(bound, target, options))
    try:
        return DefaultCheck(check(session, compiled, workdir))
    except DeployError as exc:
        return DefaultCheck(None, reason(exc))


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


def judge(session: Session, hand: Checked | None, contenders: dict[str, Checked]) -> dict[str, Any]:
    """The verdict on a search's best finds (record name -> build checked against numpy): timed
    with the hand schedule, interleaved in one session, the fastest that beats the hand
    schedule by more than the spread of either is accepted ({"record": name, "ms", ...});
    otherwise the hand schedule stays ({"record": None, "kept": "hand", ...}). Both times go in.
    Without `hand` (its check failed) the fastest contender is accepted: verified beats wrong."""
    timed = time_interleaved(session, [*([hand] if hand else []), *contenders.values()], ACCEPT_ROUNDS)
    hand_time = timed.pop(0) if hand else None
    times = dict(zip(contenders, timed, strict=True))
    common = {
        "hand_ms": hand_time.ms if hand_time else None,
        "hand_spread_ms": hand_time.spread if hand_time else None,
    }
    winners = sorted((m.ms, name) for name, m in times.items() if hand_time is None or m.beats(hand_time))
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
    default: DefaultCheck | None = None,
) -> dict[str, Any]:
    """The verdict on a search's best finds (name -> how to build it as `--tuned` builds) against
    the hand schedule (`judge_built`), checked here unless `default` says how its check went
    (before the search). A hand schedule that failed its check is named in "hand_failed", and
    the fastest verified contender is accepted."""
    if default is None:
        default = check_default(session, bound, target, options, workdir)
    verdict = judge_built(session, default.checked, contenders, workdir)
    return verdict | ({"hand_failed": default.failure} if default.failure else {})


def judge_built(
    session: Session,
    hand: Checked | None,
    contenders: Mapping[str, Callable[[], Compiled | CompiledGraph]],
    workdir: Path,
) -> dict[str, Any]:
    """Each contender (name -> how to build it) built and checked against numpy (one that fails
    is rejected, with why, in "rejected"), then the rest judged against `hand` (`judge`). One
    whose module is the hand's, byte for byte, is the hand schedule (a search's first record is
    the hand's with unit splits): it is named in "same_as_hand", not timed; timed beside the
    hand, its copy once came out 3.6% ahead by noise alone and was accepted."""
    checked: dict[str, Checked] = {}
    rejected: list[str] = []
    same: list[str] = []
    answers: Answers | None = None  # the contenders' item's, drawn at the first one built

    def attempt(name: str, action: Callable[[], T]) -> T | None:
        """`action()`, or None with why it failed in `rejected`: a record TVM cannot apply or
        build, a mismatch (DeployError), a build the device cannot run."""
        try:
            return action()
        except Exception as exc:
            raise_if_stopped()
            rejected.append(f"{name}: {reason(exc)}")
            return None

    for name, build in contenders.items():
        compiled = attempt(name, build)
        if compiled is None:
            continue
        answers = Answers(compiled.item) if answers is None else answers.of(compiled.item)  # one item
        found = attempt(name, functools.partial(check, session, compiled, workdir, answers))
        if found is None:
            continue
        if hand is not None and found.manifest.sha256 == hand.manifest.sha256:
            same.append(name)
        else:
            checked[name] = found
    verdict = judge(session, hand, checked) | {"rejected": rejected}
    if same and verdict["record"] is None and verdict["best_tuned_ms"] is None:  # only the hand's code
        verdict["best_tuned_ms"] = verdict["hand_ms"]
    return verdict | ({"same_as_hand": same} if same else {})
