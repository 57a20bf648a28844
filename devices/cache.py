"""Where deploy keeps what it builds and provisions: `$DEPLOY_CACHE_DIR`, else
`$XDG_CACHE_HOME/deploy`, else `~/.cache/deploy`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("DEPLOY_CACHE_DIR"):
        return Path(os.environ["DEPLOY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deploy"
