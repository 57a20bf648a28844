"""`deploy tune`: each artifact kind's tuner, a run over one task, and the schedules tuning
accepted, which `--tuned` builds use (`AcceptedRecords` is build's `TunedSchedules`).

A new artifact kind that can be tuned adds one entry to TUNERS; one without is refused up front.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError
from deploy.compiler.artifacts import ArtifactKind
from deploy.compiler.opencl import OPENCL_PLAN
from deploy.compiler.options import KEPT_HAND, REFUSED, BuildOptions
from deploy.compiler.shared_object import SHARED_OBJECT
from deploy.compiler.targets import Target
from deploy.devices import Device
from deploy.ops.graph import BoundGraph
from deploy.ops.spec import BoundOp
from deploy.tune import records as db
from deploy.tune.layouts import read_layout
from deploy.tune.metaschedule import MetaScheduleTuner
from deploy.tune.tuner import Progress, Tuner, TuneResult, check_static
from deploy.tune.work_group import WorkGroupTuner
from deploy.verify.run import check_device

TUNERS: dict[ArtifactKind, Tuner] = {SHARED_OBJECT: MetaScheduleTuner(), OPENCL_PLAN: WorkGroupTuner()}


def tuner_for(target: Target) -> Tuner:
    """The tuner for the target's artifact kind (MetaSchedule for shared objects, work-group
    sizes for OpenCL); a UsageError for a kind with none."""
    if target.artifact not in TUNERS:
        raise UsageError(f"target {target.name}: {target.artifact.name} artifacts have no tuner")
    return TUNERS[target.artifact]


def tune(
    bound: BoundOp, target: Target, options: BuildOptions, device: Device, root: Path, trials: int,
    timeout_s: float = 60.0, progress: Progress = Progress(),  # noqa: B008  (frozen: shared safely)
) -> TuneResult:  # fmt: skip
    """Tune `bound` for `target` (built as `options` say) on `device` until its task under `root`
    holds `trials` records, then accept the fastest record only if it matches numpy and beats the
    hand schedule."""
    if trials < 1:
        raise UsageError(f"--trials {trials}: expected a positive number of trials")
    check_static(f"tuning {bound.name}", bound.inputs)
    tuner = tuner_for(target)
    check_device(target, device)
    directory = db.task_dir(root, bound, target.name)
    directory.mkdir(parents=True, exist_ok=True)
    with db.tuning(directory, progress.waiting):
        db.check_task_files(directory)
        db.write_json(directory / db.TASK, {**bound.key(), "target": target.name, "device": device.name})
        return tuner.search(bound, target, options, device, directory, trials, timeout_s, progress)


@dataclass(frozen=True)
class AcceptedRecords:
    """The schedules `deploy tune` accepted under a records directory `root`. Records are data
    read from disk: one that fails a check (`Tuner.schedule`) is not built; `warn` says why in
    one line (the caller shows it) and the build keeps the hand schedule."""

    root: Path
    warn: Callable[[str], None]
    warned: set[str] = field(default_factory=set, compare=False)
    """What was warned of already: a command may build one graph more than once (`deploy bench`
    once per batch size), and says each problem once."""

    def _once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            self.warn(message)

    def schedule(self, bound: BoundOp, target: Target, options: BuildOptions) -> tuple[Any, str] | None:
        """(the scheduled module, its record id) of the accepted record for `bound`; None when
        there is none or it fails a check (warned of: the hand schedule builds)."""
        directory = db.task_dir(self.root, bound, target.name)
        try:
            entry = db.accepted(directory)
            if entry is None:
                return None
            return tuner_for(target).schedule(directory, entry, bound, target, options), entry["record"]
        except UsageError as exc:
            self._once(f"--tuned {self.root}: {exc}; building the hand schedule")
            return None

    def verdict(self, bound: BoundOp, target: Target) -> str | None:
        """What tuning decided for `bound`, as the build key holds it: None (not tuned), KEPT_HAND,
        REFUSED (a verdict that is not one) or the accepted record with its database's digest."""
        directory = db.task_dir(self.root, bound, target.name)
        try:
            entry = db.verdict(directory)
        except UsageError:
            return REFUSED
        if entry is None:
            return None
        if not entry["record"]:
            return KEPT_HAND
        return f"{entry['record']} of records {db.records_digest(directory)}"

    def layout(self, graph: BoundGraph, target: Target) -> str | None:
        """The layout tuning accepted for `graph` (None: NCHW); a bad verdict is warned of."""
        try:
            return read_layout(self.root, graph, target.name)
        except UsageError as exc:
            self._once(f"--tuned {self.root}: {exc}; building the graph in NCHW")
            return None
