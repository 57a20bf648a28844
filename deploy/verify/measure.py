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

from deploy.base.errors import DeployError
from deploy.base.files import name_part
from deploy.compiler.cache import Buildable
from deploy.compiler.compile import Compiled, CompiledGraph
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.devices import Session
from deploy.verify.compare import INPUT_SETS, random_input
from deploy.verify.run import Expected, against, expected_of, run_artifact

TARGET_SECONDS = 0.2
"""Calls per timed run are chosen so one run lasts about this long."""
REPEAT = 7
"""Timed runs per measurement; the median is reported."""


class WrongAnswer(DeployError):
    """An artifact's output differs from numpy: a failed check (exit 1), never a time."""


HOST_RUN_SECONDS = 0.02
"""A timed run of a host function calls it enough times to last about this long."""


def host_ms(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds per call of `fn()` on this host over `repeat` runs, after one untimed
    call; a run averages as many calls as last about HOST_RUN_SECONDS (one of a slow `fn`), as
    an artifact's timed run does, so a call of microseconds in cache is timed warm like ours."""
    start = time.perf_counter()
    fn()
    number = calls_lasting(HOST_RUN_SECONDS, time.perf_counter() - start)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times) * 1e3


def calls_lasting(seconds: float, once: float) -> int:
    """How many calls of something that took `once` seconds make a timed run of about `seconds`."""
    return max(1, int(seconds / max(once, 1e-6)))


class Timer:
    """Times one artifact on a session: a first untimed call loads it and sets how many calls
    one timed run averages (enough to last about TARGET_SECONDS). Given the `item` it was built
    from, that call's output is checked against numpy (a WrongAnswer when it differs; its
    largest error is `max_error`), so a time is never reported for a wrong answer."""

    def __init__(
        self, session: Session, directory: Path, manifest: Manifest, inputs: list[np.ndarray],
        item: Buildable | None = None,
    ) -> None:  # fmt: skip
        start = time.perf_counter()
        outputs = run_artifact(session, directory, manifest, inputs)
        once = time.perf_counter() - start
        self.max_error = None if item is None else max_error(item, inputs, outputs, manifest)
        self.number = calls_lasting(TARGET_SECONDS, once)
        self.session, self.inputs = session, inputs
        self.module = manifest.check_module(directory)
        shapes = [a.shape for a in inputs]
        self.outputs = [(t.shape, t.dtype) for t in manifest.output_types(shapes)]
        self.entry = manifest.entry
        self.workspace = manifest.arena_bytes(shapes)

    def runs(self, repeat: int) -> list[float]:
        """`repeat` timed runs, milliseconds per call."""
        runs = self.session.time(
            self.module, self.inputs, self.outputs, self.number, repeat, entry=self.entry,
            workspace=self.workspace,
        )  # fmt: skip
        return [t * 1e3 for t in runs]


class Answers:
    """Numpy's answers for one item (an op or a graph) on the seeded input sets `check_artifact`
    runs (INPUT_SETS: random, ties, NaN and infinities), drawn and computed on first use: checking
    several builds of one item (a search's contenders, a report's variants, every structure a
    search may pick) with one of these runs the reference once an input set, not again for each
    build. It holds every set's inputs and expected outputs while it lives (at 8x64x112x112
    float32, some hundreds of MB)."""

    def __init__(self, item: Buildable) -> None:
        self.item = item
        self._sets: list[tuple[list[np.ndarray], Expected]] | None = None

    def of(self, item: Buildable) -> Answers:
        """These answers, which must be `item`'s (a ValueError otherwise: a caller's mistake)."""
        if item is not self.item and item != self.item:
            raise ValueError(f"answers for {_described(self.item)} asked of {_described(item)}")
        return self

    def sets(self) -> list[tuple[list[np.ndarray], Expected]]:
        """Per input set: its inputs (each drawn from a generator seeded 1) and what is expected.
        The reference runs on copies: one that wrote into its inputs would change what the
        builds run on after it."""
        if self._sets is None:
            sets, types = [], self.item.inputs
            for kind in INPUT_SETS:
                rng = np.random.default_rng(1)
                inputs = [random_input(t, rng, ties=kind.ties, specials=kind.specials) for t in types]
                sets.append((inputs, expected_of(self.item, [a.copy() for a in inputs])))
            self._sets = sets
        return self._sets


def _described(item: Buildable) -> str:
    """`add (7x13:float32, 7x13:float32)`: an item's name and input types, for a message."""
    return f"{item.name} ({', '.join(map(str, item.inputs))})"


