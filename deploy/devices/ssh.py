"""Boards over SSH (paramiko): deploy's native RPC server runs on the board's loopback, reached by a
tunnel. The board needs no Python: only a POSIX shell, and the runtime `deploy device setup` pushed.

Host keys are checked against `~/.ssh/known_hosts` and deploy's own `known_hosts`; an unknown host
is refused unless the user accepts it explicitly. Every remote command is built from quoted
words; nothing the board prints is executed here. What a board prints is read up to a limit
(OUTPUT_LIMIT per command, LINE_LIMIT per line of the server's log), replies are taken from stdout
between random markers (a login shell's start-up files may print anything around them), and any
text of the board's that reaches the terminal goes through `printable`.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import posixpath
import re
import secrets
import select
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import paramiko

from deploy.base.errors import DeployError, UsageError, printable, reason
from deploy.base.files import replacing
from deploy.base.locks import guarding
from deploy.devices.boards import Board, check_remote_dir, get_board, known_hosts_file
from deploy.devices.native import SERVER
from deploy.devices.registry import DeviceLost, register_device_source
from deploy.devices.rpc import EndpointDevice, RpcEndpoint, RpcSession, connect

logging.getLogger("paramiko").addHandler(logging.NullHandler())
"""paramiko's transport thread logs a failed handshake with its traceback, which Python would
print on stderr above deploy's one line that says the same (`ssh_connect`)."""

CONNECT_TIMEOUT_S = 15.0
SERVER_TIMEOUT_S = 120.0
RPC_PORTS = (9090, 9199)
PGID = "pgid"
"""The file in a board server's directory that holds its process group (the shell's pid) and
the board's `uname -n`."""
READY = re.compile(r"bind to 127\.0\.0\.1:(\d+)")
OUTPUT_LIMIT = 1 << 20
"""The most a board may print for one command deploy runs there (stdout and stderr together)."""
LINE_LIMIT = 4096
"""The most of one line of the server's output that is kept (the end of it)."""
CHUNK = 1 << 15


def _where(board: Board) -> str:
    return f"{board.user}@{board.host}:{board.port}"


@dataclass(frozen=True)
class Reply:
    """What a command on the board gave: its exit status, what it printed on stdout (between the
    markers), and the last lines of its stderr, printable on one line (for messages only)."""

    status: int
    out: str
    err: str


def ssh_connect(board: Board, accept_new_host_key: bool = False) -> paramiko.SSHClient:
    """An authenticated SSH connection; errors are one line naming the board and the cause."""
    client = paramiko.SSHClient()
    ours = known_hosts_file()
    for path, load in (
        (SYSTEM_KNOWN_HOSTS.expanduser(), client.load_system_host_keys),
        (ours, client.load_host_keys),
    ):
        if os.path.realpath(path) == os.devnull:  # a link to /dev/null: none, an idiom
            continue
        _readable(path, "known_hosts")
        if not path.exists():
            continue
        try:
            load(str(path))
        except PermissionError:
            if path != ours:  # skipped, as paramiko skips ssh's own file it cannot read
                continue
            raise UsageError(f"known_hosts {path}: cannot read it: permission denied") from None
        except (OSError, UnicodeDecodeError, paramiko.SSHException) as exc:
            raise UsageError(f"known_hosts {path}: cannot read it: {reason(exc)}") from None
    if board.key is not None:
        _readable(Path(board.key), f"board {board.name} key", KEY_LIMIT)
        if not Path(board.key).exists():
            raise UsageError(f"board {board.name} key {board.key}: no such file (a private key file)")
    policy = paramiko.AutoAddPolicy() if accept_new_host_key else paramiko.RejectPolicy()
    client.set_missing_host_key_policy(policy)
    try:
        client.connect(
            board.host,
            port=board.port,
            username=board.user,
            key_filename=board.key,
            look_for_keys=board.key is None,
            allow_agent=True,
            timeout=CONNECT_TIMEOUT_S,
            banner_timeout=CONNECT_TIMEOUT_S,
            auth_timeout=CONNECT_TIMEOUT_S,
        )
    except paramiko.BadHostKeyException:
        client.close()
        raise DeployError(
            f"host key of {board.host}:{board.port} differs from the one in known_hosts: refusing to"
            f" connect (if the board was reinstalled, remove its old key from {ours} or ~/.ssh/known_hosts)"
        ) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        key = board.key or "ssh-agent and ~/.ssh keys"
        raise DeployError(f"SSH login to {_where(board)} failed with {key}: {reason(exc)}") from None
    except (paramiko.SSHException, ValueError) as exc:
        client.close()
        _check_key(board)
        if "not found in known_hosts" in str(exc):
            raise DeployError(
                f"unknown host key for {board.host}:{board.port}: check it, then rerun with"
                f" --accept-new-host-key (`deploy device check {board.name} --accept-new-host-key`)"
            ) from None
        raise DeviceLost(f"SSH to {_where(board)} failed: {reason(exc)}") from None
    except (OSError, EOFError) as exc:
        client.close()
        raise DeviceLost(f"cannot reach {board.name} at {board.host}:{board.port}: {reason(exc)}") from None
    if accept_new_host_key:
        _record_host_keys(client, ours)
    return client


