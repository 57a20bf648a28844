"""Model files -> `deploy.ops.graph.Graph`: a reader per file suffix (`READERS`).

`.onnx` is an ONNX model (`onnx_import.py`); `.yaml`, `.yml` and `.json` are our graph file
(`graph_file.py`). Ops a model names must be registered first (built-in ones load themselves;
user ops come from `--ops-path`). The Graph is unchecked: `deploy.ops.graph.bind_graph` binds it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from deploy.base.errors import UsageError, reason
from deploy.base.files import read_regular
from deploy.model.graph_file import read_json, read_yaml
from deploy.model.onnx_import import read_onnx
from deploy.ops.graph import Graph

Reader = Callable[[Path, bytes], Graph]
"""(the file's path, for messages and the default name; its bytes) -> its Graph."""


class Format(NamedTuple):
    """A model file format: its reader, and the most bytes a file of it may hold (checked before
    it is read: a 1 GB sparse file took 2.5 GB of memory to be refused)."""

    read: Reader
    most_bytes: int
    what: str


GRAPH_FILE = Format(read_yaml, 16 * 2**20, "a graph file")
"""A YAML graph of 100,000 nodes is about 10 MB."""
ONNX = Format(read_onnx, 2**31 - 1, "an ONNX model")
"""Protobuf's limit: larger models keep their weights in external data, which is not read."""

READERS: dict[str, Format] = {
    ".onnx": ONNX,
    ".yaml": GRAPH_FILE,
    ".yml": GRAPH_FILE,
    ".json": GRAPH_FILE._replace(read=read_json),
}
"""Formats by file suffix (lower case)."""


def load_model(path: str | Path) -> Graph:
    """The Graph of the model file at `path`, chosen by its suffix; bad files are one line."""
    path = Path(path)
    found = READERS.get(path.suffix.lower())
    if found is None:
        raise UsageError(
            f"model {path}: unknown model file type {path.suffix or '(no suffix)'!r}"
            f" (known: {', '.join(READERS)})"
        )
    return found.read(path, model_bytes(path, found))


def model_bytes(path: Path, found: Format) -> bytes:
    """The bytes of the model file at `path`, of format `found`: a regular file (no FIFO, no
    device), at most as large as the format may be; a one-line UsageError otherwise."""
    try:
        size = path.stat().st_size if path.is_file() else 0
        if size > found.most_bytes:
            raise UsageError(
                f"model {path}: {size} bytes, more than {found.what} may hold ({found.most_bytes} bytes)"
            )
        return read_regular(path)
    except OSError as exc:
        raise UsageError(f"model {path}: cannot read it: {exc.strerror or reason(exc)}") from None


__all__ = ["READERS", "Format", "Reader", "load_model", "model_bytes"]
