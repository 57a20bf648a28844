"""The tuner of OpenCL plans: search the work-group size of the GPU schedule on the device.

MetaSchedule measures through TVM's runtime, which the PyPI wheels lack for OpenCL, so OpenCL
targets tune the GPU schedule's one knob, work-items per work-group, with our own runner. Each size
is an artifact built as `deploy build` builds it, run on the device (a size the device rejects
fails alone); `work_groups.json` in the task directory keeps every measurement, so an interrupted
run continues with the sizes not yet tried. The fastest size whose output matches numpy is timed
against the target's default size, interleaved in one session, and accepted (`accepted.json`
with `work_group`, which `--tuned` builds use) only if it beats the default by more than the
spread; otherwise the default size stays. A size read from either file is one of WORK_GROUPS or
refused (`checked_size`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from deploy.base.errors import DeployError, UsageError, reason
from deploy.compiler.compile import Compiled, compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target
from deploy.devices import Device
from deploy.ops.spec import BoundOp
from deploy.tune import records as db
from deploy.tune.tuner import Progress, TuneResult, decide
from deploy.verify.measure import Answers, check_and_time

WORK_GROUPS = (64, 128, 32, 256, 16, 512, 1024)
"""Sizes in the order they are tried: the default first, then outward."""
RECORDS = "work_groups.json"
REPEAT = 5


def record_name(work_group: int) -> str:
    return f"work_group={work_group}"


def checked_size(value: Any) -> int:
    """`value`, read from a records file, as a work-group size: one of WORK_GROUPS (the only sizes
    deploy tune tries); a UsageError otherwise."""
    if type(value) is not int or value not in WORK_GROUPS:
        sizes = ", ".join(map(str, WORK_GROUPS))
        raise UsageError(f"work_group {db.shown(value)} is not a size deploy tune tries ({sizes})")
    return value


def measurements(directory: Path) -> list[dict[str, Any]]:
    """Every size tried so far, in order: {"work_group", "ms", "max_error"} or {"work_group", "error"};
    a UsageError when the file holds anything else."""
    path = directory / RECORDS
    if not path.exists():
        return []
    body = db.read_json(path)
    try:
        trials = body["trials"]
        for trial in trials:
            checked_size(trial["work_group"])
            expected = float | int if "ms" in trial else str  # a time, else why the size failed
            if not isinstance(trial.get("ms", trial.get("error")), expected):
                raise ValueError(f"trial {db.shown(trial)} has neither a time nor an error")
    except (UsageError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"cannot read {path}: {reason(exc)}") from None
    return list(trials)


def scheduled(bound: BoundOp, target: Target, options: BuildOptions, work_group: int) -> Any:
    """The op under the GPU schedule with `work_group` work-items per work-group."""
    mod, _ = hand_schedule(bound, replace(target, work_group=work_group), options)
    return mod


def _builder(
    bound: BoundOp, target: Target, options: BuildOptions, work_group: int
) -> Callable[[], Compiled]:
    """How to build the op with `work_group` work-items per work-group, as `--tuned` builds do."""
    return lambda: compile_scheduled(
        bound,
        target,
        options,
        scheduled(bound, target, options, work_group),
        "tuned",
        record_name(work_group),
    )


def _fastest(done: list[dict[str, Any]]) -> float | None:
    return min((m["ms"] for m in done if "ms" in m), default=None)


class WorkGroupTuner:
    """Every work-group size in WORK_GROUPS, built, checked and timed on the device."""

    searches_structures = False

    def search(
        self, bound: BoundOp, target: Target, options: BuildOptions, device: Device, directory: Path,
        trials: int, timeout_s: float, progress: Progress,
    ) -> TuneResult:  # fmt: skip
        """Try sizes not yet measured until `trials` sizes are (at most every size); accept the
        fastest only if it beats the default size (`decide`). A size the device rejects
        (CL_INVALID_WORK_GROUP_SIZE) fails alone. `timeout_s` is not applied: each size runs the
        op's own schedule in this process, where a running OpenCL kernel cannot be stopped."""
        done = measurements(directory)
        before = len(done)
        best = _fastest(done)
        progress.started(before, best / 1e3 if best is not None else None)
        tried = {m["work_group"] for m in done}
        todo = [size for size in WORK_GROUPS if size not in tried][: max(0, trials - before)]
        with device.open() as session, tempfile.TemporaryDirectory(prefix="deploy-tune-cl-") as tmp:
            options = for_device(options, session)  # float16 as this device computes it
            answers = Answers(bound)  # every size is checked on the same inputs
            for size in todo:
                try:
                    mod = scheduled(bound, target, options, size)
                    compiled = compile_scheduled(bound, target, options, mod, "tuned")
                    measured = check_and_time(session, compiled, Path(tmp), REPEAT, answers)
                    entry: dict[str, Any] = {
                        "work_group": size,
                        "ms": measured.ms,
                        "max_error": measured.max_error,
                    }
                except DeployError as exc:
                    entry = {"work_group": size, "error": str(exc)}
                except Exception as exc:  # the device rejected the size
                    entry = {"work_group": size, "error": f"{type(exc).__name__}: {reason(exc)}"}
                done.append(entry)
                db.write_json(directory / RECORDS, {"trials": done})
                progress.trial(entry["ms"] / 1e3 if "ms" in entry else None)
            valid = sorted((m for m in done if "ms" in m), key=lambda m: m["ms"])
            verdict = db.standing_verdict(directory, len(done), device.name)
            if valid and verdict is None:
                fastest = valid[0]["work_group"]
                contenders = (
                    {}
                    if fastest == target.work_group
                    else {record_name(fastest): _builder(bound, target, options, fastest)}
                )
                verdict = decide(session, bound, target, options, contenders, Path(tmp))
                verdict |= {"work_group": fastest} if verdict["record"] else {}
                verdict = db.write_verdict(directory, verdict, len(done), device.name)
        rejected = [f"{record_name(m['work_group'])}: {m['error']}" for m in done[before:] if "error" in m]
        new = len(done) - before
        return TuneResult(directory, len(done), new, len(valid), _fastest(done), verdict, rejected)

    def trial_ms(
        self, directory: Path, bound: BoundOp, target: Target, options: BuildOptions
    ) -> list[float | None]:
        return [m.get("ms") for m in measurements(directory)]

    def schedule(
        self, directory: Path, entry: dict[str, Any], bound: BoundOp, target: Target, options: BuildOptions
    ) -> Any:
        """The GPU schedule with the accepted size; a UsageError when it is not one tuning tries or
        not the size the record names."""
        try:
            size = checked_size(entry.get("work_group"))
        except UsageError as exc:
            raise UsageError(f"{directory / db.ACCEPTED}: {exc}") from None
        if entry["record"] != record_name(size):
            raise UsageError(
                f"{directory / db.ACCEPTED}: record {db.shown(entry['record'])} is not size {size}"
            )
        return scheduled(bound, target, options, size)