SYSTEM_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
"""What `SSHClient.load_system_host_keys` reads."""
KEY_LIMIT = 1 << 16
"""The largest private key file deploy lets paramiko read (keys are a few KiB)."""


def _readable(path: Path, what: str, limit: int | None = None) -> None:
    """A UsageError naming `path` where paramiko would block on it (a FIFO), read it without end
    (/dev/zero), fail with a traceback (a directory) or read more than `limit` bytes; nothing
    where it does not exist."""
    if path.is_dir():
        raise UsageError(f"{what} {path}: is a directory, expected a file")
    if path.exists() and not path.is_file():
        raise UsageError(f"{what} {path}: not a regular file")
    if limit is not None and path.exists() and path.stat().st_size > limit:
        raise UsageError(f"{what} {path}: {path.stat().st_size} bytes, not a private key file")


def _check_key(board: Board) -> None:
    """A UsageError naming the board's key where paramiko cannot read it as a private key: the
    failure a login reported was the file's, not the board's. A key with a passphrase is left to
    the agent, as a login does."""
    if board.key is None:
        return
    try:
        paramiko.PKey.from_path(board.key)
    except paramiko.PasswordRequiredException:
        return
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise UsageError(
            f"board {board.name} key {board.key}: not a private key paramiko reads: {reason(exc)}"
        ) from None


def _record_host_keys(client: paramiko.SSHClient, ours: Path) -> None:
    """Add the keys `client` accepted to deploy's known_hosts: read afresh and replaced under its
    lock, so concurrent `--accept-new-host-key` commands keep each other's keys."""
    with guarding(ours):
        merged = paramiko.HostKeys(str(ours)) if ours.exists() else paramiko.HostKeys()
        for host, keys in client.get_host_keys().items():
            for kind, key in keys.items():
                merged.add(host, kind, key)
        with replacing(ours, 0o600, through_links=True) as temporary:
            merged.save(str(temporary))


