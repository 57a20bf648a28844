"""The `deploy` command line: the group every command hangs from.

Errors are one line on stderr: exit 2 for bad input, 1 for failures; `--debug` shows tracebacks.
SIGTERM and SIGHUP (a closed terminal) unwind like Ctrl-C, so servers and files a command started
are cleaned up; the exit code is then 128 + the signal's number.
The commands live one module per job beside this one; this module only assembles them.
"""

from __future__ import annotations

import codecs
import io
import os
import select
import signal
import sys
import traceback
from typing import Any, NoReturn

import click

from deploy.base.errors import DeployError, first_line
from deploy.base.forked import end_children
from deploy.base.paths import check_places
from deploy.base.stopping import Stopped, abandoned, exit_code, stopped_by, stopping_like_ctrl_c
from deploy.base.threads import check_thread_env
from deploy.cli.bench import bench_command
from deploy.cli.build import build_command, run_command
from deploy.cli.describe import ops_command, targets_command
from deploy.cli.device import device_group, tracker_group
from deploy.cli.test import test_command
from deploy.cli.tune import tune_command
from deploy.ops import failure_line


def _one_line_usage(exc: click.UsageError) -> NoReturn:
    """Click's usage errors as one `error:` line too, instead of its usage, hint and error lines
    (a bare `deploy` or `deploy device` still prints the help it asks for)."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc
    command = exc.ctx.command_path if exc.ctx else "deploy"
    click.echo(f"error: {first_line(exc.format_message())} (see `{command} --help`)", err=True)
    raise click.exceptions.Exit(exc.exit_code)


UNENCODABLE = "deploy.unencodable"
"""The error handler of deploy's output streams (`_unencodable`)."""


def _unencodable(error: UnicodeError) -> tuple[str | bytes, int]:
    """What a stream writes for characters its encoding lacks: the bytes a path's undecodable
    bytes were read as (surrogateescape, as the C locale prints them), `?` for the rest."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    chunk = error.object[error.start : error.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in chunk):
        return bytes(ord(c) - 0xDC00 for c in chunk), error.end
    return "?" * len(chunk), error.end


codecs.register_error(UNENCODABLE, _unencodable)


def _stopped(ctx: click.Context, interrupt: KeyboardInterrupt) -> NoReturn:
    """End the command a signal stopped: one line, exit 128 + the signal's number."""
    signal_name = str(interrupt) if isinstance(interrupt, Stopped) else "SIGINT"
    click.echo(f"error: stopped by {signal_name}", err=True)
    ctx.exit(exit_code(interrupt))


def _reader_gone() -> bool:
    """Whether stdout is a pipe its reader has closed (`deploy device list | head -3`), not a
    socket to a device that broke."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor (a test's stream)
        return False


def _unread(ctx: click.Context) -> NoReturn:
    """End quietly with 128 + SIGPIPE, as a command the signal ends does: the reader wanted no
    more. Whatever is still buffered goes to /dev/null (Python would report it at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    ctx.exit(128 + signal.SIGPIPE)


GROUP_OPTIONS_WITH_VALUE = ("--ops-path",)
"""Options of `deploy` itself that users also put after the command (`deploy test --ops-path
myops ...`): click takes them only before it, so they are moved there."""


def hoist_group_options(args: list[str]) -> list[str]:
    """`args` with each GROUP_OPTIONS_WITH_VALUE given after the command (as `--opt VALUE` or
    `--opt=VALUE`, before any `--`) moved to the front, in order; one without its value stays
    where it is, for click's own error."""
    front: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest += args[index:]
            break
        if arg in GROUP_OPTIONS_WITH_VALUE and index + 1 < len(args):
            front += args[index : index + 2]
            index += 2
            continue
        if arg.split("=", 1)[0] in GROUP_OPTIONS_WITH_VALUE and "=" in arg:
            front.append(arg)
        else:
            rest.append(arg)
        index += 1
    return front + rest


class DeployGroup(click.Group):
    """Turns DeployError into `error: ...` and exit codes; other exceptions into one line too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_group_options(args))

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Print what an ASCII or Latin-1 stream (`PYTHONIOENCODING=ascii`, the C locale without
        UTF-8) cannot encode as `?`: a `…` in a rich table ended `deploy targets` with a
        UnicodeEncodeError line (click's own lines pick UTF-8 on such a stream)."""
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(errors=UNENCODABLE)
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            if abandoned():  # a stopped compile still runs: end now, under it (`interruptible`)
                end_children()  # an export's child, and its scratch in $TMPDIR
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(exc.code if isinstance(exc.code, int) else 1)
            raise

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            _one_line_usage(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with stopping_like_ctrl_c():
                return super().invoke(ctx)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM/SIGHUP as a Stopped
            _stopped(ctx, interrupt)
        except click.UsageError as exc:
            _one_line_usage(exc)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except SystemExit as exc:  # deploy exits through click: a SystemExit is code it ran (an op's)
            if ctx.params.get("debug"):  # where it was called (Python prints none for SystemExit)
                traceback.print_exc()
            code = 0 if exc.code is None else exc.code
            click.echo(
                f"error: exit({code!r}) was called before the command finished (in an op's code?)", err=True
            )
            ctx.exit(1)
        except DeployError as exc:
            stop = stopped_by()
            if stop is not None:  # a stop TVM's FFI handed back, which deploy's code then reported
                _stopped(ctx, stop)
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except Exception as exc:
            stop = stopped_by()
            if stop is not None:  # a stop TVM's FFI handed back as another exception
                _stopped(ctx, stop)
            if isinstance(exc, BrokenPipeError) and _reader_gone():
                _unread(ctx)
            if ctx.params.get("debug"):  # the one line too: a TVM message may bury its reason
                click.echo(f"error: {failure_line(exc)}", err=True)
                raise
            click.echo(f"error: {failure_line(exc)} (rerun with --debug for details)", err=True)
            ctx.exit(1)


@click.group(cls=DeployGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deploy-toolchain", prog_name="deploy")
@click.option("--ops-path", multiple=True, type=click.Path(), help="Directory of extra op files (*.py).")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def main(ops_path: tuple[str, ...], debug: bool) -> None:
    """deploy: build neural-network ops for embedded targets and verify them on devices."""
    from deploy.ops import load_entry_points, load_ops_path

    check_thread_env()
    check_places()
    load_entry_points()
    for directory in ops_path:
        load_ops_path(directory)


for command in (
    ops_command, targets_command, build_command, run_command, test_command, bench_command, tune_command,
    device_group, tracker_group,
):  # fmt: skip
    main.add_command(command)
