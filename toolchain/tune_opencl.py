"""`deploy tune --target opencl`: search the work-group size of the GPU schedule on the device.

MetaSchedule measures through TVM's runtime, which the PyPI wheels lack for OpenCL, so OpenCL
targets tune the GPU schedule's one knob, work-items per work-group, with our own runner. Each size
is an artifact built as `deploy build` builds it, run on the device (a size the device rejects
fails alone); `work_groups.json` in the task directory keeps every measurement, so an interrupted
run continues with the sizes not yet tried. The fastest size whose output matches numpy is
accepted (`accepted.json` with `work_group`), and `--tuned` builds use it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from devices import Device
from ops.errors import DeployError
from ops.spec import BoundOp
from toolchain import tuning_db
from toolchain.build import compile_scheduled, export, hand_schedule
from toolchain.compare import random_input
from toolchain.targets import Target
from toolchain.timing import artifact_ms
from toolchain.verify import check_artifact

WORK_GROUPS = (64, 128, 32, 256, 16, 512, 1024)
"""Sizes in the order they are tried: the default first, then outward."""
RECORDS = "work_groups.json"
REPEAT = 5


def record_name(work_group: int) -> str:
    return f"work_group={work_group}"


def measurements(directory: Path) -> list[dict[str, Any]]:
    """Every size tried so far, in order: {"work_group", "ms", "max_error"} or {"work_group", "error"}."""
    path = directory / RECORDS
    return list(json.loads(path.read_text())["trials"]) if path.exists() else []


def scheduled(bound: BoundOp, target: Target, work_group: int) -> Any:
    """The op under the GPU schedule with `work_group` work-items per work-group."""
    mod, _ = hand_schedule(bound, replace(target, work_group=work_group))
    return mod


def _check_and_time(
    session: Any, bound: BoundOp, target: Target, work_group: int, tmp: Path
) -> dict[str, Any]:
    """Build with `work_group`, compare with numpy on random inputs and on ties; the median ms
    and the largest error."""
    compiled = compile_scheduled(bound, target, scheduled(bound, target, work_group), "tuned")
    directory = tmp / f"wg{work_group}"
    manifest = export(compiled, directory)
    worst = check_artifact(session, bound, directory, manifest)
    inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
    return {"ms": artifact_ms(session, directory, manifest, inputs, REPEAT), "max_error": worst}


def tune_work_group(
    bound: BoundOp,
    target: Target,
    device: Device,
    directory: Path,
    trials: int,
    on_trial: Callable[[float | None], None],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Try sizes not yet measured until `trials` sizes are (at most every size); accept the
    fastest. Returns (every measurement, accepted entry or None)."""
    done = measurements(directory)
    tried = {m["work_group"] for m in done}
    todo = [size for size in WORK_GROUPS if size not in tried][: max(0, trials - len(done))]
    with device.open() as session, tempfile.TemporaryDirectory(prefix="deploy-tune-cl-") as tmp:
        for size in todo:
            try:
                entry = {"work_group": size, **_check_and_time(session, bound, target, size, Path(tmp))}
            except DeployError as exc:
                entry = {"work_group": size, "error": str(exc)}
            except Exception as exc:  # the device rejected the size (e.g. CL_INVALID_WORK_GROUP_SIZE)
                entry = {"work_group": size, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            done.append(entry)
            tuning_db.write_json(directory / RECORDS, {"trials": done})
            on_trial(entry["ms"] / 1e3 if "ms" in entry else None)
    valid = sorted((m for m in done if "ms" in m), key=lambda m: m["ms"])
    if not valid:
        return done, None
    best = valid[0]
    accepted = {"record": record_name(best["work_group"]), **best, "device": device.name}
    tuning_db.write_json(directory / tuning_db.ACCEPTED, accepted)
    return done, accepted
