"""The `deploy` command line: ops, targets, build, run, test.

Errors are one line on stderr: exit 2 for bad input, 1 for failures; `--debug` shows tracebacks.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ops.errors import DeployError, UsageError, first_line


class DeployGroup(click.Group):
    """Turns DeployError into `error: ...` and exit codes; other exceptions into one line too."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except DeployError as exc:
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            click.echo(
                f"error: {type(exc).__name__}: {first_line(str(exc))} (rerun with --debug for details)",
                err=True,
            )
            ctx.exit(1)


@click.group(cls=DeployGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deploy-toolchain", prog_name="deploy")
@click.option("--ops-path", multiple=True, type=click.Path(), help="Directory of extra op files (*.py).")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def main(ops_path: tuple[str, ...], debug: bool) -> None:
    """deploy: build neural-network ops for embedded targets and verify them on devices."""
    from ops import load_entry_points, load_ops_path

    load_entry_points()
    for directory in ops_path:
        load_ops_path(directory)


def _target(name: str, tuned: str | None = None, cores: int | None = None) -> Any:
    """The target `name`; with `tuned`, building from that `deploy tune` records directory; with
    `cores`, splitting parallel work for that many threads (else for the device's, asked later)."""
    from toolchain.targets import get_target

    if tuned is not None and not Path(tuned).is_dir():
        raise UsageError(f"--tuned {tuned}: no such directory (write one with `deploy tune --db {tuned}`)")
    if cores is not None and not 1 <= cores <= 4096:
        raise UsageError(f"--cores {cores}: expected a thread count from 1 to 4096")
    return get_target(name).with_tuning(tuned).with_cores(cores)


def _bind(op_name: str, attrs: tuple[str, ...], types: list[Any]) -> Any:
    from ops import bind, get_op
    from toolchain.cli_args import parse_attrs

    return bind(get_op(op_name), parse_attrs(attrs), types)


@dataclass(frozen=True)
class DeviceChoice:
    """Where a command runs: `--device NAME`, `--cl-device P:D`, any free server of `--key` on
    `--tracker`, or (none given) the target's default device."""

    name: str | None
    tracker: str | None
    key: str | None
    cl_device: str | None

    def resolve(self, target: Any) -> Any:
        from devices import get_device

        if self.cl_device:
            if self.name or self.tracker:
                raise UsageError("--cl-device goes instead of --device and --tracker")
            return get_device(f"opencl:{self.cl_device}")
        if self.tracker or self.key:
            from devices.tracker import TrackerDevice, parse_address

            if self.name or not (self.tracker and self.key):
                raise UsageError("--tracker and --key go together, instead of --device")
            host, port = parse_address(self.tracker)
            return TrackerDevice(host, port, self.key, target.arch)
        return get_device(self.name or target.default_device)


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


OP = click.option("--op", "op_name", required=True, help="Op name (see `deploy ops`).")
OP_OPTIONAL = click.option("--op", "op_name", help="Op name (see `deploy ops`).")
TARGET = click.option("--target", "target_name", required=True, help="Target name (see `deploy targets`).")
ATTR = click.option("-a", "--attr", "attrs", multiple=True, metavar="KEY=VALUE", help="Op attribute.")
CORES = click.option(
    "--cores",
    type=int,
    metavar="N",
    help="Split parallel loops for N threads [default: ask the device: its runtime's thread count].",
)
TUNED = click.option(
    "--tuned",
    metavar="DIR",
    help="Use the records `deploy tune` accepted in DIR where they match (else the hand schedule).",
)


@main.command("ops")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ops_command(as_json: bool) -> None:
    """List ops with inputs, attributes, dtypes and targets."""
    from toolchain.describe import describe_ops, print_ops

    described = describe_ops()
    if as_json:
        click.echo(json.dumps(described, indent=2))
    else:
        print_ops(described)


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def targets_command(as_json: bool) -> None:
    """List targets."""
    from toolchain.describe import describe_targets, print_targets

    described = describe_targets()
    if as_json:
        click.echo(json.dumps(described, indent=2))
    else:
        print_targets(described)


@main.command("build")
@OP
@TARGET
@TUNED
@CORES
@device_options
@ATTR
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    required=True,
    help="Input shape, e.g. 32x64x112x112; once per input.",
)
@click.option("--dtype", default="float32", show_default=True, help="Dtype of every input.")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(),
    help="Artifact directory [default: ./OP-TARGET].",
)
@click.option(
    "--bundle",
    is_flag=True,
    help="Also write OP.h, libOP.so, lib/ and deploy-run: the op callable from C without Python.",
)
def build_command(
    op_name: str,
    target_name: str,
    tuned: str | None,
    cores: int | None,
    where: DeviceChoice,
    attrs: tuple[str, ...],
    shapes: tuple[str, ...],
    dtype: str,
    out_dir: str | None,
    bundle: bool,
) -> None:
    """Compile an op for a target into a module and manifest.json (split for --cores, else for the
    cores of --device or the target's default device)."""
    from ops import TensorType
    from toolchain.build import compile_op, export
    from toolchain.bundle import check_bundle
    from toolchain.cli_args import parse_shape
    from toolchain.verify import for_device

    target = _target(target_name, tuned, cores)
    bound = _bind(op_name, attrs, [TensorType(parse_shape(s), dtype) for s in shapes])
    if bundle:
        check_bundle(bound, target)
    if target.cores is None and target.artifact != "opencl":
        with where.resolve(target).open() as session:
            target = for_device(target, session)
    directory = Path(out_dir or f"{op_name}-{target_name}")
    manifest = export(compile_op(bound, target), directory, bundle=bundle)
    if tuned is not None and manifest.schedule != "tuned":
        click.echo(
            f"no accepted record for this op and these shapes in {tuned}:"
            f" using the {manifest.schedule} schedule"
        )
    record = f" record {manifest.tuning_record}" if manifest.tuning_record else ""
    click.echo(
        f"built {manifest.op} for {manifest.target} ({manifest.schedule} schedule{record}"
        f"{f', {manifest.cores} cores' if manifest.cores else ''}):"
        f" {bound.output} -> {directory / manifest.module} sha256 {manifest.sha256[:12]}"
    )
    if manifest.bundle is not None:
        from devices.platforms import get_platform

        emulator = " ".join(get_platform(target.arch).emulator_command())
        inputs = " ".join(f"-i {spec.name}.npy" for spec in bound.op.inputs)
        click.echo(
            f"bundle: {directory / manifest.bundle['header']} + {manifest.bundle['library']}; run it with"
            f" {emulator + ' ' if emulator else ''}{directory / manifest.bundle['runner']} {directory}"
            f" {inputs} -o out.npy"
        )


