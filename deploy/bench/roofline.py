"""The memory-bandwidth roofline of a device: how fast it reads, writes and copies, measured with
our own builds.

Four kernels over BYTES (well beyond the last-level cache), each built for the target with its
generic schedule, checked against numpy and timed on the device:
- write: a fill, `out[i] = x[0]`: BYTES written (with streaming stores where the target has them,
  `deploy/compiler/streaming.py`, as a large output is);
- read: folds of 16 and of 4 rows (FOLDS), `out[j] = x[0, j] + ... + x[rows-1, j]`: BYTES
  read, BYTES/rows written; the faster read is the device's (a core reads fastest from a few
  streams on some CPUs, many on others, `bandwidth_from`);
- copy: `out = x`, BYTES read and written, the yardstick before the split.
An op's floor is the longer of bytes read / read bandwidth and bytes written / write bandwidth:
streaming stores go out beside the reads (measured: an add moves its bytes faster than the
sum of the two times would allow), so only the busier direction bounds it. `deploy bench` times each
op interleaved with the four kernels, one run of each per round, and takes the median of the
per-round ratios: this shared machine's bandwidth drifts between minutes, and a yardstick measured
minutes before the op could not follow it.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy.compiler.compile import compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.devices import Session
from deploy.ops.spec import Input, Op, TensorType, bind
from deploy.verify.measure import Timer, check, interleaved_runs, seeded_timer

BYTES = 64 << 20
EMULATED_BYTES = 4 << 20
"""qemu: keep it short (its figures say nothing about speed)."""
FOLDS = (16, 4)
"""Rows of each read kernel (a fold: it writes 1/rows of what it reads, each row a contiguous
stream); the read bandwidth is the faster fold's (`bandwidth_from`). Cores differ in how many
streams they draw most from: on a 2-core AMD EPYC (Zen 3) VM, one thread, folds of 2, 4, 8, 16
and 32 rows of 64 MB took 5.58, 4.80, 4.84, 5.83 and 8.34 ms (interleaved medians); on an
Intel Xeon (Emerald Rapids) VM 4 rows took 0.97 / 1.01x the time of 16 at 1 / 2 threads
(docs/performance.md)."""


class Copy(Op):
    """out = x, as a memory-bound kernel to measure bandwidth with (not a registered op)."""

    name = "copy"
    inputs = (Input("x"),)
    dtypes = ("float32",)
    exact = True

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: Any) -> Any:
        from tvm import te

        return te.compute(out.shape, lambda *i: x[i], name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x.copy()


class Fill(Op):
    """out[i] = x[0] for `size` elements: writes only (not a registered op)."""

    name = "fill"
    inputs = (Input("x"),)
    dtypes = ("float32",)
    exact = True

    def __init__(self, size: int) -> None:
        self.size = size

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return TensorType((self.size,), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: Any) -> Any:
        from tvm import te

        return te.compute(out.shape, lambda i: x[0], name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return np.full(self.size, x[0], dtype=x.dtype)


class Fold(Op):
    """out[j] = the sum over rows of x[:, j], left to right: reads all of x [rows, n], writes n
    (not a registered op)."""

    name = "fold"
    inputs = (Input("x", min_rank=2, max_rank=2),)
    dtypes = ("float32",)

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return TensorType(inputs[0].shape[1:], inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: Any) -> Any:
        from tvm import te

        rows = int(x.shape[0])
        return te.compute(out.shape, lambda j: sum((x[r, j] for r in range(1, rows)), x[0, j]), name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        total = x[0].copy()
        for row in x[1:]:
            total += row
        return total


@dataclass(frozen=True)
class Bandwidth:
    """A device's read, write and copy bandwidth (GB/s; copy counts the bytes read and written)."""

    read: float
    write: float
    copy: float

    def floor_ms(self, read_bytes: int, written_bytes: int) -> float:
        """Milliseconds an op that reads and writes these bytes takes at best: the longer of its
        reads and its writes, which overlap."""
        return max(read_bytes / self.read, written_bytes / self.write) / 1e6

    def copy_ms(self, moved: int) -> float:
        """Milliseconds `moved` bytes take at the copy bandwidth (the copy-only yardstick)."""
        return moved / self.copy / 1e6


def read_bytes(inputs: list[np.ndarray]) -> int:
    """Bytes a memory-bound op must read at least: every input once."""
    return sum(a.nbytes for a in inputs)


def written_bytes(out: TensorType) -> int:
    """Bytes a memory-bound op must write at least: its output once."""
    return out.nbytes()


