"""Run a server that cannot register itself and register it with an RPC tracker on its behalf:
`python -m deploy.devices.registrar HOST:PORT KEY KEY_FILE -- SERVER_COMMAND...`.

The server (the native `deploy-rpc-server`) runs as our child in our process group, so stopping the
group stops both. Its output passes through to ours; its "bind to HOST:PORT" line is passed on only
once the tracker has the server, so whoever waits for that line waits for the registration too.
We exit with the server; the tracker then forgets it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from deploy.base.errors import DeployError
from deploy.devices.tracker import TrackerRegistration, parse_address

READY = re.compile(r"bind to ([\d.]+):(\d+)")


def serve(tracker: str, key: str, key_file: Path, command: list[str]) -> int:
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    registration: TrackerRegistration | None = None
    try:
        for line in server.stdout:
            ready = READY.search(line)
            if ready and registration is None:
                session_key = key_file.read_text().strip()
                address, port = ready.group(1), int(ready.group(2))
                registration = TrackerRegistration(parse_address(tracker), key, address, port, session_key)
            elif registration is not None:
                registration.event(line)
                if registration.ended.is_set():
                    raise DeployError(registration.reason)
            print(line, end="", flush=True)
        return server.wait()
    except DeployError as exc:  # no tracker, or it went away: the server goes too
        print(f"registrar: {exc}", flush=True)
        server.kill()
        return 1
    finally:
        if registration is not None:
            registration.close()


def main() -> int:
    tracker, key, key_file, separator, *command = sys.argv[1:]
    if separator != "--" or not command:
        usage = "usage: python -m deploy.devices.registrar HOST:PORT KEY KEY_FILE -- COMMAND..."
        print(usage, file=sys.stderr)
        return 2
    return serve(tracker, key, Path(key_file), command)


if __name__ == "__main__":
    sys.exit(main())
