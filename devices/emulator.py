"""The ARM emulator device: TVM's RPC server on aarch64 Python under qemu-aarch64.

`deploy device emulator start` leaves a server running (its pid, process group and port in
`server.json`); any command that needs the emulator uses that one, or starts its own and stops it
when done — on errors and Ctrl-C too, since the whole process group is stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from devices.cache import cache_root
from devices.registry import register_device
from devices.rpc import EndpointDevice, RpcEndpoint, RpcSession, connect
from devices.server_process import Server, ServerState, accepts, free_port, spawn
from devices.sysroot import Sysroot
from ops.errors import DeployError

START_TIMEOUT_S = 90.0


def emulator_dir() -> Path:
    """`$DEPLOY_EMULATOR_DIR`, else `emulator/` in the cache root."""
    override = os.environ.get("DEPLOY_EMULATOR_DIR")
    return Path(override) if override else cache_root() / "emulator"


class Emulator:
    """The sysroot, the qemu wrapper and RPC servers started from them."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = base or emulator_dir()
        self.sysroot = Sysroot(self.base)
        self.state = ServerState(self.base / "server.json")

    def provision(self) -> None:
        """Build the sysroot if needed (idempotent, resumable), with a progress bar on stderr."""
        if shutil.which("qemu-aarch64") is None:
            raise DeployError("qemu-aarch64 not found: install the Debian package qemu-user")
        if self.sysroot.ready():
            return
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("emulator set-up", total=1)

            def step(description: str, done: int, total: int) -> None:
                progress.update(
                    task, description=f"emulator set-up: {description}", completed=done, total=total
                )

            self.sysroot.provision(step)

    def wrapper(self) -> Path:
        """A host script that runs aarch64 Python under qemu; children it starts run there too."""
        path = self.base / "python-aarch64"
        script = (
            "#!/bin/sh\n"
            f'S="{self.sysroot.root}"\n'
            'exec qemu-aarch64 -L "$S" -0 "$0" "$S/usr/bin/python3.11" "$@"\n'
        )
        if not path.exists() or path.read_text() != script:
            path.write_text(script)
            path.chmod(0o755)
        return path

    def start(self, port: int | None = None, tracker: str | None = None, key: str = "emulator") -> Server:
        """Start a server in its own process group; return once it accepts connections."""
        self.provision()
        port = port or free_port()
        log = self.base / f"server-{port}.log"
        cmd = [str(self.wrapper()), "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
               "--port", str(port), "--port-end", str(port + 1)]  # fmt: skip
        if tracker:
            cmd += ["--tracker", tracker, "--key", key]
        env = {**os.environ, "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1))}
        proc = spawn(cmd, log, env)
        server = Server(proc.pid, port, str(log))
        try:
            self._wait_ready(server, proc)
        except BaseException:
            server.stop(grace_s=1.0)
            raise
        return server

    def _wait_ready(self, server: Server, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DeployError(f"emulator RPC server exited with {proc.returncode}: {server.log_tail()}")
            if (Path(server.log).read_text(errors="replace").find("bind to") >= 0) and accepts(server.port):
                return
            time.sleep(0.25)
        raise DeployError(
            f"emulator RPC server on port {server.port} not ready after {START_TIMEOUT_S:.0f} s:"
            f" {server.log_tail()}"
        )

    def running(self) -> Server | None:
        """The long-lived server started by `deploy device emulator start`, if it is still up."""
        return self.state.running()

    def start_detached(
        self, port: int | None = None, tracker: str | None = None, key: str = "emulator"
    ) -> Server:
        existing = self.running()
        if existing is not None:
            return existing
        return self.state.remember(self.start(port, tracker, key))

    def stop_detached(self) -> Server | None:
        return self.state.stop()


class EmulatorDevice(EndpointDevice):
    """aarch64 under qemu-aarch64 on this machine (correctness, not performance)."""

    name = "emulator"
    arch = "aarch64"
    emulated = True

    def __init__(self) -> None:
        self.emulator = Emulator()

    def new_endpoint(self) -> RpcEndpoint:
        """The server `deploy device emulator start` left running, else (or after a restart) our
        own, stopped when the endpoint closes."""
        return _EmulatorEndpoint(self.emulator)


class _EmulatorEndpoint:
    """Sessions on the detached server, or on one of our own (started on first use)."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.own: Server | None = None
        self.use_detached = True

    def _server(self) -> Server:
        detached = self.emulator.running() if self.use_detached else None
        if detached is not None:
            return detached
        if self.own is None or not self.own.alive():
            self.close()
            self.own = self.emulator.start()
        return self.own

    def session(self, session_timeout_s: float = 0) -> AbstractContextManager[RpcSession]:
        server = self._server()
        label = f"emulator on port {server.port}"
        return connect("127.0.0.1", server.port, EmulatorDevice.arch, label, session_timeout_s)

    def restart(self) -> None:
        """Our own server from now on (a detached one is left to its owner), started afresh."""
        self.use_detached = False
        self.close()

    def close(self) -> None:
        if self.own is not None:
            self.own.stop()
            Path(self.own.log).unlink(missing_ok=True)
            self.own = None


register_device("emulator")(EmulatorDevice)
