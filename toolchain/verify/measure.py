"""Measuring on a device: time an artifact (and a host function, the numpy and PyTorch
baselines), and the one way every room builds, checks against numpy and times a compiled op."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from base.errors import DeployError
from devices import Session
from ops.spec import BoundOp
from toolchain.build.compile import Compiled
from toolchain.build.export import export
from toolchain.build.manifest import Manifest
from toolchain.verify.compare import compare, random_input
from toolchain.verify.run import run_artifact

TARGET_SECONDS = 0.2
"""Calls per timed run are chosen so one run lasts about this long."""
REPEAT = 7
"""Timed runs per measurement; the median is reported."""


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


def check_artifact(session: Session, bound: BoundOp, directory: Path, manifest: Manifest) -> float:
    """Run the artifact of `bound` on seeded random inputs and on inputs full of ties; the
    largest error against numpy. A mismatch is a DeployError saying how it differs."""
    worst = 0.0
    for ties in (False, True):
        rng = np.random.default_rng(1)
        inputs = [random_input(t, rng, ties=ties) for t in bound.inputs]
        actual = run_artifact(session, directory, manifest, inputs)
        comparison = compare(np.asarray(bound.op.reference(bound.attrs, *inputs)), actual, bound.op.exact)
        if not comparison.ok:
            raise DeployError(f"{manifest.schedule} build differs from numpy: {comparison.detail}")
        worst = max(worst, comparison.max_error)
    return worst


@dataclass(frozen=True)
class Measured:
    """A compiled op checked against numpy and timed on a device."""

    max_error: float
    """Largest difference from numpy over random inputs and ties."""
    ms: float
    """Median milliseconds per call."""


def check_and_time(
    session: Session, compiled: Compiled, workdir: Path, repeat: int = REPEAT
) -> Measured:
    """Export `compiled` into a directory under `workdir`, check it against numpy on the session
    (a DeployError says how it differs), then time it on seeded random inputs: the median over
    `repeat` runs. Tuning, its report and the roofline all measure this way."""
    name = f"{compiled.schedule.replace('/', '-')}-{compiled.tuning_record or 'build'}-"
    directory = Path(tempfile.mkdtemp(prefix=name, dir=workdir))  # a fresh name: sessions cache by name
    manifest = export(compiled, directory)
    max_error = check_artifact(session, compiled.bound, directory, manifest)
    inputs = [random_input(t, np.random.default_rng(0)) for t in compiled.bound.inputs]
    return Measured(max_error, artifact_ms(session, directory, manifest, inputs, repeat))
