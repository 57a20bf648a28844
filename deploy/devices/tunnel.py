"""Port forwards over an SSH connection (what `ssh -L` does), for paramiko.

Connections to 127.0.0.1:`port` on this host are carried to `remote_host:remote_port` as seen from
the board, so a server that listens only on the board's loopback is reachable here.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any

import paramiko

CHUNK = 1 << 16


def pump(sock: socket.socket, channel: Any, closed: threading.Event) -> None:
    """Copy bytes both ways between a socket and an SSH channel until either side ends."""
    try:
        while not closed.is_set():
            ready, _, _ = select.select([sock, channel], [], [], 0.5)
            if sock in ready:
                data = sock.recv(CHUNK)
                if not data:
                    break
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(CHUNK)
                if not data:
                    break
                sock.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the connection ends; the RPC client on it reports the loss
    finally:
        channel.close()
        sock.close()


class LocalForward:
    """Listens on a loopback address (`listen`, a free port unless one is given; `self.port`)
    until `close()`."""

    def __init__(
        self, transport: Any, remote_host: str, remote_port: int, listen: tuple[str, int] = ("127.0.0.1", 0)
    ) -> None:
        self._transport = transport
        self._remote = (remote_host, remote_port)
        self._listener = socket.create_server(listen)
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._pairs: list[tuple[socket.socket, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            try:
                channel = self._transport.open_channel("direct-tcpip", self._remote, peer, timeout=10)
            except Exception:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, channel))
            threading.Thread(target=pump, args=(client, channel, self._closed), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for client, channel in self._pairs:
                channel.close()
                client.close()
            self._pairs.clear()
