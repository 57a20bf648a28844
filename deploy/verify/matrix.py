"""`deploy test`'s matrix: every op x dtype x case verified on a device, on several sessions at
once when the device serves several (a tracker key); and a model's graph verified on each kind of
input against each of its references."""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deploy.base.errors import DeployError
from deploy.base.stopping import beside, raise_if_stopped, stopped_by
from deploy.compiler.cache import cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target
from deploy.devices import Device, DeviceLost, Session
from deploy.ops import failure_line
from deploy.ops.graph import BoundGraph
from deploy.ops.spec import BoundOp, Case, Op, TensorType, batch_sizes, bind, sizes_text, symbols_of
from deploy.verify.compare import INPUT_SETS, Comparison, InputSet, random_input
from deploy.verify.run import against, check_device, expected_of, run_artifact, verify_built


@dataclass(frozen=True)
class CaseResult:
    op: str
    dtype: str
    case: str
    ok: bool
    max_error: float
    detail: str
    schedule: str
    notes: tuple[str, ...] = ()
    """What the build said of its schedule (`Manifest.notes`)."""


@dataclass(frozen=True)
class PlannedCase:
    op: Op
    dtype: str
    case: Case
    index: int

    def bind(self) -> BoundOp:
        return bind(self.op, self.case.attrs, [TensorType(s, self.dtype) for s in self.case.shapes])

    @property
    def symbolic(self) -> bool:
        """Its batch is symbolic: one module, run at every size of SYMBOLIC_SIZES."""
        return self.case.symbolic

    def runs_on(self, target: Target) -> bool:
        """The target builds this case: a symbolic batch needs an artifact that runs every size."""
        return target.artifact.symbolic_batch or not self.symbolic


SYMBOLIC_SIZES = (1, 3, 32)
"""The sizes a symbolic batch is verified at, every one from the same module."""


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


def verify_case(
    session: Session, planned: PlannedCase, target: Target, options: BuildOptions, specials: bool = False
) -> CaseResult:
    """Build and run one planned case on seeded random inputs (every other case rounded so ties
    abound; with `specials`, NaN, infinities and repeated maxima planted); compare with numpy."""
    seed = zlib.crc32(f"{planned.op.name}/{planned.dtype}/{planned.index}".encode())
    rng = np.random.default_rng(seed)
    label = planned.case.label()
    try:
        bound = planned.bind()
        symbols = symbols_of(bound.inputs)
        if symbols:
            label += f" at {', '.join(symbols)}={','.join(map(str, SYMBOLIC_SIZES))}"
        ties = planned.index % 2 == 1
        comparisons = []
        for sizes in batch_sizes(bound.inputs, SYMBOLIC_SIZES):
            inputs = [random_input(t.at(sizes), rng, ties=ties, specials=specials) for t in bound.inputs]
            comparison, manifest = verify_built(session, bound, target, options, inputs)
            comparisons.append((sizes, comparison))
        comparison = worst_of(comparisons)
    except DeviceLost:
        raise
    except Exception as exc:  # a compiler or runtime failure fails this case, not the matrix
        raise_if_stopped()
        if isinstance(exc, DeployError):
            return CaseResult(planned.op.name, planned.dtype, label, False, float("inf"), str(exc), "-")
        detail = failure_line(exc)
        return CaseResult(planned.op.name, planned.dtype, label, False, float("inf"), detail, "-")
    return CaseResult(
        planned.op.name,
        planned.dtype,
        label,
        comparison.ok,
        comparison.max_error,
        comparison.detail,
        manifest.built_with,
        tuple(manifest.notes or ()),
    )


def worst_of(comparisons: list[tuple[dict[str, int], Comparison]]) -> Comparison:
    """One comparison for the runs of one case (one per batch size, `batch_sizes`): the first
    failure, its detail naming the size, else the largest error."""
    for sizes, comparison in comparisons:
        if not comparison.ok:
            where = f"{sizes_text(sizes)}: " if sizes else ""
            return Comparison(False, comparison.max_error, where + comparison.detail)
    return max((c for _, c in comparisons), key=lambda c: c.max_error)


AHEAD = 8
"""Cases `_BuildAhead` builds at most past the last one a worker took."""


