"""Device farms: TVM's RPC tracker, and a device that is "any free server of KEY on a tracker".

`deploy tracker start` runs `tvm.exec.rpc_tracker` in its own process group (state in
`<cache>/tracker.json`); RPC servers register with it under a key (`deploy device emulator start
--tracker HOST:PORT --key KEY`, or a board's `deploy device serve`); clients ask it for a free one.
Whoever reaches a tracker can get its servers' sessions, so it listens on loopback unless told
`public`. deploy talks to a tracker with one try (no retries), short timeouts and a cap on replies.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.base.errors import DeployError, UsageError, reason
from deploy.base.paths import cache_root
from deploy.base.stopping import raise_if_stopped
from deploy.base.tvm_workers import worker_env
from deploy.devices.registry import DeviceLost
from deploy.devices.rpc import EndpointDevice, RpcSession, rpc_session
from deploy.devices.server_process import Server, ServerState, accepts, spawn

DEFAULT_PORT = 9190
START_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
"""How long a tracker has to accept a connection and to answer the handshake."""
REPLY_TIMEOUT_S = 30.0
"""How long a tracker has to answer each later message."""
GRANT_TIMEOUT_S = 30.0
"""How long a session waits for the tracker to give it a server once a server it gave did not
answer (a registration left by a server that is gone, which nothing offers again): the wait
before that is unbounded, as a farm busy with others may keep every server for long."""
GRANTS = 3
"""Servers a session tries, one after the other, where the one given does not answer."""
REPLY_LIMIT = 16 << 20
"""The largest reply deploy reads from a tracker."""


def check_port(port: int, option: str) -> int:
    """A TCP port given by the user (`option` names where), else a one-line error."""
    if not 1 <= port <= 65535:
        raise UsageError(f"{option} {port}: expected a port from 1 to 65535")
    return port


def exposed(host: str) -> bool:
    """Whether a server listening on `host` is reachable from other machines: some address the
    name stands for is not loopback (0.0.0.0 and :: are every interface). A name that resolves
    to nothing is a one-line error."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM) if host.strip() else []
    except (OSError, UnicodeError):
        found = []
    if not found:
        raise UsageError(f"--host {host!r}: expected an address of this host, e.g. 127.0.0.1")
    return any(not ipaddress.ip_address(str(entry[4][0]).split("%")[0]).is_loopback for entry in found)


def check_key(key: str) -> str:
    """A device key to register under: printable, no spaces and not empty (a client could
    not ask for it)."""
    if not key or not key.isprintable() or any(c.isspace() for c in key):
        raise UsageError(f"--key {key!r}: expected a device key (letters, digits, punctuation)")
    return key


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); an IPv6 host in brackets (`[::1]:9190`). A host with spaces,
    control characters or an unbracketed colon is refused here, not looked up."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""
    plain = host.isprintable() and not any(c.isspace() for c in host)
    if (
        not sep
        or not host
        or not plain
        or not (port.isascii() and port.isdigit())
        or not 1 <= int(port) <= 65535
    ):
        raise UsageError(f"tracker address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9190 or [::1]:9190")
    return host, int(port)


def tracker_socket(host: str, port: int) -> socket.socket:
    """A connection to the RPC tracker at host:port that has answered TVM's handshake, in one try
    within CONNECT_TIMEOUT_S (TVM's own client retries for a minute); else a one-line DeviceLost."""
    from tvm.rpc import base

    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise DeviceLost(f"cannot reach the RPC tracker at {where}: {exc.strerror or exc}") from None
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
    except OSError as exc:
        sock.close()
        raise DeviceLost(f"the RPC tracker at {where} did not answer: {exc.strerror or exc}") from None
    if magic != base.RPC_TRACKER_MAGIC:
        sock.close()
        raise DeviceLost(f"{where} is not an RPC tracker")
    sock.settimeout(REPLY_TIMEOUT_S)
    return sock


def tracker_call(sock: socket.socket, message: list[Any]) -> Any:
    """Send one message to a tracker and read its reply (OSError for a reply over REPLY_LIMIT)."""
    from tvm.rpc import base

    base.sendjson(sock, message)
    size = struct.unpack("<i", base.recvall(sock, 4))[0]
    if not 0 <= size <= REPLY_LIMIT:
        raise OSError(f"the tracker announced a reply of {size} bytes")
    return json.loads(base.recvall(sock, size))


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
        proc = spawn(cmd, log, worker_env(os.environ))
        server = Server.of(proc, port, log, host=host)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not accepts(port, host):
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop(grace_s=1.0)
                raise DeployError(f"RPC tracker on {host}:{port} did not start: {server.log_tail()}")
            time.sleep(0.1)
        return server

    def stop(self) -> Server | None:
        return self.state.stop()


