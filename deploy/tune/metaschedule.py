"""The tuner of shared objects: search an op's schedule with MetaSchedule on the device that will
run it.

Records go to a task directory under the database root (`records.py`) after every
batch of trials, so an interrupted run keeps what it measured; the same command again counts the
records already there and runs only the trials still missing. The space searched is the target's
own schedule for the op with its choices sampled (`deploy/schedules/space.py`). When the search ends, the
fastest records are checked against numpy and timed against the hand schedule on the device
(`tuner.decide`): one is accepted only if it beats the hand schedule by more than the spread, and
only an accepted record is ever built by `--tuned` (else the build keeps the hand schedule).
The default build is checked against numpy before the search (seconds): a build that fails stops
the run before minutes of search; a wrong answer is reported, and the search goes on to find a
verified record to build instead.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError
from deploy.base.stopping import STOP_SIGNALS, handled, interrupt_for
from deploy.base.threads import host_cpus
from deploy.base.tvm_workers import hide_torch_in_workers
from deploy.compiler.compile import Compiled, compile_scheduled, context, prim_module
from deploy.compiler.compile import strategy as compiled_strategy
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target
from deploy.devices import Device
from deploy.devices.runner import RUNNER_PROTOCOL as RUNNER
from deploy.devices.runner import RunnerSession
from deploy.ops.spec import BoundOp
from deploy.schedules.registry import Picked, every_structure
from deploy.schedules.space import design_spaces
from deploy.tune import records as db
from deploy.tune.runner import Measuring, builder, bundle_runner, local_runner, session_runner
from deploy.tune.tuner import DefaultCheck, Progress, TuneResult, check_default, decide

BATCH = 8
"""Candidates per search iteration: records are written after each batch."""
SEEDS = 8
"""Most design spaces of our own measured as they are before the search starts."""
ACCEPT_TOP = 3
"""The fastest records of a search that are checked and timed against the hand schedule."""


def cost_model() -> str:
    """XGBoost when it imports (PyPI's `xgboost-cpu`), else MetaSchedule's random model."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return "random"
    return "xgb"


@contextmanager
def _measuring(device: Device, bound: BoundOp, timeout_s: float) -> Iterator[tuple[Measuring, Any]]:
    """(MetaSchedule's runner, open a verification session) for the device, kept up while tuning;
    the worker processes MetaSchedule starts from here on import TVM without torch."""
    hide_torch_in_workers()
    if device.measures_in_process:
        yield local_runner(timeout_s), device.open
        return
    if RUNNER in device.protocols:  # each candidate's bundle through its runner, in one session
        with device.open() as session:
            assert isinstance(session, RunnerSession)  # what every runner-protocol device opens
            yield bundle_runner(session, bound, timeout_s), lambda: nullcontext(session)
        return
    with device.rpc_endpoint() as rpc:
        yield session_runner(rpc, bound, timeout_s), rpc.session


def _progress_callback(on_trial: Callable[[float | None], None], interrupted: list[int]) -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):  # type: ignore[misc]  # tvm has no stubs: the base is Any
        def apply(self, task_scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any) -> None:
            for run in runs:
                secs = [float(t) for t in run.run_secs] if run.run_secs and not run.error_msg else []
                on_trial(sum(secs) / len(secs) if secs else None)
            if interrupted:
                raise _Stop

    return Progress()


@dataclass(frozen=True)
class Variant:
    """One computation of the op that the target's strategy may build: the structural picks its
    compute made (`{}` for most ops) and its PrimFunc, a MetaSchedule task of its own."""

    picks: dict[str, Any]
    mod: Any


def compute_variants(bound: BoundOp, target: Target, options: BuildOptions) -> list[Variant]:
    """Every computation the target's strategy builds the op as (pooling on CPUs: without and with
    a column stage), the hand's first."""

    def run(picks: dict[str, Any]) -> tuple[Picked, Any]:
        choices = Picked(picks)
        return choices, prim_module(bound, target, options, choices)

    return [Variant(picks, mod) for picks, mod in every_structure(run)]


