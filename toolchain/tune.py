"""`deploy tune`: search an op's schedule with MetaSchedule on the device that will run it.

Records go to a task directory under the database root (`toolchain/tuning_db.py`) after every
batch of trials, so an interrupted run keeps what it measured; the same command again counts the
records already there and runs only the trials still missing. When the search ends, the fastest
records are verified against numpy on the device and the first that passes is accepted: only an
accepted record is ever built by `--tuned`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices import Device, Session
from devices.rpc import EndpointDevice
from ops.errors import DeployError, UsageError
from ops.spec import BoundOp
from toolchain import tuning_db
from toolchain.build import compile_scheduled, export, prim_module
from toolchain.targets import Target
from toolchain.tune_runner import builder, local_runner, session_runner
from toolchain.verify import check_artifact, check_device, for_device

BATCH = 8
"""Candidates per search iteration: records are written after each batch."""
VERIFY_TOP = 5
"""How many of the fastest records may be tried, in order, until one passes verification."""


@dataclass(frozen=True)
class TuneResult:
    directory: Path
    trials: int
    """Records of the task now (earlier runs included)."""
    new_trials: int
    valid: int
    best_ms: float | None
    accepted: dict[str, Any] | None
    rejected: list[str]


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
    if device.name == "local":
        yield local_runner(timeout_s), device.open
        return
    if not isinstance(device, EndpointDevice):
        raise UsageError(f"device {device.name} cannot measure tuning candidates (local or RPC devices can)")
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


def tune(
    bound: BoundOp,
    target: Target,
    device: Device,
    root: Path,
    trials: int,
    timeout_s: float = 60.0,
    on_trial: Callable[[float | None], None] = lambda secs: None,
    on_start: Callable[[int, float | None], None] = lambda done, best: None,
) -> TuneResult:
    """Tune `bound` for `target` on `device` until its task under `root` holds `trials` records,
    then accept the fastest record that matches numpy. `on_start(records, best_s)` is called once
    with what earlier runs left; `on_trial(seconds or None)` after each new trial."""
    if trials < 1:
        raise UsageError(f"--trials {trials}: expected a positive number of trials")
    check_device(target, device)
    directory = tuning_db.task_dir(root, bound, target.name)
    directory.mkdir(parents=True, exist_ok=True)
    tuning_db.write_json(
        directory / tuning_db.TASK, {**bound.key(), "target": target.name, "device": device.name}
    )
    if target.artifact == "opencl":
        return _tune_opencl(bound, target, device, directory, trials, on_trial, on_start)
    tuning_db.drop_partial_lines(directory)
    mod = prim_module(bound, target)
    before = tuning_db.TaskRecords.load(directory, mod)
    valid = before.valid()
    on_start(len(before.records), tuning_db.mean_secs(valid[0]) if valid else None)
    missing = trials - len(before.records)
    with _measuring(device, bound, timeout_s) as (runner, open_verify):
        if target.cores is None:
            with open_verify() as session:
                target = for_device(target, session)
        if missing > 0:
            _search(mod, target, directory, runner, missing, seed=len(before.records), on_trial=on_trial)
        records = tuning_db.TaskRecords.load(directory, mod)
        entry, rejected = _accept(bound, target, records, open_verify, device.name)
    valid = records.valid()
    return TuneResult(
        directory,
        len(records.records),
        len(records.records) - len(before.records),
        len(valid),
        tuning_db.mean_secs(valid[0]) * 1e3 if valid else None,
        entry,
        rejected,
    )


def _tune_opencl(
    bound: BoundOp, target: Target, device: Device, directory: Path, trials: int,
    on_trial: Callable[[float | None], None], on_start: Callable[[int, float | None], None],
) -> TuneResult:  # fmt: skip
    from toolchain.tune_opencl import measurements, record_name, tune_work_group

    def fastest(done: list[dict[str, Any]]) -> float | None:
        return min((m["ms"] for m in done if "ms" in m), default=None)

    before = measurements(directory)
    best = fastest(before)
    on_start(len(before), best / 1e3 if best is not None else None)
    done, entry = tune_work_group(bound, target, device, directory, trials, on_trial)
    rejected = [f"{record_name(m['work_group'])}: {m['error']}" for m in done[len(before) :] if "error" in m]
    valid = sum("ms" in m for m in done)
    return TuneResult(directory, len(done), len(done) - len(before), valid, fastest(done), entry, rejected)


def _search(
    mod: Any, target: Target, directory: Path, runner: Any, trials: int, seed: int,
    on_trial: Callable[[float | None], None],
) -> None:  # fmt: skip
    from tvm.s_tir import meta_schedule as ms

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.ERROR)
    with _stopping_on_interrupt() as interrupted:
        try:
            ms.tune_tir(
                mod,
                target.tvm_target(num_cores=target.build_cores()),  # the device's cores
                str(directory),
                max_trials_global=trials,
                num_trials_per_iter=min(BATCH, trials),
                builder=builder(target.cross_compiler, timeout_s=120.0),
                runner=runner,
                cost_model=cost_model(),
                measure_callbacks=[
                    *ms.MeasureCallback.create("default"),  # first: records are written before a stop
                    _progress_callback(on_trial, interrupted),
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
def _stopping_on_interrupt() -> Iterator[list[int]]:
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
        sys.stderr.write("\nstopping after this batch of trials (Ctrl-C again to stop now)\n")

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _accept(
    bound: BoundOp,
    target: Target,
    records: tuning_db.TaskRecords,
    open_session: Callable[[], Any],
    device: str,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Keep the accepted record if it is still the fastest; else verify the fastest ones in order
    and accept the first that matches numpy. Returns (accepted entry, ids rejected now)."""
    ranked = records.valid()[:VERIFY_TOP]
    current = tuning_db.accepted(records.directory)
    if current is not None and ranked and current["record"] == tuning_db.record_id(ranked[0]):
        return current, []
    rejected: list[str] = []
    with open_session() as session:
        for record in ranked:
            rid = tuning_db.record_id(record)
            max_error, detail = _verify_record(bound, target, record, session)
            if detail:
                rejected.append(f"{rid}: {detail}")
                continue
            entry = {
                "record": rid,
                "ms": tuning_db.mean_secs(record) * 1e3,
                "max_error": max_error,
                "device": device,
            }
            tuning_db.write_json(records.directory / tuning_db.ACCEPTED, {**entry, "rejected": rejected})
            return entry, rejected
    return current, rejected


def _verify_record(bound: BoundOp, target: Target, record: Any, session: Session) -> tuple[float, str]:
    """Build the record as `deploy build --tuned` would and check it against numpy on the
    session (`check_artifact`). Returns (max error, "" or what went wrong)."""
    try:
        mod = tuning_db.apply_record(prim_module(bound, target), record)
        compiled = compile_scheduled(bound, target, mod, "tuned", tuning_db.record_id(record))
        with tempfile.TemporaryDirectory(prefix="deploy-accept-") as tmp:
            directory = Path(tmp) / "artifact"
            return check_artifact(session, bound, directory, export(compiled, directory)), ""
    except DeployError as exc:
        return float("inf"), str(exc)
