"""Files deploy owns: replacing a small one (JSON state, configs, verdicts) so that a reader sees
the old or the new content, never half of either, and concurrent writers never share a temporary;
the sha256 that pins a file (modules, plans, wheels, runtimes); and names as parts of file names."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.base.errors import DeployError, reason


@contextmanager
def replacing(path: Path, mode: int = 0o644, through_links: bool = False) -> Iterator[Path]:
    """A fresh temporary file beside `path`, with permission bits `mode` from the start (0o600
    for files that name hosts or keys), to write inside the block: it replaces `path` in one
    rename when the block ends, and is removed if the block fails. With `through_links` (a
    user's config, which may be a link into their dotfiles), a symlink's file is replaced and
    the link stays; otherwise the link itself is (deploy's own state is never written through)."""
    given = path
    if through_links:
        path = Path(os.path.realpath(path))
    shown = f"{path} (where the link {given} points)" if through_links and given.is_symlink() else str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".deploy-", suffix=".partial", dir=path.parent)  # any name fits
    except OSError as exc:  # a read-only store a dotfiles link points into, say
        raise DeployError(f"cannot write {shown}: {exc.strerror or reason(exc)}") from None
    temporary = Path(name)
    try:
        os.fchmod(fd, mode)
        os.close(fd)
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def fresh_directory(parent: Path, prefix: str) -> Path:
    """A new empty directory in `parent` named `prefix` and 8 random hex digits, with the
    permissions the umask gives (mkdtemp's are 0700: an artifact directory made from it could be
    read by its owner alone)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


@contextmanager
def replacing_directory(place: Path) -> Iterator[Path]:
    """A fresh directory beside `place` to write a whole artifact into: when the block ends, it
    replaces `place` (what was there removed); when it raises, it is removed and `place` stays as
    it was. A reader never sees half an artifact."""
    place.parent.mkdir(parents=True, exist_ok=True)
    staging = fresh_directory(place.parent, f".{place.name}.")
    try:
        yield staging
        if place.exists():
            shutil.rmtree(place)
        os.replace(staging, place)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_entry(path: Path) -> None:
    """Remove an entry of deploy's own cache, whatever it became: a directory tree, a file, a
    symlink (only the link goes)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


def write_json_atomically(path: Path, body: Any, mode: int = 0o644, through_links: bool = False) -> None:
    """Replace `path` with `body` as indented JSON (see `replacing`)."""
    with replacing(path, mode, through_links) as temporary:
        temporary.write_text(json.dumps(body, indent=2) + "\n")


SUMS = "SHA256SUMS"
"""The file that pins the files of a directory: `SHA256  NAME` per line, as sha256sum writes it."""


def write_sums(directory: Path, names: Iterable[str]) -> Path:
    """Write `directory`'s SHA256SUMS for the files `names` (relative to it); its path."""
    sums = directory / SUMS
    sums.write_text("".join(f"{sha256_file(directory / name)}  {name}\n" for name in names))
    return sums


def read_sums(directory: Path) -> dict[str, str]:
    """NAME -> sha256 as `directory`'s SHA256SUMS lists them; {} when it is missing, a symlink or
    unreadable."""
    sums = directory / SUMS
    try:
        lines = sums.read_text().splitlines() if sums.is_file() and not sums.is_symlink() else []
    except (OSError, ValueError):
        return {}
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines) if name}


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at `path`, read in 1 MiB pieces."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def name_part(name: str, limit: int = 64) -> str:
    """`name` (a model's graph name, an op's, a schedule's label: anything a file may say) as
    part of a file name: characters other than letters, digits, `_`, `.` and `-` as `_`, at most
    `limit` of them, no leading dot; so it can neither leave its directory nor be too long."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:limit].lstrip(".") or "_"


def check_regular(path: Path) -> None:
    """An OSError when `path` is a directory or another file than a regular one (a FIFO or a
    device would block its reader forever: files deploy reads may be anything); nothing for a
    regular file or a path that names nothing (opening it says so)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists() and not path.is_file():
        raise OSError("not a regular file")


def read_regular(path: Path) -> bytes:
    """The bytes of the file `path`; an OSError when it cannot be read or is no regular file
    (`check_regular`)."""
    check_regular(path)
    return path.read_bytes()


def load_json(path: Path) -> Any:
    """The JSON value the file `path` holds (`read_regular`). An OSError when it cannot be read,
    a ValueError when it is not JSON, nested deeper than Python's recursion limit included."""
    text = read_regular(path).decode()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def check_writable(directory: Path) -> None:
    """That files can be created in `directory`, or in the nearest directory above it that exists
    (where it would be made): a probe file made there and removed. An OSError when they cannot
    (read-only, immutable, not a directory), checked before a command does its work."""
    nearest = next(path for path in (directory, *directory.parents) if path.exists() or path.is_symlink())
    if not nearest.exists():
        raise FileNotFoundError(f"{nearest} is a symbolic link to nothing")
    if not nearest.is_dir():
        raise NotADirectoryError(f"{nearest} is not a directory")
    descriptor, probe = tempfile.mkstemp(prefix=".deploy-probe.", dir=nearest)
    os.close(descriptor)
    os.unlink(probe)
