"""Timing: an artifact on a device session, and a host function (numpy, PyTorch) as baseline."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devices import Session
from toolchain.manifest import Manifest
from toolchain.verify import run_artifact

TARGET_SECONDS = 0.2
"""Calls per timed run are chosen so one run lasts about this long."""


def host_ms(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of `fn()` on this host over `repeat` calls, after one untimed call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
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