class MetaScheduleTuner:
    """MetaSchedule's search over the op's PrimFuncs, measured on the device."""

    searches_structures = True

    def search(
        self, bound: BoundOp, target: Target, options: BuildOptions, device: Device, directory: Path,
        trials: int, timeout_s: float, progress: Progress,
    ) -> TuneResult:  # fmt: skip
        db.drop_partial_lines(directory)
        cpu_intrinsics_only()
        variants = compute_variants(bound, target, options)
        mods = [v.mod for v in variants]
        before = db.TaskRecords.load(directory, *mods)
        best = before.valid()
        progress.started(len(before.records), db.mean_secs(best[0]) if best else None)
        missing = trials - len(before.records)
        with (
            _measuring(device, bound, timeout_s) as (measuring, open_verify),
            tempfile.TemporaryDirectory(prefix="deploy-default-") as default_dir,
        ):
            with open_verify() as session:
                if options.cores is None or RUNNER in device.protocols:  # (its candidates: bundles)
                    options = for_device(options, session)
                default = check_default(session, bound, target, options, Path(default_dir))  # seconds, first
            progress.default_checked(default)
            for index, variant in enumerate(variants):
                share = -(-missing // (len(variants) - index))  # what one leaves goes to the next
                if share <= 0:
                    break
                missing -= _search_phases(
                    bound, target, options, variant, directory, measuring, share, progress
                )
            records = db.TaskRecords.load(directory, *mods)
            entry = _accept(bound, target, options, variants, records, open_verify, device.name, default)
        valid = records.valid()
        return TuneResult(
            directory,
            len(records.records),
            len(records.records) - len(before.records),
            len(valid),
            db.mean_secs(valid[0]) * 1e3 if valid else None,
            entry,
            entry.get("rejected", []) if entry else [],
        )

    def trial_ms(
        self, directory: Path, bound: BoundOp, target: Target, options: BuildOptions
    ) -> list[float | None]:
        mods = [v.mod for v in compute_variants(bound, target, options)]
        records = db.TaskRecords.load(directory, *mods).records
        return [s * 1e3 if (s := db.mean_secs(r)) < db.FAILED_SECS else None for r in records]

    def schedule(
        self, directory: Path, entry: dict[str, Any], bound: BoundOp, target: Target, options: BuildOptions
    ) -> Any:
        """The accepted record applied to the computation of its structure (`"compute"`: one of
        `compute_variants`); a UsageError when either no longer matches (the op or strategy
        changed since) or the record fails the checks of `records.tuned_module`."""
        picks = entry.get("compute", {})
        variant = next((v for v in compute_variants(bound, target, options) if v.picks == picks), None)
        if variant is None:
            raise UsageError(
                f"{directory / db.ACCEPTED} names the structure {db.shown(picks)}, which the"
                f" {target.name} strategy does not build {bound.op.name} as (stale: it changed since)"
            )
        return db.tuned_module(directory, entry, variant.mod)


INTRINSICS = "tvm.s_tir.tensor_intrin"
"""The package of TVM's tensor intrinsics, which `TuneContext` imports when it is made."""
CPU_INTRINSICS = ("x86", "arm_cpu", "riscv_cpu")
"""Its modules whose intrinsics MetaSchedule's CPU rules look up by name (VNNI, AVX-512, dot; RVV: a
RISC-V target's TuneContext calls `register_rvv_isa_intrinsics`)."""


def cpu_intrinsics_only() -> None:
    """Import TVM's tensor intrinsics package without running its `__init__`, then its CPU
    modules. The `__init__` parses some 250 CUDA, ROCm and Hexagon intrinsics through TVMScript,
    15-20 s before the first trial of every `deploy tune` on a 2-core host, and no target of ours
    tensorizes with them: the spaces drawn for x86 (AVX2, AVX-512, VNNI), Arm and OpenCL are
    the same without them. A package imported already (whole or so) is left as it is."""
    if INTRINSICS not in sys.modules:
        spec = importlib.util.find_spec(INTRINSICS)
        if spec is None:
            raise ModuleNotFoundError(INTRINSICS)
        package = importlib.util.module_from_spec(spec)
        sys.modules[INTRINSICS] = package
        parent, _, name = INTRINSICS.rpartition(".")
        setattr(sys.modules[parent], name, package)
    for module in CPU_INTRINSICS:
        importlib.import_module(f"{INTRINSICS}.{module}")


def search_spaces(
    bound: BoundOp, target: Target, options: BuildOptions, variant: Variant
) -> tuple[Any | None, list[Any]]:
    """(our space, the spaces searched one after the other). Ours is the target's strategy for
    the op with its choices sampled (`deploy/schedules/space.py`) and is searched first, until it has
    no untried candidate left or the trials are used up; then, where MetaSchedule's default
    space samples anything, both together (for injective ops the default is one fixed
    candidate, slower than ours; for reductions its candidates would crowd ours out of a joint
    search: it has many more points)."""
    from tvm.s_tir import meta_schedule as ms

    default = ms.space_generator.PostOrderApply()
    strategy = compiled_strategy(bound, target, options)
    if strategy is None:
        return None, [default]
    spaces = design_spaces(strategy.schedule, context(bound, target, options))
    ours = ms.space_generator.ScheduleFn(spaces)
    probe = ms.TuneContext(mod=variant.mod, target=_tvm_target(target, options), space_generator=default)
    if not any(len(space.trace.decisions) for space in probe.generate_design_space()):
        return ours, [ours]
    return ours, [ours, ms.space_generator.SpaceGeneratorUnion([ours, default])]


def _search_phases(
    bound: BoundOp, target: Target, options: BuildOptions, variant: Variant, directory: Path,
    measuring: Measuring, missing: int, progress: Progress,
) -> int:  # fmt: skip
    """Add up to `missing` trials to a variant: seed it, when it has no records, with our design
    spaces, then search each space of `search_spaces` in turn while trials are left; returns
    how many were added (fewer when the spaces ran out of untried candidates)."""
    mod = variant.mod
    start = done = len(db.TaskRecords.load(directory, mod).records)
    with _tvm_target(target, options), tempfile.TemporaryDirectory(prefix="deploy-tune-") as built:
        ours, phases = search_spaces(bound, target, options, variant)  # in the target: RISC-V's rules ask it
        candidates = builder(target, options, 120.0, Path(built), bound)
        if not done and ours is not None:
            count = min(missing, SEEDS)
            seeded = _seed(mod, target, options, ours, directory, measuring, candidates, count, progress)
            missing, done = missing - seeded, done + seeded
        for space in phases:
            if missing <= 0:
                break
            _search(mod, target, options, space, directory, measuring, candidates, missing, done, progress)
            now = len(db.TaskRecords.load(directory, mod).records)
            missing, done = missing - (now - done), now
    return done - start


def _tvm_target(target: Target, options: BuildOptions) -> Any:
    """The TVM target candidates are built for, with the device's cores (MetaSchedule needs them)."""
    return target.tvm_target(num_cores=options.build_cores())


def _seed(
    mod: Any, target: Target, options: BuildOptions, ours: Any, directory: Path, measuring: Measuring,
    candidates: Any, count: int, progress: Progress,
) -> int:  # fmt: skip
    """Measure our space's design spaces as they are (the hand schedule first, then its other
    structures with the hand's values) and record them as the task's first trials, so the
    evolutionary search starts from them instead of from random points; returns how many."""
    from tvm.s_tir import meta_schedule as ms

    tvm_target = _tvm_target(target, options)
    spaces = ms.TuneContext(mod=mod, target=tvm_target, space_generator=ours).generate_design_space()[:count]
    requests = [ms.builder.BuilderInput(space.mod, tvm_target) for space in spaces]
    built = candidates.build(requests)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    inputs = [ms.runner.RunnerInput(b.artifact_path, "cpu", args) for b in built if b.error_msg is None]
    results = iter(future.result() for future in measuring.runner.run(inputs))
    database = ms.database.JSONDatabase(work_dir=str(directory))
    workload = database.commit_workload(mod)
    for space, build in zip(spaces, built, strict=True):
        result = next(results) if build.error_msg is None else None
        secs = (
            [float(t) for t in result.run_secs] if result is not None and result.error_msg is None else None
        )
        record = ms.database.TuningRecord(space.trace, workload, secs or [1e10], tvm_target, args)
        database.commit_tuning_record(record)
        progress.trial(sum(secs) / len(secs) if secs else None)
    return len(spaces)


def _search(
    mod: Any, target: Target, options: BuildOptions, space: Any, directory: Path, measuring: Measuring,
    candidates: Any, trials: int, seed: int, progress: Progress,
) -> None:  # fmt: skip
    from tvm.s_tir import meta_schedule as ms

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.ERROR)
    with _stopping_on_interrupt(progress.stopping) as interrupted:
        try:
            ms.tune_tir(
                mod,
                _tvm_target(target, options),  # the device's cores
                str(directory),
                max_trials_global=trials,
                num_trials_per_iter=min(BATCH, trials),
                builder=candidates,
                runner=measuring.runner,
                cost_model=cost_model(),
                space=space,
                measure_callbacks=[
                    *ms.MeasureCallback.create("default"),  # first: records are written before a stop
                    _progress_callback(progress.trial, interrupted),
                ],
                num_tuning_cores=host_cpus(),  # this host's: it builds the candidates
                seed=seed,
            )
        except Exception:
            if interrupted:
                raise interrupt_for(interrupted[0]) from None
            lost = measuring.lost()
            if lost is not None:
                raise lost from None
            raise


