"""Numpy broadcasting for shapes and TE index expressions, shared by elementwise ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from base.errors import UsageError


def broadcast_shapes(named: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """Numpy broadcast of several (name, shape); a mismatch names both shapes."""
    rank = max(len(shape) for _, shape in named)
    out = [1] * rank
    owner = [""] * rank
    for name, shape in named:
        for axis, dim in enumerate(shape, start=rank - len(shape)):
            if dim == out[axis] or dim == 1:
                continue
            if out[axis] != 1:
                raise UsageError(
                    f"cannot broadcast {name} shape {list(shape)} with {owner[axis]}: dim"
                    f" {axis - (rank - len(shape))} is {dim}, expected {out[axis]} or 1"
                )
            out[axis] = dim
            owner[axis] = f"{name} shape {list(shape)}"
    return tuple(out)


def broadcast_index(shape: tuple[int, ...], out_index: Sequence[Any]) -> tuple[Any, ...]:
    """Index into a tensor of `shape` for an output index of higher or equal rank."""
    tail = out_index[len(out_index) - len(shape) :]
    return tuple(0 if dim == 1 else i for dim, i in zip(shape, tail, strict=True))
