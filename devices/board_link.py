"""Helper process for an SSH board session: `python -m devices.board_link BOARD_JSON [TRACKER_JSON]`.

Logs in, starts TVM's RPC server on the board's loopback, forwards a local port to it and prints
one JSON line: {"port": local port, "rpc_port": board port}, or {"error"|"lost": message}. It then
serves until its stdin closes (or the SSH connection dies), stops the server and logs out. Ctrl-C
is left to the parent, which closes stdin from its cleanup.
"""

from __future__ import annotations

import json
import select
import signal
import sys

from devices.boards import Board
from devices.registry import DeviceLost
from devices.server_process import free_port
from devices.ssh import BoardShell, RemoteServer, ssh_connect
from devices.tunnel import LocalForward, RemoteForward
from ops.errors import DeployError

FARM_ADDRESS = "127.0.0.2"
"""Where a board served to a tracker is reached on this host: the tracker hands clients this
address and the board's port, and a loopback alias of its own cannot clash with a server bound on
127.0.0.1 here (as when the "board" is this machine)."""


def serve(board: Board, tracker: tuple[str, int, str] | None = None) -> int:
    """Serve `board` to this host; with `tracker` (host, port, key), register it there instead,
    reachable from this host at the port it reports."""
    client = server = forward = back = None
    try:
        client = ssh_connect(board)
        transport = client.get_transport()
        shell = BoardShell(board, client)
        if tracker is None:
            server = RemoteServer(shell)
            server.wait_ready()
            forward = LocalForward(transport, "127.0.0.1", server.port)
        else:
            host, port, key = tracker
            back = RemoteForward(transport, host, port)
            here = free_port(FARM_ADDRESS)
            server = RemoteServer(shell, (here, here + 1), (back.port, key, FARM_ADDRESS))
            server.wait_ready()
            forward = LocalForward(transport, "127.0.0.1", server.port, (FARM_ADDRESS, server.port))
        _say({"port": forward.port, "rpc_port": server.port})
        while transport is not None and transport.is_active():
            ready, _, _ = select.select([sys.stdin], [], [], 0.5)
            if ready and not sys.stdin.read(1):
                break
        return 0
    except DeviceLost as exc:
        return _say({"lost": str(exc)})
    except DeployError as exc:
        return _say({"error": str(exc)})
    finally:
        if forward is not None:
            forward.close()
        if server is not None:
            server.stop()
        if back is not None:
            back.close()
        if client is not None:
            client.close()


def _say(message: dict[str, object]) -> int:
    print(json.dumps(message), flush=True)
    return 1 if "error" in message or "lost" in message else 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    board = Board(**json.loads(sys.argv[1]))
    tracker = tuple(json.loads(sys.argv[2])) if len(sys.argv) > 2 else None
    return serve(board, tracker)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
