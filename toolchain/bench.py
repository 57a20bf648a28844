"""`deploy bench`: median time per op on a device against the device's memory roofline, with
numpy and (when installed) PyTorch on the host as baselines, all measured in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from devices import Device
from ops.spec import Op, TensorType, bind
from toolchain.cache import cached_build
from toolchain.compare import random_input
from toolchain.roofline import bytes_moved, copy_gbps, roofline_ms
from toolchain.targets import Target
from toolchain.timing import artifact_ms, host_ms
from toolchain.torch_baseline import torch_ms
from toolchain.verify import check_device, for_device


def bench_ops(
    ops: list[Op], dtype: str, target: Target, device: Device, repeat: int, fresh_roofline: bool = False
) -> list[dict[str, Any]]:
    """One row per op (its first case, in `dtype`): median ms; MB moved (inputs read once, output
    written once); GB/s; the roofline time (MB at the device's copy bandwidth) and how far from
    it; numpy and PyTorch ms on this host and our speed-up over each."""
    check_device(target, device)
    rows = []
    with device.open() as session:
        bandwidth = copy_gbps(session, target, device, fresh_roofline)
        for op in ops:
            if dtype not in op.dtypes:
                continue
            case = op.cases[0]
            bound = bind(op, case.attrs, [TensorType(s, dtype) for s in case.shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            directory, manifest = cached_build(bound, for_device(target, session))
            median_ms = artifact_ms(session, directory, manifest, inputs, repeat)
            moved = bytes_moved(inputs, bound.output)
            best_ms = roofline_ms(moved, bandwidth)
            numpy = host_ms(
                lambda op=op, bound=bound, inputs=inputs: op.reference(bound.attrs, *inputs), repeat
            )
            torch = torch_ms(op.name, bound.attrs, inputs, repeat)
            rows.append(
                {
                    "op": op.name,
                    "shapes": case.label(),
                    "dtype": dtype,
                    "schedule": manifest.schedule,
                    "median_ms": median_ms,
                    "mb_moved": moved / 1e6,
                    "gb_per_s": moved / (median_ms / 1e3) / 1e9,
                    "roofline_gb_per_s": bandwidth,
                    "roofline_ms": best_ms,
                    "x_roofline": median_ms / best_ms,
                    "numpy_ms": numpy,
                    "speedup_vs_numpy": numpy / median_ms,
                    "torch_ms": torch,
                    "speedup_vs_torch": torch / median_ms if torch is not None else None,
                    "emulated": device.emulated,
                }
            )
    return rows


def print_bench(rows: list[dict[str, Any]], target: str, device: Device) -> None:
    where = device.name
    if device.emulated:
        where += " (emulated: timings show correctness, not speed)"
    bandwidth = f"{rows[0]['roofline_gb_per_s']:.1f} GB/s" if rows else "-"
    table = Table(title=f"deploy bench --target {target} on {where}; copy roofline {bandwidth} (medians)")
    columns = ("op", "shapes", "schedule", "ms", "MB", "GB/s", "x roofline", "numpy ms", "vs numpy",
               "torch ms", "vs torch")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for r in rows:
        torch = r["torch_ms"]
        table.add_row(
            r["op"], r["shapes"], r["schedule"], f"{r['median_ms']:.3f}", f"{r['mb_moved']:.1f}",
            f"{r['gb_per_s']:.1f}", f"{r['x_roofline']:.2f}", f"{r['numpy_ms']:.3f}",
            f"{r['speedup_vs_numpy']:.1f}x", f"{torch:.3f}" if torch is not None else "-",
            f"{r['speedup_vs_torch']:.2f}x" if torch is not None else "-",
        )  # fmt: skip
    Console(width=max(Console().width, 150)).print(table)


def plot_bench(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Achieved GB/s per op against the copy roofline (a line), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    labels = [r["op"] for r in rows]
    axes.bar(labels, [r["gb_per_s"] for r in rows], color="tab:blue", label="achieved")
    if rows:
        axes.axhline(rows[0]["roofline_gb_per_s"], color="tab:red", linestyle="--", label="copy roofline")
    for index, r in enumerate(rows):
        axes.annotate(f"{r['x_roofline']:.2f}x", (index, r["gb_per_s"]), ha="center", va="bottom")
    axes.set_ylabel("GB/s (bytes moved / median time)")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
