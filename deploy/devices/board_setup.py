"""`deploy device setup` and `deploy device check`: put deploy's native runtime on a board, and say
whether the board can run it.

The runtime (`deploy-rpc-server` and the TVM runtime libraries, about 5 MB, built on this host for
the board's architecture) is pushed over SFTP into `<remote_dir>/runtime.new`, checked with the
board's own `sha256sum`, and renamed into `<remote_dir>/runtime`, so that directory never holds a
half-written runtime. The board needs no Python: a POSIX shell with `uname`, `sha256sum`, `rm`,
`sleep` and `timeout` (coreutils or busybox), and SFTP. Nothing goes outside the remote dir, and a
`runtime` there that holds none of the runtime's files is left alone (setup refuses). Before
anything is pushed, the runtime's ELF machine is checked against `uname -m`, and the glibc and
libstdc++ versions the board's libraries define against those the runtime needs.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import stat
import struct
from collections.abc import Callable
from pathlib import Path

import paramiko

from deploy.base.errors import DeployError, UsageError, printable
from deploy.base.files import sha256_file
from deploy.devices.boards import Board
from deploy.devices.elf import Version, elf_machine, provided_versions, required_versions, version_text
from deploy.devices.native import RUNTIME_FILES, native_runtime
from deploy.devices.platforms import Platform, tvm_runtime_platform
from deploy.devices.ssh import BoardShell, ssh_connect

MACHINE_ALIASES = {"arm64": "aarch64", "amd64": "x86_64"}
TOOLS = ("sha256sum", "rm", "sleep", "timeout")
"""What deploy runs on the board besides the shell's builtins and `uname`."""
LIBRARY_DIRS = (
    "/lib/{arch}-linux-gnu", "/usr/lib/{arch}-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
)  # fmt: skip
"""Where the board's C libraries are looked for, in order (Debian's multiarch dirs first)."""
LIBRARIES = {"GLIBC": ("glibc", "libc.so.6"), "GLIBCXX": ("libstdc++", "libstdc++.so.6")}
"""Symbol-version family -> (what to call it, the library that defines it)."""
SHA256_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")
LIBRARY_READ_LIMIT = 32 << 20
"""The most read of a board's C library (its section table and version sections: kilobytes)."""
MACHINE = re.compile(r"[A-Za-z0-9_]{1,32}")
"""What a `uname -m` looks like (anything else a board answers is not shown as its machine)."""


def _say_versions(kind: str, version: Version) -> str:
    """How a version of `kind` reads in messages: glibc "2.34", libstdc++ "GLIBCXX_3.4.26"."""
    return version_text(version) if kind == "GLIBC" else f"{kind}_{version_text(version)}"


def require_versions(name: str, provided: dict[str, Version], required: dict[str, Version]) -> None:
    """Refuse, in one line naming both versions, a board whose glibc or libstdc++ is older than
    the runtime needs or missing (as on musl boards)."""
    for kind, needed in sorted(required.items()):
        label, library = LIBRARIES[kind]
        have = provided.get(kind)
        if have is None:
            raise DeployError(
                f"{name}: no {label} on the board ({library} not found), the runtime needs"
                f" {label} {_say_versions(kind, needed)}"
            )
        if have < needed:
            raise DeployError(
                f"{name}: {label} {_say_versions(kind, have)} on the board, the runtime needs"
                f" {_say_versions(kind, needed)}"
            )


def board_machine(shell: BoardShell) -> str:
    """The board's `uname -m` (arm64 read as aarch64); a one-line error if a tool deploy runs
    there is missing."""
    name = shell.board.name
    probe = "; ".join(f"command -v {q} >/dev/null || echo missing: {q}" for q in map(shlex.quote, TOOLS))
    reply = shell.run(f"uname -m; {probe}")
    lines = reply.out.splitlines()
    missing = [tool for tool in TOOLS if f"missing: {tool}" in lines]
    if missing:
        raise DeployError(f"{name}: the board has no {', '.join(missing)} (deploy runs {', '.join(TOOLS)})")
    machine = lines[0].strip() if len(lines) == 1 else ""
    if not MACHINE.fullmatch(machine):
        said = reply.err or printable(" | ".join(lines)) or "no output"
        raise DeployError(f"{name}: `uname -m` failed on the board: {said}")
    return MACHINE_ALIASES.get(machine, machine)


def _board_versions(shell: BoardShell, machine: str) -> dict[str, Version]:
    """The newest GLIBC and GLIBCXX versions that the board's libc.so.6 and libstdc++.so.6 define,
    each from the first of LIBRARY_DIRS that has a 64-bit one (read over SFTP: only the section
    table and version sections); a library not found is left out."""
    found: dict[str, Version] = {}
    directories = [directory.format(arch=machine) for directory in LIBRARY_DIRS]
    with shell.files("reading the board's C libraries") as sftp:
        for kind, (_, library) in LIBRARIES.items():
            for directory in directories:
                version = _defined_version(shell.board.name, sftp, posixpath.join(directory, library), kind)
                if version is not None:
                    found[kind] = version
                    break
    return found


