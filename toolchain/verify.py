"""Verification of built ops against their numpy references on a device.

`deploy test` runs the op x dtype x case matrix; `deploy run --check` one case with user data.
"""

from __future__ import annotations

import collections
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices import Device, DeviceLost, Session
from devices.elf import check_machine
from ops.errors import DeployError, UsageError, first_line
from ops.spec import BoundOp, Case, Op, TensorType, bind
from toolchain.cache import cached_build
from toolchain.compare import Comparison, compare, random_input
from toolchain.manifest import Manifest
from toolchain.targets import Target


def check_device(target: Target, device: Device) -> None:
    """The device can run `target`'s modules: same architecture, and the CPU features they use."""
    if device.arch != target.arch:
        raise UsageError(
            f"target {target.name} builds {target.arch} modules; device {device.name} runs {device.arch}"
        )
    missing = target.missing_cpu_flags() if device.name == "local" else []
    if missing:
        raise UsageError(f"target {target.name} needs CPU features this host lacks: {', '.join(missing)}")


def run_artifact(
    session: Session, directory: Path, manifest: Manifest, inputs: list[np.ndarray]
) -> np.ndarray:
    """Check the module (sha256 against the manifest, ELF machine against the device), run it."""
    module = manifest.check_module(directory)
    if module.suffix == ".so":
        check_machine(module, session.arch, session.label)
    elif manifest.arch != session.arch:
        raise UsageError(f"artifact {directory} is for {manifest.arch}; {session.label} runs {session.arch}")
    out = manifest.output
    return session.run(module, inputs, tuple(out["shape"]), out["dtype"])


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
class CaseResult:
    op: str
    dtype: str
    case: str
    ok: bool
    max_error: float
    detail: str
    schedule: str


@dataclass(frozen=True)
class PlannedCase:
    op: Op
    dtype: str
    case: Case
    index: int

    def bind(self) -> BoundOp:
        return bind(self.op, self.case.attrs, [TensorType(s, self.dtype) for s in self.case.shapes])


def plan(ops: Iterable[Op], dtypes: Iterable[str] | None = None) -> list[PlannedCase]:
    """Every (op, dtype, case) to verify; `dtypes` limits the dtypes."""
    wanted = set(dtypes) if dtypes else None
    return [
        PlannedCase(op, dtype, case, index)
        for op in ops
        for dtype in op.dtypes
        if wanted is None or dtype in wanted
        for index, case in enumerate(op.cases)
    ]


def for_device(target: Target, session: Session) -> Target:
    """`target` building for the session's device: split for its cores, unless --cores said."""
    cores = session.cores() if target.cores is None else None
    return target.with_cores(cores)


def verify(
    session: Session, bound: BoundOp, target: Target, inputs: list[np.ndarray]
) -> tuple[Comparison, str]:
    """Build (cached, for the session's device), run on the session, compare with the reference;
    with the schedule name."""
    directory, manifest = cached_build(bound, for_device(target, session))
    actual = run_artifact(session, directory, manifest, inputs)
    with np.errstate(invalid="ignore", over="ignore"):  # inputs may hold NaN and infinities
        expected = bound.op.reference(bound.attrs, *inputs)
    return compare(np.asarray(expected), actual, bound.op.exact), manifest.schedule


def verify_case(session: Session, planned: PlannedCase, target: Target, specials: bool = False) -> CaseResult:
    """Build and run one planned case on seeded random inputs (every other case rounded so ties
    abound; with `specials`, NaN, infinities and repeated maxima planted); compare with numpy."""
    seed = zlib.crc32(f"{planned.op.name}/{planned.dtype}/{planned.index}".encode())
    rng = np.random.default_rng(seed)
    label = planned.case.label()
    try:
        bound = planned.bind()
        inputs = [random_input(t, rng, ties=planned.index % 2 == 1, specials=specials) for t in bound.inputs]
        comparison, schedule = verify(session, bound, target, inputs)
    except DeviceLost:
        raise
    except DeployError as exc:
        return CaseResult(planned.op.name, planned.dtype, label, False, float("inf"), str(exc), "-")
    except Exception as exc:  # a compiler or runtime failure fails this case, not the matrix
        detail = f"{type(exc).__name__}: {first_line(str(exc))}"
        return CaseResult(planned.op.name, planned.dtype, label, False, float("inf"), detail, "-")
    return CaseResult(
        planned.op.name,
        planned.dtype,
        label,
        comparison.ok,
        comparison.max_error,
        comparison.detail,
        schedule,
    )


class _Queue:
    """Cases still to run, shared by the workers; a case whose device was lost goes back in front."""

    def __init__(self, planned: list[PlannedCase]) -> None:
        self._cases = collections.deque(enumerate(planned))
        self._lock = threading.Lock()

    def pop(self) -> tuple[int, PlannedCase] | None:
        with self._lock:
            return self._cases.popleft() if self._cases else None

    def put_back(self, item: tuple[int, PlannedCase]) -> None:
        with self._lock:
            self._cases.appendleft(item)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cases)


def run_matrix(
    planned: list[PlannedCase],
    target: Target,
    device: Device,
    on_result: Callable[[CaseResult, str], None] = lambda r, worker: None,
    on_lost: Callable[[DeviceLost], None] = lambda e: None,
    workers: int = 1,
) -> list[CaseResult]:
    """Verify the cases on `workers` sessions of `device` at once (e.g. the free servers of a
    tracker key), in the order planned. A worker whose device is lost reports it, puts its case
    back for the others, and opens a fresh session once; a second loss in a row retires it. When
    every worker is retired with cases left, the last loss ends the run."""
    check_device(target, device)
    queue = _Queue(planned)
    results: dict[int, CaseResult] = {}
    losses: list[DeviceLost] = []
    report = threading.Lock()

    def work(worker: str) -> None:
        lost_in_a_row = 0
        while lost_in_a_row < 2 and len(queue):
            try:
                with device.open() as session:
                    while (item := queue.pop()) is not None:
                        try:
                            result = verify_case(session, item[1], target)
                        except DeviceLost:
                            queue.put_back(item)
                            raise
                        lost_in_a_row = 0
                        with report:
                            results[item[0]] = result
                            on_result(result, worker)
            except DeviceLost as lost:
                lost_in_a_row += 1
                with report:
                    losses.append(lost)
                    on_lost(lost)

    names = [f"#{n + 1}" for n in range(max(1, workers))]
    if len(names) == 1:
        work(names[0])
    else:
        failures: list[BaseException] = []

        def guarded(name: str) -> None:
            try:
                work(name)
            except BaseException as exc:  # re-raised in the caller's thread below
                failures.append(exc)

        threads = [threading.Thread(target=guarded, args=(name,), name=f"worker-{name}") for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
    if len(queue):
        raise losses[-1]
    return [results[index] for index in range(len(planned))]