class _BuildAhead:
    """The planned cases built in order on a thread of their own (`beside`), so that a case's
    build (its compile, and the cross compiler and linker its export runs) goes on while the
    device runs the cases before it: on this 2-core VM `deploy test --target arm` of four ops
    took 133 s one after the other. The worker's own build of a case is then a cache lookup
    (`cached_build`: one build at a time, the other waits for it); a case whose build fails
    here is built again by its worker, which reports why. It stays at most AHEAD cases past
    the last case taken, so a stop or a lost device leaves little built for nothing."""

    def __init__(self, planned: list[PlannedCase], target: Target) -> None:
        self._planned, self._target = planned, target
        self._taken = -1
        self._stopped = False
        self._changed = threading.Condition()
        self._ended: threading.Event | None = None

    def start(self, options: BuildOptions) -> None:
        """Start building, for a session whose options (`for_device`) are `options`; once."""
        with self._changed:
            if self._ended is None and not self._stopped:
                self._ended = beside(lambda: self._build(options), "deploy-build-ahead")

    def took(self, index: int) -> None:
        """A worker took case `index` (of the planned list)."""
        with self._changed:
            self._taken = max(self._taken, index)
            self._changed.notify_all()

    def stop(self, wait: bool) -> None:
        """Build nothing more; with `wait`, until the build under way is done."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            ended = self._ended
        if wait and ended is not None:
            ended.wait()

    def _may_build(self, index: int) -> bool:
        """Whether case `index` may be built now (or the building is to end)."""
        return self._stopped or index <= self._taken + AHEAD

    def _build(self, options: BuildOptions) -> None:
        for index, planned in enumerate(self._planned):
            with self._changed:
                self._changed.wait_for(functools.partial(self._may_build, index))
                if self._stopped or stopped_by() is not None:
                    return
            if index <= self._taken:
                continue
            try:
                cached_build(planned.bind(), self._target, options)
            except Exception:  # the case's worker builds it again and says why
                continue


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
    options: BuildOptions,
    device: Device,
    on_result: Callable[[CaseResult, str], None] = lambda r, worker: None,
    on_lost: Callable[[DeviceLost], None] = lambda e: None,
    workers: int = 1,
) -> list[CaseResult]:
    """Verify the cases on `workers` sessions of `device` at once (e.g. the free servers of a
    tracker key), in the order planned. A worker whose device is lost reports it, puts its case
    back for the others, and opens a fresh session once; a second loss in a row retires it. When
    every worker is retired with cases left, the last loss ends the run. A stop (Ctrl-C, SIGTERM)
    ends it too, before the next case and before any reconnect, even where its exception did not
    come up this far: TVM's FFI hands one raised inside a call back as another exception, which a
    catch-all on the way may take for a device lost (`RpcSession._guard`) or a failed case."""
    check_device(target, device)
    queue = _Queue(planned)
    results: dict[int, CaseResult] = {}
    losses: list[DeviceLost] = []
    report = threading.Lock()
    ahead = _BuildAhead(planned, target)

    def work(worker: str) -> None:
        lost_in_a_row = 0
        while lost_in_a_row < 2 and len(queue):
            try:
                with device.open() as session:
                    ahead.start(for_device(options, session))
                    while (item := queue.pop()) is not None:
                        raise_if_stopped()
                        ahead.took(item[0])
                        try:
                            result = verify_case(session, item[1], target, options)
                        except DeviceLost:
                            queue.put_back(item)
                            raise
                        lost_in_a_row = 0
                        with report:
                            results[item[0]] = result
                            on_result(result, worker)
            except DeviceLost as lost:
                raise_if_stopped()
                lost_in_a_row += 1
                with report:
                    losses.append(lost)
                    on_lost(lost)

    names = [f"#{n + 1}" for n in range(max(1, workers))]
    try:
        _work_on(names, work)
    except BaseException:
        ahead.stop(wait=False)  # the command ends under the build under way (`beside`)
        raise
    ahead.stop(wait=True)
    if len(queue):
        raise losses[-1]
    return [results[index] for index in range(len(planned))]


def _work_on(names: list[str], work: Callable[[str], None]) -> None:
    """`work(name)` for each worker name: in this thread for one, else on a thread each, the
    first exception raised here."""
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


@dataclass(frozen=True)
class Reference:
    """What a model's outputs are compared with: `expected(arrays)` (None: not available here),
    on the input sets `applies` accepts."""

    name: str
    expected: Callable[[list[np.ndarray]], list[np.ndarray] | None]
    applies: Callable[[InputSet], bool] = lambda inputs: True
    note: str = ""
    """A line saying what it really compares against, where its name alone does not."""


def _onnxruntime(graph: BoundGraph, model: Path) -> Reference | str:
    """onnxruntime's reference for an ONNX model, on the inputs where its semantics agree with
    numpy's (`deploy/verify/onnx_reference.py`: NaN inputs only where every op treats NaN as
    numpy), named with how many nodes it ran where custom-domain nodes ran our numpy references;
    why there is none when it is not installed or runs no node of the model."""
    from deploy.verify import onnx_reference

    if not onnx_reference.installed():
        return "onnxruntime is not installed: compared with numpy only"
    ran, nodes = onnx_reference.standard_nodes(model)
    if not ran:
        return (
            "onnxruntime runs no node of this model (every node is of a custom domain, which only our"
            " ops' numpy references compute): compared with numpy only"
        )
    nan_too = onnx_reference.agrees_on_nan(model)
    return Reference(
        "onnxruntime",
        lambda arrays: onnx_reference.onnxruntime_reference(model, graph, arrays),
        lambda inputs: nan_too or not inputs.specials,
        ""
        if ran == nodes
        else f"vs onnxruntime: onnxruntime ran {ran} of {nodes} nodes, our numpy references the"
        " custom-domain ones",
    )


FILE_REFERENCES: dict[str, Callable[[BoundGraph, Path], Reference | str]] = {".onnx": _onnxruntime}
"""A second reference for models of a file kind (its suffix, as `deploy.model.READERS`): the
runtime the format comes with; or why it is not available here."""


def model_references(graph: BoundGraph, model: Path) -> tuple[list[Reference], list[str]]:
    """The graph's numpy reference (its ops' references composed) and, for a model file of a
    kind with one (`FILE_REFERENCES`), its runtime's; with a line for each reference the model
    has but this host cannot run."""
    references = [Reference("numpy", lambda arrays: graph.references(*arrays))]
    notes = []
    second = FILE_REFERENCES.get(model.suffix.lower())
    found = second(graph, model) if second is not None else None
    if isinstance(found, Reference):
        references.append(found)
        notes += [found.note] if found.note else []
    elif found is not None:
        notes.append(found)
    return references, notes


def verify_model(
    session: Session, graph: BoundGraph, target: Target, options: BuildOptions, references: list[Reference]
) -> list[CaseResult]:
    """Build the graph (cached, for the session's device) and run it on each input set (at each
    size of SYMBOLIC_SIZES when its batch is symbolic, all from the one module); one result per
    input set, size and reference that applies to it."""
    results = []
    directory, manifest = cached_build(graph, target, for_device(options, session))
    dtype = graph.inputs[0].dtype if graph.inputs else graph.outputs[0].dtype
    for (index, inputs), sizes in itertools.product(
        enumerate(INPUT_SETS), batch_sizes(graph.inputs, SYMBOLIC_SIZES)
    ):
        rng = np.random.default_rng(zlib.crc32(f"{graph.name}/{index}/{sizes_text(sizes)}".encode()))
        arrays = [
            random_input(t.at(sizes), rng, ties=inputs.ties, specials=inputs.specials) for t in graph.inputs
        ]
        label = f"{inputs.label} at {sizes_text(sizes)}" if sizes else inputs.label
        actual = run_artifact(session, directory, manifest, arrays)
        for reference in references:
            if not reference.applies(inputs):
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                expected = reference.expected(arrays)
            if expected is None:
                continue
            comparison = against(graph, expected_of(graph, arrays, expected), actual)
            results.append(
                CaseResult(
                    f"{graph.name} vs {reference.name}",
                    dtype,
                    label,
                    comparison.ok,
                    comparison.max_error,
                    comparison.detail,
                    manifest.built_with,
                )
            )
    return results