@main.command("run")
@CORES
@OP
@TARGET
@TUNED
@ATTR
@device_options
@click.option(
    "-i",
    "--input",
    "inputs",
    multiple=True,
    required=True,
    help="Input .npy, once per input in order.",
)
@click.option("-o", "--output", "output", required=True, help="Where to write the output .npy.")
@click.option("--check", is_flag=True, help="Compare with the numpy reference; exit 1 on mismatch.")
def run_command(
    cores: int | None,
    op_name: str,
    target_name: str,
    tuned: str | None,
    attrs: tuple[str, ...],
    where: DeviceChoice,
    inputs: tuple[str, ...],
    output: str,
    check: bool,
) -> None:
    """Build (cached) and run an op on .npy inputs; optionally check against numpy."""
    from ops import TensorType
    from toolchain.cache import cached_build
    from toolchain.cli_args import load_npy, save_npy
    from toolchain.compare import compare
    from toolchain.verify import check_device, for_device, run_artifact

    target = _target(target_name, tuned, cores)
    arrays = [load_npy(path) for path in inputs]
    bound = _bind(op_name, attrs, [TensorType(a.shape, str(a.dtype)) for a in arrays])
    device = where.resolve(target)
    check_device(target, device)
    with device.open() as session:
        directory, manifest = cached_build(bound, for_device(target, session))
        result = run_artifact(session, directory, manifest, arrays)
    save_npy(output, result)
    click.echo(f"{op_name} on {device.name} ({manifest.schedule}): wrote {output} {bound.output}")
    if check:
        comparison = compare(bound.op.reference(bound.attrs, *arrays), result, bound.op.exact)
        if not comparison.ok:
            raise DeployError(f"check failed: {comparison.detail}, max error {comparison.max_error:.3g}")
        click.echo(f"check passed: max error {comparison.max_error:.3g} vs numpy")


