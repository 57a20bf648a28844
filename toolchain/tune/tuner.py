"""What a tuner is: the interface each artifact kind's tuner implements (`tuners.py` maps kinds to
tuners), the result of a run, and the callbacks a run reports its progress through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from devices import Device
from ops.spec import BoundOp
from toolchain.build.targets import Target


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
    the running batch."""

    started: Callable[[int, float | None], None] = lambda records, best_s: None
    trial: Callable[[float | None], None] = lambda secs: None
    stopping: Callable[[], None] = lambda: None


class Tuner(Protocol):
    """Searches one artifact kind's schedules for an op on a device, keeping its records in a task
    directory, and rebuilds the schedule it accepted."""

    def search(
        self, bound: BoundOp, target: Target, device: Device, directory: Path, trials: int,
        timeout_s: float, progress: Progress,
    ) -> TuneResult:  # fmt: skip
        """Measure until the task holds `trials` records, then accept the fastest that matches numpy."""
        ...

    def trial_ms(self, directory: Path, bound: BoundOp, target: Target) -> list[float | None]:
        """Milliseconds of each trial in the order they ran (None for a failed one)."""
        ...

    def schedule(self, directory: Path, entry: dict[str, Any], bound: BoundOp, target: Target) -> Any | None:
        """The op's IRModule scheduled as the accepted `entry` says; None when it no longer applies."""
        ...
