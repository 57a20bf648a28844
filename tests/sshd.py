"""A real OpenSSH server for tests: loopback port, generated host and user keys, config in a temp dir."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"


def available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deploy-test", "-f", str(path)], check=True
    )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sshd:
    """A running sshd: connect as `user` with `key` to 127.0.0.1:`port`."""

    directory: Path
    port: int
    user: str
    key: Path
    proc: subprocess.Popen[bytes]

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener named sshd)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [c.pid for c in children if c.name() == "sshd"]

    def kill(self) -> None:
        """Kill the listener and every connection's sshd, as a crashed sshd would leave things."""
        for pid in [*self.session_pids(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        self.proc.wait(timeout=10)


def start(directory: Path) -> Sshd:
    directory.mkdir(parents=True, exist_ok=True)
    host_key = keygen(directory / "host_ed25519")
    user_key = keygen(directory / "user_ed25519")
    (directory / "authorized_keys").write_text((directory / "user_ed25519.pub").read_text())
    port = _free_port()
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "UsePAM no",
                "StrictModes no",
                "AllowTcpForwarding yes",
                "Subsystem sftp internal-sftp",
                "PermitRootLogin prohibit-password",
                f"PidFile {directory / 'sshd.pid'}",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [SSHD, "-D", "-f", str(config), "-E", str(directory / "sshd.log")], stdin=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(directory / 'sshd.log').read_text()[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return Sshd(directory, port, getpass.getuser(), user_key, proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("sshd did not accept connections within 10 s")


def stop(server: Sshd) -> None:
    for pid in server.session_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