class _Stop(Exception):
    """Raised by the progress callback after a batch, once Ctrl-C was pressed."""


@contextmanager
def _stopping_on_interrupt(stopping: Callable[[], None]) -> Iterator[list[int]]:
    """The first Ctrl-C (or SIGTERM, SIGHUP) lets the running batch finish and be recorded, then
    stops the search: an exception raised at an arbitrary point inside MetaSchedule's C++ loop can
    abort the process. A second one interrupts at once."""
    noted: list[int] = []

    def note(signum: int, frame: Any) -> None:
        if noted:
            raise interrupt_for(signum)
        noted.append(signum)
        stopping()

    with handled(note, (signal.SIGINT, *STOP_SIGNALS)):
        yield noted


def _accept(
    bound: BoundOp,
    target: Target,
    options: BuildOptions,
    variants: list[Variant],
    records: db.TaskRecords,
    open_session: Callable[[], Any],
    device: str,
    default: DefaultCheck,
) -> dict[str, Any] | None:
    """The task's verdict, written to accepted.json: the fastest records are built as `deploy
    build --tuned` builds them and judged against the hand schedule on the device (`decide`,
    the hand's check done before the search: `default`);
    an accepted one is pinned by its sha256 and names the structure of its computation
    ("compute": its picks). An earlier verdict stands while no new record was measured and the
    device is the same (`records.standing_verdict`)."""
    import tvm_ffi

    current = db.standing_verdict(records.directory, len(records.records), device)
    if current is not None:
        return current
    ranked = {
        db.record_id(r): (next(v for v in variants if tvm_ffi.structural_equal(v.mod, r.workload.mod)), r)
        for r in records.valid()[:ACCEPT_TOP]
    }
    if not ranked:
        return None
    contenders = {
        name: functools.partial(_build_record, bound, target, options, *found)
        for name, found in ranked.items()
    }
    with open_session() as session, tempfile.TemporaryDirectory(prefix="deploy-accept-") as tmp:
        entry = decide(session, bound, target, options, contenders, Path(tmp), default)
    if entry.get("record"):
        variant, record = ranked[entry["record"]]
        entry |= {"sha256": db.record_sha256(record), "compute": variant.picks}
    return db.write_verdict(records.directory, entry, len(records.records), device)


def _build_record(
    bound: BoundOp, target: Target, options: BuildOptions, variant: Variant, record: Any
) -> Compiled:
    """The op scheduled by a tuning record and compiled as `deploy build --tuned` compiles it."""
    mod = db.apply_record(variant.mod, record)
    return compile_scheduled(bound, target, options, mod, "tuned", db.record_id(record))
