"""Long-running helper processes we start (RPC servers, the tracker): each leads its own process
group, so stopping it stops everything it started."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running RPC server: the leader pid (= process group id) and its loopback port."""

    pid: int
    port: int
    log: str

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


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
