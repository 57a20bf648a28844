"""The `deploy` command line: the group every command hangs from.

Errors are one line on stderr: exit 2 for bad input, 1 for failures; `--debug` shows tracebacks.
The commands live one module per job beside this one; this module only assembles them.
"""

from __future__ import annotations

from typing import Any

import click

from base.errors import DeployError, first_line
from toolchain.cli.bench import bench_command
from toolchain.cli.build import build_command, run_command
from toolchain.cli.describe import ops_command, targets_command
from toolchain.cli.device import device_group, tracker_group
from toolchain.cli.test import test_command
from toolchain.cli.tune import tune_command


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


for command in (
    ops_command, targets_command, build_command, run_command, test_command, bench_command, tune_command,
    device_group, tracker_group,
):  # fmt: skip
    main.add_command(command)
