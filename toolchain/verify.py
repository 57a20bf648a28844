"""Verification of built ops against their numpy references on a device.

`deploy test` runs the op x dtype x case matrix; `deploy run --check` one case with user data.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices import Device, DeviceLost, Session
from ops.errors import DeployError, UsageError, first_line
from ops.spec import BoundOp, Case, Op, TensorType, bind
from toolchain.cache import cached_build
from toolchain.compare import Comparison, compare, random_input
from toolchain.elf import check_machine
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
    check_machine(module, session.arch, session.label)
    out = manifest.output
    return session.run(module, inputs, tuple(out["shape"]), out["dtype"])


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


def verify(
    session: Session, bound: BoundOp, target: Target, inputs: list[np.ndarray]
) -> tuple[Comparison, str]:
    """Build (cached), run on the session, compare with the reference; with the schedule name."""
    directory, manifest = cached_build(bound, target)
    actual = run_artifact(session, directory, manifest, inputs)
    expected = bound.op.reference(bound.attrs, *inputs)
    return compare(np.asarray(expected), actual, bound.op.exact), manifest.schedule


def verify_case(session: Session, planned: PlannedCase, target: Target) -> CaseResult:
    seed = zlib.crc32(f"{planned.op.name}/{planned.dtype}/{planned.index}".encode())
    rng = np.random.default_rng(seed)
    label = planned.case.label()
    try:
        bound = planned.bind()
        inputs = [random_input(t, rng, ties=planned.index % 2 == 1) for t in bound.inputs]
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


def run_matrix(
    planned: list[PlannedCase],
    target: Target,
    device: Device,
    on_result: Callable[[CaseResult], None] = lambda r: None,
    on_lost: Callable[[DeviceLost], None] = lambda e: None,
) -> list[CaseResult]:
    """Verify each case on one session; a lost device is reported, reopened and the case retried
    once (a second loss in a row ends the run)."""
    check_device(target, device)
    results: list[CaseResult] = []
    with ExitStack() as stack:
        session = stack.enter_context(device.open())
        for case in planned:
            try:
                result = verify_case(session, case, target)
            except DeviceLost as lost:
                on_lost(lost)
                stack.close()
                session = stack.enter_context(device.open())
                result = verify_case(session, case, target)
            on_result(result)
            results.append(result)
    return results
