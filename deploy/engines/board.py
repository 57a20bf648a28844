"""An engine's host run on a board over SSH (`deploy test --model M --engine E --device BOARD`),
as the runner protocol runs a bundle there (`deploy/devices/board_runner.py`).

The host, its plugin, the engine's libraries and the model are staged with their SHA256SUMS and
pushed once over SFTP into `<remote_dir>/bundles/<digest of the SHA256SUMS>`; each run checks
them with the board's `sha256sum`, pushes the inputs into a directory of its own under
`<remote_dir>/calls`, runs the host there under `timeout` and fetches the outputs, the directory
removed after it. The board needs what the runner protocol needs (a POSIX shell, `uname`,
`sha256sum`, `rm`, `timeout`, SFTP), its `uname -m` the target's arch, and the C library the
host and the engine's libraries were linked against (glibc, as the engines' wheels need).
"""

from __future__ import annotations

import math
import posixpath
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.base.errors import DeployError, UsageError
from deploy.base.files import SUMS, write_sums
from deploy.devices.board_runner import REPLY_SLACK_S, TIMED_OUT, SshRunnerLink, check_runner_board, make_dirs
from deploy.devices.boards import Board, require_board
from deploy.devices.registry import DeviceLost
from deploy.devices.ssh import BoardShell, ssh_connect


def engine_board(engine: str, target: Any, where: Any) -> Board | None:
    """The board `deploy test --engine` runs on (None: here, or the target's emulator), from the
    command's device options; a one-line UsageError for a choice an engine's host cannot run on
    (a tracker, an OpenCL device, a built-in device other than the target's, a board of another
    arch)."""
    if where.tracker or where.key is not None or where.cl_device:
        raise UsageError(
            f"--engine {engine} runs the model here, under the emulator or on a board (--device NAME):"
            " not through --tracker, --key or --cl-device"
        )
    if where.name is None or where.name == target.default_device:
        return None
    from deploy.devices.registry import built_in_names

    if where.name in built_in_names():
        raise UsageError(
            f"--device {where.name}: --engine {engine} --target {target.name} runs on"
            f" {target.default_device} or on a board added with `deploy device add`"
        )
    board = require_board(where.name)
    if board.arch != target.arch:
        raise UsageError(
            f"--device {board.name} is an {board.arch} board: --target {target.name} builds for"
            f" {target.arch} (expected a target for {board.arch})"
        )
    return board


def run_on_board(
    board: Board,
    files: dict[str, Path],
    program: str,
    args: Callable[[str], list[str]],
    inputs: list[Path],
    outputs: Path,
    timeout_s: float,
) -> subprocess.CompletedProcess[str]:
    """Run `program` (a name of `files`) on `board` with `args(where the files are there)`, in a
    fresh directory holding `inputs`, under the board's `timeout`; when it succeeds, the files it
    wrote there (all but the inputs) are fetched into the local directory `outputs`. `files` maps
    each name the host expects (`lib/x.so` for a subdirectory) to the local file. Returns what it
    exited with and printed (its stderr's last lines), as subprocess.run would."""
    client = ssh_connect(board)
    try:
        shell = BoardShell(board, client)
        check_runner_board(shell)
        link = SshRunnerLink(shell)
        with tempfile.TemporaryDirectory(prefix="deploy-engine-push-") as scratch:
            staged = Path(scratch)
            for name, path in files.items():
                (staged / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, staged / name)
            write_sums(staged, sorted(files))
            remote = link.bundle(staged, program)
        checked = shell.run(f"cd {shlex.quote(remote)} && sha256sum -c --quiet --strict {SUMS}")
        if checked.status != 0:
            failed = "; ".join(line for line in checked.out.splitlines() if line.strip())
            raise DeployError(
                f"{board.name}: the files pushed to {remote} do not match their {SUMS} there"
                f" ({failed or checked.err or f'exit status {checked.status}'}): changed on the board;"
                " remove that directory there to push them again"
            )
        work = posixpath.join(link.calls, secrets.token_hex(8))
        try:
            with shell.files(f"pushing the inputs to {work}") as sftp:
                make_dirs(sftp, work)
                for path in inputs:
                    sftp.put(str(path), posixpath.join(work, path.name))
            command = ["timeout", "-s", "KILL", str(math.ceil(timeout_s)), *args(remote)]
            start = time.monotonic()
            reply = shell.run(f"cd {shlex.quote(work)} && {shlex.join(command)}", timeout_s + REPLY_SLACK_S)
            if reply.status in TIMED_OUT and time.monotonic() - start >= timeout_s:
                raise DeviceLost(f"{program} ran over its {timeout_s:.0f} s limit on {board.name}: killed")
            if reply.status == 0:
                with shell.files(f"fetching the outputs from {work}") as sftp:
                    for name in sftp.listdir(work):
                        if name not in {p.name for p in inputs}:
                            sftp.get(posixpath.join(work, name), str(outputs / name))
        finally:
            shell.run(f"rm -rf -- {shlex.quote(work)}")
    finally:
        client.close()
    stderr = "\n".join(reply.err.split(" | "))  # the board's last lines of stderr, one a line again
    return subprocess.CompletedProcess(args(remote), reply.status, reply.out, stderr)
