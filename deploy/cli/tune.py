"""`deploy tune`: search schedules on the device, keep the records, report default vs hand vs tuned."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from deploy.base.errors import DeployError, UsageError
from deploy.base.files import check_writable, replacing
from deploy.base.stopping import exit_code
from deploy.base.threads import THREADS_ENV, runtime_threads
from deploy.cli.options import (
    ATTR,
    CORES,
    LAYOUT,
    MODEL,
    OP_OPTIONAL,
    TARGET,
    DeviceChoice,
    bind_op,
    device_options,
    load_graph,
    op_or_model,
    resolve_build,
    warn,
    wide_console,
)

if TYPE_CHECKING:
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import Target
    from deploy.devices import Device
    from deploy.ops.spec import BoundOp
    from deploy.tune.layouts import LayoutVerdict
    from deploy.tune.tuner import TuneResult


PNG = "report.png"
MAX_TRIALS = 100_000
MAX_TIMEOUT_S = 86_400.0


@click.command("tune")
@OP_OPTIONAL
@MODEL
@LAYOUT
@TARGET
@ATTR
@CORES
@device_options
@click.option("--shape", "shapes", multiple=True, help="Input shape, e.g. 32x64x112x112; once per input.")
@click.option("--dtype", help="Dtype of every input [default: float32].")
@click.option(
    "--trials", default=64, show_default=True, help="Records to reach for this op and shape (per kernel)."
)
@click.option(
    "--db", "db_dir", default="tuning", show_default=True, type=click.Path(), help="Records directory."
)
@click.option(
    "--timeout",
    "timeout_s",
    default=60.0,
    show_default=True,
    help="Seconds a MetaSchedule candidate may run (OpenCL targets try work-group sizes of their own"
    " schedule, with no limit).",
)
@click.option("--report", is_flag=True, help="Write DB/TARGET/report.png and a default/hand/tuned table.")
def tune_command(
    op_name: str | None,
    model: str | None,
    layout: str | None,
    target_name: str,
    attrs: tuple[str, ...],
    cores: int | None,
    where: DeviceChoice,
    shapes: tuple[str, ...],
    dtype: str | None,
    trials: int,
    db_dir: str,
    timeout_s: float,
    report: bool,
) -> None:
    """Tune an op for input shapes (or each fused kernel of --model) on the target's device with
    MetaSchedule; records go to --db and the same command again continues from them. Build from
    them with `--tuned DB`.

    With --report (and no --op or --model): report every op and kernel tuned for the target in --db."""
    from deploy.cli.args import parse_shape
    from deploy.ops import TensorType
    from deploy.tune.tuner import check_static

    if not 1 <= trials <= MAX_TRIALS:
        raise UsageError(f"--trials {trials}: expected 1..{MAX_TRIALS}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN fails too
        raise UsageError(f"--timeout {timeout_s}: expected seconds in (0, {MAX_TIMEOUT_S:.0f}]")
    root = _records_dir(db_dir)
    os.environ[THREADS_ENV] = runtime_threads()
    target, options = resolve_build(target_name, cores=cores, layout=layout, model=model)
    device = where.resolve(target)
    if op_name is not None or model is not None:
        op_or_model(op_name, model, **{"-a": attrs, "--shape": shapes, "--dtype": dtype})
    if model is not None:
        from deploy.compiler.compile import lay_out
        from deploy.compiler.options import for_device
        from deploy.tune.layouts import choose_layout, write_layout
        from deploy.verify.run import check_device

        graph = load_graph(model)
        check_static(f"tuning {graph.name}", graph.inputs)  # before any kernel is tuned
        check_device(target, device)
        with device.open() as session:
            options = for_device(options, session)  # the kernels as it computes them (float16 widened)
            if layout is not None:  # the kernels tuned are this layout's: --tuned builds follow it
                write_layout(root, graph, target.name, {"layout": layout, "given": "--layout"})
            else:  # measure the target's layout first: the kernels to tune are its graph's
                chosen = choose_layout(graph, target, options, device, session, root)
                if chosen is not None:
                    _print_layout(chosen)
                    options = replace(options, layout=chosen.layout)
        for kernel in lay_out(graph, target, options).kernels:
            wide_console().print(f"kernel {kernel.name}: nodes {', '.join(kernel.nodes)}", highlight=False)
            _tune_with_progress(kernel.bound, target, options, device, root, trials, timeout_s)
    elif op_name is not None:
        if not shapes:
            raise UsageError("--shape is required with --op (once per input)")
        each = "float32" if dtype is None else dtype
        bound = bind_op(op_name, attrs, [TensorType(parse_shape(s), each) for s in shapes])
        check_static(f"tuning {bound.name}", bound.inputs)  # before the progress display starts
        _tune_with_progress(bound, target, options, device, root, trials, timeout_s)
    elif not report:
        raise UsageError("--op or --model is required (or --report alone, to report what --db holds)")
    if report:
        from deploy.tune.report import report_target

        measured = report_target(root, target, options, device, warn)
        png = measured.json.with_name(PNG)
        plot_curves(measured.curves, png, f"deploy tune --target {target.name} on {device.name}")
        print_report(measured.rows, target, device, png)


def _records_dir(db_dir: str) -> Path:
    """--db as a directory that is or can be created: no file where a directory must be."""
    if not db_dir:
        raise UsageError("--db '': expected a records directory")
    root = Path(db_dir)
    nearest = next((path for path in (root, *root.parents) if path.exists() or path.is_symlink()), None)
    if nearest is not None and not nearest.is_dir():
        what = "a file" if nearest.exists() else "a symbolic link to nothing"
        where = f"is {what}" if nearest == root else f"is under {nearest}, {what}"
        raise UsageError(f"--db {db_dir}: {where}; expected a records directory")
    try:
        check_writable(root)
    except OSError as exc:
        problem = exc.strerror or exc
        raise UsageError(f"--db {db_dir}: {problem}; expected a directory deploy can write") from None
    return root


def _tune_with_progress(
    bound: BoundOp, target: Target, options: BuildOptions, device: Device, root: Path, trials: int,
    timeout_s: float,
) -> None:  # fmt: skip
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from deploy.tune.records import task_dir
    from deploy.tune.tuner import DefaultCheck
    from deploy.tune.tuner import Progress as Callbacks
    from deploy.tune.tuners import tune

    console = wide_console()
    best: list[float] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(f"tuning {bound.op.name} on {device.name}", total=trials)

        def describe() -> str:
            shown = f"best {min(best) * 1e3:.4g} ms" if best else "no valid trial yet"
            return f"tuning {bound.op.name} on {device.name}: {shown}"

        def on_start(done: int, best_s: float | None) -> None:
            if best_s is not None:
                best.append(best_s)
            if done:
                console.print(f"continuing: {done} records already in {task_dir(root, bound, target.name)}")
            progress.update(bar, completed=min(done, trials), description=describe())

        def stopping() -> None:
            click.echo("\nstopping after this batch of trials (Ctrl-C again to stop now)", err=True)

        def waiting(directory: Path) -> None:
            click.echo(f"waiting: another deploy tune is tuning this task in {directory}", err=True)

        def on_trial(secs: float | None) -> None:
            if secs is not None:
                best.append(secs)
            progress.update(bar, advance=1, description=describe())

        def default_checked(default: DefaultCheck) -> None:
            if default.checked is not None:
                schedule, error = default.checked.manifest.schedule, default.checked.max_error
                shown = f"default build ({schedule}) checked first: max error {error:.3g} vs numpy"
                console.print(shown, highlight=False)
            else:
                warn(f"the default build fails its check ({default.failure}); searching for a verified one")

        try:
            callbacks = Callbacks(on_start, on_trial, stopping, waiting, default_checked)
            result = tune(bound, target, options, device, root, trials, timeout_s, callbacks)
        except KeyboardInterrupt as interrupt:
            progress.stop()
            directory = task_dir(root, bound, target.name)
            click.echo(
                f"interrupted: the records measured so far stay in {directory};"
                " run the same command to continue",
                err=True,
            )
            raise click.exceptions.Exit(exit_code(interrupt)) from None
    _print_result(console, result, trials)


def _print_layout(verdict: LayoutVerdict) -> None:
    """One line: the layout `choose_layout` measured against NCHW, and which one builds use
    (and a line before it where the verdict stands from an earlier run)."""
    if verdict.standing is not None:
        click.echo(
            f"layout measured before on {verdict.device} (delete {verdict.standing} to measure again):"
        )
    candidate, nchw, packed = verdict.candidate, verdict.nchw_ms, verdict.packed_ms
    if verdict.layout is not None and packed is not None:
        click.echo(
            f"layout {candidate}: {packed:.4g} ms against {nchw:.4g} ms in NCHW ({packed / nchw:.2f}x);"
            f" --tuned builds run the graph in {candidate}"
        )
        return
    for line in verdict.rejected:
        warn(f"rejected layout {line}")
    shown = f"{packed:.4g} ms ({packed / nchw:.2f}x)" if packed is not None else "rejected"
    click.echo(f"layout NCHW stays: {nchw:.4g} ms, {candidate} {shown} with its conversions")


def _print_result(console: Console, result: TuneResult, trials: int) -> None:
    best = f"{result.best_ms:.4g} ms" if result.best_ms is not None else "none"
    console.print(
        f"{result.trials} records in {result.directory} ({result.new_trials} new, {result.valid} valid);"
        f" best while searching {best}",
        highlight=False,
    )
    if result.trials < trials:
        console.print(
            f"the search ended at {result.trials} of {trials} trials: no untried candidate left in the space",
            highlight=False,
        )
    for line in result.rejected:
        console.print(f"[yellow]rejected[/yellow] record {line}", highlight=False)
    entry = result.accepted
    if entry is None:
        console.print("no candidate ran: builds keep the hand schedule", highlight=False)
        return
    if entry.get("same_as_hand"):
        console.print(
            f"{len(entry['same_as_hand'])} of the fastest records compile to the hand schedule's own"
            " module: not timed against it",
            highlight=False,
        )
    failed = entry.get("hand_failed")
    if failed:
        console.print(f"[red]the default build fails its check[/red]: {failed}", highlight=False)
    if not entry["record"]:
        best = f"{entry['best_tuned_ms']:.4g} ms" if entry.get("best_tuned_ms") is not None else "none"
        if failed:
            raise DeployError(f"no record passed its check either (best tuned {best}): nothing verified")
        console.print(
            f"kept the hand schedule: tuning found nothing faster on {entry['device']} (timed side"
            f" by side: hand {entry['hand_ms']:.4g} ms, best tuned {best}); --tuned builds use the hand"
            " schedule",
            highlight=False,
        )
    elif failed:
        console.print(
            f"accepted record {entry['record']}, the fastest that passed its check: {entry['ms']:.4g} ms"
            f" (max error {entry['max_error']:.3g} vs numpy on {entry['device']}):"
            f" build with --tuned {result.directory.parent.parent}",
            highlight=False,
        )
    else:
        console.print(
            f"accepted record {entry['record']}: {entry['ms']:.4g} ms against the hand schedule's"
            f" {entry['hand_ms']:.4g} ms (spread {max(entry['spread_ms'], entry['hand_spread_ms']):.2g} ms,"
            f" max error {entry['max_error']:.3g} vs numpy on {entry['device']}):"
            f" build with --tuned {result.directory.parent.parent}",
            highlight=False,
        )
    ratio = default_over_best(entry)
    if ratio is not None:
        console.print(ratio, highlight=False)


def default_over_best(entry: dict[str, Any]) -> str | None:
    """How far the default build was from the best found, timed side by side: 'default 12.3 ms /
    best 1.2 ms = 10.25x' (1.00x where nothing beat it); None where the default was not timed."""
    hand = entry.get("hand_ms")
    found = [entry[key] for key in ("ms", "best_tuned_ms") if entry.get(key) is not None]
    if hand is None or not found:
        return None
    best = min(hand, *found)
    return f"default {hand:.4g} ms / best found {best:.4g} ms = {hand / best:.2f}x"


