"""The loops of a schedule's function as every family reads them: its blocks, a loop's extent
(None when symbolic), whether a block is spatial, the work a loop nest does, and a loop made of
several (or of none)."""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

SPATIAL = 0
"""`IterVar.iter_type` of a data-parallel block iterator (TVM's kDataPar)."""

REDUCE = 2
"""`IterVar.iter_type` of a reduction's block iterator (TVM's kCommReduce)."""


def blocks(sch: Any) -> list[Any]:
    """The top-level blocks of the function `sch` works on."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def extent(sch: Any, loop: Any) -> int | None:
    """The loop's extent; None for a symbolic one (a batch, known when the module runs)."""
    return static(sch.get(loop).extent)


def static(value: Any) -> int | None:
    """An extent's or a dim's value where it is a constant; None for a symbolic one."""
    return int(value) if isinstance(value, tirx.IntImm) else None


def work_of(sizes: list[int | None]) -> int:
    """Iterations of loops of extents `sizes` for one batch item (a symbolic extent counts as 1):
    what deciding on threads goes by, so a batch-1 call does not pay for a launch it cannot use."""
    return math.prod(size or 1 for size in sizes)


def is_spatial(sch: Any, block: Any) -> bool:
    return all(int(iv.iter_type) == SPATIAL for iv in sch.get(block).iter_vars)


def fused_or_unit(sch: Any, loops: list[Any], anchor: Any) -> Any:
    """`loops` fused into one, or a unit loop added above `anchor` when there are none."""
    if not loops:
        return sch.add_unit_loop(anchor)
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def mentions(expr: Any, var: Any) -> bool:
    """`var` occurs in `expr`."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))
