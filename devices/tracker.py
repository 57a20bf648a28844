"""Device farms: TVM's RPC tracker, and a device that is "any free server of KEY on a tracker".

`deploy tracker start` runs `tvm.exec.rpc_tracker` in its own process group (state in
`<cache>/tracker.json`); RPC servers register with it under a key (`deploy device emulator start
--tracker HOST:PORT --key KEY`, or a board's `deploy device serve`); clients ask it for a free one.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from base.errors import DeployError, UsageError, first_line
from base.paths import cache_root
from devices.registry import DeviceLost
from devices.rpc import EndpointDevice, RpcSession, rpc_session
from devices.server_process import Server, ServerState, accepts, spawn

DEFAULT_PORT = 9190
START_TIMEOUT_S = 30.0


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"tracker address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9190")
    return host, int(port)


class TrackerProcess:
    """The tracker started by `deploy tracker start`, remembered in `tracker.json`."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = base or cache_root()
        self.state = ServerState(self.base / "tracker.json")

    def running(self) -> Server | None:
        return self.state.running()

    def start(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> Server:
        """The running tracker, else a new one on host:port (one, however many ask at once)."""
        return self.state.start_once(lambda: self._start(host, port))

    def _start(self, host: str, port: int) -> Server:
        if accepts(port, host):
            raise DeployError(f"port {host}:{port} is taken: pick another port")
        self.base.mkdir(parents=True, exist_ok=True)
        log = self.base / f"tracker-{port}.log"
        cmd = [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", host, "--port", str(port),
               "--port-end", str(port + 1)]  # fmt: skip
        proc = spawn(cmd, log)
        server = Server.of(proc, port, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not accepts(port, host):
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop(grace_s=1.0)
                raise DeployError(f"RPC tracker on {host}:{port} did not start: {server.log_tail()}")
            time.sleep(0.1)
        return server

    def stop(self) -> Server | None:
        return self.state.stop()


def summary(host: str, port: int) -> dict[str, Any]:
    """The tracker's queue: {"queue_info": {key: {"free", "pending"}}, "server_info": [...]}."""
    import tvm.rpc

    try:
        return dict(tvm.rpc.connect_tracker(host, port).summary())
    except Exception as exc:
        raise DeviceLost(f"cannot reach the RPC tracker at {host}:{port}: {first_line(str(exc))}") from None


def free_servers(host: str, port: int, key: str) -> int:
    """How many servers of `key` are free now."""
    queue = summary(host, port).get("queue_info", {})
    return int(queue.get(key, {}).get("free", 0))


class TrackerRegistration:
    """Offers a server that does not speak to the tracker itself (the native server) on its behalf.

    The tracker hands clients (addr, port, match key); the match key is the server's session key,
    so only clients sent by the tracker (or holding the key file) get in. The connection is held
    for the server's lifetime: when it closes, the tracker forgets the server. Like TVM's Python
    server, the server is offered again once a session ends, or when a client took it from the
    tracker but did not connect within `UNCLAIMED_S` (checked every `TICK_S` by a thread of its
    own). When the tracker goes away, `ended` is set and `reason` says so; `close()` sets it too.
    """

    UNCLAIMED_S = 6.0
    TICK_S = 2.0

    def __init__(self, tracker: tuple[str, int], key: str, addr: str, port: int, session_key: str) -> None:
        from tvm.rpc import base

        if not session_key.startswith(f"{key}:"):
            raise DeployError(
                f"a session key offered on a tracker must start with '{key}:' (the tracker withdraws by it)"
            )
        self._base = base
        self._offer = [base.TrackerCode.PUT, key, (port, session_key), addr]
        self._session_key = session_key
        self._lock = threading.Lock()
        self._busy = False
        self._unclaimed_since: float | None = None
        self._where = f"{tracker[0]}:{tracker[1]}"
        self.ended = threading.Event()
        self.reason = ""
        try:
            self._sock = base.connect_with_retry(tracker, timeout=10)
            self._sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(self._sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise DeployError(f"{tracker[0]}:{tracker[1]} is not an RPC tracker")
            self._call([base.TrackerCode.UPDATE_INFO, {"key": "server:" + key, "addr": [addr, port]}])
            self._call(self._offer)
        except (OSError, RuntimeError) as exc:
            raise DeviceLost(
                f"cannot register with the RPC tracker at {tracker[0]}:{tracker[1]}: {exc}"
            ) from None
        threading.Thread(target=self._keep_offering, daemon=True).start()

    def _call(self, message: list[Any]) -> Any:
        with self._lock:
            self._base.sendjson(self._sock, message)
            return self._base.recvjson(self._sock)

    def _claimed(self) -> bool:
        """Whether a client took the offer (it is no longer pending on the tracker)."""
        return self._session_key not in self._call([self._base.TrackerCode.GET_PENDING_MATCHKEYS])

    def _guard(self, call: Callable[..., None], *args: Any) -> None:
        """Run a tracker conversation; a tracker that went away ends the registration."""
        try:
            call(*args)
        except (OSError, ValueError, RuntimeError) as exc:
            self.reason = (
                f"lost the RPC tracker at {self._where}: {first_line(str(exc)) or type(exc).__name__}"
            )
            self.ended.set()

    def _keep_offering(self) -> None:
        while not self.ended.wait(self.TICK_S):
            self._guard(self._tick)

    def event(self, line: str) -> None:
        """Follow the server's "session start" / "session end" lines."""
        self._guard(self._event, line)

    def _event(self, line: str) -> None:
        if line.strip() == "session start":
            self._busy = True
        elif line.strip() == "session end":
            self._busy = False
            if self._claimed():
                self._call(self._offer)

    def _tick(self) -> None:
        """Offer the server again when a client took it but never came."""
        if self._busy or not self._claimed():
            self._unclaimed_since = None
            return
        now = time.monotonic()
        if self._unclaimed_since is None:
            self._unclaimed_since = now
        elif now - self._unclaimed_since > self.UNCLAIMED_S:
            self._call(self._offer)
            self._unclaimed_since = None

    def close(self) -> None:
        self.ended.set()
        self._sock.close()


class TrackerDevice(EndpointDevice):
    """Any free server registered under `key` with the tracker at host:port."""

    def __init__(self, host: str, port: int, key: str, arch: str) -> None:
        self.host, self.port, self.key, self.arch = host, port, key, arch
        self.name = f"{key}@{host}:{port}"

    def capacity(self) -> int:
        """Servers of this key that are free now (the parallelism a run can use)."""
        return free_servers(self.host, self.port, self.key)

    def new_endpoint(self) -> TrackerDevice:
        """The device is its own endpoint: each session is a fresh request for a free server."""
        return self

    def restart(self) -> None:
        """Nothing to restart here: a server whose session crashed leaves the tracker's pool."""

    def close(self) -> None:
        """Nothing to stop: the servers belong to the farm."""

    @contextmanager
    def session(self, session_timeout_s: float = 0) -> Iterator[RpcSession]:
        import tvm.rpc

        where = f"{self.host}:{self.port}"
        if self.key not in summary(self.host, self.port).get("queue_info", {}):
            raise DeviceLost(f"no server with key {self.key!r} is registered with {where}")
        try:
            remote = tvm.rpc.connect_tracker(self.host, self.port).request(
                self.key, priority=1, session_timeout=session_timeout_s, max_retry=3
            )
        except Exception as exc:
            raise DeviceLost(f"tracker {where} gave no {self.key!r} server: {first_line(str(exc))}") from None
        with rpc_session(remote, self.arch, f"{self.key} server via tracker {where}") as session:
            yield session
