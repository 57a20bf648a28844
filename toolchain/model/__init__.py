"""Model files -> `ops.graph.Graph`: a reader per file suffix (`READERS`).

`.onnx` is an ONNX model (`onnx_import.py`); `.yaml`, `.yml` and `.json` are our graph file
(`graph_file.py`). Ops a model names must be registered first (built-in ones load themselves;
user ops come from `--ops-path`). The Graph is unchecked: `ops.graph.bind_graph` binds it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from base.errors import UsageError, reason
from base.files import read_regular
from ops.graph import Graph
from toolchain.model.graph_file import read_json, read_yaml
from toolchain.model.onnx_import import read_onnx

Reader = Callable[[Path, bytes], Graph]
"""(the file's path, for messages and the default name; its bytes) -> its Graph."""

READERS: dict[str, Reader] = {
    ".onnx": read_onnx,
    ".yaml": read_yaml,
    ".yml": read_yaml,
    ".json": read_json,
}
"""Readers by file suffix (lower case)."""


def load_model(path: str | Path) -> Graph:
    """The Graph of the model file at `path`, chosen by its suffix; bad files are one line."""
    path = Path(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise UsageError(
            f"model {path}: unknown model file type {path.suffix or '(no suffix)'!r}"
            f" (known: {', '.join(READERS)})"
        )
    try:
        data = read_regular(path)
    except OSError as exc:
        raise UsageError(f"model {path}: cannot read it: {exc.strerror or reason(exc)}") from None
    return reader(path, data)


__all__ = ["READERS", "Reader", "load_model"]
