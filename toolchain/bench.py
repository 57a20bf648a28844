"""`deploy bench`: median time per op on a device, bytes moved, and numpy on the host as baseline."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from devices import Device, Session
from ops.spec import Op, TensorType, bind
from toolchain.cache import cached_build
from toolchain.compare import random_input
from toolchain.manifest import Manifest
from toolchain.verify import check_device, run_artifact

TARGET_SECONDS = 0.2
"""Calls per timed run are chosen so one run lasts about this long."""


def numpy_ms(op: Op, attrs: dict[str, Any], inputs: list[np.ndarray], repeat: int) -> float:
    """Median milliseconds of the op's numpy reference on this host over `repeat` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        op.reference(attrs, *inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def artifact_ms(
    session: Session, directory: Path, manifest: Manifest, inputs: list[np.ndarray], repeat: int
) -> float:
    """Median milliseconds per call of the artifact on the session over `repeat` timed runs, each
    averaging enough calls to last about TARGET_SECONDS (the first, untimed call loads it)."""
    start = time.perf_counter()
    run_artifact(session, directory, manifest, inputs)
    once = time.perf_counter() - start
    number = max(1, int(TARGET_SECONDS / max(once, 1e-6)))
    out = manifest.output
    module = manifest.check_module(directory)
    runs = session.time(module, inputs, tuple(out["shape"]), out["dtype"], number, repeat)
    return statistics.median(runs) * 1e3


def bench_ops(ops: list[Op], dtype: str, target: Any, device: Device, repeat: int) -> list[dict[str, Any]]:
    """One row per op (its first case, in `dtype`): median ms, MB moved, GB/s, numpy ms and ratio."""
    check_device(target, device)
    rows = []
    with device.open() as session:
        for op in ops:
            if dtype not in op.dtypes:
                continue
            case = op.cases[0]
            bound = bind(op, case.attrs, [TensorType(s, dtype) for s in case.shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            directory, manifest = cached_build(bound, target)
            median_ms = artifact_ms(session, directory, manifest, inputs, repeat)
            out = bound.output
            moved = sum(a.nbytes for a in inputs) + int(np.prod(out.shape)) * np.dtype(out.dtype).itemsize
            reference_ms = numpy_ms(op, bound.attrs, inputs, repeat)
            rows.append(
                {
                    "op": op.name,
                    "shapes": case.label(),
                    "dtype": dtype,
                    "schedule": manifest.schedule,
                    "median_ms": median_ms,
                    "mb_moved": moved / 1e6,
                    "gb_per_s": moved / (median_ms / 1e3) / 1e9,
                    "numpy_ms": reference_ms,
                    "speedup_vs_numpy": reference_ms / median_ms,
                    "emulated": device.emulated,
                }
            )
    return rows


def print_bench(rows: list[dict[str, Any]], target: str, device: Device) -> None:
    where = device.name
    if device.emulated:
        where += " (emulated: timings show correctness, not speed)"
    table = Table(title=f"deploy bench --target {target} on {where}")
    for column in ("op", "shapes", "schedule", "median ms", "MB", "GB/s", "numpy ms (host)", "vs numpy"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["op"], r["shapes"], r["schedule"], f"{r['median_ms']:.3f}", f"{r['mb_moved']:.1f}",
            f"{r['gb_per_s']:.2f}", f"{r['numpy_ms']:.3f}", f"{r['speedup_vs_numpy']:.2f}x",
        )  # fmt: skip
    Console().print(table)