@main.command("test")
@CORES
@TARGET
@TUNED
@device_options
@click.option("--op", "op_names", multiple=True, help="Only these ops (default: all).")
@click.option("--dtype", "dtypes", multiple=True, help="Only these dtypes (default: each op's).")
def test_command(
    cores: int | None,
    target_name: str,
    tuned: str | None,
    where: DeviceChoice,
    op_names: tuple[str, ...],
    dtypes: tuple[str, ...],
) -> None:
    """Verify every op x dtype x shape against numpy on the target's device (with --tracker: on
    every free server of the key at once)."""
    from ops import all_ops, get_op
    from toolchain.report import run_with_progress
    from toolchain.verify import plan

    target = _target(target_name, tuned, cores)
    ops = [get_op(name) for name in op_names] if op_names else all_ops()
    planned = plan(ops, dtypes)
    if not planned:
        raise UsageError(f"no cases for ops {', '.join(op_names) or 'all'} with dtypes {', '.join(dtypes)}")
    device = where.resolve(target)
    if not dtypes and hasattr(device, "unsupported_dtypes"):
        for dtype, reason in device.unsupported_dtypes().items():
            click.echo(f"skipping {dtype} cases: {reason} (ask for them with --dtype {dtype})")
            planned = [case for case in planned if case.dtype != dtype]
    workers = device.capacity() if hasattr(device, "capacity") else 1
    if workers < 1:
        raise DeployError(f"no free server with key {where.key!r} on the tracker {where.tracker}")
    results = run_with_progress(planned, target, device, workers)
    if not all(r.ok for r in results):
        sys.exit(1)


@main.command("bench")
@CORES
@TARGET
@TUNED
@device_options
@click.option("--op", "op_names", multiple=True, help="Only these ops (default: all).")
@click.option("--dtype", default="float32", show_default=True, help="Dtype of the inputs.")
@click.option("--repeat", default=5, show_default=True, help="Timed runs; the median is reported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--plot", type=click.Path(dir_okay=False), help="Write a PNG of GB/s per op against the roofline."
)
@click.option("--fresh-roofline", is_flag=True, help="Measure the device's copy bandwidth again.")
def bench_command(
    cores: int | None,
    target_name: str,
    tuned: str | None,
    where: DeviceChoice,
    op_names: tuple[str, ...],
    dtype: str,
    repeat: int,
    as_json: bool,
    plot: str | None,
    fresh_roofline: bool,
) -> None:
    """Median time per op (its first verification case) on the target's device, against the
    device's copy-bandwidth roofline, numpy and (if installed) PyTorch, measured in one run."""
    from ops import all_ops, get_op
    from toolchain.bench import bench_ops, plot_bench, print_bench

    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: expected at least 1")
    target = _target(target_name, tuned, cores)
    ops = [get_op(name) for name in op_names] if op_names else all_ops()
    device = where.resolve(target)
    rows = bench_ops(ops, dtype, target, device, repeat, fresh_roofline)
    if not rows:
        raise UsageError(f"no op in the selection supports dtype {dtype}")
    if plot:
        plot_bench(rows, Path(plot), f"deploy bench --target {target.name} on {device.name}")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        print_bench(rows, target.name, device)


def _add_groups() -> None:
    import toolchain.cli_tune  # noqa: F401  (registers `deploy tune`)
    from toolchain.cli_device import device_group, tracker_group

    main.add_command(device_group)
    main.add_command(tracker_group)


_add_groups()
