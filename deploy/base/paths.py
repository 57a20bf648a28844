"""Where deploy keeps its files: builds and provisioned runtimes in the cache root, boards and
host keys in the config directory, the emulator's server state in its own directory (in the
cache root unless moved). Environment variables move each, for tests and CI."""

from __future__ import annotations

import os
from pathlib import Path

from deploy.base.errors import UsageError, reason
from deploy.base.files import check_writable


def _own(variable: str) -> Path | None:
    """The directory deploy's own `$variable` names, `~` expanded (a quoted `"~/c"`, a Dockerfile's
    ENV: no shell expanded it) and made absolute (servers deploy starts run elsewhere); None
    when unset or empty."""
    value = os.environ.get(variable)
    return Path(os.path.expanduser(value)).absolute() if value else None


def _place(own: str | None, xdg: str, under_home: str) -> tuple[Path, str]:
    """`$own`, else `$xdg/deploy`, else `~/under_home/deploy`; and the variable that decided, as
    messages name it. A relative `$xdg` is ignored, as the XDG Base Directory spec says."""
    mine = _own(own) if own else None
    if mine is not None:
        return mine, f"${own}"
    if os.path.isabs(os.environ.get(xdg, "")):
        return Path(os.environ[xdg]) / "deploy", f"${xdg}"
    return Path.home() / under_home / "deploy", "$HOME"


def _cache_place() -> tuple[Path, str]:
    return _place("DEPLOY_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def _config_place() -> tuple[Path, str]:
    return _place(None, "XDG_CONFIG_HOME", ".config")


def _emulator_place() -> tuple[Path, str]:
    mine = _own("DEPLOY_EMULATOR_DIR")
    if mine is not None:
        return mine, "$DEPLOY_EMULATOR_DIR"
    root, source = _cache_place()
    return root / "emulator", source


def cache_root() -> Path:
    """`$DEPLOY_CACHE_DIR`, else `$XDG_CACHE_HOME/deploy`, else `~/.cache/deploy`."""
    return _cache_place()[0]


def check_cache_writable(directory: Path) -> None:
    """A one-line UsageError when `directory`, in the cache root, cannot be written (a read-only
    mount, no permission), naming it, the variable that put it there and why: what an OSError
    writing there meant. Asked after one: a cache that cannot be written still serves what it
    holds."""
    try:
        check_writable(directory)
    except OSError as exc:
        source = _cache_place()[1]
        said = exc.strerror or reason(exc)
        raise UsageError(f"the cache {directory} (from {source}) is not writable: {said}") from None


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/deploy`, else `~/.config/deploy`."""
    return _config_place()[0]


def emulator_dir() -> Path:
    """`$DEPLOY_EMULATOR_DIR`, else `emulator/` in the cache root: the emulator's state file."""
    return _emulator_place()[0]


def check_places() -> None:
    """The cache root, the config directory and the emulator's directory, each a directory or
    nothing yet (deploy creates it): a file or a dangling symlink there, or in a directory above,
    is named with the variable that put it there, before any work (mkdir would fail with
    NotADirectoryError mid-build). What cannot be looked at (no home directory, no permission)
    is left to the command that needs the directory."""
    for place in (_cache_place, _config_place, _emulator_place):
        try:
            directory, source = place()
            for step in (directory, *directory.parents):
                if step.is_symlink() and not step.exists():
                    raise UsageError(f"{step} (from {source}) is a dangling symlink: expected a directory")
                if step.exists():
                    if not step.is_dir():
                        raise UsageError(f"{step} (from {source}) is not a directory: expected one")
                    break
        except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
            continue