class BoardShell:
    """Commands and files on a board over one SSH connection, with the paths deploy uses there."""

    def __init__(self, board: Board, client: paramiko.SSHClient) -> None:
        self.board = board
        self.client = client
        self._sftp: paramiko.SFTPClient | None = None
        with self.files("finding the login's home directory") as sftp:
            home = sftp.normalize(".")
        self.remote_dir = self._own_dir(home)
        self.runtime_dir = posixpath.join(self.remote_dir, "runtime")
        self.servers_dir = posixpath.join(self.remote_dir, "servers")

    def _own_dir(self, home: str) -> str:
        """The board's remote dir as an absolute path: refused (one line) where it is the home
        directory or one above it, or the home is not a plain path."""
        name = self.board.name
        if not home.startswith("/") or not home.isprintable():
            raise DeployError(f"{name}: the login's home directory is not a plain path: '{printable(home)}'")
        remote = posixpath.normpath(posixpath.join(home, check_remote_dir(self.board.remote_dir)))
        if f"{home.rstrip('/')}/".startswith(f"{remote.rstrip('/')}/"):
            raise UsageError(
                f"{name}: remote dir {remote} is the login's home or above it: re-add the board with"
                " --remote-dir naming a directory for deploy alone (e.g. .deploy)"
            )
        return remote

    def transport(self) -> paramiko.Transport:
        """The connection's transport; once the connection is closed (it has none), a DeviceLost."""
        transport = self.client.get_transport()
        if transport is None:
            raise DeviceLost(f"lost SSH connection to {self.board.name}: it is closed")
        return transport

    def run(self, command: str, timeout: float = 120.0) -> Reply:
        """Run a shell command on the board. Its reply is what it printed on stdout between two
        random markers, so whatever the login's shell start-up files print is left out; more
        than OUTPUT_LIMIT bytes, no reply within `timeout` s, or no markers, is a one-line error."""
        begin, end = (f"deploy-{word}-{secrets.token_hex(8)}" for word in ("reply", "done"))
        wrapped = f"echo {begin}; {command}\nstatus=$?; echo; echo {end}; exit $status"
        name = self.board.name
        try:
            channel = self.transport().open_session(timeout=timeout)
            try:
                channel.exec_command(wrapped)
                out, err = self._read(channel, command, timeout)
                status = channel.recv_exit_status() if channel.status_event.wait(timeout) else -1
            finally:
                channel.close()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DeviceLost(f"lost SSH connection to {name}: {reason(exc)}") from None
        text = out.decode(errors="replace")
        start, stop = text.find(f"{begin}\n"), text.rfind(f"\n{end}\n")
        lines = err.decode(errors="replace").strip().splitlines()
        said = " | ".join(printable(line.strip()) for line in lines[-3:] if line.strip())
        if start < 0 or stop < start:
            raise DeployError(
                f"{name}: no reply from the board's shell to `{command}`: {said or f'exit status {status}'}"
            )
        return Reply(status, text[start + len(begin) + 1 : stop], said)

    def _read(self, channel: paramiko.Channel, command: str, timeout: float) -> tuple[bytes, bytes]:
        """A command's stdout and stderr, read together until it ends (at most OUTPUT_LIMIT bytes:
        a board that prints more is cut off)."""
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            if channel.recv_ready():
                out += channel.recv(CHUNK)
            elif channel.recv_stderr_ready():
                err += channel.recv_stderr(CHUNK)
            elif channel.eof_received or channel.closed:
                return bytes(out), bytes(err)
            elif time.monotonic() > deadline:
                raise DeployError(f"{self.board.name}: `{command}` gave no reply within {timeout:.0f} s")
            else:
                select.select([channel], [], [], 0.5)
            if len(out) + len(err) > OUTPUT_LIMIT:
                raise DeployError(
                    f"{self.board.name}: the board printed more than {OUTPUT_LIMIT >> 20} MiB for"
                    f" `{command}` (its login's start-up files?): stopped reading"
                )

    @contextmanager
    def files(self, what: str) -> Iterator[paramiko.SFTPClient]:
        """The board's SFTP client (one per connection); a failure in the block is one line
        naming `what` (DeviceLost when the connection itself is gone)."""
        try:
            if self._sftp is None:
                self._sftp = self.client.open_sftp()
            yield self._sftp
        except (OSError, EOFError, paramiko.SSHException) as exc:
            transport = self.client.get_transport()
            name, detail = self.board.name, reason(exc)
            if transport is None or not transport.is_active():
                raise DeviceLost(f"lost SSH connection to {name}: {detail}") from None
            raise DeployError(f"{name}: {what} failed: {detail}") from None

    def write_private(self, path: str, text: str) -> None:
        """Write `text` to `path` on the board, readable by the login only (0600 before any byte
        is written)."""
        with self.files(f"writing {path}") as sftp, sftp.open(path, "w") as stream:
            stream.chmod(0o600)
            stream.write(text)

    def remove(self, path: str) -> None:
        """Remove a file on the board; one that is already gone is fine."""
        with self.files(f"removing {path}") as sftp, suppress(FileNotFoundError):
            sftp.remove(path)


