"""How `deploy tune` builds and measures MetaSchedule candidates on a device.

Candidates are compiled in worker processes (MetaSchedule's LocalBuilder) and linked with the
target's compiler, so an aarch64 candidate is a shared object the board loads as it is. The local
host measures them in worker processes (MetaSchedule's LocalRunner); an RPC device (emulator, SSH
board, tracker) measures each in a session of its own whose length the server bounds, so a
candidate that crashes or hangs the device fails alone and the next one gets a fresh session. A
device of the runner protocol (`deploy/devices/runner.py`) measures each candidate's C bundle through
its own `deploy-run`, one process per candidate: a crash fails that candidate alone.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy.base.errors import DeployError, reason
from deploy.base.threads import host_cpus
from deploy.compiler.bundle import BundleSignature, write_bundle
from deploy.compiler.options import BuildOptions
from deploy.compiler.shared_object import export_module
from deploy.compiler.targets import Target
from deploy.compiler.tir_passes import compile_cpu
from deploy.devices import DeviceLost
from deploy.devices.rpc import RpcEndpoint
from deploy.devices.runner import RunnerSession
from deploy.ops.graph import Constant
from deploy.ops.spec import OUTPUT, BoundOp, TensorType
from deploy.verify.compare import random_input
from deploy.verify.measure import calls_lasting

MIN_REPEAT_S = 0.05
"""One measurement averages enough calls to last this long (a few calls of a fast kernel are
mostly timer and cold-cache noise)."""
REPEAT = 3
"""Measurements per candidate; MetaSchedule ranks candidates by their mean."""


def build_candidate(deploy_target: Target, mod: Any, target: Any, params: Any) -> Any:
    """Compile a scheduled candidate for `deploy_target` (MetaSchedule's TVM `target`) exactly as
    `deploy build` compiles CPU targets (the deploy-cpu pipeline at opt level 3), so what is
    measured is what gets built.

    Runs in MetaSchedule's builder workers instead of its default build, which imports
    `tvm.s_tir.tensor_intrin` in every fresh worker (about 20 s on a small machine, per batch)."""
    return compile_cpu(mod, target, deploy_target.two_vector_shuffles)


@dataclass(frozen=True)
class Signature:
    """What a candidate's C bundle is called with: the op's name, its inputs and output (picklable
    into the builder workers, as a bound op of a user's op file is not)."""

    name: str
    inputs: tuple[tuple[str, TensorType], ...]
    output: TensorType

    @staticmethod
    def of(bound: BoundOp) -> Signature:
        inputs = tuple((spec.name, t) for spec, t in zip(bound.op.inputs, bound.inputs, strict=True))
        return Signature(bound.op.name, inputs, bound.output)


@dataclass(frozen=True)
class _Candidate:
    """A built candidate as `bundle.write_bundle` takes it (`bundle.Bundled`)."""

    target: Target
    options: BuildOptions
    executable: Any
    signature: Signature
    constants: tuple[Constant, ...] = ()
    """A kernel reads a graph's constants as inputs: the candidate itself holds none."""

    def bundle_signature(self) -> BundleSignature:
        return self.signature.name, list(self.signature.inputs), [(OUTPUT, self.signature.output)], None


def export_candidate(
    target: Target, options: BuildOptions, signature: Signature, into: str, rt_mod: Any
) -> str:
    """Link a built candidate into a shared object in a fresh directory inside `into` (the
    tuning's own, removed when it ends), as `deploy build` links for `target`; return its path.
    For a build whose artifacts carry their bundle (`BuildOptions.bundle`: a runner device), write the
    candidate's bundle there instead: the path is then of a module beside it that is not written
    (what the runner session is given, `deploy/devices/runner.py`). Runs in MetaSchedule's builder
    workers (pickled there with `functools.partial`)."""
    directory = tempfile.mkdtemp(prefix="candidate-", dir=into)
    path = os.path.join(directory, "candidate.so")
    if options.bundle:
        write_bundle(_Candidate(target, options, rt_mod, signature), Path(directory), None)
    else:
        export_module(rt_mod, Path(path), target)
    return path


def builder(target: Target, options: BuildOptions, timeout_s: float, into: Path, bound: BoundOp) -> Any:
    """MetaSchedule's LocalBuilder that builds and links candidates of `bound` for `target` (as
    `options` say) into `into`."""
    import functools

    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(
        max_workers=host_cpus(),
        timeout_sec=timeout_s,
        f_build=functools.partial(build_candidate, target),
        f_export=functools.partial(export_candidate, target, options, Signature.of(bound), str(into)),
    )


@dataclass(frozen=True)
class Measuring:
    """A MetaSchedule runner for a device, and what stopped the device when it stopped (the error
    opening a session raised, which MetaSchedule would report as its own failure), else None."""

    runner: Any
    lost: Callable[[], DeployError | None]


def local_runner(timeout_s: float) -> Measuring:
    """MetaSchedule's LocalRunner: each candidate runs in a worker process of this host (which
    cannot be lost)."""
    from tvm.s_tir import meta_schedule as ms

    config = ms.runner.EvaluatorConfig(number=1, repeat=REPEAT, min_repeat_ms=int(MIN_REPEAT_S * 1e3))
    return Measuring(ms.runner.LocalRunner(timeout_sec=timeout_s, evaluator_config=config), lambda: None)


def session_runner(endpoint: RpcEndpoint, bound: BoundOp, timeout_s: float) -> Measuring:
    """A MetaSchedule runner measuring each candidate in its own session of an RPC device."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class SessionRunner(ms.runner.PyRunner):  # type: ignore[misc]  # tvm has no stubs: the base is Any
        def __init__(self) -> None:
            super().__init__()
            rng = np.random.default_rng(0)
            self.inputs = [random_input(t, rng) for t in bound.inputs]
            self.fatal: DeployError | None = None

        def run(self, runner_inputs: list[Any]) -> list[Any]:
            results = [self._measure(Path(str(item.artifact_path))) for item in runner_inputs]
            return [ms.runner.RunnerFuture(lambda: True, lambda r=r: r) for r in results]

        def _measure(self, module: Path) -> Any:
            outputs = [(bound.output.shape, bound.output.dtype)]
            opened = False
            try:
                with endpoint.session(timeout_s) as session:
                    opened = True
                    once = session.time(module, self.inputs, outputs, 1, 1)[0]
                    number = calls_lasting(MIN_REPEAT_S, once)
                    runs = session.time(module, self.inputs, outputs, number, REPEAT)
            except DeployError as exc:
                if not opened:  # the device itself is gone: stop tuning, keep the records
                    self.fatal = exc
                    raise
                if not isinstance(exc, DeviceLost):
                    return ms.runner.RunnerResult(None, str(exc))
                endpoint.restart()  # TVM's server stops accepting after a session crashed
                if "RPCSessionTimeoutError" in str(exc):
                    return ms.runner.RunnerResult(None, f"ran over the {timeout_s:g} s limit (--timeout)")
                return ms.runner.RunnerResult(None, f"crashed the device's session: {exc}")
            except Exception as exc:
                return ms.runner.RunnerResult(None, f"{type(exc).__name__}: {reason(exc)}")
            return ms.runner.RunnerResult([float(t) for t in runs], None)

    runner = SessionRunner()
    return Measuring(runner, lambda: runner.fatal)


def bundle_runner(session: RunnerSession, bound: BoundOp, timeout_s: float) -> Measuring:
    """A MetaSchedule runner measuring each candidate's bundle through the session's runner (the
    runner protocol): a candidate that fails, crashes its process or runs past `timeout_s`
    fails alone."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]

    @derived_object
    class BundleRunner(ms.runner.PyRunner):  # type: ignore[misc]  # tvm has no stubs: the base is Any
        def run(self, runner_inputs: list[Any]) -> list[Any]:
            results = [self._measure(Path(str(item.artifact_path))) for item in runner_inputs]
            return [ms.runner.RunnerFuture(lambda: True, lambda r=r: r) for r in results]

        def _measure(self, module: Path) -> Any:
            outputs = [(bound.output.shape, bound.output.dtype)]
            try:  # the runner adds calls until a run lasts its minimum; measuring only is bounded
                runs = session.time(module, inputs, outputs, 1, REPEAT, timeout_s=timeout_s)
            except DeployError as exc:
                return ms.runner.RunnerResult(None, str(exc))
            return ms.runner.RunnerResult([float(t) for t in runs], None)

    return Measuring(BundleRunner(), lambda: None)
