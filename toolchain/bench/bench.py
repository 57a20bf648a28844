"""`deploy bench`: median time per op (or per model) on a device against the device's memory
roofline, with numpy and (when installed) PyTorch on the host as baselines, all measured in the
same run."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from devices import Device, Session
from ops.graph import BoundGraph
from ops.spec import Op, TensorType, bind, symbols_of
from toolchain.bench.roofline import bytes_moved, copy_gbps, roofline_ms
from toolchain.bench.torch_baseline import torch_graph_ms, torch_ms
from toolchain.build.cache import Buildable, cached_build
from toolchain.build.targets import Target
from toolchain.verify.compare import random_input
from toolchain.verify.measure import artifact_ms, host_ms
from toolchain.verify.run import check_device, for_device


def bench_ops(
    ops: list[Op], dtype: str, target: Target, device: Device, repeat: int, fresh_roofline: bool = False
) -> list[dict[str, Any]]:
    """One row per op (its first case, in `dtype`): see `measure_row`."""
    check_device(target, device)
    with device.open() as session:
        bandwidth = copy_gbps(session, target, device, fresh_roofline)
        rows = []
        for op in ops:
            case = op.cases[0]
            bound = bind(op, case.attrs, [TensorType(s, dtype) for s in case.shapes])
            torch = functools.partial(torch_ms, op.name, bound.attrs)
            for sizes, at in batches(bound.inputs):
                label = case.label() + at
                rows.append(
                    measure_row(session, bound, label, target, device, bandwidth, repeat, torch, sizes)
                )
    return rows


BENCH_BATCHES = (1, 32)
"""The sizes a symbolic batch is timed at, each from the same module: one row per size."""


def batches(types: tuple[TensorType, ...]) -> list[tuple[dict[str, int], str]]:
    """(sizes of the symbolic batch, how a row's label says it) per row: one row for static
    shapes, one per size of BENCH_BATCHES for a symbolic batch."""
    symbols = symbols_of(types)
    if not symbols:
        return [({}, "")]
    return [(dict.fromkeys(symbols, size), f" ({', '.join(symbols)}={size})") for size in BENCH_BATCHES]


def bench_model(
    graph: BoundGraph, target: Target, device: Device, repeat: int, fresh_roofline: bool = False
) -> list[dict[str, Any]]:
    """One row for the model's graph as a whole (its kernels run in one call), one per size of
    BENCH_BATCHES when its batch is symbolic: see `measure_row`; its roofline counts the bytes the
    fused graph must move, its inputs and its output once."""
    check_device(target, device)
    with device.open() as session:
        bandwidth = copy_gbps(session, target, device, fresh_roofline)
        torch = functools.partial(torch_graph_ms, graph)
        rows = []
        for sizes, at in batches(graph.inputs):
            label = " ".join(str(t.at(sizes)).split(":")[0] for t in graph.inputs) + at
            rows.append(measure_row(session, graph, label, target, device, bandwidth, repeat, torch, sizes))
        return rows


def measure_row(
    session: Session, item: Buildable, label: str, target: Target, device: Device, bandwidth: float,
    repeat: int, torch: Callable[[list[np.ndarray], int], float | None], sizes: dict[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Median ms of an op or a graph on seeded random inputs (a symbolic batch of the size in
    `sizes`); MB moved (inputs read once, output written once); GB/s; the roofline time (MB at
    the device's copy bandwidth) and how far from it; numpy and PyTorch (`torch(inputs,
    repeat)`) ms on this host and our speed-up over each."""
    sizes = sizes or {}
    inputs = [random_input(t.at(sizes), np.random.default_rng(0)) for t in item.inputs]
    directory, manifest = cached_build(item, for_device(target, session))
    median_ms = artifact_ms(session, directory, manifest, inputs, repeat)
    moved = bytes_moved(inputs, item.output.at(sizes))
    best_ms = roofline_ms(moved, bandwidth)
    numpy = host_ms(lambda: item.reference(*inputs), repeat)
    torch_time = torch(inputs, repeat)
    return {
        "op": item.name,
        "shapes": label,
        "dtype": item.inputs[0].dtype if item.inputs else item.output.dtype,
        "schedule": manifest.schedule,
        "median_ms": median_ms,
        "mb_moved": moved / 1e6,
        "gb_per_s": moved / (median_ms / 1e3) / 1e9,
        "roofline_gb_per_s": bandwidth,
        "roofline_ms": best_ms,
        "x_roofline": median_ms / best_ms,
        "numpy_ms": numpy,
        "speedup_vs_numpy": numpy / median_ms,
        "torch_ms": torch_time,
        "speedup_vs_torch": torch_time / median_ms if torch_time is not None else None,
        "emulated": device.emulated,
    }