def stop_script(pgid: int, directory: str) -> str:
    """Shell code that ends process group `pgid` (TERM, then KILL after 5 s; none: 0) and removes
    `directory`. `kill -s SIG -- -PGID`: dash, Debian's /bin/sh, reads `kill -TERM -- -PGID` as
    an illegal number and signals nothing."""
    script = f"rm -rf -- {shlex.quote(directory)}"
    if not pgid:
        return script
    group = f"-{int(pgid)}"
    return (
        f"kill -s TERM -- {group} 2>/dev/null; i=0; while kill -s 0 -- {group} 2>/dev/null &&"
        f" [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; kill -s KILL -- {group} 2>/dev/null; {script}"
    )


def abandoned_script(servers_dir: str) -> str:
    """Shell code that removes the server directories in `servers_dir` whose server is gone: a
    server whose SSH connection was lost dies with its pty, but could not remove its directory.
    Only a directory (not a link) whose PGID file names this host (`uname -n`: a home shared
    over NFS holds other hosts' servers) and a process group that no longer exists; a directory
    without the file (a server another deploy is starting) stays, as does anything else."""
    return (
        f'here=$(uname -n); for d in {shlex.quote(servers_dir)}/*/; do d=${{d%/}}; [ -L "$d" ] && continue;'
        f' [ -f "$d/{PGID}" ] || continue; read p host < "$d/{PGID}"; [ "$host" = "$here" ] || continue;'
        ' case $p in ""|*[!0-9]*) continue;; esac; kill -s 0 -- "-$p" 2>/dev/null || rm -rf -- "$d"; done'
    )


