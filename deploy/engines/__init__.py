"""Inference engines deploy builds plugins for (`deploy build/test --engine NAME`).

An engine is data plus one module: `Engine` says what it is called, what its plugin is and how
to build and check one; `deploy/engines/<name>.py` registers it with `register`, its C glue
beside it. The CLI looks engines up here by name and knows nothing else about them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.base.ctext import c_identifier, c_word
from deploy.base.errors import UsageError
from deploy.ops.spec import BoundOp


@dataclass(frozen=True)
class Engine:
    """An engine: its name, what its plugin is (for messages), `build` (the op's or model's
    plugin into a directory; returns lines to print) and `test` (a model run in the engine with
    its plugin against a reference, told how to say what it fetches and the board to run on,
    None for here or the emulator; returns lines to print, raises a DeployError when an output
    differs)."""

    name: str
    plugin: str
    build: Callable[..., list[str]]
    test: Callable[..., list[str]]


_ENGINES: dict[str, Engine] = {}
MODULES = ("onnxruntime", "executorch")
"""The modules under deploy/engines/ that register an engine, imported on first look-up."""


def register(engine: Engine) -> Engine:
    _ENGINES[engine.name] = engine
    return engine


def get_engine(name: str) -> Engine:
    """The engine `name`; a one-line UsageError naming the known ones otherwise."""
    if name not in MODULES:
        raise UsageError(f"--engine {name!r}: expected one of {', '.join(MODULES)}")
    importlib.import_module(f"deploy.engines.{name}")
    return _ENGINES[name]


def engine_source(name: str) -> Path:
    """A C file of the engines' glue, beside this module."""
    return Path(__file__).with_name(name)


def write_bundles(
    bounds: list[BoundOp], tag: str, target: Any, options: Any, work: Path
) -> list[tuple[str, Path]]:
    """Each op of `bounds` compiled for `target` as `options` say and written as a bundle into a
    directory of `work` named by its prefix, `<tag><i>_<op>` (an identifier deploy makes, each
    once): (prefix, directory) per op, in order. An engine's plugin links their libraries."""
    from deploy.compiler.bundle import write_bundle
    from deploy.compiler.compile import compile_op

    taken: set[str] = set()
    written = []
    for index, bound in enumerate(bounds):
        prefix = c_identifier(f"{tag}{index}_{c_word(bound.op.name, 24)}", taken)
        directory = work / prefix
        directory.mkdir()
        write_bundle(compile_op(bound, target, options), directory, prefix)
        written.append((prefix, directory))
    return written
