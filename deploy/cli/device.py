"""`deploy device ...` and `deploy tracker ...`: the emulator, boards over SSH, the RPC tracker."""

from __future__ import annotations

import json
from pathlib import Path

import click

from deploy.base.errors import DeployError, UsageError, printable
from deploy.base.stopping import Stopped


@click.group("device")
def device_group() -> None:
    """Manage devices: the emulator and boards over SSH."""


@device_group.group("emulator")
def emulator_group() -> None:
    """The ARM emulator (qemu-aarch64 running deploy's native RPC server)."""


@emulator_group.command("setup")
def emulator_setup() -> None:
    """Build the native aarch64 runtime the emulator runs (also done on first use)."""
    from deploy.devices.emulator import Emulator

    runtime = Emulator().provision()
    click.echo(f"emulator runtime ready in {runtime}")


@emulator_group.command("start")
@click.option("--port", type=int, help="Loopback port (default: a free one).")
@click.option("--tracker", metavar="HOST:PORT", help="Register with this RPC tracker.")
@click.option("--key", default="emulator", show_default=True, help="Device key on the tracker.")
def emulator_start(port: int | None, tracker: str | None, key: str) -> None:
    """Start a long-lived emulator that later commands use."""
    from deploy.devices.emulator import Emulator
    from deploy.devices.tracker import check_key, check_port, parse_address

    if port is not None:
        check_port(port, "--port")
    if tracker:
        parse_address(tracker)
        check_key(key)
    server = Emulator().start_detached(port, tracker, key)
    registered = f", registered as {key!r} with {tracker}" if tracker else ""
    click.echo(f"emulator running: pid {server.pid}, 127.0.0.1:{server.port}{registered}, log {server.log}")


@emulator_group.command("stop")
def emulator_stop() -> None:
    """Stop the long-lived emulator."""
    from deploy.devices.emulator import Emulator

    server = Emulator().stop_detached()
    click.echo(f"emulator stopped (pid {server.pid})" if server else "emulator was not running")


@emulator_group.command("status")
def emulator_status() -> None:
    """Say whether the long-lived emulator runs (exit 1 if not)."""
    from deploy.devices.emulator import Emulator

    emulator = Emulator()
    server = emulator.running()
    if server is None:
        click.echo(f"emulator not running ({emulator.base})")
        raise click.exceptions.Exit(1)
    click.echo(f"emulator running: pid {server.pid}, 127.0.0.1:{server.port}, log {server.log}")


ACCEPT = click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust and record the board's host key if it is not known yet (check it first).",
)


@device_group.command("add")
@click.argument("name")
@click.option("--host", required=True, help="Board host name or address.")
@click.option("--port", default=22, show_default=True, help="SSH port.")
@click.option("--user", required=True, help="Login name on the board.")
@click.option("--key", type=click.Path(), help="Private key file (default: ssh-agent and ~/.ssh keys).")
@click.option("--arch", default="aarch64", show_default=True, help="The board's machine (uname -m).")
@click.option("--remote-dir", default=".deploy", show_default=True, help="Our directory on the board.")
@click.option(
    "--protocol",
    type=click.Choice(["tvm", "runner"]),
    help="How artifacts run there: tvm (deploy's RPC server; glibc 2.34+) or runner (each bundle's own"
    " static deploy-run, any libc) [default: tvm where TVM has a runtime for the arch, else runner].",
)
@click.option(
    "--opencl",
    metavar="P:D",
    help="The board's OpenCL device (platform:device, e.g. 0:0): `--target opencl --device NAME` runs"
    " OpenCL bundles there through their runner [default: none].",
)
@click.option("--replace", is_flag=True, help="Replace a device of the same name.")
@ACCEPT
def device_add(
    name: str,
    host: str,
    port: int,
    user: str,
    key: str | None,
    arch: str,
    remote_dir: str,
    protocol: str | None,
    opencl: str | None,
    replace: bool,
    accept_new_host_key: bool,
) -> None:
    """Register a board reached over SSH (no passwords are stored)."""
    from deploy.devices.boards import Board, add_board, known_hosts_file
    from deploy.devices.ssh import ssh_connect

    key = str(Path(key).absolute()) if key else None  # stored: later commands run from elsewhere
    board = Board(name, host, user, port, key, arch, remote_dir, protocol or "", opencl or "").validate()
    if accept_new_host_key:
        ssh_connect(board, accept_new_host_key=True).close()
        click.echo(f"host key of {host}:{port} recorded in {known_hosts_file()}")
    add_board(board, replace)
    nxt = f"deploy device setup {name}" if board.speaks == "tvm" else f"deploy device check {name}"
    gpu = f", OpenCL {board.opencl}" if board.opencl else ""
    click.echo(f"added {name}: {user}@{host}:{port} ({arch}, {board.speaks} protocol{gpu}); next: `{nxt}`")