def check_artifact(
    session: Session, bound: Buildable, directory: Path, manifest: Manifest, answers: Answers | None = None
) -> float:
    """Run the artifact of `bound` (an op or a graph) on seeded random inputs, on inputs full of
    ties and on inputs with NaN, infinities and repeated maxima planted (a tuned schedule must
    keep numpy's special cases too): the input sets of `answers` (drawn here when None); the
    largest error against numpy. A mismatch is a WrongAnswer saying how it differs."""
    worst = 0.0
    for inputs, expected in (Answers(bound) if answers is None else answers.of(bound)).sets():
        outputs = run_artifact(session, directory, manifest, inputs)
        worst = max(worst, compared(bound, expected, outputs, manifest))
    return worst


def max_error(
    item: Buildable, inputs: list[np.ndarray], outputs: list[np.ndarray], manifest: Manifest
) -> float:
    """The largest difference of `outputs` (of the artifact of `item` `manifest` describes, run on
    `inputs`) from the numpy reference; a WrongAnswer saying how it differs when it does."""
    return compared(item, expected_of(item, inputs), outputs, manifest)


def compared(item: Buildable, expected: Expected, outputs: list[np.ndarray], manifest: Manifest) -> float:
    """The largest difference of `outputs` from `expected`; a WrongAnswer saying how they differ."""
    comparison = against(item, expected, outputs)
    if not comparison.ok:
        raise WrongAnswer(f"{manifest.schedule} build of {item.name} differs from numpy: {comparison.detail}")
    return comparison.max_error


@dataclass(frozen=True)
class Checked:
    """A compiled op exported to `directory` and checked against numpy on a session."""

    compiled: Compiled | CompiledGraph
    directory: Path
    manifest: Manifest
    max_error: float
    """Largest difference from numpy over random inputs, ties and planted NaN and infinities."""


def check(
    session: Session, compiled: Compiled | CompiledGraph, workdir: Path, answers: Answers | None = None
) -> Checked:
    """Export `compiled` into a fresh directory under `workdir` and check it against numpy on the
    session (`answers`, where the caller checks several builds of one item); a WrongAnswer says
    how it differs."""
    name = f"{name_part(compiled.item.name)}-{name_part(compiled.schedule, 80)}-"
    directory = Path(tempfile.mkdtemp(prefix=name, dir=workdir))  # a fresh name: sessions cache by name
    manifest = export(compiled, directory)
    max_error = check_artifact(session, compiled.item, directory, manifest, answers)
    return Checked(compiled, directory, manifest, max_error)


@dataclass(frozen=True)
class Measured:
    """A compiled op checked against numpy and timed on a device."""

    max_error: float
    """Largest difference from numpy over random inputs, ties and planted NaN and infinities."""
    runs: tuple[float, ...]
    """Milliseconds per call of each timed run."""

    @property
    def ms(self) -> float:
        """Median milliseconds per call."""
        return statistics.median(self.runs)

    @property
    def spread(self) -> float:
        """Interquartile range of the runs (ms): how far apart the middle half of them lie."""
        if len(self.runs) < 2:
            return 0.0
        low, _, high = statistics.quantiles(self.runs, n=4, method="inclusive")
        return high - low

    def beats(self, other: Measured) -> bool:
        """Faster than `other` by more than the spread of either: a win that noise does not explain."""
        return other.ms - self.ms > max(self.spread, other.spread)


def interleaved_runs(timers: list[Timer], rounds: int) -> list[list[float]]:
    """Milliseconds per call of one run of each timer per round, per timer in round order, so
    that drift of the device (bandwidth, clocks, other load) falls on all of them alike; each
    round starts one timer later than the one before, so that none is always timed first."""
    runs: list[list[float]] = [[] for _ in timers]
    for round_ in range(rounds):
        for index in range(len(timers)):
            turn = (index + round_) % len(timers)
            runs[turn] += timers[turn].runs(1)
    return runs


def seeded_timer(session: Session, checked: Checked) -> Timer:
    """A timer of a checked artifact on seeded random inputs."""
    inputs = [random_input(t, np.random.default_rng(0)) for t in checked.compiled.item.inputs]
    return Timer(session, checked.directory, checked.manifest, inputs)


def time_interleaved(session: Session, checked: list[Checked], rounds: int) -> list[Measured]:
    """Time every checked artifact on seeded random inputs, interleaved (`interleaved_runs`)."""
    runs = interleaved_runs([seeded_timer(session, item) for item in checked], rounds)
    return [Measured(item.max_error, tuple(times)) for item, times in zip(checked, runs, strict=True)]


def check_and_time(
    session: Session,
    compiled: Compiled | CompiledGraph,
    workdir: Path,
    repeat: int = REPEAT,
    answers: Answers | None = None,
) -> Measured:
    """Export `compiled` under `workdir`, check it against numpy on the session (a WrongAnswer
    says how it differs; on `answers` where the caller checks several builds of one item), then
    time it: `repeat` runs. Work-group tuning and the bench scripts measure this way
    (`time_interleaved` when variants are compared)."""
    return time_interleaved(session, [check(session, compiled, workdir, answers)], repeat)[0]
