"""`deploy test`: the op x dtype x case matrix on a device, with a progress bar while cases run,
then a table per op x dtype and every failure."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deploy.base.errors import DeployError, UsageError
from deploy.cli.options import (
    CORES,
    ENGINE,
    LAYOUT,
    MODEL,
    TARGET,
    TUNED,
    DeviceChoice,
    device_options,
    load_graph,
    resolve_build,
    wide_console,
)

if TYPE_CHECKING:
    from deploy.verify.matrix import CaseResult, PlannedCase


@click.command("test")
@CORES
@TARGET
@TUNED
@device_options
@click.option(
    "--op",
    "op_names",
    multiple=True,
    help="Only these ops (default: all; with `deploy --ops-path DIR`, the ops of DIR's files).",
)
@click.option("--dtype", "dtypes", multiple=True, help="Only these dtypes (default: each op's).")
@MODEL
@LAYOUT
@ENGINE
def test_command(
    cores: int | None,
    target_name: str,
    tuned: str | None,
    where: DeviceChoice,
    op_names: tuple[str, ...],
    dtypes: tuple[str, ...],
    model: str | None,
    layout: str | None,
    engine_name: str | None,
) -> None:
    """Verify every op x dtype x shape against numpy on the target's device (with --tracker: on
    every free server of the key at once); with `deploy --ops-path DIR` and no --op, only the
    ops of DIR's files; with --model, the model's graph on random inputs,
    ties and NaN/inf against numpy and (an ONNX model, onnxruntime installed) onnxruntime; with
    --engine, the model inside that engine with deploy's plugin (docs/engines.md)."""
    from deploy.ops import get_op
    from deploy.verify.matrix import plan

    target, options = resolve_build(target_name, tuned, cores, layout, model)
    if engine_name is not None:
        _test_in_engine(engine_name, model, op_names, dtypes, target, options, where)
        return
    if model is not None:
        if op_names or dtypes:
            raise UsageError(f"--model {model}: --op and --dtype select ops; the model file gives its own")
        if not _test_model(model, target, options, where.resolve(target)):
            raise click.exceptions.Exit(1)
        return
    ops = [get_op(name) for name in op_names] if op_names else _default_ops()
    planned = plan(ops, dtypes)
    if not planned:
        raise UsageError(f"no cases for ops {', '.join(op_names) or 'all'} with dtypes {', '.join(dtypes)}")
    device = where.resolve(target)
    if any(not case.runs_on(target) for case in planned):
        click.echo(
            f"skipping symbolic-batch cases: target {target.name} writes {target.artifact.name} kernels,"
            " built for one batch size"
        )
        planned = [case for case in planned if case.runs_on(target)]
    workers = device.capacity()
    if workers < 1:
        raise DeployError(f"no free server with key {where.key!r} on the tracker {where.tracker}")
    results = run_with_progress(planned, target, options, device, workers)
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(1)


def _default_ops() -> list[Any]:
    """The ops `deploy test` verifies without --op: those of the `--ops-path` folders given
    (a user wants theirs, not the 397 shipped cases again), else every op."""
    from deploy.ops import all_ops, get_op, ops_in

    folders = click.get_current_context().find_root().params.get("ops_path") or ()
    if not folders:
        return all_ops()
    names = sorted({name for folder in folders for name in ops_in(folder)})
    if not names:
        raise UsageError(f"--ops-path {', '.join(folders)}: no op file there registers an op; pass --op")
    return [get_op(name) for name in names]


def _test_in_engine(
    engine_name: str,
    model: str | None,
    op_names: tuple[str, ...],
    dtypes: tuple[str, ...],
    target: Any,
    options: Any,
    where: DeviceChoice,
) -> None:
    """`deploy test --model M --engine NAME`: the engine's test of the model with its plugin,
    built into a temporary directory; run here, under the target's emulator, or on the board
    `--device` names."""
    import functools
    import tempfile
    from pathlib import Path

    from deploy.engines import get_engine
    from deploy.engines.board import engine_board

    engine = get_engine(engine_name)
    if model is None or op_names or dtypes:
        raise UsageError(
            f"--engine {engine.name}: give --model FILE and no --op or --dtype: a model runs in it"
        )
    board = engine_board(engine.name, target, where)
    with tempfile.TemporaryDirectory(prefix="deploy-engine-") as scratch:
        say = functools.partial(click.echo, err=True)
        for line in engine.test(Path(model), Path(scratch) / "plugin", target, options, say, board):
            click.echo(line)