@device_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def device_list(as_json: bool) -> None:
    """List devices: built in, and boards added with `deploy device add`."""
    from dataclasses import asdict

    from deploy.devices.boards import load_boards

    boards = load_boards()
    if as_json:
        click.echo(json.dumps({name: asdict(b) for name, b in boards.items()}, indent=2))
        return
    click.echo("local      this host (built in)")
    click.echo("emulator   aarch64 under qemu-aarch64 on this host (built in)")
    from deploy.devices.platforms import get_platform
    from deploy.devices.runner import EMULATED

    for arch, suffix in EMULATED.items():
        qemu = get_platform(arch).qemu
        click.echo(f"emulator-{suffix} {arch} under {qemu} on this host, runner protocol (built in)")
    for name, b in boards.items():
        where = f"{b.user}@{b.host}:{b.port} {b.arch} {b.speaks}{f' opencl={b.opencl}' if b.opencl else ''}"
        click.echo(f"{name:10} {where} key={b.key or 'agent'} dir={b.remote_dir}")
    from deploy.devices.opencl import opencl_devices

    try:
        found = opencl_devices()
    except DeployError:  # no pyopencl: no OpenCL devices to list
        found = []
    for platform, device, label, fp16 in found:
        name = f"opencl:{platform}:{device}"
        click.echo(f"{name:10} {label}{' (fp16)' if fp16 else ''} (--cl-device {platform}:{device})")


@device_group.command("check")
@click.argument("name")
@ACCEPT
def device_check(name: str, accept_new_host_key: bool) -> None:
    """Log in to a board and report what its protocol needs against what it has: for tvm its
    machine, glibc and libstdc++ and whether the runtime is installed (a board too old for it is
    offered the runner protocol); for runner its machine (and RVV on riscv64); its OpenCL device
    where it was added with one. Exit 1 if the board cannot serve."""
    from deploy.devices.board_runner import check_runner
    from deploy.devices.board_setup import check_board
    from deploy.devices.boards import require_board

    board = require_board(name)
    check = check_board if board.speaks == "tvm" else check_runner
    if not check(board, click.echo, accept_new_host_key):
        raise click.exceptions.Exit(1)
    if board.opencl:
        from deploy.devices.board_opencl import check_opencl

        check_opencl(board, click.echo)


@device_group.command("setup")
@click.argument("name")
def device_setup(name: str) -> None:
    """Push deploy's native runtime to a board (no Python needed there; idempotent)."""
    from deploy.devices.board_setup import setup_board
    from deploy.devices.boards import require_board

    board = require_board(name)
    if board.speaks != "tvm":
        click.echo(f"{name}: the runner protocol needs nothing set up: each bundle carries its runner")
        return
    setup_board(board, click.echo)


