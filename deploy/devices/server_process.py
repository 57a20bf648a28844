"""Long-running helper processes we start (RPC servers, the tracker): each leads its own process
group, so stopping it stops everything it started.

A server is known by its pid and the kernel's start time of that pid (clock ticks since boot, which
setting the clock does not move), so a remembered server whose pid now belongs to another process
is seen as gone, never signalled. State files are read and written under an exclusive lock, so
concurrent `start`/`stop` commands agree on one server.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.base.errors import UsageError, printable
from deploy.base.files import load_json, write_json_atomically
from deploy.base.locks import guarding


def _process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of `pid` from /proc/PID/stat (fields 3
    and 22, counted after the command name, which may hold spaces and parentheses); None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


PYTHON_ERROR = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")
"""The last line of a Python traceback: the exception and why."""


@dataclass(frozen=True)
class Server:
    """A running RPC server: the leader pid (= process group id), the leader's start time (clock
    ticks since boot: with the pid, what makes it ours), its port, its log, the file holding the
    session key clients must send (None: no key) and the address it listens on."""

    pid: int
    started: int
    port: int
    log: str
    key_file: str | None = None
    host: str = "127.0.0.1"

    @classmethod
    def of(
        cls,
        proc: subprocess.Popen[bytes],
        port: int,
        log: Path,
        key_file: Path | None = None,
        host: str = "127.0.0.1",
    ) -> Server:
        """The server `proc` (just spawned) leads."""
        state = _process_state(proc.pid)
        started = state[1] if state else -1
        return cls(proc.pid, started, port, str(log), str(key_file) if key_file else None, host)

    def session_key(self) -> str:
        return Path(self.key_file).read_text().strip() if self.key_file else ""

    def alive(self) -> bool:
        """Our leader still runs: the pid exists, started when ours did, and is no zombie."""
        state = _process_state(self.pid)
        return state is not None and state[0] != "Z" and state[1] == self.started

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `grace_s`. A leader that is
        no longer ours (gone, or its pid reused) is left alone."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not self.alive():
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    finished, _ = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    finished = self.pid if not self.alive() else 0
                if finished and not self.alive():
                    return
                time.sleep(0.05)

    def log_tail(self, lines: int = 5) -> str:
        """The log's last `lines` lines on one line; for a Python server that died of an
        exception, its last `...Error: why` line before any shutdown noise (TVM's tracker then
        prints a second traceback from `__del__`, which said nothing of the cause)."""
        try:
            text = Path(self.log).read_text(errors="replace").strip()
        except OSError:
            return ""
        before_noise = text.split("\nException ignored in", 1)[0]
        raised = [line for line in before_noise.splitlines() if PYTHON_ERROR.match(line)]
        return printable(raised[-1] if raised else " | ".join(text.splitlines()[-lines:]))


def new_key_file(path: Path, prefix: str = "") -> Path:
    """A fresh random session key (after `prefix`) in `path`, which must not exist yet (nothing is
    overwritten), readable by this user only (0600 from creation). A server offered on a tracker
    needs the prefix "KEY:": TVM's tracker reads the device key back from the match key when it
    withdraws a server."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(prefix + secrets.token_hex(16) + "\n")
    return path


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `cmd` as the leader of a new process group, output to `log`, no stdin."""
    with log.open("wb") as stream:
        return subprocess.Popen(
            cmd,
            stdout=stream,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env if env is not None else dict(os.environ),
        )


class ServerState:
    """A long-lived server remembered in a JSON file, for start/status/stop across commands.
    `start_once` and `stop` hold an exclusive lock on `<file>.lock` throughout."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _check(self) -> None:
        """Refuse a state file that is no file (a directory, a FIFO), before a server is started
        that could not be remembered, or one is stopped whose file could not be forgotten. (A
        symlink is deploy's to replace, as any state file.)"""
        if not self.path.is_symlink() and self.path.exists() and not self.path.is_file():
            raise UsageError(f"{self.path} is not a file: expected deploy's server state there")

    def running(self) -> Server | None:
        """The remembered server if it is still ours and runs. A file that does not describe a
        live server of ours (unreadable, an older format, a dead or reused pid) is no server."""
        try:
            server = Server(**load_json(self.path))
        except (OSError, ValueError, TypeError):
            return None
        return server if server.alive() else None

    def start_once(self, start: Callable[[], Server]) -> Server:
        """The running server, else the one `start()` starts, remembered (one of either, however
        many commands ask at once)."""
        self._check()
        with guarding(self.path):
            existing = self.running()
            if existing is not None:
                return existing
            server = start()
            try:
                write_json_atomically(self.path, asdict(server))
            except BaseException:  # unrecorded, it would run on with nobody to stop it
                server.stop(grace_s=1.0)
                raise
            return server

    def stop(self) -> Server | None:
        """Stop the remembered server if it is ours and runs; forget the file either way."""
        self._check()
        with guarding(self.path):
            server = self.running()
            if server is not None:
                server.stop()
                if server.key_file:
                    Path(server.key_file).unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
            return server
