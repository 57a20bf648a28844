"""Where deploy keeps its files: builds and provisioned runtimes in the cache root, boards and
host keys in the config directory. Environment variables move each, for tests and CI."""

from __future__ import annotations

import os
from pathlib import Path

from base.errors import UsageError


def cache_root() -> Path:
    """`$DEPLOY_CACHE_DIR`, else `$XDG_CACHE_HOME/deploy`, else `~/.cache/deploy`."""
    if os.environ.get("DEPLOY_CACHE_DIR"):
        return Path(os.environ["DEPLOY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deploy"


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/deploy`, else `~/.config/deploy`."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "deploy"


def _source(variables: tuple[str, ...]) -> str:
    """The first of `variables` set, as messages name where a directory came from."""
    return next((f"${name}" for name in variables if os.environ.get(name)), "$HOME")


def check_places() -> None:
    """The cache root and the config directory, each a directory or nothing yet (deploy creates
    it): a file or a dangling symlink there, or in a directory above, is named with the variable
    that put it there, before any work (mkdir would fail with NotADirectoryError mid-build)."""
    for directory, source in (
        (cache_root(), _source(("DEPLOY_CACHE_DIR", "XDG_CACHE_HOME"))),
        (config_dir(), _source(("XDG_CONFIG_HOME",))),
    ):
        for place in (directory, *directory.parents):
            if place.is_symlink() and not place.exists():
                raise UsageError(f"{place} (from {source}) is a dangling symlink: expected a directory")
            if place.exists():
                if not place.is_dir():
                    raise UsageError(f"{place} (from {source}) is not a directory: expected one")
                break
