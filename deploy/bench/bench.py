"""`deploy bench`: median time per op (or per model) on a device against the device's memory
roofline, with numpy, onnxruntime and (when installed) PyTorch on the host as baselines, all
measured in the same run."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy.base.errors import DeployError, UsageError, reason
from deploy.bench.onnxruntime_baseline import onnxruntime_ms
from deploy.bench.roofline import Yardstick, read_bytes, written_bytes, yardstick
from deploy.bench.torch_baseline import torch_ms
from deploy.compiler.cache import Buildable, cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target
from deploy.devices import Device, Session
from deploy.ops.graph import BoundGraph
from deploy.ops.spec import BoundOp, Case, Op, TensorType, batch_sizes, bind, sizes_text
from deploy.verify.compare import random_input
from deploy.verify.measure import Timer, WrongAnswer, host_ms
from deploy.verify.run import against, check_device, expected_of


@dataclass(frozen=True)
class BenchOptions:
    """How `deploy bench` measures."""

    repeat: int = 5
    """Rounds: a timed run of the op and one of each bandwidth kernel; rows give medians."""
    min_bytes: int = 0
    """Bench cases grow until they move this many bytes, and the roofline streams as many."""
    baselines: bool = True
    """Time numpy, onnxruntime and PyTorch on the host too (at GB sizes numpy takes seconds a call)."""
    single: bool = True
    """Beside each op's bench case, a row at batch 1 (in cache: how an edge device calls it)."""


Progress = Callable[[str, int, int], None]
"""Told (row label, rows done, rows in all) as each row starts: `deploy bench` shows it on a terminal."""


def _quiet(label: str, done: int, total: int) -> None:
    """A Progress that shows nothing."""


def bench_ops(
    ops: list[Op], dtype: str, target: Target, build: BuildOptions, device: Device,
    options: BenchOptions, progress: Progress = _quiet,
) -> list[dict[str, Any]]:  # fmt: skip
    """Rows per op (its bench case, in `dtype`, grown to move at least `options.min_bytes`, then
    that case at batch 1, `batch_1` in its row; on an emulator its first, small case), built
    with `build` for the device: see `measure_row`. Every case is bound before the device is
    touched, so a case that cannot grow is refused first."""
    check_device(target, device)
    planned = [row for op in ops for row in plan_rows(op, dtype, options, device.emulated)]
    with device.open() as session, _yardstick(session, target, build, device, options) as stick:
        rows = []
        for index, (bound, label, sizes, in_cache) in enumerate(planned):
            progress(f"{bound.op.name} {label}", index, len(planned))
            row = measure_row(session, bound, label, target, build, device, stick, options, sizes)
            rows.append(row | {"batch_1": in_cache})
    return rows


def plan_rows(
    op: Op, dtype: str, options: BenchOptions, emulated: bool
) -> list[tuple[BoundOp, str, dict[str, int], bool]]:
    """(bound op, row label, symbolic sizes, whether at batch 1) of each row `bench_ops` measures
    for `op`: its bench case (`sized_case`), then that case with its batch inputs at 1
    (`Case.batch_inputs`: the data, not a weight)."""
    case, bound = sized_case(op, dtype, options.min_bytes, emulated)
    rows = [(bound, case.label() + at, sizes, False) for sizes, at in batches(bound.inputs)]
    base = op.bench_case()
    single = base.single(base.batch_inputs(op))
    if options.single and not emulated and single != base:
        rows.append((bind_case(op, single, dtype), f"{single.label()} (batch 1)", {}, True))
    return rows


def _yardstick(
    session: Session, target: Target, build: BuildOptions, device: Device, options: BenchOptions
) -> AbstractContextManager[Yardstick]:
    """The bandwidth kernels for the session's device (built for its cores, as the ops are)."""
    return yardstick(session, target, for_device(build, session), device.emulated, options.min_bytes)