def plot_curves(curves: dict[str, list[float | None]], path: Path, title: str) -> None:
    """Best ms against trials, one line per task, log-scaled time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, curve in curves.items():
        points = [(i + 1, y) for i, y in enumerate(curve) if y is not None]
        if points:
            axes.plot(*zip(*points, strict=True), marker=".", label=label)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trials")
    axes.set_ylabel("best time so far (ms)")
    axes.set_yscale("log")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    with replacing(path) as partial:  # deploy's file in the records: replaced, never written through
        figure.savefig(partial, format="png")
    plt.close(figure)


def print_report(rows: list[dict[str, Any]], target: Target, device: Device, png: Path) -> None:
    where = f"{device.name}{' (emulated: timings show correctness, not speed)' if device.emulated else ''}"
    table = Table(title=f"default vs hand vs tuned, target {target.name} on {where} (median ms)")
    for column in ("op", "shapes", "trials", "default", "hand", "tuned", "hand/tuned"):
        table.add_column(column)
    for r in rows:
        tuned = r["tuned_ms"]
        shown = {"hand kept": "= hand (nothing faster)"}
        if r["verdict"] == "tuned":
            shown["tuned"] = f"{tuned:.4g} ±{r['tuned_spread_ms'] / 2:.2g}"
        table.add_row(
            r["op"],
            r["label"].split(" ", 1)[1],
            str(r["trials"]),
            f"{r['default_ms']:.4g}" if r["default_ms"] is not None else "-",
            f"{r['hand_ms']:.4g} ±{r['hand_spread_ms'] / 2:.2g}",
            shown.get(r["verdict"], "not verified"),
            f"{r['hand_ms'] / tuned:.2f}x" if tuned else "-",
        )
    console = wide_console()
    console.print(table)
    console.print(f"best time against trials: {png}", highlight=False)
