"""The memory-bandwidth roofline of a device: how fast it reads, writes and copies, measured with
our own builds.

Three kernels over BYTES (well beyond the last-level cache), each built for the target with its
generic schedule, checked against numpy and timed on the device, best of REPEAT runs after a
warm-up call (the best run is the one the rest of the machine disturbed least):
- write: a fill, `out[i] = x[0]`: BYTES written;
- read: a fold of FOLD rows, `out[j] = x[0, j] + ... + x[FOLD-1, j]`: BYTES read, BYTES/FOLD
  written (its write time at the write bandwidth is taken off);
- copy: `out = x`, BYTES read and written, the yardstick before the split.
An op's floor is bytes read / read bandwidth + bytes written / write bandwidth. The figures are
cached per target and device in `roofline.json` of the cache root (`--fresh-roofline` measures
again).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from base.files import write_json_atomically
from base.paths import cache_root
from devices import Device, Session
from ops.spec import Input, Op, TensorType, bind
from toolchain.build.compile import compile_scheduled, hand_schedule
from toolchain.build.targets import Target
from toolchain.verify.measure import check_and_time

BYTES = 64 << 20
EMULATED_BYTES = 4 << 20
"""qemu: keep it short (its figures say nothing about speed)."""
REPEAT = 7
FOLD = 16
"""Rows the read kernel sums: it writes 1/FOLD of what it reads, each row a contiguous stream."""


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
        """Milliseconds an op that reads and writes these bytes takes at best."""
        return (read_bytes / self.read + written_bytes / self.write) / 1e6

    def copy_ms(self, moved: int) -> float:
        """Milliseconds `moved` bytes take at the copy bandwidth (the copy-only yardstick)."""
        return moved / self.copy / 1e6


def read_bytes(inputs: list[np.ndarray]) -> int:
    """Bytes a memory-bound op must read at least: every input once."""
    return sum(a.nbytes for a in inputs)


def written_bytes(out: TensorType) -> int:
    """Bytes a memory-bound op must write at least: its output once."""
    return out.nbytes()


def _cache_file() -> Path:
    return cache_root() / "roofline.json"


def _best_ms(session: Session, target: Target, op: Op, shape: tuple[int, ...], workdir: Path) -> float:
    """The best of REPEAT timed runs (ms per call) of `op` on float32 `shape`, built with the
    target's generic schedule and checked against numpy first."""
    bound = bind(op, {}, [TensorType(shape, "float32")])
    compiled = compile_scheduled(bound, target, *hand_schedule(bound, target))
    return min(check_and_time(session, compiled, workdir, REPEAT).runs)


def roofline_bytes(emulated: bool, min_bytes: int = 0) -> int:
    """Bytes each bandwidth kernel streams: BYTES, or `min_bytes` when larger (a GPU's L2 holds
    tens of MB), a multiple of 4 * FOLD; EMULATED_BYTES on an emulator."""
    if emulated:
        return EMULATED_BYTES
    return max(BYTES, -(-min_bytes // (4 * FOLD)) * 4 * FOLD)


def measure_bandwidth(session: Session, target: Target, emulated: bool, min_bytes: int = 0) -> Bandwidth:
    """Read, write and copy bandwidth of the session's device for `target` modules, each kernel
    streaming `roofline_bytes`."""
    size = roofline_bytes(emulated, min_bytes) // 4
    with tempfile.TemporaryDirectory(prefix="deploy-roofline-") as tmp:
        fill_ms = _best_ms(session, target, Fill(size), (1,), Path(tmp))
        fold_ms = _best_ms(session, target, Fold(), (FOLD, size // FOLD), Path(tmp))
        copy_ms = _best_ms(session, target, Copy(), (size,), Path(tmp))
    total = size * 4
    write = total / fill_ms / 1e6
    reading_ms = fold_ms - total / FOLD / write / 1e6  # the fold's own writes at the write bandwidth
    read = total / (reading_ms if reading_ms > fold_ms / 2 else fold_ms) / 1e6
    return Bandwidth(read=read, write=write, copy=2 * total / copy_ms / 1e6)


def _entry_bytes(entry: dict[str, Any]) -> int:
    """Bytes a cached entry was measured over (0 when it does not say, as older deploys wrote)."""
    value = entry.get("bytes")
    return value if type(value) is int else 0


def bandwidth(
    session: Session, target: Target, device: Device, fresh: bool = False, min_bytes: int = 0
) -> Bandwidth:
    """The device's bandwidth for `target` modules, from the cache unless `fresh` (an entry
    without all three figures, as older deploys wrote, or measured over fewer bytes than
    `roofline_bytes` asks for now, is measured again)."""
    size = roofline_bytes(device.emulated, min_bytes)
    path = _cache_file()
    key = f"{target.name}@{device.name}"
    try:
        cached = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        cached = {}
    entry = cached.get(key)
    if not fresh and isinstance(entry, dict) and _entry_bytes(entry) >= size:
        try:
            return Bandwidth(**{k: float(entry[f"{k}_gb_per_s"]) for k in ("read", "write", "copy")})
        except (KeyError, TypeError, ValueError):
            pass
    measured = measure_bandwidth(session, target, device.emulated, min_bytes)
    cached[key] = {
        **{f"{k}_gb_per_s": v for k, v in asdict(measured).items()},
        "bytes": size,
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json_atomically(path, cached)
    return measured
