"""`deploy device setup`: make a board able to run TVM's RPC server.

The runtime wheels are fetched by the host's pip for the board's Python and architecture and pushed
over SFTP into `<remote_dir>/runtime` on the board, so boards without internet work too. Nothing is
installed system-wide on the board; running it again does nothing once the runtime is there.
"""

from __future__ import annotations

import posixpath
import shlex
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from devices.boards import Board
from devices.runtime_wheels import TVM_VERSION, install_runtime
from devices.ssh import BoardShell, PythonInfo, ssh_connect
from ops.errors import DeployError

MIN_PYTHON = (3, 9)
MACHINE_ALIASES = {"arm64": "aarch64", "amd64": "x86_64"}


def check_board(board: Board, accept_new_host_key: bool = False) -> tuple[PythonInfo, str]:
    """Log in, check the board's Python and machine; with the runtime directory."""
    client = ssh_connect(board, accept_new_host_key)
    try:
        shell = BoardShell(board, client)
        info = shell.probe()
    finally:
        client.close()
    _check_python(board, info)
    return info, shell.runtime_dir


def _check_python(board: Board, info: PythonInfo) -> None:
    machine = MACHINE_ALIASES.get(info.machine, info.machine)
    if machine != board.arch:
        raise DeployError(f"{board.name} runs {info.machine}, but it was added with --arch {board.arch}")
    if info.version < MIN_PYTHON:
        found, wanted = ".".join(map(str, info.version)), ".".join(map(str, MIN_PYTHON))
        raise DeployError(f"{board.name} has Python {found}: the TVM runtime needs {wanted} or newer")


def setup_board(board: Board, say: Callable[[str], None]) -> None:
    """Install the TVM runtime on the board unless the right version is already importable."""
    client = ssh_connect(board)
    try:
        shell = BoardShell(board, client)
        info = shell.probe()
        _check_python(board, info)
        version = ".".join(map(str, info.version))
        say(f"{board.name}: Python {version} on {info.machine}")
        if info.runtime is not None and info.runtime.startswith(TVM_VERSION):
            say(f"{board.name}: TVM runtime {info.runtime} already importable; nothing to do")
            return
        say(f"{board.name}: TVM runtime {'found ' + info.runtime if info.runtime else 'missing'}; installing")
        with tempfile.TemporaryDirectory() as tmp:
            archive = _pack_runtime(Path(tmp), board.arch, info.version, say)
            upload = posixpath.join(shell.remote_dir, "runtime.tar.gz.partial")
            status, out = shell.run(f"mkdir -p {shlex.quote(shell.remote_dir)}")
            if status != 0:
                raise DeployError(f"{board.name}: cannot create {shell.remote_dir}: {out}")
            say(f"{board.name}: uploading {archive.stat().st_size / 1e6:.0f} MB to {shell.remote_dir}")
            shell.put(archive, upload)
        _unpack(shell, upload)
        after = shell.probe()
        if after.runtime is None or not after.runtime.startswith(TVM_VERSION):
            raise DeployError(
                f"{board.name}: the runtime was installed in {shell.runtime_dir} but does not import"
            )
        say(f"{board.name}: TVM runtime {after.runtime} installed in {shell.runtime_dir}")
    finally:
        client.close()


def _pack_runtime(tmp: Path, arch: str, version: tuple[int, int], say: Callable[[str], None]) -> Path:
    stage = tmp / "runtime"
    say(f"fetching the {arch} wheels for Python {version[0]}.{version[1]} with this host's pip")
    install_runtime(stage, arch, version)
    archive = tmp / "runtime.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for path in sorted(stage.iterdir()):
            tar.add(path, arcname=path.name)
    return archive


def _unpack(shell: BoardShell, upload: str) -> None:
    """Replace `runtime/` with the archive's content in one rename."""
    q = shlex.quote
    directory, fresh = shell.runtime_dir, shell.runtime_dir + ".new"
    status, out = shell.run(
        f"rm -rf {q(fresh)} && mkdir {q(fresh)} && tar -xzf {q(upload)} -C {q(fresh)} &&"
        f" rm -rf {q(directory)} && mv {q(fresh)} {q(directory)} && rm -f {q(upload)}",
        timeout=600,
    )
    if status != 0:
        raise DeployError(f"{shell.board.name}: unpacking the runtime failed: {out.splitlines()[-1:]}")