def roofline_bytes(emulated: bool, min_bytes: int = 0) -> int:
    """Bytes each bandwidth kernel streams: BYTES, or `min_bytes` when larger (a GPU's L2 holds
    tens of MB), a multiple of 4 bytes times every fold's rows; EMULATED_BYTES on an emulator."""
    if emulated:
        return EMULATED_BYTES
    unit = 4 * math.lcm(*FOLDS)
    return max(BYTES, -(-min_bytes // unit) * unit)


def bandwidth_from(total: int, fill_ms: float, folds_ms: tuple[float, float], copy_ms: float) -> Bandwidth:
    """Read, write and copy bandwidth from one run of each kernel over `total` bytes (ms per
    call; `folds_ms` in the order of FOLDS). The read is the faster of the fold of 16, its few
    writes (1/16) taken off its time at the fill's write bandwidth, and the fold of 4 as timed:
    its writes (a quarter, max_pool2d k3 s2's mix) go out beside its reads by the floor's own rule
    (`Bandwidth.floor_ms`), so our kernel of that mix meets the floor."""
    write = total / fill_ms / 1e6
    many, few = folds_ms
    reading_ms = many - total / FOLDS[0] / write / 1e6
    read = total / min(reading_ms if reading_ms > many / 2 else many, few) / 1e6
    return Bandwidth(read=read, write=write, copy=2 * total / copy_ms / 1e6)


@dataclass(frozen=True)
class Beside:
    """An op's timed runs, each in the same round as one run of each bandwidth kernel, so that
    a ratio compares the op with the bandwidth of the same moment."""

    runs: tuple[float, ...]
    """Milliseconds per call of the op, one per round."""
    bandwidths: tuple[Bandwidth, ...]
    """The device's bandwidth in each round."""

    @property
    def ms(self) -> float:
        """Median milliseconds per call of the op."""
        return statistics.median(self.runs)

    @property
    def bandwidth(self) -> Bandwidth:
        """The median of each figure over the rounds."""
        return Bandwidth(
            *(statistics.median(getattr(b, k) for b in self.bandwidths) for k in ("read", "write", "copy"))
        )

    def x_floor(self, read: int, written: int) -> float:
        """Median over the rounds of the op's time over its floor in that round."""
        return self._per_round(lambda b: b.floor_ms(read, written))

    def x_copy(self, moved: int) -> float:
        """Median over the rounds of the op's time over `moved` bytes at that round's copy speed."""
        return self._per_round(lambda b: b.copy_ms(moved))

    def _per_round(self, yardstick_ms: Callable[[Bandwidth], float]) -> float:
        return statistics.median(
            ms / yardstick_ms(b) for ms, b in zip(self.runs, self.bandwidths, strict=True)
        )


@dataclass(frozen=True)
class Yardstick:
    """The fill, the folds (FOLDS) and the copy kernels, built for a target, checked against
    numpy and loaded on a session, each streaming `total` bytes."""

    timers: tuple[Timer, ...]
    total: int

    def beside(self, op: Timer, rounds: int) -> Beside:
        """`rounds` runs of `op`, interleaved with one run of each kernel per round."""
        fill, *folds, copy, runs = interleaved_runs([*self.timers, op], rounds)
        rounds_ms = zip(fill, zip(*folds, strict=True), copy, strict=True)
        return Beside(tuple(runs), tuple(bandwidth_from(self.total, *r) for r in rounds_ms))


@contextmanager
def yardstick(
    session: Session, target: Target, options: BuildOptions, emulated: bool, min_bytes: int = 0
) -> Iterator[Yardstick]:
    """The bandwidth kernels over `roofline_bytes`, built with the target's generic schedule
    (and `options`) and checked against numpy on the session, for as long as the context lasts."""
    size = roofline_bytes(emulated, min_bytes) // 4
    folds = ((Fold(), (rows, size // rows)) for rows in FOLDS)
    kernels = ((Fill(size), (1,)), *folds, (Copy(), (size,)))
    with tempfile.TemporaryDirectory(prefix="deploy-roofline-") as tmp:
        timers = []
        for op, shape in kernels:
            bound = bind(op, {}, [TensorType(shape, "float32")])
            compiled = compile_scheduled(bound, target, options, *hand_schedule(bound, target, options))
            timers.append(seeded_timer(session, check(session, compiled, Path(tmp))))
        yield Yardstick(tuple(timers), size * 4)
