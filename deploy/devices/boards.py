"""Boards registered with `deploy device add`: stored in `$XDG_CONFIG_HOME/deploy/devices.json`.

Only connection facts are stored (host, port, user, key path, architecture, our directory there,
the OpenCL device's indices); never passwords. Entries written by older versions may carry keys
we no longer use ("python"): they are ignored. Accepted host keys go to `known_hosts` next to it.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError, printable, reason
from deploy.base.files import load_json, write_json_atomically
from deploy.base.locks import guarding
from deploy.base.paths import config_dir
from deploy.devices.platforms import get_platform
from deploy.devices.registry import built_in_names

ARCHES = ("aarch64", "armv7l", "riscv64", "x86_64")
PROTOCOLS = ("tvm", "runner")
"""How deploy runs artifacts on a board: "tvm", deploy's native RPC server over TVM's runtime
(`deploy device setup` pushes it; glibc 2.34 or newer), or "runner", each artifact's own C bundle
and its static `deploy-run`, pushed per bundle (nothing to set up, any libc: `board_runner.py`)."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
OPENCL_DEVICE = re.compile(r"[0-9]{1,4}:[0-9]{1,4}")
"""A board's OpenCL device as `--opencl` gives it: PLATFORM:DEVICE, OpenCL's indices."""
DEFAULT_REMOTE_DIR = ".deploy"


