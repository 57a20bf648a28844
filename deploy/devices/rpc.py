"""Sessions with a TVM RPC server: modules are uploaded, loaded and run remotely."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deploy.base.errors import DeployError, reason
from deploy.devices.registry import Device, DeviceLost
from deploy.devices.session import TvmSession

UPLOADS_KEPT_BYTES = 64 << 20
"""Input bytes an RPC session keeps on the device for the next run on the same data."""


class RpcSession(TvmSession):
    """A TvmSession whose failures of the connection itself become DeviceLost, and which uploads
    an input once for consecutive runs on the same data: checking each candidate of a tune, or
    each structure of an op, runs them on the same seeded inputs, and an upload to an emulator
    moves about 8 MB/s (a 4 MB input took 0.26 s, most of such a check). An input is kept by
    its content (shape, dtype and a hash of its bytes), never by the array object, since the
    kernels deploy builds write only their outputs and a graph's arena, never an input."""

    def __init__(self, remote: Any, arch: str, label: str) -> None:
        self._remote = remote
        self._uploaded: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        super().__init__(self._upload_and_load, remote.cpu(0), arch, label, remote.get_function)

    def close(self) -> None:
        self._uploaded.clear()
        super().close()
        self._remote = None

    def _input(self, array: np.ndarray) -> Any:
        key = (array.shape, str(array.dtype), hashlib.blake2b(array.data, digest_size=16).digest())
        if key in self._uploaded:
            self._uploaded.move_to_end(key)
            return self._uploaded[key][0]
        tensor = super()._input(array)
        self._uploaded[key] = (tensor, array.nbytes)
        while len(self._uploaded) > 1 and sum(n for _, n in self._uploaded.values()) > UPLOADS_KEPT_BYTES:
            self._uploaded.popitem(last=False)  # the least recently used; never the one just made
        return tensor

    def _upload_and_load(self, path: Path) -> Any:
        name = f"{path.parent.name}-{path.name}"
        self._remote.upload(str(path), target=name)
        return self._remote.load_module(name)

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeployError:
            raise
        except Exception as exc:
            if not self._responds():
                raise DeviceLost(f"lost {self.label}: {reason(exc)}") from exc
            raise

    def _responds(self) -> bool:
        """Whether the server still answers a trivial call (tells a lost device from a failing op)."""
        try:
            self._remote.get_function("tvm.rpc.server.workpath")
        except Exception:
            return False
        return True

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().run, *args, **kwargs)

    def time(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().time, *args, **kwargs)

    def cores(self) -> int:
        return int(self._guard(super().cores))


@contextmanager
def rpc_session(remote: Any, arch: str, label: str) -> Iterator[RpcSession]:
    """An RpcSession over a connected `remote`, closed on exit (which frees the server)."""
    session = RpcSession(remote, arch, label)
    try:
        yield session
    finally:
        session.close()


class RpcEndpoint(Protocol):
    """A device's RPC server kept up while a context lasts (`device.rpc_endpoint()`)."""

    def session(self, session_timeout_s: float = 0) -> AbstractContextManager[RpcSession]:
        """A new session; the server ends one that lasts longer than the timeout (0: no limit),
        which bounds a hanging call."""
        ...

    def restart(self) -> None:
        """Start the server afresh: TVM's server stops accepting after a session crashed."""
        ...

    def close(self) -> None:
        """Stop what the endpoint started."""
        ...


class EndpointDevice(Device):
    """A device whose sessions come from an endpoint (`new_endpoint()`) kept up while a context
    lasts: `rpc_endpoint()` for many sessions (tuning), `open()` for one."""

    def new_endpoint(self) -> RpcEndpoint:
        raise NotImplementedError

    @contextmanager
    def rpc_endpoint(self) -> Iterator[RpcEndpoint]:
        endpoint = self.new_endpoint()
        try:
            yield endpoint
        finally:
            endpoint.close()

    @contextmanager
    def open(self) -> Iterator[RpcSession]:
        with self.rpc_endpoint() as endpoint, endpoint.session() as session:
            yield session


@contextmanager
def connect(
    host: str, port: int, arch: str, label: str, session_timeout_s: float = 0, key: str = ""
) -> Iterator[RpcSession]:
    """Connect to an RPC server with its session `key`; an unreachable one is a one-line DeviceLost."""
    import tvm.rpc

    try:
        remote = tvm.rpc.connect(host, port, key=key, session_timeout=session_timeout_s)
    except Exception as exc:
        raise DeviceLost(f"cannot reach {label} at {host}:{port}: {reason(exc)}") from exc
    with rpc_session(remote, arch, label) as session:
        yield session