class RemoteServer:
    """deploy's native RPC server (`deploy-rpc-server`, pushed by `deploy device setup`) on the
    board's loopback, in its own session on a pty: closing the connection hangs it up, and `stop()`
    kills its process group. Every start has a fresh session key (`self.key`) that clients must
    send; it reaches the server in a 0600 file that is removed once the server has read it. Each
    server has a directory of its own in `<remote_dir>/servers` (key file, session directories),
    removed by `stop()`."""

    def __init__(self, shell: BoardShell, ports: tuple[int, int] = RPC_PORTS, key_prefix: str = "") -> None:
        """`ports`: the range to bind on the board; `key_prefix`: the session key becomes
        "PREFIX:RANDOM" (a tracker's match keys must look like that)."""
        self.shell = shell
        self.port = 0
        self.pgid = 0
        self.key = f"{key_prefix}:{secrets.token_hex(16)}" if key_prefix else secrets.token_hex(16)
        self.on_line: Callable[[str], None] | None = None
        """Called with each line the server prints once it is ready (session start/end, ...)."""
        self._lines: collections.deque[str] = collections.deque(maxlen=20)
        self._ready = threading.Event()
        self._marker = f"deploy-server-{secrets.token_hex(8)}-pgid="
        """Printed with the shell's pid before the server starts: lines before it are the login's."""
        name = shell.board.name
        server = posixpath.join(shell.runtime_dir, SERVER)
        with shell.files(f"looking for {server}") as sftp:
            try:
                sftp.stat(server)
            except FileNotFoundError:
                raise DeployError(
                    f"no deploy runtime on {name} in {shell.runtime_dir}: run `deploy device setup {name}`"
                ) from None
        self._remove_abandoned()
        with shell.files(f"making a directory in {shell.servers_dir}") as sftp:
            try:
                sftp.stat(shell.servers_dir)
            except FileNotFoundError:
                sftp.mkdir(shell.servers_dir, 0o700)
            self._dir = posixpath.join(shell.servers_dir, secrets.token_hex(4))
            sftp.mkdir(self._dir, 0o700)
        self._key_file = posixpath.join(self._dir, "key")
        shell.write_private(self._key_file, self.key + "\n")
        self._channel = shell.transport().open_session()
        self._channel.get_pty()
        low, high = ports
        q = shlex.quote
        command = (
            f"cd {q(shell.remote_dir)} && echo $$ $(uname -n) > {q(posixpath.join(self._dir, PGID))}"
            f" && echo {self._marker}$$ && exec {q(server)} --host 127.0.0.1"
            f" --port {low} --port-end {high} --key-file {q(self._key_file)}"
            f" --work-dir {q(self._dir)} 2>&1"
        )
        self._channel.exec_command(command)
        threading.Thread(target=self._read, daemon=True).start()

    def _remove_abandoned(self) -> None:
        """Remove what servers of this host that are gone left in `servers/` (`abandoned_script`);
        tidying never fails a start."""
        with suppress(DeployError):
            self.shell.run(abandoned_script(self.shell.servers_dir), timeout=15)

    def _read(self) -> None:
        """Follow the pty: the pid line after the marker, then the server's lines (each kept to
        its last LINE_LIMIT characters, the last 20 of them for messages)."""
        pending = ""
        while True:
            try:
                data = self._channel.recv(CHUNK)
            except (OSError, EOFError, paramiko.SSHException):
                data = b""
            if not data:
                self._ready.set()
                return
            pending += data.decode(errors="replace")
            *lines, pending = pending.replace("\r", "").split("\n")
            pending = pending[-LINE_LIMIT:]
            for line in lines:
                self._follow(line[-LINE_LIMIT:])

    def _follow(self, line: str) -> None:
        if not self.pgid:
            _, marker, pid = line.rpartition(self._marker)
            if marker and pid.isdecimal():
                self.pgid = int(pid)
                return  # our own line, no message of the server's
        self._lines.append(printable(line))
        if not self.pgid:
            return
        if (match := READY.search(line)) and not self.port:
            self.port = int(match.group(1))
            self._ready.set()
        elif self.on_line is not None:
            self.on_line(line)

    def wait_ready(self) -> None:
        """Return once the server listens (its key file is then removed); a one-line error if it
        exits first or takes longer than SERVER_TIMEOUT_S."""
        name = self.shell.board.name
        if not self._ready.wait(SERVER_TIMEOUT_S):
            raise DeployError(
                f"RPC server on {name} not ready after {SERVER_TIMEOUT_S:.0f} s: {self.log_tail()}"
            )
        if not self.port and not self._channel.get_transport().is_active():
            raise DeviceLost(f"lost the SSH connection to {name} while its RPC server started")
        if not self.port:
            said = self.log_tail() or "no output"
            raise DeployError(f"RPC server on {name} exited: {said} (see `deploy device check {name}`)")
        self.shell.remove(self._key_file)

    def log_tail(self, lines: int = 3) -> str:
        return " | ".join(line for line in list(self._lines)[-lines:] if line.strip())

    def stop(self) -> None:
        """Kill the server's process group (TERM, then KILL), remove its directory; then close its
        channel."""
        with suppress(DeployError):  # connection gone: the hang-up of the pty ends the server
            self.shell.run(stop_script(self.pgid, self._dir), timeout=15)
        self._channel.close()


