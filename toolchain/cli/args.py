"""Parsing the CLI's value syntax: shapes `32x64x112x112`, attributes `key=value`, .npy files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from base.errors import UsageError


def parse_shape(text: str) -> tuple[int, ...]:
    """`32x64x112x112` -> (32, 64, 112, 112); `()` or `scalar` -> ()."""
    cleaned = text.strip().lower()
    if cleaned in ("", "()", "scalar"):
        return ()
    try:
        dims = tuple(int(part) for part in cleaned.split("x"))
    except ValueError:
        raise UsageError(f"--shape {text!r}: expected dims like 32x64x112x112 (or 'scalar')") from None
    if any(d < 1 for d in dims):
        raise UsageError(f"--shape {text!r}: every dim must be >= 1")
    return dims


def parse_attrs(pairs: tuple[str, ...]) -> dict[str, str]:
    """`('kernel=3', 'stride=2')` -> {'kernel': '3', 'stride': '2'}."""
    attrs: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"-a {pair!r}: expected key=value, e.g. -a kernel=3")
        attrs[name.strip()] = value.strip()
    return attrs


def load_npy(path: str) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise UsageError(f"cannot read input {path!r} as a .npy array: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"input {path!r} holds several arrays (.npz); expected one .npy array")
    return array


def save_npy(path: str, array: np.ndarray) -> None:
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise UsageError(f"cannot write output {path!r}: directory {target.parent} does not exist")
    tmp = target.with_name(target.name + ".partial.npy")
    np.save(tmp, array)
    tmp.replace(target)