@device_group.command("serve")
@click.argument("name")
@click.option("--tracker", required=True, metavar="HOST:PORT", help="The RPC tracker to register with.")
@click.option("--key", required=True, help="Device key on the tracker.")
def device_serve(name: str, tracker: str, key: str) -> None:
    """Offer a board on an RPC tracker until Ctrl-C. Its server stays on the board's loopback and
    this host registers it; clients on this host reach it through the SSH connection."""
    from deploy.devices.boards import require_board
    from deploy.devices.registry import DeviceLost
    from deploy.devices.ssh import board_link, link_ended
    from deploy.devices.tracker import check_key, parse_address

    host, port = parse_address(tracker)
    check_key(key)
    with board_link(require_board(name), (host, port, key)) as ready:
        rpc_port = ready["rpc_port"]
        click.echo(f"{name} registered as {key!r} with {tracker} (RPC port {rpc_port}); Ctrl-C stops")
        try:
            reason = link_ended(ready, name)
        except Stopped:
            click.echo(f"stopping {name}")
            raise
        except KeyboardInterrupt:
            click.echo(f"stopping {name}")
            return
    raise DeviceLost(reason)


@device_group.command("remove")
@click.argument("name")
def device_remove(name: str) -> None:
    """Forget a board (its host key stays in known_hosts)."""
    from deploy.devices.boards import remove_board

    click.echo(f"removed {name!r} ({remove_board(name)})")


@click.group("tracker")
def tracker_group() -> None:
    """TVM's RPC tracker, for pools of devices (`deploy test --tracker HOST:PORT --key KEY`)."""


@tracker_group.command("start")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9190, show_default=True, help="Port to listen on.")
@click.option(
    "--public",
    is_flag=True,
    help="Allow a --host other machines reach: whoever reaches the tracker gets its servers' sessions.",
)
def tracker_start(host: str, port: int, public: bool) -> None:
    """Start a tracker in the background (one per machine), on this host's loopback unless --public."""
    from deploy.devices.tracker import TrackerProcess, check_port, exposed

    check_port(port, "--port")
    if exposed(host):
        if not public:
            raise UsageError(
                f"--host {host} is reachable from other machines, and whoever reaches the tracker gets"
                " sessions on its servers: add --public to mean it"
            )
        click.echo(
            f"warning: the tracker on {host}:{port} is public: anyone who reaches it can run code on the"
            " servers registered there",
            err=True,
        )
    server = TrackerProcess().start(host, port)
    if (server.host, server.port) != (host, port):  # one per machine: the one running stays
        raise DeployError(
            f"a tracker already runs on {server.host}:{server.port} (pid {server.pid}): `deploy tracker stop`"
            f" it first to start one on {host}:{port}"
        )
    click.echo(f"tracker running: pid {server.pid}, {server.host}:{server.port}, log {server.log}")


@tracker_group.command("stop")
def tracker_stop() -> None:
    """Stop the tracker started by `deploy tracker start`."""
    from deploy.devices.tracker import TrackerProcess

    server = TrackerProcess().stop()
    click.echo(f"tracker stopped (pid {server.pid})" if server else "tracker was not running")


@tracker_group.command("status")
@click.option("--tracker", metavar="HOST:PORT", help="Ask this tracker (default: ours).")
def tracker_status(tracker: str | None) -> None:
    """Servers registered per key, free and in use (exit 1 if no tracker answers)."""
    from deploy.devices.tracker import TrackerProcess, parse_address, queue

    if tracker:
        host, port = parse_address(tracker)
    else:
        server = TrackerProcess().running()
        if server is None:
            click.echo("tracker not running (start one with `deploy tracker start`)")
            raise click.exceptions.Exit(1)
        host, port = ("127.0.0.1" if server.host in ("0.0.0.0", "::") else server.host), server.port
    keys = queue(host, port)
    click.echo(f"tracker {host}:{port}: {len(keys)} key(s)")
    for key, (free, pending) in sorted(keys.items()):
        click.echo(f"  {printable(key)}: {free} free, {pending} waiting requests")