def queue(host: str, port: int) -> dict[str, tuple[int, int]]:
    """The tracker's queue: key -> (free servers, waiting requests). A tracker that cannot be
    reached, does not answer in time, or answers something else, is a one-line DeviceLost."""
    from tvm.rpc import base

    sock = tracker_socket(host, port)
    try:
        reply = tracker_call(sock, [base.TrackerCode.SUMMARY])
        if reply[0] != base.TrackerCode.SUCCESS:
            raise ValueError("it answered with a failure code")
        info = reply[1]["queue_info"]
        return {str(key): (int(entry["free"]), int(entry["pending"])) for key, entry in info.items()}
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as exc:
        raise DeviceLost(f"the RPC tracker at {host}:{port} gave no queue: {reason(exc)}") from None
    finally:
        sock.close()


def free_servers(host: str, port: int, key: str) -> int:
    """How many servers of `key` are free now."""
    return queue(host, port).get(key, (0, 0))[0]


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
        self._sock = tracker_socket(*tracker)
        try:
            self._call([base.TrackerCode.UPDATE_INFO, {"key": "server:" + key, "addr": [addr, port]}])
            self._call(self._offer)
        except (OSError, ValueError) as exc:
            self._sock.close()
            where = self._where
            raise DeviceLost(f"cannot register with the RPC tracker at {where}: {reason(exc)}") from None
        threading.Thread(target=self._keep_offering, daemon=True).start()

    def _call(self, message: list[Any]) -> Any:
        with self._lock:
            return tracker_call(self._sock, message)

    def _claimed(self) -> bool:
        """Whether a client took the offer (it is no longer pending on the tracker)."""
        return self._session_key not in self._call([self._base.TrackerCode.GET_PENDING_MATCHKEYS])

    def _guard(self, call: Callable[..., None], *args: Any) -> None:
        """Run a tracker conversation; a tracker that went away ends the registration."""
        try:
            call(*args)
        except (OSError, ValueError, RuntimeError, LookupError, TypeError) as exc:
            self.reason = f"lost the RPC tracker at {self._where}: {reason(exc)}"
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
        self.refused = ""
        """The last server given that did not answer ("" none yet): from then on every wait for
        a server is bounded by GRANT_TIMEOUT_S, the run's other sessions' too."""

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
        if self.key not in queue(self.host, self.port):
            raise DeviceLost(f"no server with key {self.key!r} is registered with {where}")
        deadline = time.monotonic() + GRANT_TIMEOUT_S
        for _ in range(GRANTS):
            host, port, match_key = self._granted(deadline if self.refused else None)
            try:
                remote = tvm.rpc.connect(host, port, key=match_key, session_timeout=session_timeout_s)
                break
            except Exception as exc:  # a server registered, then gone: the tracker may give another
                raise_if_stopped()
                self.refused = f"{host}:{port}: {reason(exc)}"
        else:
            raise DeviceLost(
                f"tracker {where} gave {GRANTS} {self.key!r} servers, none answered (last {self.refused})"
            )
        with rpc_session(remote, self.arch, f"{self.key} server via tracker {where}") as session:
            yield session

    def _granted(self, deadline: float | None) -> tuple[str, int, str]:
        """(host, port, match key) of a server the tracker gives this key, waited for until
        `deadline` (time.monotonic; None: as long as it takes). TVM's client asks again without
        a bound where a registered server is gone, so a stale registration hung the run."""
        from tvm.rpc import base

        where = f"{self.host}:{self.port}"
        sock = tracker_socket(self.host, self.port)
        try:
            sock.settimeout(None if deadline is None else max(0.1, deadline - time.monotonic()))
            reply = tracker_call(sock, [base.TrackerCode.REQUEST, self.key, "", 1])
            if reply[0] != base.TrackerCode.SUCCESS:
                raise ValueError(f"it answered {reply!r:.80}")
            host, port, match_key = reply[1]
            return str(host), int(port), str(match_key)
        except TimeoutError:
            raise DeviceLost(
                f"tracker {where} gave no {self.key!r} server within {GRANT_TIMEOUT_S:g} s after one did"
                f" not answer ({self.refused})"
            ) from None
        except (OSError, ValueError, LookupError, TypeError) as exc:
            raise DeviceLost(f"tracker {where} gave no {self.key!r} server: {reason(exc)}") from None
        finally:
            sock.close()