class _Capped:
    """A file on the board of which at most LIBRARY_READ_LIMIT bytes are read in all, whatever
    sizes its headers claim."""

    def __init__(self, stream: paramiko.SFTPFile) -> None:
        self._stream, self._left = stream, LIBRARY_READ_LIMIT

    def seek(self, offset: int) -> None:
        self._stream.seek(offset)

    def read(self, size: int) -> bytes:
        if size > self._left:
            raise ValueError(f"its sections would take over {LIBRARY_READ_LIMIT >> 20} MiB")
        self._left -= size
        return bytes(self._stream.read(size))


def _defined_version(name: str, sftp: paramiko.SFTPClient, path: str, kind: str) -> Version | None:
    try:
        with sftp.open(path, "rb") as stream:
            return provided_versions(_Capped(stream), path).get(kind)
    except FileNotFoundError:
        return None
    except UsageError:  # not a 64-bit little-endian ELF file (a 32-bit multilib copy)
        return None
    except (struct.error, LookupError, ValueError) as exc:
        raise DeployError(f"{name}: {path} is not an ELF library deploy can read: {exc}") from None


def _board_sha256(shell: BoardShell, directory: str) -> dict[str, str]:
    """The sha256 of each runtime file in `directory`, computed on the board; missing ones (or a
    missing directory) are left out."""
    names = " ".join(shlex.quote(name) for name in RUNTIME_FILES)
    reply = shell.run(f"cd {shlex.quote(directory)} 2>/dev/null && sha256sum -- {names}")
    found = {}
    for line in reply.out.splitlines():
        match = SHA256_LINE.match(line.strip())
        if match and match.group(2) in RUNTIME_FILES:
            found[match.group(2)] = match.group(1)
    return found


def _compatible_runtime(shell: BoardShell, platform: Platform, say: Callable[[str], None]) -> Path:
    """The runtime for `platform` (the board's arch), once the board is known to run it: its ELF
    machine is the board's `uname -m`, and the board's glibc and libstdc++ are new enough."""
    board = shell.board
    machine = board_machine(shell)
    say(f"{board.name}: SSH ok, {machine} (uname -m)")
    runtime = native_runtime(platform)
    built = {elf_machine(runtime / name) for name in RUNTIME_FILES}
    if built != {machine}:
        raise DeployError(
            f"{board.name}: the runtime is built for {', '.join(sorted(built))}"
            f" (the board's arch {board.arch}) but the board runs {machine}: re-add it with arch {machine}"
        )
    required = required_versions([runtime / name for name in RUNTIME_FILES])
    provided = _board_versions(shell, machine)

    def found(kind: str) -> str:
        label = LIBRARIES[kind][0]
        return f"{label} {_say_versions(kind, provided[kind])}" if kind in provided else f"no {label}"

    needed = ", ".join(f"{LIBRARIES[k][0]} {_say_versions(k, v)}" for k, v in sorted(required.items()))
    say(f"{board.name}: {', '.join(map(found, sorted(LIBRARIES)))} on the board; the runtime needs {needed}")
    try:
        require_versions(board.name, provided, required)
    except DeployError as exc:  # the runner protocol needs no glibc of a version: offer it
        raise DeployError(
            f"{exc}; the runner protocol needs none (each bundle's deploy-run is static):"
            f" `deploy device add {board.name} ... --protocol runner --replace`"
        ) from None
    return runtime


def _stale(runtime: Path, on_board: dict[str, str]) -> list[str]:
    """Runtime files that are missing on the board or differ from this host's."""
    return [name for name in RUNTIME_FILES if on_board.get(name) != sha256_file(runtime / name)]


def check_board(board: Board, say: Callable[[str], None], accept_new_host_key: bool = False) -> bool:
    """Report what the board has against what the runtime needs (refusing a board that cannot
    run it); whether our runtime is installed there and matches this host's."""
    platform = tvm_runtime_platform(board.arch)
    client = ssh_connect(board, accept_new_host_key)
    try:
        shell = BoardShell(board, client)
        runtime = _compatible_runtime(shell, platform, say)
        on_board = _board_sha256(shell, shell.runtime_dir)
    finally:
        client.close()
    stale = _stale(runtime, on_board)
    if not on_board:
        say(f"{board.name}: no runtime in {shell.runtime_dir} (run `deploy device setup {board.name}`)")
    elif stale:
        say(
            f"{board.name}: the runtime in {shell.runtime_dir} differs from this host's ({', '.join(stale)});"
            f" run `deploy device setup {board.name}`"
        )
    else:
        say(f"{board.name}: runtime in {shell.runtime_dir} matches this host's (sha256)")
    return not stale


