"""A real OpenSSH server for tests: loopback port, generated host and user keys, config in a temp dir.

Every server a test process starts has the same host key: the session shares one known_hosts
(tests/conftest.py), and a port the kernel hands out again to a later server must not read as a
board whose host key changed.

Its logins see a board without Python: PATH holds only a directory of links to BOARD_TOOLS, and
HOME is an empty directory (this machine's ~/.bashrc, which bash reads for SSH commands, would put
pyenv's python3 back on the PATH). The login shell's builtins (cd, echo, exec, kill, command) come
with it.
"""

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
BOARD_TOOLS = ("uname", "sha256sum", "rm", "sleep", "timeout")
"""What deploy runs on a board besides the shell (devices/board_setup.py TOOLS, and `uname`)."""


def available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deploy-test", "-f", str(path)], check=True
    )
    return path


_HOST_KEY: list[tuple[bytes, bytes]] = []
"""The process's host key pair (private, public), made by the first `start`."""


def _host_key(path: Path) -> Path:
    """The process's one host key, written to `path` (and `path`.pub)."""
    if not _HOST_KEY:
        keygen(path)
        _HOST_KEY.append((path.read_bytes(), path.with_suffix(".pub").read_bytes()))
        return path
    private, public = _HOST_KEY[0]
    path.write_bytes(private)
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(public)
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


def _board_path(directory: Path, tools: tuple[str, ...]) -> Path:
    """A directory of links to `tools` as found on this host's PATH."""
    directory.mkdir(parents=True)
    for tool in tools:
        found = shutil.which(tool)
        if found is None:
            raise RuntimeError(f"{tool} is not on this host's PATH")
        (directory / tool).symlink_to(found)
    return directory


def start(directory: Path, tools: tuple[str, ...] = BOARD_TOOLS, env: dict[str, str] | None = None) -> Sshd:
    """An sshd whose logins have only `tools` on their PATH, and the variables `env`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = _board_path(directory / "board-bin", tools)
    home = directory / "board-home"
    home.mkdir()
    host_key = _host_key(directory / "host_ed25519")
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
                " ".join(
                    ["SetEnv", f"PATH={path}", f"HOME={home}", *(f"{k}={v}" for k, v in (env or {}).items())]
                ),
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
