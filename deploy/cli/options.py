"""What several commands share: the options naming an op, a target, a device, cores and tuned
records, and how they become a bound op, a target with the build's options and a device."""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from deploy.base.errors import UsageError, shown

if TYPE_CHECKING:
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import Target


class _Console(Console):
    """A rich console whose broken pipe is a BrokenPipeError, as click.echo's is (`main` ends
    quietly on it): rich's own handler raised SystemExit(1), read as an op calling exit()."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def wide_console(min_width: int = 80) -> Console:
    """Where a command prints its tables: the terminal's width, but at least `min_width` columns
    (a COLUMNS of 0 made rich print nothing at all, `deploy test`'s verdict included)."""
    return _Console(width=max(Console().width, min_width))


def warn(message: str) -> None:
    """One warning line on stderr (a records directory the build could not use, say)."""
    click.echo(f"warning: {message}", err=True)


def resolve_build(
    name: str,
    tuned: str | None = None,
    cores: int | None = None,
    layout: str | None = None,
    model: str | None = None,
) -> tuple[Target, BuildOptions]:
    """The target `name` and the build's options: with
    `tuned`, building from that `deploy tune` records directory; with `cores`, splitting parallel
    work for that many threads (else for the device's, asked later); with `layout`, running the
    graph of `model` in that layout."""
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import get_target
    from deploy.ops.layouts import LAYOUTS

    if tuned is not None and not Path(tuned).is_dir():
        found = "is not a directory" if Path(tuned).exists() else "no such directory"
        raise UsageError(
            f"--tuned {tuned}: {found} (expected the records directory of `deploy tune --db DIR`)"
        )
    if cores is not None and not 1 <= cores <= 4096:
        raise UsageError(f"--cores {cores}: expected a thread count from 1 to 4096")
    if layout is not None and model is None:
        raise UsageError(
            f"--layout {layout!r}: lays out a model's graph (--model); an op's layout is its -a layout="
            " attribute, where it has one"
        )
    if layout is not None and layout not in LAYOUTS:
        raise UsageError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    target = get_target(name)
    records = None
    if tuned is not None:
        from deploy.tune.tuners import AcceptedRecords  # the tuners only when --tuned asks for them

        records = AcceptedRecords(Path(tuned), warn)
    return target, BuildOptions(tuned=records, cores=cores, layout=layout)


def bind_op(op_name: str, attrs: tuple[str, ...], types: list[Any]) -> Any:
    """The op `op_name` bound to `-a` attributes and input types (a BoundOp)."""
    from deploy.cli.args import parse_attrs
    from deploy.ops import bind, get_op

    return bind(get_op(op_name), parse_attrs(attrs), types)


def load_graph(path: str) -> Any:
    """The model file at `path` (ONNX or a graph file) as a checked graph (`deploy.ops.graph.BoundGraph`),
    with a note naming the nodes it left out as computing nothing its outputs read."""
    from deploy.model import load_model
    from deploy.ops.graph import bind_graph

    graph = bind_graph(load_model(path))
    if graph.dropped:
        names = ", ".join(shown(name) for name in graph.dropped[:DROPPED_SHOWN])
        more = " ..." if len(graph.dropped) > DROPPED_SHOWN else ""
        click.echo(
            f"note: model {path}: {len(graph.dropped)} node(s) compute nothing its outputs read;"
            f" dropped: {names}{more}",
            err=True,
        )
    return graph


DROPPED_SHOWN = 5
"""The most dropped nodes a note names."""


def op_or_model(op_name: str | None, model: str | None, **op_only: Any) -> None:
    """Exactly one of --op and --model; the options in `op_only` (name -> value given) describe
    an op's inputs and attributes, which a model file holds itself."""
    if (op_name is None) == (model is None):
        raise UsageError("give --op NAME or --model FILE (one of them)")
    if model is not None:
        given = [name for name, value in op_only.items() if value not in (None, (), False)]
        if given:
            raise UsageError(
                f"--model {model}: {', '.join(given)} describe an op; the model file gives its own"
            )


@dataclass(frozen=True)
class DeviceChoice:
    """Where a command runs: `--device NAME`, `--cl-device P:D`, any free server of `--key` on
    `--tracker`, or (none given) the target's default device."""

    name: str | None
    tracker: str | None
    key: str | None
    cl_device: str | None

    def resolve(self, target: Any) -> Any:
        from deploy.devices import get_device

        if self.cl_device:
            if self.name or self.tracker:
                raise UsageError("--cl-device goes instead of --device and --tracker")
            return get_device(f"opencl:{self.cl_device}")
        if self.tracker or self.key is not None:
            from deploy.devices.tracker import TrackerDevice, check_key, parse_address

            if self.key is not None:
                check_key(self.key)
            if self.name or not (self.tracker and self.key):
                raise UsageError("--tracker and --key go together, instead of --device")
            host, port = parse_address(self.tracker)
            return TrackerDevice(host, port, self.key, target.arch)
        return get_device(self.name or target.default_device, target.arch)


def device_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --device, --tracker, --key and --cl-device; the command receives them as `where`."""

    @functools.wraps(command)
    def with_choice(
        *args: Any,
        device_name: str | None,
        tracker: str | None,
        tracker_key: str | None,
        cl_device: str | None,
        **kwargs: Any,
    ) -> Any:
        return command(*args, where=DeviceChoice(device_name, tracker, tracker_key, cl_device), **kwargs)

    options = (
        click.option("--device", "device_name", help="Device to run on (default: the target's)."),
        click.option("--tracker", metavar="HOST:PORT", help="Run on servers from this RPC tracker."),
        click.option("--key", "tracker_key", metavar="KEY", help="Device key on the tracker."),
        click.option("--cl-device", metavar="P:D", help="OpenCL platform:device (`deploy device list`)."),
    )
    for option in reversed(options):
        with_choice = option(with_choice)
    return with_choice


OP_OPTIONAL = click.option("--op", "op_name", help="Op name (see `deploy ops`).")
MODEL = click.option(
    "--model",
    type=click.Path(dir_okay=False),
    help="A model instead of an op: ONNX (.onnx) or a graph file (.yaml/.json), see docs/graphs.md.",
)
ENGINE = click.option(
    "--engine",
    "engine_name",
    metavar="ENGINE",
    help="Build for, or test inside, an inference engine: onnxruntime (a custom-op library serving the"
    " model's custom-domain nodes, or the op's) or executorch (a kernel library serving the deploy::"
    " ops of an exported PyTorch program, or the op), see docs/engines.md.",
)
TARGET = click.option("--target", "target_name", required=True, help="Target name (see `deploy targets`).")
ATTR = click.option("-a", "--attr", "attrs", multiple=True, metavar="KEY=VALUE", help="Op attribute.")
CORES = click.option(
    "--cores",
    type=int,
    metavar="N",
    help="Split parallel loops for N threads [default: ask the device: its runtime's thread count].",
)
LAYOUT = click.option(
    "--layout",
    metavar="LAYOUT",
    help="With --model: run the graph's pooling (and what joins it) in LAYOUT (NCHW, NHWC or a packed"
    " NCHW<p>c; a name deploy does not know is refused with the list; `deploy targets` shows what"
    " `deploy tune --model` measures per target), converting only at the graph's boundaries and where"
    " neighbours disagree [default: NCHW, or with --tuned what `deploy tune --model` measured fastest].",
)
TUNED = click.option(
    "--tuned",
    metavar="DIR",
    help="Use the records `deploy tune` accepted in DIR where they match (else the hand schedule).",
)
