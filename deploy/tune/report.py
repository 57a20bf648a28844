"""`deploy tune --report`'s measurements: best time against trials, and default vs hand vs tuned.

For every task tuned for a target under the records root, the default (unscheduled), hand and
tuned builds are compared with numpy and timed in one session of the device, interleaved, so the
ratios compare like with like. Where tuning kept the hand schedule, the `--tuned` build is the
hand build: its time is the hand's. The rows go to report.json beside the tasks; the CLI prints
and plots them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError, reason
from deploy.compiler.compile import Compiled, compile_scheduled, hand_schedule, prim_module
from deploy.compiler.options import KEPT_HAND, BuildOptions
from deploy.compiler.targets import Target
from deploy.devices import Device
from deploy.ops import TensorType, bind
from deploy.ops.fused import FusedOp
from deploy.ops.registry import find_op, get_op
from deploy.ops.spec import BoundOp
from deploy.tune import records as db
from deploy.tune.layouts import LAYOUT
from deploy.tune.tuners import AcceptedRecords, tuner_for
from deploy.verify.measure import Answers, check, time_interleaved
from deploy.verify.run import check_device

REPEAT = 7
JSON = "report.json"


def task_dirs(root: Path, target: Target) -> list[Path]:
    """The directories under `root` tuned for `target`, but for the layout verdicts' (which hold
    no task) and empty ones (a verdict deleted to measure again): a directory holding something
    but no task.json is kept, for the report to say it is not a task."""
    base = Path(root) / target.name
    found = (
        sorted(p for p in base.iterdir() if p.is_dir() and not (p / LAYOUT).exists() and any(p.iterdir()))
        if base.is_dir()
        else []
    )
    if not found:
        raise UsageError(f"nothing tuned for target {target.name} in {root} (run `deploy tune --db {root}`)")
    return found


TASK_FIELDS = {
    "op": (str, "the name of an op"),
    "attrs": (dict, "a mapping of attribute names to values"),
    "inputs": (list, "a list of {shape, dtype}, one per input"),
}
"""What task.json must hold to be bound again: each field's type and how a message names it."""


def task_bound(directory: Path) -> BoundOp:
    """The op, attributes and input types a task directory was tuned for: a registered op, or
    a model's fused kernel (its attributes list its nodes). Bound again, it must have the key
    the task was written under, so that its records are the ones found for it."""
    path = directory / db.TASK
    task = db.read_json(path)
    if not isinstance(task, dict):
        raise UsageError(f"cannot read {path}: {db.shown(task)}: expected a mapping of op, attrs and inputs")
    for field, (kind, expected) in TASK_FIELDS.items():
        if not isinstance(task.get(field), kind):
            raise UsageError(f"cannot read {path}: {field} {db.shown(task.get(field))}: expected {expected}")
    name, attrs = task["op"], task["attrs"]
    for given in task["inputs"]:
        if not (
            isinstance(given, dict)
            and isinstance(given.get("shape"), list)
            and isinstance(given.get("dtype"), str)
        ):
            raise UsageError(
                f"cannot read {path}: input {db.shown(given)}: expected {{shape: [dims], dtype: name}}"
            )
    try:
        inputs = [TensorType(tuple(t["shape"]), t["dtype"]) for t in task["inputs"]]
        fused = find_op(name) is None and "nodes" in attrs
        bound = FusedOp.bind_key(attrs, inputs) if fused else bind(get_op(name), attrs, inputs)
    except UsageError as exc:
        raise UsageError(f"cannot read {path}: {reason(exc)}") from None
    if db.task_dir(directory.parent.parent, bound, directory.parent.name) != directory:
        raise UsageError(f"{path} describes another task than {directory.name}")
    return bound


def best_so_far(times: list[float | None]) -> list[float | None]:
    """The best time after each trial (None before the first valid one)."""
    curve: list[float | None] = []
    best: float | None = None
    for ms in times:
        if ms is not None:
            best = ms if best is None else min(best, ms)
        curve.append(best)
    return curve


def _variants(
    bound: BoundOp, target: Target, options: BuildOptions, accepted: AcceptedRecords
) -> dict[str, Compiled]:
    """The default build (where the artifact kind builds unscheduled code), the hand and the tuned."""
    variants = {}
    if target.artifact.builds_unscheduled:
        unscheduled = prim_module(bound, target, options)
        variants["default"] = compile_scheduled(bound, target, options, unscheduled, "default")
    variants["hand"] = compile_scheduled(bound, target, options, *hand_schedule(bound, target, options))
    tuned = accepted.schedule(bound, target, options)
    if tuned is not None:
        variants["tuned"] = compile_scheduled(bound, target, options, tuned[0], "tuned", tuned[1])
    return variants


@dataclass(frozen=True)
class Report:
    """One row per task (median ms of each variant) and each task's best time after every trial."""

    rows: list[dict[str, Any]]
    curves: dict[str, list[float | None]]
    json: Path
    """Where the rows were written."""


def report_target(
    root: Path, target: Target, options: BuildOptions, device: Device, warn: Callable[[str], None]
) -> Report:
    """Measure every task tuned for `target` under `root` on `device` (each variant built with
    `options`); write report.json beside them.
    `warn` gets one line per accepted record that fails its checks (the hand schedule is used) and
    per task it cannot rebuild (an unreadable task.json, an op no longer loaded)."""
    check_device(target, device)
    accepted = AcceptedRecords(root, warn)
    rows: list[dict[str, Any]] = []
    curves: dict[str, list[float | None]] = {}
    tuner = tuner_for(target)
    with device.open() as session, tempfile.TemporaryDirectory(prefix="deploy-report-") as tmp:
        for directory in task_dirs(root, target):
            try:
                bound = task_bound(directory)
            except UsageError as exc:
                warn(f"task {directory.name} is not in the report: {exc}")
                continue
            times = tuner.trial_ms(directory, bound, target, options)
            label = f"{bound.op.name} {' '.join('x'.join(map(str, t.shape)) for t in bound.inputs)}"
            curves[label] = best_so_far(times)
            variants = _variants(bound, target, options, accepted)
            answers = Answers(bound)
            checked = [check(session, compiled, Path(tmp), answers) for compiled in variants.values()]
            timed = dict(zip(variants, time_interleaved(session, checked, REPEAT), strict=True))
            kept_hand = accepted.verdict(bound, target) == KEPT_HAND
            if kept_hand:
                timed["tuned"] = timed["hand"]
            rows.append(
                {
                    "op": bound.op.name,
                    "task": directory.name,
                    "label": label,
                    "dtype": bound.inputs[0].dtype,
                    "trials": len(times),
                    "default_ms": timed["default"].ms if "default" in timed else None,
                    "hand_ms": timed["hand"].ms,
                    "hand_spread_ms": timed["hand"].spread,
                    "hand_schedule": variants["hand"].schedule,
                    "tuned_ms": timed["tuned"].ms if "tuned" in timed else None,
                    "tuned_spread_ms": timed["tuned"].spread if "tuned" in timed else None,
                    "tuned_record": variants["tuned"].tuning_record if "tuned" in variants else None,
                    "verdict": "hand kept" if kept_hand else ("tuned" if "tuned" in variants else "none"),
                }
            )
    if not rows:
        raise UsageError(f"no task tuned for target {target.name} in {root} can be reported (see warnings)")
    path = Path(root) / target.name / JSON
    db.write_json(path, {"target": target.name, "device": device.name, "rows": rows})
    return Report(rows, curves, path)
