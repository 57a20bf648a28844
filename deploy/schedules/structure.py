"""What a PrimFunc's blocks compute, read from their iteration variables and the indices of
their reads, not from an op's name: the structure a CPU default schedule is chosen by
(`deploy.schedules.cpu.generic`). Our own reading of what MetaSchedule's rules and TVM's dlight
test (`normalize_prim_func`'s S/R kinds, `is_reduction`, `detect_dominant_read`).

- elementwise: no reduction variable (maps, broadcasts, padding, a permutation that keeps the
  innermost axis such as attention's head split).
- data movement: an elementwise function whose costliest block has a transposing read: its
  innermost index is an outer variable of the output while the output's innermost variable
  indexes it further out (x[i, j] for out[j, i]; NCHW to NHWC). A block of it is still
  elementwise to the other rules (inlined into its consumer like any map).
- dot product: two reads use the reduction variables and each uses a spatial variable the
  other does not (matmul's a[m, k] and b[k, n]; batched matmul, a 1x1 convolution).
- window: an index of a read adds a spatial and a reduction variable (a convolution's y + i).
- row reduction: the innermost index of the dominant read (the largest read that uses the
  reduction variables) is a reduction variable: contiguous along the reduction (softmax's max
  and sum, a norm's moments).
- outer reduction: another reduction, contiguous along a spatial variable (a mean over
  channels).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Any

from tvm import tirx

SPATIAL, REDUCE = 0, 2


class Structure(enum.Enum):
    ELEMENTWISE = "elementwise"
    DATA_MOVEMENT = "data movement"
    ROW_REDUCTION = "row reduction"
    OUTER_REDUCTION = "outer reduction"
    DOT = "dot product"
    WINDOW = "window"


RANK = {
    Structure.ELEMENTWISE: 0,
    Structure.DATA_MOVEMENT: 0,
    Structure.OUTER_REDUCTION: 1,
    Structure.ROW_REDUCTION: 2,
    Structure.WINDOW: 3,
    Structure.DOT: 4,
}
"""Which block's structure a function's schedule follows when they differ: the costliest kind."""


@dataclass(frozen=True)
class BlockInfo:
    """One top-level block: its handle in the schedule, name and structure, its spatial and
    reduction variables, the iterations of one instance (the product of its extents), and the
    position in `spatial` a transposing read is contiguous along (`transposed_along`), if any."""

    block: Any
    name: str
    structure: Structure
    spatial: tuple[Any, ...]
    reduce: tuple[Any, ...]
    work: int
    along: int | None = None


def _uses(expr: Any, variables: tuple[Any, ...]) -> set[int]:
    """Positions in `variables` of those `expr` uses."""
    used = tirx.analysis.undefined_vars(expr)
    return {i for i, v in enumerate(variables) if any(v.same_as(u) for u in used)}


def loads(node: Any) -> list[Any]:
    """Each load in a TIR statement or expression (a block's or a function's body), in order: a
    buffer read at two places, or twice at one, is read by two of them."""
    import tvm
    import tvm_ffi

    found: list[Any] = []

    def note(load: Any) -> Any:
        found.append(load)
        return load

    tvm_ffi.structural_map(node, [(tvm.ir.TensorLoad, note)])
    return found


def _extent(value: Any) -> int:
    return int(value) if isinstance(value, tirx.IntImm) else 1


def classify(stmt: Any) -> tuple[Structure, tuple[Any, ...], tuple[Any, ...]]:
    """(structure, spatial variables, reduction variables) of a block statement."""
    spatial = tuple(iv.var for iv in stmt.iter_vars if int(iv.iter_type) == SPATIAL)
    reduce = tuple(iv.var for iv in stmt.iter_vars if int(iv.iter_type) == REDUCE)
    if not reduce:
        return Structure.ELEMENTWISE, spatial, reduce
    reads = [[r.min for r in read.region] for read in stmt.reads]
    reducing = [index for index in reads if any(_uses(i, reduce) for i in index)]
    for index in reducing:
        if any(_uses(i, reduce) and _uses(i, spatial) for i in index):
            return Structure.WINDOW, spatial, reduce
    owned = [set().union(*(_uses(i, spatial) for i in index)) for index in reducing]
    for a, mine in enumerate(owned):
        if any(mine - theirs and theirs - mine for b, theirs in enumerate(owned) if b != a):
            return Structure.DOT, spatial, reduce
    dominant = max(reducing, key=len, default=[])
    if dominant and any(dominant[-1].same_as(v) for v in reduce):
        return Structure.ROW_REDUCTION, spatial, reduce
    return Structure.OUTER_REDUCTION, spatial, reduce


def dot_axes(stmt: Any) -> tuple[list[int], list[int], list[int]]:
    """Positions among a dot product's spatial variables of its (batch, m, n) axes: n the
    variables only the operand read along them uses (its innermost index one of them: b's n in
    a[m, k] @ b[k, n], a 1x1 convolution's pixels) after its reduction variables, m the other
    operand's own, batch the rest (a 1x1 convolution's image in x[image, ci, y, x]: joined to
    the pixels, a tile's vectors straddled images, 2.6x onnxruntime's time at 2 images).
    Where neither operand is read along its own variable (a @ b transposed) the last variable is
    n and the one before m."""
    _, spatial, reduce = classify(stmt)
    reads = [[r.min for r in read.region] for read in stmt.reads]
    reducing = [index for index in reads if any(_uses(i, reduce) for i in index)]
    if len(reducing) == 2:
        owned = [set().union(*(_uses(i, spatial) for i in index)) for index in reducing]
        for side in (1, 0):
            mine, theirs = owned[side] - owned[1 - side], owned[1 - side] - owned[side]
            innermost = _uses(reducing[side][-1], spatial) if reducing[side] else set()
            if innermost and innermost <= mine:
                index = reducing[side]
                summed = min(p for p, i in enumerate(index) if _uses(i, reduce))
                apart = mine & set().union(*(_uses(i, spatial) for i in index[:summed]))
                apart -= set().union(*(_uses(i, spatial) for i in index[summed:]))  # b[n // 8, k, n % 8]
                batch = [i for i in range(len(spatial)) if i not in (mine - apart) | theirs]
                return batch, sorted(theirs), sorted(mine - apart)
    last = len(spatial) - 1
    return list(range(last - 1)), [last - 1], [last]


def transposed_read(stmt: Any) -> tuple[int, int] | None:
    """Where no operand of a dot product's block is read along an output axis (its innermost
    index uses no spatial variable: a Linear layer's weight as PyTorch keeps it, a[m, k] @ b[n,
    k]; attention's q @ k^T), so that `dot_axes` takes the last spatial variable as n: the
    position among the reads of the one read at n with a reduction variable last, and the
    position of n among its indices. None where no read is so."""
    _, spatial, reduce = classify(stmt)
    reads = [[r.min for r in read.region] for read in stmt.reads]
    reducing = [p for p, index in enumerate(reads) if any(_uses(i, reduce) for i in index)]
    if not spatial or any(_uses(reads[p][-1], spatial) for p in reducing):
        return None
    for position in reducing:
        index = reads[position]
        at_n = [p for p, i in enumerate(index[:-1]) if i.same_as(spatial[-1])]
        if at_n and any(index[-1].same_as(v) for v in reduce):
            return position, at_n[0]
    return None


def channel_sum(stmt: Any) -> tuple[set[int], int | None]:
    """A window's reduction variables that are not taps of its window (no read index adds them
    to one of the two innermost spatial variables, the output's row and column: a grouped
    convolution's input channels), by position; and, when there are some, the position of the
    innermost outer spatial variable the other operand uses (the output channel, whose
    neighbours read the same input and can share its loads)."""
    _, spatial, reduce = classify(stmt)
    reads = [[r.min for r in read.region] for read in stmt.reads]
    taps = set().union(*(_uses(i, reduce) for index in reads for i in index if _uses(i, spatial[-2:])))
    sums = set(range(len(reduce))) - taps
    operands = [
        index
        for index in reads
        if any(_uses(i, reduce) for i in index) and not any(_uses(i, spatial[-2:]) for i in index)
    ]
    channels = set().union(*(_uses(i, spatial[:-2]) for index in operands for i in index))
    return sums, max(channels) if sums and channels else None


def transposed_along(stmt: Any, spatial: tuple[Any, ...]) -> int | None:
    """The position in `spatial` of the variable an elementwise block's transposing read is
    contiguous along (its innermost index), where the output's innermost variable indexes that
    read further out; None when no read transposes (a map, a broadcast b[i] of out[i, j])."""
    if not spatial:
        return None
    inner = len(spatial) - 1
    for read in stmt.reads:
        index = [r.min for r in read.region]
        last = _uses(index[-1], spatial) if index else set()
        if len(last) == 1 and inner not in last and any(inner in _uses(i, spatial) for i in index[:-1]):
            return next(iter(last))
    return None


def block_infos(sch: Any) -> list[BlockInfo]:
    """The top-level blocks of the function `sch` works on, in order, classified."""
    infos = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        structure, spatial, reduce = classify(stmt)
        work = math.prod(_extent(iv.dom.extent) for iv in stmt.iter_vars)
        along = transposed_along(stmt, spatial) if structure is Structure.ELEMENTWISE else None
        infos.append(BlockInfo(block, stmt.name_hint, structure, spatial, reduce, work, along))
    return infos


def anchor(infos: list[BlockInfo]) -> BlockInfo:
    """The block whose structure the function's schedule follows: the costliest kind, the most
    work among those; an elementwise one with a transposing read as data movement."""
    top = max(infos, key=lambda info: (RANK[info.structure], info.work))
    if top.structure is Structure.ELEMENTWISE and top.along is not None:
        return replace(top, structure=Structure.DATA_MOVEMENT)
    return top
