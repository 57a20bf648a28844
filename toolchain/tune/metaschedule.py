"""The tuner of shared objects: search an op's schedule with MetaSchedule on the device that will
run it.

Records go to a task directory under the database root (`records.py`) after every
batch of trials, so an interrupted run keeps what it measured; the same command again counts the
records already there and runs only the trials still missing. When the search ends, the fastest
records are verified against numpy on the device and the first that passes is accepted: only an
accepted record is ever built by `--tuned`.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from base.errors import DeployError
from devices import Device, Session
from ops.spec import BoundOp
from toolchain.build.compile import compile_scheduled, prim_module
from toolchain.build.targets import Target
from toolchain.tune import records as db
from toolchain.tune.runner import builder, local_runner, session_runner
from toolchain.tune.tuner import Progress, TuneResult
from toolchain.verify.measure import Measured, check_and_time
from toolchain.verify.run import for_device

BATCH = 8
"""Candidates per search iteration: records are written after each batch."""
VERIFY_TOP = 5
"""How many of the fastest records may be tried, in order, until one passes verification."""
ACCEPT_REPEAT = 3
"""Timed runs of a record being accepted (its time in accepted.json is the device's, measured as
`deploy bench` measures)."""


def cost_model() -> str:
    """XGBoost when it imports (PyPI's `xgboost-cpu`), else MetaSchedule's random model."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return "random"
    return "xgb"


@contextmanager
def _measuring(device: Device, bound: BoundOp, timeout_s: float) -> Iterator[tuple[Any, Any]]:
    """(MetaSchedule runner, open a verification session) for the device, kept up while tuning."""
    if device.measures_in_process:
        yield local_runner(timeout_s), device.open
        return
    with device.rpc_endpoint() as rpc:
        yield session_runner(rpc, bound, timeout_s), rpc.session


def _progress_callback(on_trial: Callable[[float | None], None], interrupted: list[int]) -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any) -> None:
            for run in runs:
                secs = [float(t) for t in run.run_secs] if run.run_secs and not run.error_msg else []
                on_trial(sum(secs) / len(secs) if secs else None)
            if interrupted:
                raise _Stop

    return Progress()


class MetaScheduleTuner:
    """MetaSchedule's search over the op's PrimFunc, measured on the device."""

    def search(
        self, bound: BoundOp, target: Target, device: Device, directory: Path, trials: int,
        timeout_s: float, progress: Progress,
    ) -> TuneResult:  # fmt: skip
        db.drop_partial_lines(directory)
        mod = prim_module(bound, target)
        before = db.TaskRecords.load(directory, mod)
        valid = before.valid()
        progress.started(len(before.records), db.mean_secs(valid[0]) if valid else None)
        missing = trials - len(before.records)
        with _measuring(device, bound, timeout_s) as (runner, open_verify):
            if target.cores is None:
                with open_verify() as session:
                    target = for_device(target, session)
            if missing > 0:
                _search(mod, target, directory, runner, missing, len(before.records), progress)
            records = db.TaskRecords.load(directory, mod)
            entry, rejected = _accept(bound, target, records, open_verify, device.name)
        valid = records.valid()
        return TuneResult(
            directory,
            len(records.records),
            len(records.records) - len(before.records),
            len(valid),
            db.mean_secs(valid[0]) * 1e3 if valid else None,
            entry,
            rejected,
        )

    def trial_ms(self, directory: Path, bound: BoundOp, target: Target) -> list[float | None]:
        records = db.TaskRecords.load(directory, prim_module(bound, target)).records
        return [s * 1e3 if (s := db.mean_secs(r)) < db.FAILED_SECS else None for r in records]

    def schedule(self, directory: Path, entry: dict[str, Any], bound: BoundOp, target: Target) -> Any | None:
        return db.tuned_module(directory, entry["record"], prim_module(bound, target))


def _search(
    mod: Any, target: Target, directory: Path, runner: Any, trials: int, seed: int, progress: Progress
) -> None:
    from tvm.s_tir import meta_schedule as ms

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.ERROR)
    with _stopping_on_interrupt(progress.stopping) as interrupted:
        try:
            ms.tune_tir(
                mod,
                target.tvm_target(num_cores=target.build_cores()),  # the device's cores
                str(directory),
                max_trials_global=trials,
                num_trials_per_iter=min(BATCH, trials),
                builder=builder(target, timeout_s=120.0),
                runner=runner,
                cost_model=cost_model(),
                measure_callbacks=[
                    *ms.MeasureCallback.create("default"),  # first: records are written before a stop
                    _progress_callback(progress.trial, interrupted),
                ],
                num_tuning_cores=os.cpu_count() or 1,  # this host's: it builds the candidates
                seed=seed,
            )
        except Exception:
            if interrupted:
                raise KeyboardInterrupt from None
            fatal = getattr(runner, "fatal", None)
            if fatal is not None:
                raise fatal from None
            raise


class _Stop(Exception):
    """Raised by the progress callback after a batch, once Ctrl-C was pressed."""


@contextmanager
def _stopping_on_interrupt(stopping: Callable[[], None]) -> Iterator[list[int]]:
    """The first Ctrl-C lets the running batch finish and be recorded, then stops the search
    (an exception raised at an arbitrary point inside MetaSchedule's C++ loop can abort the
    process); a second Ctrl-C interrupts at once."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stopping()

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _accept(
    bound: BoundOp,
    target: Target,
    records: db.TaskRecords,
    open_session: Callable[[], Any],
    device: str,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Keep the accepted record if it is still the fastest; else verify the fastest ones in order
    and accept the first that matches numpy. Returns (accepted entry, ids rejected now)."""
    ranked = records.valid()[:VERIFY_TOP]
    current = db.accepted(records.directory)
    if current is not None and ranked and current["record"] == db.record_id(ranked[0]):
        return current, []
    rejected: list[str] = []
    with open_session() as session:
        for record in ranked:
            rid = db.record_id(record)
            try:
                measured = _verify_record(bound, target, record, session)
            except DeployError as exc:
                rejected.append(f"{rid}: {exc}")
                continue
            entry = {"record": rid, "ms": measured.ms, "max_error": measured.max_error, "device": device}
            db.write_json(records.directory / db.ACCEPTED, {**entry, "rejected": rejected})
            return entry, rejected
    return current, rejected


def _verify_record(bound: BoundOp, target: Target, record: Any, session: Session) -> Measured:
    """Build the record as `deploy build --tuned` would, check it against numpy on the session and
    time it (the time accepted.json keeps); a DeployError says what went wrong."""
    mod = db.apply_record(prim_module(bound, target), record)
    compiled = compile_scheduled(bound, target, mod, "tuned", db.record_id(record))
    with tempfile.TemporaryDirectory(prefix="deploy-accept-") as tmp:
        return check_and_time(session, compiled, Path(tmp), ACCEPT_REPEAT)