def _test_model(model: str, target: Any, options: Any, device: Any) -> bool:
    """Verify the model on the device (`matrix.verify_model`), print the table; whether all passed."""
    from pathlib import Path

    from deploy.verify.matrix import model_references, verify_model
    from deploy.verify.run import check_device

    graph = load_graph(model)
    check_device(target, device)
    references, notes = model_references(graph, Path(model))
    console = wide_console()
    with console.status(f"verifying {graph.name} on {device.name}"), device.open() as session:
        results = verify_model(session, graph, target, options, references)
    print_results(console, results, target.name, device)
    for note in notes:
        console.print(note, highlight=False)
    return all(r.ok for r in results)


def run_with_progress(
    planned: list[PlannedCase], target: Any, options: Any, device: Any, workers: int = 1
) -> list[CaseResult]:
    """Run the matrix on `workers` sessions with a progress bar; print the summary table, how the
    cases were spread when several workers ran, and every failure."""
    from deploy.verify.matrix import run_matrix

    console = wide_console()
    per_worker: Counter[str] = Counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"verifying on {device.name}", total=len(planned))

        def advance(result: CaseResult, worker: str) -> None:
            per_worker[worker] += 1
            progress.update(task, advance=1, description=f"{result.op} {result.dtype} {result.case}")

        def lost(error: Exception) -> None:
            console.print(
                f"[yellow]device lost[/yellow] ({error}); its case goes back in the queue", highlight=False
            )

        results = run_matrix(planned, target, options, device, advance, lost, workers)
    print_results(console, results, target.name, device)
    if workers > 1:
        spread = ", ".join(f"worker {name}: {count}" for name, count in sorted(per_worker.items()))
        console.print(f"cases per device session: {spread}", highlight=False)
    return results


def print_results(console: Console, results: list[CaseResult], target: str, device: Any) -> None:
    groups: dict[tuple[str, str], list[CaseResult]] = defaultdict(list)
    for result in results:
        groups[(result.op, result.dtype)].append(result)
    where = f"{device.name}{' (emulated)' if device.emulated else ''}"
    table = Table(title=f"deploy test --target {target} on {where}")
    for column in ("op", "dtype", "cases", "max error", "schedule", "status"):
        table.add_column(column)
    for (op, dtype), group in groups.items():
        passed = sum(r.ok for r in group)
        finite = [r.max_error for r in group if r.max_error != float("inf")]
        table.add_row(
            op,
            dtype,
            f"{passed}/{len(group)}",
            f"{max(finite):.3g}" if finite else "-",
            ", ".join(sorted({r.schedule for r in group})),
            "[green]ok[/green]" if passed == len(group) else "[red]FAIL[/red]",
        )
    console.print(table)
    for result in results:
        if not result.ok:
            console.print(
                f"[red]FAIL[/red] {result.op} {result.dtype} {result.case}: {result.detail}",
                highlight=False,
            )
    failed = sum(not r.ok for r in results)
    console.print(f"{len(results) - failed} cases passed, {failed} failed", highlight=False)
    for line in note_lines(results):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def note_lines(results: list[CaseResult]) -> list[str]:
    """The builds' notes (`CaseResult.notes`) once per op and note, not per case: which dtypes
    and how many cases said it."""
    said: dict[tuple[str, str], list[CaseResult]] = defaultdict(list)
    for result in results:
        for note in result.notes:
            said[(result.op, note)].append(result)
    lines = []
    for (op, note), group in said.items():
        dtypes = ", ".join(dict.fromkeys(r.dtype for r in group))
        lines.append(f"note: {op} ({dtypes}, {len(group)} case{'s' if len(group) > 1 else ''}): {note}")
    return lines
