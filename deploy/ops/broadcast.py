"""Numpy broadcasting for shapes and TE index expressions, shared by elementwise ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tvm import tirx

from deploy.base.errors import UsageError
from deploy.ops.spec import Dim, is_symbolic


def broadcast_shapes(named: Sequence[tuple[str, tuple[Dim, ...]]]) -> tuple[Dim, ...]:
    """Numpy broadcast of several (name, shape); a mismatch names both shapes. A symbolic dim
    (a batch) matches itself and 1 only: whether N is 1 or 64 is known only at run time."""
    rank = max(len(shape) for _, shape in named)
    out: list[Dim] = [1] * rank
    owner = [""] * rank
    for name, shape in named:
        for axis, dim in enumerate(shape, start=rank - len(shape)):
            if same(dim, out[axis]) or is_one(dim):
                continue
            if not is_one(out[axis]):
                raise UsageError(
                    f"cannot broadcast {name} shape {list(shape)} with {owner[axis]}: dim"
                    f" {axis - (rank - len(shape))} is {dim}, expected {out[axis]} or 1"
                )
            out[axis] = dim
            owner[axis] = f"{name} shape {list(shape)}"
    return tuple(out)


def same(a: Dim, b: Dim) -> bool:
    """Equal sizes, or one symbolic batch (one Var per name: `deploy.ops.spec.symbol`)."""
    return a is b if is_symbolic(a) or is_symbolic(b) else a == b


def is_one(dim: Any) -> bool:
    """A static dim of size 1 (an int, or TVM's IntImm in a placeholder's shape)."""
    if isinstance(dim, tirx.IntImm):
        return int(dim) == 1
    return isinstance(dim, int) and dim == 1


def broadcast_index(shape: Sequence[Any], out_index: Sequence[Any]) -> tuple[Any, ...]:
    """Index into a tensor of `shape` (its te.Tensor's) for an output index of higher or equal rank."""
    tail = out_index[len(out_index) - len(shape) :]
    return tuple(0 if is_one(dim) else i for dim, i in zip(shape, tail, strict=True))
