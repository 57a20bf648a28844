"""Boards over SSH through the runner protocol (`deploy/devices/runner.py`): each artifact's C bundle is
pushed once per session over SFTP into `<remote_dir>/bundles/<digest of its SHA256SUMS>` and its
static `deploy-run` runs it there, checking every file's sha256 on the board at each call. The
board needs a POSIX shell with `uname`, `sha256sum`, `rm`, `sleep` and `timeout` and SFTP: no
Python, no TVM, no particular glibc (armv7 and riscv64 boards, and aarch64 or x86 boards too old
for deploy's RPC server: `deploy device add ... --protocol runner`).

Before anything is pushed, the board's `uname -m` must be its arch, and a riscv64 board must have
the vector extension (the `isa` line of /proc/cpuinfo): builds for `riscv64` use RVV.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import paramiko

from deploy.base.errors import DeployError, UsageError
from deploy.base.files import SUMS, read_sums
from deploy.devices.board_setup import board_machine
from deploy.devices.boards import Board, get_board
from deploy.devices.registry import Device, register_device_source
from deploy.devices.runner import RUNNER, RUNNER_PROTOCOL, RunnerSession, file_args, ran_over
from deploy.devices.ssh import BoardShell, ssh_connect

ISA = re.compile(r"^isa\s*:\s*rv64([a-z]*)", re.MULTILINE)
PROCESSOR = re.compile(r"^processor\s*:", re.MULTILINE)
CPUINFO_LIMIT = 1 << 20
CALL_LIMIT_S = 600.0
"""The longest a run without a limit of its own is waited for."""
REPLY_SLACK_S = 30.0
"""How long past a run's limit its reply is waited for (the board's `timeout` kills it at the limit)."""
TIMED_OUT = (124, 128 + 9)
"""`timeout`'s status for a command it stopped: 124, or SIGKILL's (GNU's `-s KILL` kills itself too)."""


def check_runner_board(shell: BoardShell, say: Callable[[str], None] = lambda _: None) -> int:
    """Refuse a board the runner protocol cannot serve its arch on (its `uname -m`, a riscv64 one
    without V), before anything is pushed; its online CPUs."""
    board = shell.board
    machine = board_machine(shell)
    if machine != board.arch:
        raise UsageError(
            f"{board.name} runs {machine} (uname -m) but was added with arch {board.arch}: re-add it with"
            f" --arch {machine} (`deploy device add {board.name} ... --replace`)"
        )
    with shell.files("reading /proc/cpuinfo") as sftp, sftp.open("/proc/cpuinfo", "rb") as stream:
        cpuinfo = stream.read(CPUINFO_LIMIT).decode(errors="replace")  # no `cat` needed on the board
    if board.arch == "riscv64":
        isa = ISA.search(cpuinfo)
        extensions = isa.group(1) if isa else ""
        if "v" not in extensions:
            said = f"its isa is rv64{extensions}" if isa else "/proc/cpuinfo names no isa"
            raise UsageError(
                f"{board.name}: builds for riscv64 use the vector extension V (RVV 1.0), and {said}"
            )
    cpus = max(1, len(PROCESSOR.findall(cpuinfo)))
    say(f"{board.name}: SSH ok, {machine} (uname -m), {cpus} CPUs; runner protocol: each bundle"
        " carries its static deploy-run, nothing to set up (any libc)")  # fmt: skip
    return cpus


class SshRunnerLink:
    """The runner on a board: bundles pushed once (by the digest of their SHA256SUMS), each call's
    inputs and output in a directory of its own, removed after it."""

    def __init__(self, shell: BoardShell) -> None:
        board = shell.board
        self.shell = shell
        self.label = f"{board.name} ({board.user}@{board.host}:{board.port}, runner)"
        self.bundles = posixpath.join(shell.remote_dir, "bundles")
        self.calls = posixpath.join(shell.remote_dir, "calls")

    def bundle(self, directory: Path, program: str = RUNNER) -> str:
        """Where the files `directory`'s SHA256SUMS lists are on the board, pushed unless they are
        there already, `program` among them made executable."""
        sums = (directory / SUMS).read_bytes()
        remote = posixpath.join(self.bundles, hashlib.sha256(sums).hexdigest()[:24])
        with (
            self.shell.files(f"reading {remote}") as sftp,
            suppress(FileNotFoundError),
            sftp.open(posixpath.join(remote, SUMS), "rb") as stream,
        ):
            if stream.read(len(sums) + 1) == sums:
                return remote  # its files are checked by the runner at every call
        staging = f"{remote}.new-{secrets.token_hex(4)}"
        files = [*read_sums(directory), SUMS]
        self._run(f"rm -rf -- {shlex.quote(remote)}")  # a bundle of these sums cut short, or changed
        with self.shell.files(f"pushing {directory.name} to {staging}") as sftp:
            for folder in sorted({posixpath.dirname(posixpath.join(staging, name)) for name in files}):
                make_dirs(sftp, folder)
            for name in files:
                sftp.put(str(directory / name), posixpath.join(staging, name))
            sftp.chmod(posixpath.join(staging, program), 0o755)
            sftp.rename(staging, remote)
        return remote

    def call(
        self,
        bundle: str,
        inputs: list[Path],
        outputs: list[Path],
        options: list[str],
        timeout_s: float | None = None,
    ) -> tuple[int, str, str]:
        work = posixpath.join(self.calls, secrets.token_hex(8))
        try:
            with self.shell.files(f"pushing the inputs to {work}") as sftp:
                make_dirs(sftp, work)
                for path in inputs:
                    sftp.put(str(path), posixpath.join(work, path.name))
            args = [posixpath.join(bundle, RUNNER), bundle]
            args += [*file_args([p.name for p in inputs], [p.name for p in outputs]), *options]
            if timeout_s is not None:  # killed on the board: a hung runner would keep spinning there
                args = ["timeout", "-s", "KILL", str(math.ceil(timeout_s)), *args]
            start = time.monotonic()
            wait = timeout_s + REPLY_SLACK_S if timeout_s is not None else CALL_LIMIT_S
            reply = self.shell.run(f"cd {shlex.quote(work)} && {shlex.join(args)}", timeout=wait)
            if timeout_s is not None and reply.status in TIMED_OUT and time.monotonic() - start >= timeout_s:
                raise ran_over(bundle, timeout_s, self.label)
            if reply.status == 0:
                with self.shell.files(f"fetching the outputs from {work}") as sftp:
                    for path in outputs:
                        sftp.get(posixpath.join(work, path.name), str(path))
        finally:
            self.shell.run(f"rm -rf -- {shlex.quote(work)}")
        status = -(reply.status - 128) if reply.status > 128 else reply.status  # the shell's 128 + signal
        return status, reply.out, reply.err.split(" | ")[-1]

    def _run(self, command: str) -> None:
        reply = self.shell.run(command)
        if reply.status != 0:
            said = reply.err or f"exit status {reply.status}"
            raise DeployError(f"{self.shell.board.name}: `{command}` failed: {said}")


def make_dirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`mkdir -p` over SFTP (the board may have no `mkdir`: deploy runs only TOOLS there)."""
    parent = posixpath.dirname(path)
    if parent and parent != path:
        with suppress(OSError):
            sftp.stat(parent)
            parent = ""
        if parent:
            make_dirs(sftp, parent)
    with suppress(OSError):
        sftp.mkdir(path)


class RunnerBoard(Device):
    """A board registered with `deploy device add` that speaks the runner protocol."""

    protocols = (RUNNER_PROTOCOL,)

    def __init__(self, board: Board) -> None:
        self.board, self.name, self.arch = board, board.name, board.arch

    @contextmanager
    def open(self) -> Iterator[RunnerSession]:
        client = ssh_connect(self.board)
        try:
            shell = BoardShell(self.board, client)
            cpus = check_runner_board(shell)
            yield RunnerSession(SshRunnerLink(shell), self.arch, cpus)
        finally:
            client.close()


def check_runner(board: Board, say: Callable[[str], None], accept_new_host_key: bool = False) -> bool:
    """`deploy device check` of a runner board: what the protocol needs, what the board has."""
    client = ssh_connect(board, accept_new_host_key)
    try:
        check_runner_board(BoardShell(board, client), say)
    finally:
        client.close()
    return True


def _configured(name: str) -> RunnerBoard | None:
    board = get_board(name)
    return RunnerBoard(board) if board is not None and board.speaks == "runner" else None


register_device_source(_configured)
