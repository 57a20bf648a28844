"""`deploy bench`: the measurements of `deploy.bench` as a table, JSON or a PNG against the
roofline."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from deploy.base.errors import DeployError, UsageError, reason
from deploy.base.files import check_writable, replacing
from deploy.cli.options import (
    CORES,
    LAYOUT,
    MODEL,
    TARGET,
    TUNED,
    DeviceChoice,
    device_options,
    load_graph,
    resolve_build,
    warn,
    wide_console,
)

MAX_MB = 8000
"""--min-mb's bound: a 32-bit index reaches 2**31 elements, 8.6 GB of float32."""
MAX_REPEAT = 1000
"""--repeat's bound: rounds of a large case take seconds each; more is a slip of the keyboard."""


@click.command("bench")
@CORES
@TARGET
@TUNED
@device_options
@click.option("--op", "op_names", multiple=True, help="Only these ops (default: all).")
@MODEL
@LAYOUT
@click.option("--dtype", help="Dtype of the ops' inputs [default: float32].")
@click.option(
    "--repeat",
    default=5,
    show_default=True,
    help="Rounds: one timed run of the op and one of each bandwidth kernel; medians are reported.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--plot", type=click.Path(dir_okay=False), help="Write a PNG of GB/s per op against the copy roofline."
)
@click.option(
    "--min-mb",
    type=int,
    help="Grow each bench case along its leading dim until it moves at least this many MB, and"
    " measure the roofline over as many (a GPU whose L2 holds the cases) [default: the ops' cases,"
    " a 64 MiB roofline].",
)
@click.option(
    "--baselines/--no-baselines",
    default=True,
    show_default=True,
    help="Time numpy (its BLAS on one thread unless OPENBLAS_NUM_THREADS says more), onnxruntime and"
    " PyTorch (when installed) on this host beside the device.",
)
@click.option(
    "--batch-1/--no-batch-1",
    "single",
    default=True,
    show_default=True,
    help="Beside each op's bench case, a row of that case at batch 1 (in cache, as an edge device calls it).",
)
def bench_command(
    cores: int | None,
    target_name: str,
    tuned: str | None,
    where: DeviceChoice,
    op_names: tuple[str, ...],
    model: str | None,
    layout: str | None,
    dtype: str | None,
    repeat: int,
    as_json: bool,
    plot: str | None,
    min_mb: int | None,
    baselines: bool,
    single: bool,
) -> None:
    """Median time per op (its bench case, well past the last-level cache), or of a model's graph,
    on the target's device, against its floor (the longer of bytes read at the device's read
    bandwidth and bytes written at its write bandwidth, both timed in the same rounds as the op) and its copy
    bandwidth, numpy, onnxruntime and (if installed) PyTorch, measured in one run; and each op at
    batch 1. On a terminal, a line on stderr says which row is being built and timed."""
    from deploy.bench.bench import BenchOptions, bench_model, bench_ops, refuse_wrong_answers
    from deploy.ops import all_ops, get_op

    if not 1 <= repeat <= MAX_REPEAT:
        raise UsageError(f"--repeat {repeat}: expected 1 to {MAX_REPEAT}")
    if min_mb is not None and not 1 <= min_mb <= MAX_MB:
        raise UsageError(f"--min-mb {min_mb}: expected 1 to {MAX_MB}")
    options = BenchOptions(repeat=repeat, min_bytes=(min_mb or 0) * 10**6, baselines=baselines, single=single)
    if plot is not None and Path(plot).suffix.lower() != ".png":
        raise UsageError(f"--plot {plot!r}: expected a .png file path")
    if plot and not Path(plot).parent.is_dir():
        raise UsageError(f"--plot {plot}: {Path(plot).parent} is not an existing directory")
    if plot and (Path(plot).exists() or Path(plot).is_symlink()) and not Path(plot).is_file():
        raise UsageError(f"--plot {plot}: not a regular file (or a link to one) to replace")
    if plot:
        try:
            check_writable(Path(plot).parent)  # before the bench, whose figures a failed write would lose
        except OSError as exc:
            raise UsageError(
                f"--plot {plot}: cannot write in {Path(plot).parent}: {exc.strerror or exc}"
            ) from None
    if model is not None and min_mb is not None:
        raise UsageError(f"--min-mb {min_mb}: grows the ops' bench cases; a model's shapes are its own")
    if model is not None and (op_names or dtype):
        raise UsageError(f"--model {model}: --op and --dtype select ops; the model file gives its own")
    target, build = resolve_build(target_name, tuned, cores, layout, model)
    if model is not None:
        graph = load_graph(model)
        with progress_line() as progress:
            rows = bench_model(graph, target, build, where.resolve(target), options, progress)
    else:
        dtype = "float32" if dtype is None else dtype
        ops = [get_op(name) for name in op_names] if op_names else all_ops()
        unsupported = [op.name for op in ops if dtype not in op.dtypes]
        if len(unsupported) == len(ops):  # checked before any device is touched
            raise UsageError(f"no op in the selection supports dtype {dtype} (see `deploy ops`)")
        if op_names and unsupported:
            raise UsageError(
                f"--op {', '.join(unsupported)}: does not support dtype {dtype} (see `deploy ops`)"
            )
        device = where.resolve(target)
        benched = [op for op in ops if op.name not in unsupported]
        with progress_line() as progress:
            rows = bench_ops(benched, dtype, target, build, device, options, progress)
        if not device.emulated and min_mb is None:
            warn_in_cache(rows, {op.name: op for op in ops})
    device = where.resolve(target)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        print_bench(rows, target.name, device)
    unwritten: DeployError | None = None
    if plot:  # after the figures are out: a failed write loses the plot alone
        try:
            with replacing(Path(plot), through_links=True) as temporary:  # a link stays a link
                plot_bench(rows, temporary, f"deploy bench --target {target.name} on {device.name}")
        except OSError as exc:
            unwritten = DeployError(f"--plot {plot}: cannot write it: {exc.strerror or reason(exc)}")
        except DeployError as exc:
            unwritten = exc
    refuse_wrong_answers(rows)  # the verdict on the answers first
    if unwritten is not None:
        raise unwritten


