"""Files deploy owns: replacing a small one (JSON state, configs, verdicts) so that a reader sees
the old or the new content, never half of either, and concurrent writers never share a temporary;
and the sha256 that pins a file (modules, plans, wheels, runtimes)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, body: Any, mode: int = 0o644) -> None:
    """Replace `path` with `body` as indented JSON, with permission bits `mode` from the start
    (0o600 for files that name hosts or keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as stream:
            os.fchmod(stream.fileno(), mode)
            stream.write(json.dumps(body, indent=2) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at `path`, read in 1 MiB pieces."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()