class SshDevice(EndpointDevice):
    """A board registered with `deploy device add`.

    The SSH connection, the remote server and the port forward live in a helper process
    (`deploy.devices.board_link`): TVM's RPC client holds the GIL while it frees remote objects, so a
    forward served by threads of this process would deadlock.
    """

    def __init__(self, board: Board) -> None:
        self.board = board
        self.name = board.name
        self.arch = board.arch

    def new_endpoint(self) -> RpcEndpoint:
        """The board's server and the port forward, started on the first session."""
        return _BoardEndpoint(self)


class _BoardEndpoint:
    """Sessions through one helper process (server on the board + port forward), opened on
    first use and opened afresh by restart()."""

    def __init__(self, device: SshDevice) -> None:
        self.device = device
        self.link: ExitStack | None = None
        self.ready: dict[str, Any] = {}

    def session(self, session_timeout_s: float = 0) -> AbstractContextManager[RpcSession]:
        if self.link is None:
            link = ExitStack()
            self.ready = link.enter_context(board_link(self.device.board))
            self.link = link
        board = self.device.board
        label = f"{self.device.name} ({_where(board)}, RPC port {self.ready['rpc_port']})"
        port, key = int(self.ready["port"]), str(self.ready["key"])
        return connect("127.0.0.1", port, self.device.arch, label, session_timeout_s, key)

    def restart(self) -> None:
        self.close()

    def close(self) -> None:
        if self.link is not None:
            link, self.link = self.link, None
            link.close()


@contextmanager
def board_link(board: Board, tracker: tuple[str, int, str] | None = None) -> Iterator[dict[str, Any]]:
    """Run the helper process for `board` (registering with `tracker` (host, port, key) if given);
    yield its ready message {"port", "rpc_port", "key"} with "process" added; stop it on exit."""
    args = [json.dumps(asdict(board))] + ([json.dumps(list(tracker))] if tracker else [])
    with tempfile.TemporaryFile() as log:
        link = subprocess.Popen(
            [sys.executable, "-m", "deploy.devices.board_link", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        try:
            ready = _link_message(link, log)
            ready["process"] = link
            yield ready
        finally:
            _close_link(link)


def link_ended(ready: dict[str, Any], name: str) -> str:
    """Wait until the helper of `board_link` stops serving by itself; why it stopped."""
    link: subprocess.Popen[str] = ready["process"]
    assert link.stdout is not None
    try:
        message = json.loads(link.stdout.readline())
    except ValueError:
        message = {}
    return str(message.get("lost") or message.get("error") or f"the SSH helper for {name} exited")


def _link_message(link: subprocess.Popen[str], log: IO[bytes]) -> dict[str, Any]:
    """The helper's first line: {"port", "rpc_port", "key"} when ready, or {"error"|"lost": message}."""
    assert link.stdout is not None
    line = link.stdout.readline()
    try:
        message = json.loads(line)
    except ValueError:
        link.wait(timeout=10)
        log.seek(max(0, log.seek(0, os.SEEK_END) - LINE_LIMIT))
        lines = log.read().decode(errors="replace").strip().splitlines()[-3:]
        tail = " | ".join(printable(line) for line in lines)
        raise DeployError(f"SSH helper exited with {link.returncode}: {tail}") from None
    if "lost" in message:
        raise DeviceLost(message["lost"])
    if "error" in message:
        raise (UsageError if message.get("usage") else DeployError)(message["error"])
    return dict(message)


def _close_link(link: subprocess.Popen[str]) -> None:
    """Closing its stdin tells the helper to stop the server and log out."""
    assert link.stdin is not None
    with suppress(OSError):
        link.stdin.close()
    try:
        link.wait(timeout=30)
    except subprocess.TimeoutExpired:
        link.kill()
        link.wait()


def _configured(name: str) -> SshDevice | None:
    """The board `name` where it speaks TVM's RPC (`deploy/devices/board_runner.py` serves the others)."""
    board = get_board(name)
    return SshDevice(board) if board is not None and board.speaks == "tvm" else None


register_device_source(_configured)
