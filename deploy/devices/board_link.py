"""Helper process for an SSH board session: `python -m deploy.devices.board_link BOARD_JSON [TRACKER_JSON]`.

Logs in, starts deploy's native RPC server on the board's loopback, forwards a local port to it and
prints one JSON line: {"port": local port, "rpc_port": board port, "key": the server's session
key}, or {"error"|"lost": message} (with "usage": true for bad input). It then serves until its
stdin closes, stops the server and logs out; if the SSH connection (or the tracker) goes away
first, it says so in a second line, {"lost": message}. Ctrl-C is left to the parent, which
closes stdin from its cleanup.

With a tracker (host, port, key), the server is registered there on the board's behalf (the board
never talks to the tracker): clients on this host reach it at FARM_ADDRESS through the forward.
"""

from __future__ import annotations

import json
import select
import signal
import sys

from deploy.base.errors import DeployError, UsageError
from deploy.devices.board_setup import board_machine
from deploy.devices.boards import ARCHES, Board
from deploy.devices.registry import DeviceLost
from deploy.devices.ssh import BoardShell, RemoteServer, ssh_connect
from deploy.devices.tracker import TrackerRegistration
from deploy.devices.tunnel import LocalForward

FARM_ADDRESS = "127.0.0.2"
"""Where a board served to a tracker is reached on this host: the tracker hands clients this
address and the forward's port, and a loopback alias of its own cannot clash with a server bound
on 127.0.0.1 here (as when the "board" is this machine)."""


def serve(board: Board, tracker: tuple[str, int, str] | None = None) -> int:
    """Serve `board` to this host; with `tracker` (host, port, key), register it there as well."""
    client = server = forward = registration = None
    try:
        client = ssh_connect(board)
        transport = client.get_transport()
        shell = BoardShell(board, client)
        machine = board_machine(shell)  # one command: every case would fail to load, or a server's
        if machine != board.arch:  # directory be left behind where `rm` is missing
            advice = (
                f"re-add it with --arch {machine} (`deploy device add {board.name} ... --replace`), then"
                f" `deploy device setup {board.name}`"
                if machine in ARCHES
                else f"deploy has runtimes for {', '.join(ARCHES)} only"
            )
            raise DeployError(
                f"{board.name} runs {machine} (uname -m) but was added with arch {board.arch}: {advice}"
            )
        server = RemoteServer(shell, key_prefix=tracker[2] if tracker else "")
        server.wait_ready()
        if tracker is None:
            forward = LocalForward(transport, "127.0.0.1", server.port)
        else:
            host, port, key = tracker
            forward = LocalForward(transport, "127.0.0.1", server.port, (FARM_ADDRESS, 0))
            registration = TrackerRegistration((host, port), key, FARM_ADDRESS, forward.port, server.key)
            server.on_line = registration.event
        _say({"port": forward.port, "rpc_port": server.port, "key": server.key})
        while transport is not None and transport.is_active():
            if registration is not None and registration.ended.is_set():
                return _say({"lost": registration.reason})
            ready, _, _ = select.select([sys.stdin], [], [], 0.5)
            if ready and not sys.stdin.read(1):
                return 0
        return _say({"lost": f"the SSH connection to {board.name} ended"})
    except DeviceLost as exc:
        return _say({"lost": str(exc)})
    except DeployError as exc:  # bad input (a key that is a FIFO) stays exit 2 in the parent
        return _say({"error": str(exc), "usage": isinstance(exc, UsageError)})
    finally:
        if registration is not None:
            registration.close()
        if forward is not None:
            forward.close()
        if server is not None:
            server.stop()
        if client is not None:
            client.close()


def _say(message: dict[str, object]) -> int:
    print(json.dumps(message), flush=True)
    return 1 if "error" in message or "lost" in message else 0


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal sends them to its whole group: our
        signal.signal(sig, signal.SIG_IGN)  # parent stops us (by closing stdin) after its cleanup
    board = Board(**json.loads(sys.argv[1]))
    tracker = tuple(json.loads(sys.argv[2])) if len(sys.argv) > 2 else None
    return serve(board, tracker)


if __name__ == "__main__":
    sys.exit(main())