def setup_board(board: Board, say: Callable[[str], None]) -> None:
    """Push the runtime unless the board already has this host's (sha256 on the board)."""
    platform = tvm_runtime_platform(board.arch)
    client = ssh_connect(board)
    try:
        shell = BoardShell(board, client)
        runtime = _compatible_runtime(shell, platform, say)
        on_board = _board_sha256(shell, shell.runtime_dir)
        stale = _stale(runtime, on_board)
        if not stale:
            say(f"{board.name}: runtime in {shell.runtime_dir} matches this host's (sha256); nothing to do")
            return
        _refuse_foreign(shell)
        size = sum((runtime / name).stat().st_size for name in RUNTIME_FILES) / 1e6
        found = f"differs ({', '.join(stale)})" if on_board else "missing"
        say(f"{board.name}: runtime {found}; pushing {size:.1f} MB to {shell.runtime_dir}")
        _push(shell, runtime)
        say(f"{board.name}: runtime installed in {shell.runtime_dir} (sha256 checked on the board)")
    finally:
        client.close()


def _refuse_foreign(shell: BoardShell) -> None:
    """Refuse to replace `runtime`, or remove the `runtime.new`/`runtime.old` an interrupted setup
    leaves, when it holds anything but the runtime's own files: deploy did not write that (the
    remote dir is not deploy's alone)."""
    owned = {*RUNTIME_FILES, *(posixpath.dirname(name) for name in RUNTIME_FILES if "/" in name)}
    with shell.files(f"looking at {shell.runtime_dir}") as sftp:
        for top in (shell.runtime_dir, shell.runtime_dir + ".new", shell.runtime_dir + ".old"):
            stray = _stray(sftp, top, "", owned)
            if stray is not None:
                raise DeployError(
                    f"{shell.board.name}: {top} holds {printable(stray or '(not a directory)')}, which"
                    " deploy did not write: refusing to replace it (move it away, or re-add the board with"
                    " another --remote-dir)"
                )


def _stray(sftp: paramiko.SFTPClient, top: str, below: str, owned: set[str]) -> str | None:
    """The first entry under `top`/`below` that is not in `owned` ("" when `top` is not a
    directory), None when there is none or `top` does not exist."""
    try:
        entries = sftp.listdir_attr(posixpath.join(top, below) if below else top)
    except FileNotFoundError:
        return None
    except OSError:
        return below
    for entry in entries:
        name = posixpath.join(below, entry.filename) if below else entry.filename
        if name not in owned:
            return name
        if stat.S_ISDIR(entry.st_mode or 0):
            found = _stray(sftp, top, name, owned)
            if found is not None:
                return found
    return None


def _push(shell: BoardShell, runtime: Path) -> None:
    """Upload into runtime.new, check every file's sha256 on the board, make them executable, then
    rename runtime.new to runtime (the old one is moved aside first and removed after)."""
    name, q = shell.board.name, shlex.quote
    final = shell.runtime_dir
    fresh, old = final + ".new", final + ".old"
    removed = shell.run(f"rm -rf -- {q(fresh)} {q(old)}")  # left by an interrupted setup
    if removed.status != 0:
        raise DeployError(f"{name}: cannot remove {fresh} or {old}: {removed.err}")
    with shell.files(f"uploading the runtime to {fresh}") as sftp:
        _makedirs(sftp, shell.remote_dir)
        for directory in sorted({posixpath.dirname(posixpath.join(fresh, f)) for f in RUNTIME_FILES}):
            sftp.mkdir(directory, 0o755)
        for file in RUNTIME_FILES:
            sftp.put(str(runtime / file), posixpath.join(fresh, file))
    bad = _stale(runtime, _board_sha256(shell, fresh))
    if bad:
        shell.run(f"rm -rf -- {q(fresh)}")
        raise DeployError(
            f"{name}: after upload, sha256 on the board differs from this host's for {', '.join(bad)};"
            " nothing was installed"
        )
    with shell.files(f"installing the runtime in {final}") as sftp:
        for file in RUNTIME_FILES:
            sftp.chmod(posixpath.join(fresh, file), 0o755)
        if _exists(sftp, final):
            sftp.rename(final, old)
        sftp.rename(fresh, final)
    shell.run(f"rm -rf -- {q(old)}")


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.stat(path)
    except FileNotFoundError:
        return False
    return True


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`mkdir -p` over SFTP; a DeployError naming `path` where it is something else (a remote
    dir that is a file failed as `runtime.new: No such file`)."""
    if path in ("", "/"):
        return
    try:
        mode = sftp.stat(path).st_mode or 0
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISDIR(mode):
            raise DeployError(f"{path} on the board is not a directory (the remote dir, or one above it)")
        return
    _makedirs(sftp, posixpath.dirname(path))
    sftp.mkdir(path, 0o755)
