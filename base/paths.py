"""Where deploy keeps its files: builds and provisioned runtimes in the cache root, boards and
host keys in the config directory. Environment variables move each, for tests and CI."""

from __future__ import annotations

import os
from pathlib import Path


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
