"""Long-running helper processes we start (RPC servers, the tracker): each leads its own process
group, so stopping it stops everything it started."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running RPC server: the leader pid (= process group id), its loopback port, its log and
    the file holding the session key clients must send (None: no key)."""

    pid: int
    port: int
    log: str
    key_file: str | None = None

    def session_key(self) -> str:
        return Path(self.key_file).read_text().strip() if self.key_file else ""

    def alive(self) -> bool:
        """The leader runs (a zombie nobody reaped yet counts as dead)."""
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `grace_s`."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
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
        try:
            text = Path(self.log).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


def new_key_file(path: Path, prefix: str = "") -> Path:
    """A fresh random session key (after `prefix`) in `path`, readable by this user only (0600
    from creation). A server offered on a tracker needs the prefix "KEY:": TVM's tracker reads
    the device key back from the match key when it withdraws a server."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
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
    """A long-lived server remembered in a JSON file, for start/status/stop across commands."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def running(self) -> Server | None:
        """The remembered server if it still runs (a stale file is removed)."""
        try:
            server = Server(**json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if not server.alive():
            self.path.unlink(missing_ok=True)
            return None
        return server

    def remember(self, server: Server) -> Server:
        self.path.write_text(json.dumps(asdict(server)))
        return server

    def stop(self) -> Server | None:
        server = self.running()
        if server is not None:
            server.stop()
            if server.key_file:
                Path(server.key_file).unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)
        return server
