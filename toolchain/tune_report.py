"""`deploy tune --report`: best time against trials (PNG) and default vs hand vs tuned (table).

For every task tuned for a target under the records root, the default (unscheduled), hand and
tuned builds are compared with numpy and timed in one session of the device, so the ratios
compare like with like.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from devices import Device, Session
from ops import TensorType, bind, get_op
from ops.errors import UsageError
from ops.spec import BoundOp
from toolchain import tuning_db
from toolchain.build import Compiled, compile_scheduled, export, hand_schedule, prim_module, tuned_schedule
from toolchain.compare import random_input
from toolchain.targets import Target
from toolchain.timing import artifact_ms
from toolchain.verify import check_artifact, check_device

REPEAT = 7
PNG = "report.png"
JSON = "report.json"


def task_dirs(root: Path, target: Target) -> list[Path]:
    """The task directories tuned for `target` under `root`."""
    base = Path(root) / target.name
    found = sorted(p for p in base.iterdir() if (p / tuning_db.TASK).exists()) if base.is_dir() else []
    if not found:
        raise UsageError(f"nothing tuned for target {target.name} in {root} (run `deploy tune --db {root}`)")
    return found


def task_bound(directory: Path) -> BoundOp:
    """The op, attributes and input types a task directory was tuned for."""
    task = json.loads((directory / tuning_db.TASK).read_text())
    inputs = [TensorType(tuple(t["shape"]), t["dtype"]) for t in task["inputs"]]
    return bind(get_op(task["op"]), task["attrs"], inputs)


def trial_ms(directory: Path, bound: BoundOp, target: Target) -> list[float | None]:
    """Milliseconds of each trial in the order they ran (None for a failed one)."""
    if target.artifact == "opencl":
        from toolchain.tune_opencl import measurements

        return [m.get("ms") for m in measurements(directory)]
    records = tuning_db.TaskRecords.load(directory, prim_module(bound, target)).records
    return [s * 1e3 if (s := tuning_db.mean_secs(r)) < tuning_db.FAILED_SECS else None for r in records]


def best_so_far(times: list[float | None]) -> list[float | None]:
    """The best time after each trial (None before the first valid one)."""
    curve: list[float | None] = []
    best: float | None = None
    for ms in times:
        if ms is not None:
            best = ms if best is None else min(best, ms)
        curve.append(best)
    return curve


def _variants(bound: BoundOp, target: Target, root: Path) -> dict[str, Compiled]:
    """The default build (CPU targets: GPU code needs its work-items bound), the hand and the tuned."""
    mod = prim_module(bound, target)
    variants = {}
    if target.artifact != "opencl":
        variants["default"] = compile_scheduled(bound, target, mod, "default")
    hand, name = hand_schedule(bound, target)
    variants["hand"] = compile_scheduled(bound, target, hand, name)
    tuned = tuned_schedule(bound, target.with_tuning(root))
    if tuned is not None:
        variants["tuned"] = compile_scheduled(bound, target, tuned[0], "tuned", tuned[1])
    return variants


def _time_checked(session: Session, bound: BoundOp, compiled: Compiled, tmp: Path) -> float:
    """Median ms of a build on the session, after checking it against numpy."""
    directory = tmp / f"{compiled.schedule.replace('/', '-')}-{compiled.tuning_record or 'build'}"
    manifest = export(compiled, directory)
    check_artifact(session, bound, directory, manifest)
    inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
    return artifact_ms(session, directory, manifest, inputs, REPEAT)


def report_target(root: Path, target: Target, device: Device) -> list[dict[str, Any]]:
    """Measure and print the table, write report.png and report.json next to the tasks."""
    check_device(target, device)
    rows: list[dict[str, Any]] = []
    curves: dict[str, list[float | None]] = {}
    with device.open() as session, tempfile.TemporaryDirectory(prefix="deploy-report-") as tmp:
        for directory in task_dirs(root, target):
            bound = task_bound(directory)
            times = trial_ms(directory, bound, target)
            label = f"{bound.op.name} {' '.join('x'.join(map(str, t.shape)) for t in bound.inputs)}"
            curves[label] = best_so_far(times)
            variants = _variants(bound, target, root)
            ms = {kind: _time_checked(session, bound, c, Path(tmp)) for kind, c in variants.items()}
            rows.append(
                {
                    "op": bound.op.name,
                    "task": directory.name,
                    "label": label,
                    "dtype": bound.inputs[0].dtype,
                    "trials": len(times),
                    "default_ms": ms.get("default"),
                    "hand_ms": ms["hand"],
                    "hand_schedule": variants["hand"].schedule,
                    "tuned_ms": ms.get("tuned"),
                    "tuned_record": variants["tuned"].tuning_record if "tuned" in variants else None,
                }
            )
    base = Path(root) / target.name
    tuning_db.write_json(base / JSON, {"target": target.name, "device": device.name, "rows": rows})
    plot_curves(curves, base / PNG, f"deploy tune --target {target.name} on {device.name}")
    print_report(rows, target, device, base / PNG)
    return rows


def plot_curves(curves: dict[str, list[float | None]], path: Path, title: str) -> None:
    """Best ms against trials, one line per task, log-scaled time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, curve in curves.items():
        points = [(i + 1, y) for i, y in enumerate(curve) if y is not None]
        if points:
            axes.plot(*zip(*points, strict=True), marker=".", label=label)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trials")
    axes.set_ylabel("best time so far (ms)")
    axes.set_yscale("log")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def print_report(rows: list[dict[str, Any]], target: Target, device: Device, png: Path) -> None:
    where = f"{device.name}{' (emulated: timings show correctness, not speed)' if device.emulated else ''}"
    table = Table(title=f"default vs hand vs tuned, target {target.name} on {where} (median ms)")
    for column in ("op", "shapes", "trials", "default", "hand", "tuned", "hand/tuned"):
        table.add_column(column)
    for r in rows:
        tuned = r["tuned_ms"]
        table.add_row(
            r["op"],
            r["label"].split(" ", 1)[1],
            str(r["trials"]),
            f"{r['default_ms']:.4g}" if r["default_ms"] is not None else "-",
            f"{r['hand_ms']:.4g}",
            f"{tuned:.4g}" if tuned is not None else "none accepted",
            f"{r['hand_ms'] / tuned:.2f}x" if tuned else "-",
        )
    console = Console()
    console.print(table)
    console.print(f"best time against trials: {png}", highlight=False)
