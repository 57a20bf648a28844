"""A board's OpenCL device (`deploy device add ... --opencl P:D`), which runs `--target opencl`
builds with no Python on the board: each artifact's OpenCL bundle, its host code built for the
board's arch, is pushed and run by its `deploy-run --cl-device P:D` as the runner protocol runs
a CPU bundle (`deploy/devices/board_runner.py`). It is the side of the board `get_device(BOARD, "opencl")`
finds, whatever protocol the board's CPU speaks.

At the start of a session `deploy-cl-probe P:D` (deploy/devices/native/cl_probe.c, pushed like a bundle)
says what the device is: its name, and whether it has cl_khr_fp16 (else float16 is built as half
storage computed in float32). A board without an OpenCL library, platform or that device is a
one-line error naming the board, before anything is built.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deploy.base.errors import DeployError, UsageError, printable
from deploy.devices.board_runner import SshRunnerLink, check_runner_board
from deploy.devices.boards import Board, get_board
from deploy.devices.native import CL_PROBE, cl_probe
from deploy.devices.opencl import OpenClDevice
from deploy.devices.platforms import get_platform
from deploy.devices.registry import Device, register_device_side
from deploy.devices.runner import BAD_INPUT, RUNNER_PROTOCOL, RunnerSession
from deploy.devices.ssh import BoardShell, ssh_connect

FP16 = "cl_khr_fp16"
"""The extension half arithmetic needs."""


def probe(board: Board, shell: BoardShell, link: SshRunnerLink) -> tuple[str, bool]:
    """The board's OpenCL device: its name and whether it has cl_khr_fp16; a one-line error
    naming the board when it has no OpenCL (DeployError) or no device `board.opencl` (UsageError)."""
    remote = link.bundle(cl_probe(get_platform(board.arch)), CL_PROBE)
    reply = shell.run(shlex.join([posixpath.join(remote, CL_PROBE), board.opencl]))
    if reply.status != 0:
        last = reply.err.strip().splitlines()[-1] if reply.err.strip() else f"exit status {reply.status}"
        said = printable(last)
        if reply.status == BAD_INPUT:
            again = f"`deploy device add {board.name} ... --opencl P:D --replace`"
            raise UsageError(f"{board.name}: {said} (re-add it with another device: {again})")
        raise DeployError(f"{board.name} cannot run OpenCL bundles: {said}")
    lines = reply.out.splitlines()
    name = printable(lines[0].strip()) if lines else "an OpenCL device"
    return name, len(lines) > 1 and FP16 in lines[1].split()


class OpenClBoard(Device):
    """The OpenCL device of a board added with `--opencl P:D`, running OpenCL bundles."""

    arch = OpenClDevice.arch
    protocols = (RUNNER_PROTOCOL,)

    def __init__(self, board: Board) -> None:
        self.board, self.name = board, board.name

    @contextmanager
    def open(self) -> Iterator[RunnerSession]:
        board = self.board
        client = ssh_connect(board)
        try:
            shell = BoardShell(board, client)
            check_runner_board(shell)
            link = SshRunnerLink(shell)
            name, fp16 = probe(board, shell, link)
            where = f"{board.user}@{board.host}:{board.port}"
            link.label = f"{board.name} ({where}, OpenCL {board.opencl} {name})"
            options = ("--cl-device", board.opencl)
            yield RunnerSession(link, self.arch, None, options, fp16=fp16, bundle_host=board.arch)
        finally:
            client.close()


def check_opencl(board: Board, say: Callable[[str], None], accept_new_host_key: bool = False) -> bool:
    """`deploy device check` of a board's OpenCL device: what it is, and how float16 builds for it."""
    client = ssh_connect(board, accept_new_host_key)
    try:
        shell = BoardShell(board, client)
        name, fp16 = probe(board, shell, SshRunnerLink(shell))
    finally:
        client.close()
    half = "half arithmetic (cl_khr_fp16)" if fp16 else "no cl_khr_fp16: float16 is built as half storage"
    say(f"{board.name}: OpenCL {board.opencl} is {name}, {half}; `--target opencl` runs its bundles there")
    return True


def _side(name: str, arch: str) -> OpenClBoard | None:
    """The OpenCL side of the board `name`; a UsageError when it was added without one."""
    board = get_board(name) if arch == OpenClDevice.arch else None
    if board is None:
        return None
    if not board.opencl:
        raise UsageError(
            f"board {name} has no OpenCL device: add it with --opencl P:D (`deploy device add {name}"
            " ... --opencl 0:0 --replace`)"
        )
    return OpenClBoard(board)


register_device_side(_side)