def check_remote_dir(remote_dir: str) -> str:
    """A board's `remote_dir` as given, if it names a directory of deploy's own: not empty, not
    the login's home (`.`) or `/`, no `..` and no control characters (setup replaces
    `<remote_dir>/runtime`, so the directory must be one nothing else uses)."""
    parts = [part for part in remote_dir.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or not remote_dir.isprintable():
        raise UsageError(
            f"remote dir '{printable(remote_dir)}': expected a directory for deploy alone, under the"
            " login's home (e.g. .deploy) or absolute, not '', '.', '/' or a path with '..'"
        )
    return remote_dir


def _is_ipv6(host: str) -> bool:
    """Whether `host` is an IPv6 address as paramiko takes it (no brackets): the one host with a ':'."""
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def known_hosts_file() -> Path:
    return config_dir() / "known_hosts"


@dataclass(frozen=True)
class Board:
    """A board reached over SSH. `remote_dir` is where we keep the runtime on the board, relative
    to the login's home."""

    name: str
    host: str
    user: str
    port: int = 22
    key: str | None = None
    arch: str = "aarch64"
    remote_dir: str = DEFAULT_REMOTE_DIR
    protocol: str = ""
    """One of PROTOCOLS; "" is the arch's default: "tvm" where TVM has a runtime for it, else "runner"."""
    opencl: str = ""
    """The board's OpenCL device, PLATFORM:DEVICE ("0:0"), which runs `--target opencl` builds as
    OpenCL bundles through their runner (`deploy/devices/board_opencl.py`); "": it has none."""

    @property
    def speaks(self) -> str:
        """The protocol deploy uses with the board (`protocol`, or its arch's default)."""
        return self.protocol or ("tvm" if get_platform(self.arch).tvm_runtime else "runner")

    def validate(self) -> Board:
        """The board as `device add` accepts it: `check`, and its key a file."""
        self.check()
        if self.key is not None and not Path(self.key).is_file():
            raise UsageError(f"board key {self.key!r}: no such file (a private key file)")
        return self

    def check(self) -> Board:
        """Every field of the right type and in range (the config file may be edited by hand);
        a UsageError naming the first that is not."""
        texts = {"name": self.name, "host": self.host, "user": self.user, "arch": self.arch,
                 "opencl": self.opencl}  # fmt: skip
        for field_name, value in {**texts, "remote_dir": self.remote_dir}.items():
            if not isinstance(value, str):
                raise UsageError(f"board {field_name} {value!r}: expected a string")
        if self.key is not None and not isinstance(self.key, str):
            raise UsageError(f"board key {self.key!r}: expected a file path")
        if type(self.port) is not int:
            raise UsageError(f"board port {self.port!r}: expected 1..65535")
        reserved = built_in_names()
        if self.name in reserved:
            raise UsageError(
                f"device name {self.name!r}: a built-in device's name (built in: {', '.join(reserved)})"
            )
        if not NAME.fullmatch(self.name):
            raise UsageError(f"device name {self.name!r}: expected letters, digits, '.', '_' or '-'")
        if not self.host or any(c.isspace() for c in self.host) or not self.host.isprintable():
            raise UsageError(f"board host {self.host!r}: expected a host name or address")
        if "@" in self.host:
            raise UsageError(
                f"board host {self.host!r}: expected a host name or address (the user goes in --user)"
            )
        if ":" in self.host and not _is_ipv6(self.host):
            raise UsageError(
                f"board host {self.host!r}: expected a host name or address (the port goes in --port)"
            )
        if not 1 <= self.port <= 65535:
            raise UsageError(f"board port {self.port}: expected 1..65535")
        if not self.user or any(c.isspace() for c in self.user) or not self.user.isprintable():
            raise UsageError(f"board user {self.user!r}: expected a login name")
        if self.arch not in ARCHES:
            raise UsageError(f"board arch {self.arch!r}: expected one of {', '.join(ARCHES)}")
        if self.protocol not in ("", *PROTOCOLS):
            raise UsageError(f"board protocol {self.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if self.speaks == "tvm" and not get_platform(self.arch).tvm_runtime:
            raise UsageError(
                f"board protocol tvm on {self.arch}: TVM has no runtime for it (expected --protocol runner)"
            )
        if self.opencl and not OPENCL_DEVICE.fullmatch(self.opencl):
            raise UsageError(
                f"board opencl {self.opencl!r}: expected PLATFORM:DEVICE, OpenCL's indices (e.g. 0:0)"
            )
        check_remote_dir(self.remote_dir)
        return self


def _config_file() -> Path:
    return config_dir() / "devices.json"


def _entries() -> dict[str, Any]:
    """The config file's entries as stored (name -> its fields), unchecked; a UsageError naming
    the file when it is not a JSON object."""
    path = _config_file()
    if not path.exists():
        return {}
    try:
        raw = load_json(path)
    except OSError as exc:
        raise UsageError(f"cannot read device config {path}: {exc.strerror or reason(exc)}") from None
    except ValueError as exc:
        raise UsageError(f"cannot read device config {path}: {reason(exc)}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"cannot read device config {path}: expected an object of devices")
    return raw


def _board(name: str, entry: Any) -> Board:
    """The entry `name` of the config as a Board, checked as `device add` checks one (but for
    its key file, which may come back); a UsageError naming the device and how to be rid of it."""
    known = [f.name for f in fields(Board)]
    required = [f.name for f in fields(Board) if f.default is MISSING]
    try:
        if not isinstance(entry, dict):
            raise ValueError(f"expected an object of the board's {', '.join(known)}")
        if any(k not in entry for k in required):
            raise ValueError(f"it has no {next(k for k in required if k not in entry)}")
        board = Board(**{k: v for k, v in entry.items() if k in known}).check()
        if board.name != name:
            raise ValueError(f"the entry names the device {board.name!r}")
    except (ValueError, UsageError) as exc:
        forget = (
            f"`deploy device remove {shlex.quote(name)}`" if name.isprintable() else "`deploy device remove`"
        )
        raise UsageError(
            f"device {name!r} in {_config_file()}: {reason(exc)} ({forget} forgets it)"
        ) from None
    return board


def load_boards() -> dict[str, Board]:
    """Every board of the config file, each checked (`_board`)."""
    return {name: _board(name, entry) for name, entry in _entries().items()}


def get_board(name: str) -> Board | None:
    """The board `name`, checked; None when the config has none such (others are not checked)."""
    entry = _entries().get(name)
    return None if entry is None else _board(name, entry)


def require_board(name: str) -> Board:
    """The board `name`; a UsageError when there is none."""
    board = get_board(name)
    if board is None:
        raise UsageError(f"no device named {name!r} (see `deploy device list`)")
    return board


def _save(entries: dict[str, Any]) -> None:
    """Write the config atomically (private: it names hosts, users and key paths), through a
    symlink to the user's own copy."""
    write_json_atomically(_config_file(), dict(sorted(entries.items())), 0o600, through_links=True)


def add_board(board: Board, replace: bool = False) -> None:
    """Add (or with `replace`, replace) a board, checked with its key file; the other entries are
    kept as they are."""
    board.validate()
    with guarding(_config_file()):  # concurrent add/remove each see the others' boards
        entries = _entries()
        if board.name in entries and not replace:
            raise UsageError(f"device {board.name!r} exists: remove it first or replace it")
        entries[board.name] = asdict(board)
        _save(entries)


def remove_board(name: str) -> str:
    """Forget the board `name`, even one that no longer passes the checks; says what it was
    (`user@host:port`)."""
    with guarding(_config_file()):
        entries = _entries()
        if name not in entries:
            raise UsageError(f"no device named {name!r} (see `deploy device list`)")
        entry = entries.pop(name)
        _save(entries)
    if not isinstance(entry, dict):
        return "not a board"
    return printable(f"{entry.get('user')}@{entry.get('host')}:{entry.get('port', 22)}")