@contextmanager
def progress_line() -> Iterator[Callable[[str, int, int], None]]:
    """A `deploy.bench.bench.Progress` showing the row being built and timed, and how many of
    how many, as a line on stderr that goes when the bench ends; nothing where stderr is not a
    terminal (a log, a pipe: the table and the JSON on stdout stay as they are)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:  # rich would still end with an empty line
        yield lambda label, done, total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("bench", total=None)

        def show(label: str, done: int, total: int) -> None:
            bar.update(task, description=f"bench: building, checking and timing {label}", completed=done,
                       total=total)  # fmt: skip

        yield show


IN_CACHE_MB = 32.0
"""Below this many MB moved a case may be timed in a cache, not memory (a heuristic: a server's
last-level cache holds 32 MB or more, a GPU's L2 up to 60): what an op without a `bench` case
gets, its first case."""


def warn_in_cache(rows: list[dict[str, Any]], ops: dict[str, Any]) -> None:
    """A warning per op (of `ops`, by name) timed on its first case because it declares no
    `bench`, when that case moves less than IN_CACHE_MB: its figure is the cache's, not the
    memory's (the batch-1 rows are in cache on purpose)."""
    for row in rows:
        if ops[row["op"]].bench is None and row["mb_moved"] < IN_CACHE_MB and not row["batch_1"]:
            warn(
                f"{row['op']} declares no bench case: timed its first case, {row['mb_moved']:.2g} MB,"
                " which a cache may hold; give the op `bench = Case(...)` moving more than the"
                " last-level cache, or pass --min-mb"
            )


def print_bench(rows: list[dict[str, Any]], target: str, device: Any) -> None:
    """The rows as a table; a row whose answer differs from numpy says so where its time would be."""
    where = device.name
    if device.emulated:
        where += " (emulated: timings show correctness, not speed)"
    timed = [r for r in rows if not r["wrong_answer"]]
    roof = (
        f"bandwidth beside each op: read {_span(timed, 'read_gb_per_s')},"
        f" write {_span(timed, 'write_gb_per_s')}, copy {_span(timed, 'roofline_gb_per_s')} GB/s"
        if timed
        else "-"
    )
    table = Table(title=f"deploy bench --target {target} on {where}; {roof} (medians)")
    columns = ("op", "shapes", "schedule", "ms", "GB/s", "x floor", "numpy ms", "vs numpy", "ort ms",
               "vs ort", "torch ms", "vs torch")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for r in rows:
        if r["wrong_answer"]:
            table.add_row(r["op"], r["shapes"], r["schedule"], "wrong answer", *["-"] * (len(columns) - 4))
            continue
        table.add_row(
            r["op"], r["shapes"], r["schedule"], f"{r['median_ms']:.3f}", f"{r['gb_per_s']:.1f}",
            f"{r['x_floor']:.2f}", "n/a" if r["numpy_na"] else _or_dash(r["numpy_ms"], ".3f"),
            versus(r["speedup_vs_numpy"]),
            _or_dash(r["onnxruntime_ms"], ".3f"), versus(r["speedup_vs_onnxruntime"]),
            _or_dash(r["torch_ms"], ".3f") + (" *" if r["torch_preallocated"] is False else ""),
            versus(r["speedup_vs_torch"]),
        )  # fmt: skip
    table.caption = (
        "Baselines on this host with as many threads: numpy = the op's numpy_baseline (its reference"
        " unless it names a faster one; n/a: none is fair), ort = onnxruntime, through IOBinding into a"
        " preallocated output; torch into a preallocated one (out=), * where every call allocates it."
        " --json adds MB moved and x copy (time over a copy of as many bytes)."
    )
    wide_console(150).print(table)


def _span(rows: list[dict[str, Any]], key: str) -> str:
    """'low-high' of a bandwidth over the rows (each measured beside its op), or the one value."""
    low, high = min(r[key] for r in rows), max(r[key] for r in rows)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"


def versus(speedup: float | None) -> str:
    """A baseline's time over ours in words: '2.0x faster', '5.0x slower' (a bare '0.2x' was read
    as faster), '-' where the baseline was not measured."""
    if speedup is None:
        return "-"
    return f"{speedup:.1f}x faster" if speedup >= 1 else f"{1 / speedup:.1f}x slower"


def _or_dash(value: float | None, spec: str) -> str:
    """A baseline's figure, or '-' where it was not measured (not installed, --no-baselines)."""
    return "-" if value is None else f"{value:{spec}}"


def plot_bench(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Achieved GB/s per op against the copy roofline (a line), as a PNG; rows without a time
    (a wrong answer) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r["wrong_answer"]]
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    labels = [r["op"] for r in rows]
    axes.bar(labels, [r["gb_per_s"] for r in rows], color="tab:blue", label="achieved")
    if rows:
        copy = statistics.median(r["roofline_gb_per_s"] for r in rows)
        axes.axhline(copy, color="tab:red", linestyle="--", label="copy roofline (median)")
    for index, r in enumerate(rows):
        axes.annotate(f"{r['x_floor']:.2f}x floor", (index, r["gb_per_s"]), ha="center", va="bottom")
    axes.set_ylabel("GB/s (bytes moved / median time)")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
