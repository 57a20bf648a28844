"""The ARM emulator device: deploy's native RPC server for aarch64 under qemu-aarch64.

No Python and no sysroot: qemu-user runs `deploy-rpc-server` with Debian's cross libc and
libstdc++ (`-L /usr/aarch64-linux-gnu`, from the cross-compiler packages) and the aarch64 TVM
runtime libraries beside it, about 5 MB in all, ready in well under a second.

`deploy device emulator start` leaves a server running (its pid, process group, port and key file
in `server.json`); any command that needs the emulator uses that one, or starts its own and stops
it when done — on errors and Ctrl-C too, since the whole process group is stopped, and when the
command is killed outright, since such a server stops once its parent is gone (`--parent`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

from deploy.base.errors import DeployError
from deploy.base.paths import emulator_dir
from deploy.base.threads import THREADS_ENV, runtime_threads
from deploy.devices.native import SERVER, native_runtime
from deploy.devices.platforms import Platform, tvm_runtime_platform
from deploy.devices.registry import register_device
from deploy.devices.rpc import EndpointDevice, RpcEndpoint, RpcSession, connect
from deploy.devices.server_process import Server, ServerState, accepts, free_port, new_key_file, spawn

START_TIMEOUT_S = 30.0
READY = "bind to"


class Emulator:
    """The native runtime for `arch` under qemu-user, and RPC servers started from it."""

    def __init__(self, base: Path | None = None, arch: str = "aarch64") -> None:
        self.base = base or emulator_dir()
        self.platform: Platform = tvm_runtime_platform(arch)
        self.state = ServerState(self.base / "server.json")

    def provision(self) -> Path:
        """The native runtime directory (built on first use, then cached by content hash)."""
        target = self.platform
        target.require_emulator()
        prefix = target.qemu_prefix
        if not target.native_here() and (prefix is None or not Path(prefix, "lib").is_dir()):
            raise DeployError(
                f"no {target.arch} C library in {prefix}: install the Debian package {target.gxx_package}"
            )
        return native_runtime(target)

    def start(
        self, port: int | None = None, tracker: str | None = None, key: str = "emulator", own: bool = False
    ) -> Server:
        """Start a server in its own process group; return once it accepts connections (and, with
        `tracker`, once it is registered there under `key`). An `own` server (one command's) stops
        once this process is gone, however it ended (`--parent`: SIGKILL leaves no chance to
        stop it from here)."""
        runtime = self.provision()
        port = port or free_port()
        stem = f"server-{port}-{secrets.token_hex(4)}"  # its own files, even if two starts race for a port
        log = self.base / f"{stem}.log"
        key_file = new_key_file(self.base / f"{stem}.key", f"{key}:" if tracker else "")
        work = self.base / "sessions"
        work.mkdir(parents=True, exist_ok=True)
        cmd = [*self.platform.emulator_command(), str(runtime / SERVER), "--host", "127.0.0.1",
               "--port", str(port), "--key-file", str(key_file), "--work-dir", str(work)]  # fmt: skip
        if own:
            cmd += ["--parent", str(os.getpid())]
        if tracker:
            cmd = [sys.executable, "-m", "deploy.devices.registrar", tracker, key, str(key_file), "--", *cmd]
        env = {**os.environ, THREADS_ENV: runtime_threads()}
        proc = spawn(cmd, log, env)
        server = Server.of(proc, port, log, key_file)
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
            if READY in Path(server.log).read_text(errors="replace") and accepts(server.port):
                return
            time.sleep(0.02)
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
        return self.state.start_once(lambda: self.start(port, tracker, key))

    def stop_detached(self) -> Server | None:
        return self.state.stop()


class EmulatorDevice(EndpointDevice):
    """An architecture under qemu-user on this machine (correctness, not performance): what runs it
    (qemu binary, library prefix, runtime wheels) is its platform's data (`platforms.py`)."""

    emulated = True

    def __init__(self, arch: str = "aarch64", name: str = "emulator") -> None:
        self.name, self.arch = name, arch
        self.emulator = Emulator(arch=arch)

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
            self.own = self.emulator.start(own=True)
        return self.own

    def session(self, session_timeout_s: float = 0) -> AbstractContextManager[RpcSession]:
        server = self._server()
        label = f"emulator on port {server.port}"
        arch = self.emulator.platform.arch
        return connect("127.0.0.1", server.port, arch, label, session_timeout_s, server.session_key())

    def restart(self) -> None:
        """Our own server from now on (a detached one is left to its owner), started afresh."""
        self.use_detached = False
        self.close()

    def close(self) -> None:
        if self.own is not None:
            self.own.stop()
            for path in (self.own.log, self.own.key_file):
                if path:
                    Path(path).unlink(missing_ok=True)
            self.own = None


register_device("emulator")(EmulatorDevice)