def sized_case(op: Op, dtype: str, min_bytes: int, emulated: bool) -> tuple[Case, BoundOp]:
    """The op's bench case, bound in `dtype` (an emulator: its first case, speed is not the point
    there), grown along its batch inputs (`Case.batched`, `Case.batch_inputs`) until it moves at
    least `min_bytes` (a device whose last-level
    cache holds the case would otherwise time its cache); a case that cannot grow that far is a
    UsageError."""
    base = op.cases[0] if emulated else op.bench_case()
    case, bound = base, bind_case(op, base, dtype)
    if emulated or base.symbolic:
        return case, bound
    factor, batch = 1, base.batch_inputs(op)
    while moved_bytes(bound) < min_bytes:  # each round at least doubles the factor
        factor *= -(-min_bytes // moved_bytes(bound))
        case = base.batched(factor, batch)
        if case == base:
            raise UsageError(
                f"--min-mb {min_bytes // 10**6}: {op.name}'s bench case {base.label()} has no batch dim"
                " to grow (its inputs' leading dims are 1)"
            )
        try:
            bound = bind_case(op, case, dtype)
        except UsageError as error:
            raise UsageError(
                f"--min-mb {min_bytes // 10**6}: {op.name} grown to {case.label()}: {error}"
            ) from None
    return case, bound


def bind_case(op: Op, case: Case, dtype: str) -> BoundOp:
    return bind(op, case.attrs, [TensorType(s, dtype) for s in case.shapes])


def moved_bytes(bound: BoundOp) -> int:
    """Bytes an op moves at least: every input read once and its output written once."""
    return sum(t.nbytes() for t in bound.inputs) + written_bytes(bound.output)


BENCH_BATCHES = (1, 32)
"""The sizes a symbolic batch is timed at, each from the same module: one row per size."""


def batches(types: tuple[TensorType, ...]) -> list[tuple[dict[str, int], str]]:
    """(sizes of the symbolic batch, how a row's label says it) per row: one row for static
    shapes, one per size of BENCH_BATCHES for a symbolic batch."""
    return [
        (sizes, f" ({sizes_text(sizes)})" if sizes else "") for sizes in batch_sizes(types, BENCH_BATCHES)
    ]


def bench_model(
    graph: BoundGraph, target: Target, build: BuildOptions, device: Device, options: BenchOptions,
    progress: Progress = _quiet,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row for the model's graph as a whole (its kernels run in one call), one per size of
    BENCH_BATCHES when its batch is symbolic: see `measure_row`; its roofline counts the bytes the
    fused graph must move, its inputs and its output once."""
    check_device(target, device)
    with device.open() as session, _yardstick(session, target, build, device, options) as stick:
        rows = []
        planned = batches(graph.inputs)
        for index, (sizes, at) in enumerate(planned):
            label = " ".join(str(t.at(sizes)).split(":")[0] for t in graph.inputs) + at
            progress(f"{graph.name} {label}", index, len(planned))
            rows.append(measure_row(session, graph, label, target, build, device, stick, options, sizes))
        return rows


def numpy_ms(item: Buildable, inputs: list[np.ndarray], repeat: int) -> float | None:
    """Median ms per call of the item's numpy baseline (`Op.numpy_baseline`: its reference unless
    the op names a faster one) on this host, checked against the reference first (a baseline
    computing something else is a UsageError naming the op); None where it has none (n/a)."""
    with np.errstate(invalid="ignore", over="ignore"):
        found = item.baselines(*inputs)
        if found is None:
            return None
        comparison = against(item, expected_of(item, inputs), found)
    if not comparison.ok:
        raise UsageError(f"{item.name}: its numpy_baseline differs from its reference: {comparison.detail}")
    return host_ms(lambda: item.baselines(*inputs), repeat)


TIMED = ("median_ms", "max_error", "gb_per_s", "yardstick_mb", "read_gb_per_s", "write_gb_per_s",
         "floor_ms", "x_floor", "roofline_gb_per_s", "roofline_ms", "x_roofline", "numpy_ms", "numpy_na",
         "speedup_vs_numpy", "onnxruntime_ms", "speedup_vs_onnxruntime", "torch_ms", "torch_preallocated",
         "speedup_vs_torch")  # fmt: skip
"""A row's figures that only a right answer gets."""


def refuse_wrong_answers(rows: list[dict[str, Any]]) -> None:
    """A failed check (DeployError, exit 1) counting the rows whose artifact gave a wrong answer
    and saying how the first differs; called once the rows are shown, so the others' figures are
    not lost to one wrong kernel."""
    wrong = [r for r in rows if r["wrong_answer"]]
    if wrong:
        first = wrong[0]["wrong_answer"]
        raise DeployError(f"{len(wrong)} of {len(rows)} rows gave a wrong answer, no time; first: {first}")


def measure_row(
    session: Session, item: Buildable, label: str, target: Target, build: BuildOptions, device: Device,
    stick: Yardstick, options: BenchOptions, sizes: dict[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Median ms of an op or a graph (built with `build` for the session's device) on seeded
    random inputs (a symbolic batch of the size in `sizes`), timed interleaved with the
    bandwidth kernels of `stick`; MB moved (inputs and a graph's constants read once, outputs
    written once); GB/s; the median bandwidths; the floor (the longer of bytes read at the read
    bandwidth and bytes written at the write bandwidth) and the median over rounds of the time over it, and
    the same against the copy bandwidth alone; numpy, onnxruntime and PyTorch ms on this host
    (`onnxruntime_ms`, `torch_ms`) and our speed-up over each. An artifact whose answer differs
    from numpy gets no time: its row says how it differs (`wrong_answer`) and its TIMED figures
    are None, so the other rows are still measured."""
    sizes = sizes or {}
    inputs = [random_input(t.at(sizes), np.random.default_rng(0)) for t in item.inputs]
    directory, manifest = cached_build(item, target, for_device(build, session))
    read = read_bytes(inputs) + sum(len(c.data) for c in item.constants)  # a graph's constants are read too
    written = sum(written_bytes(t.at(sizes)) for t in item.outputs)
    moved = read + written
    row: dict[str, Any] = {
        "op": item.name,
        "shapes": label,
        "dtype": item.inputs[0].dtype if item.inputs else item.outputs[0].dtype,
        "schedule": manifest.schedule,
        "mb_moved": moved / 1e6,
        "emulated": device.emulated,
    }
    try:
        timer = Timer(session, directory, manifest, inputs, item)  # checked against numpy first
    except WrongAnswer as exc:
        return row | dict.fromkeys(TIMED, None) | {"wrong_answer": reason(exc)}
    beside = stick.beside(timer, options.repeat)
    median_ms, roof = beside.ms, beside.bandwidth
    numpy = numpy_ms(item, inputs, options.repeat) if options.baselines else None
    ort = onnxruntime_ms(item, inputs, options.repeat) if options.baselines else None
    torch = torch_ms(item, inputs, options.repeat) if options.baselines else None
    return row | {
        "wrong_answer": None,
        "median_ms": median_ms,
        "max_error": timer.max_error,
        "gb_per_s": moved / (median_ms / 1e3) / 1e9,
        "yardstick_mb": stick.total / 1e6,
        "read_gb_per_s": roof.read,
        "write_gb_per_s": roof.write,
        "floor_ms": roof.floor_ms(read, written),
        "x_floor": beside.x_floor(read, written),
        "roofline_gb_per_s": roof.copy,
        "roofline_ms": roof.copy_ms(moved),
        "x_roofline": beside.x_copy(moved),
        "numpy_ms": numpy,
        "numpy_na": options.baselines and numpy is None,
        "speedup_vs_numpy": None if numpy is None else numpy / median_ms,
        "onnxruntime_ms": ort,
        "speedup_vs_onnxruntime": None if ort is None else ort / median_ms,
        "torch_ms": None if torch is None else torch.ms,
        "torch_preallocated": None if torch is None else torch.preallocated,
        "speedup_vs_torch": None if torch is None else torch.ms / median_ms,
    }
