"""The memory-bandwidth roofline of a device: how fast it copies, measured with our own build.

A copy of COPY_BYTES (well beyond the last-level cache) is built for the target with its generic
schedule, checked, and timed on the device; bandwidth = bytes read + bytes written per second. A
memory-bound op can at best move its bytes at that rate. The figure is cached per target and
device in `roofline.json` of the cache root (`--fresh-roofline` measures again).
"""

from __future__ import annotations

import json
import tempfile
import time
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

COPY_BYTES = 64 << 20
REPEAT = 7


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


def bytes_moved(inputs: list[np.ndarray], out: TensorType) -> int:
    """Bytes a memory-bound op must move at least: every input read once, the output written once."""
    return sum(a.nbytes for a in inputs) + int(np.prod(out.shape)) * np.dtype(out.dtype).itemsize


def roofline_ms(moved: int, gb_per_s: float) -> float:
    """Milliseconds `moved` bytes take at the copy bandwidth `gb_per_s`."""
    return moved / (gb_per_s * 1e9) * 1e3


def _cache_file() -> Path:
    return cache_root() / "roofline.json"


def measure_copy_gbps(session: Session, target: Target, emulated: bool) -> float:
    """GB/s of a COPY_BYTES copy on the session (read + write bytes over the median time), after
    checking the copy returns its input."""
    size = (COPY_BYTES // 4) if not emulated else (4 << 20) // 4  # qemu: keep it short
    bound = bind(Copy(), {}, [TensorType((size,), "float32")])
    compiled = compile_scheduled(bound, target, *hand_schedule(bound, target))
    with tempfile.TemporaryDirectory(prefix="deploy-roofline-") as tmp:
        ms = check_and_time(session, compiled, Path(tmp), REPEAT).ms
    return 2 * size * 4 / (ms / 1e3) / 1e9


def copy_gbps(session: Session, target: Target, device: Device, fresh: bool = False) -> float:
    """The device's copy bandwidth for `target` modules, from the cache unless `fresh`."""
    path = _cache_file()
    key = f"{target.name}@{device.name}"
    try:
        cached = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        cached = {}
    if not fresh and key in cached:
        return float(cached[key]["gb_per_s"])
    gbps = measure_copy_gbps(session, target, device.emulated)
    cached[key] = {"gb_per_s": gbps, "bytes": COPY_BYTES, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json_atomically(path, cached)
    return gbps
