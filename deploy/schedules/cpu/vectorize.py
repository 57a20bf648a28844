"""Vectors and threads, the helpers every CPU schedule builds with: injective blocks vectorized
along their innermost loops and parallel outside them, reductions parallel over their outputs,
loops partitioned into whole vectors and a rest."""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

from deploy.schedules.loops import SPATIAL, extent, work_of
from deploy.schedules.registry import HAND, Choices

MIN_PARALLEL_WORK = 4096
"""Fewer output elements than this run on one thread: a parallel launch costs more."""


def parallel_outer(sch: Any, loops: list[Any], work: int) -> Any | None:
    """Fuse `loops` and mark them parallel when `work` elements justify threads; the fused loop."""
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    parallel_if_worth(sch, fused, work)
    return fused


def parallel_if_worth(sch: Any, loop: Any, work: int) -> None:
    """Mark `loop` parallel when `work` elements justify threads and it may have more than one
    step (a symbolic extent may)."""
    steps = extent(sch, loop)
    if work >= MIN_PARALLEL_WORK and (steps is None or steps > 1):
        sch.parallel(loop)


VECTORS_PER_STEP = 8
"""Most vectors one step of a vectorized loop may do (unrolled) in a search; the hand does one."""


def vectorize_parallelize(sch: Any, block: Any, lanes: int, cores: int, choices: Choices = HAND) -> None:
    """Injective block: vectors along its innermost loops, the loops outside them in parallel.

    The trailing loops inside the batch are fused until their extent is whole vectors, as far as
    the inputs are read along them (`read_along`): 1x116x28x28's rows of 28 floats make 784-float
    planes, 98 vectors of 8 on AVX2, where a split of each row ended in a predicated vector that
    LLVM does not vectorize (hard_sigmoid 0.053 against 0.0062 ms; x86, 2 threads). Where no fusing
    makes whole vectors the vectors stop at the last whole one and the rest of the row runs
    scalar. The loops outside the fused rows run in parallel, a row's vectors a loop inside, when
    they give each of `cores` a row: channel_shuffle's vectors of 1x116x28x28 in one parallel
    loop computed a channel's address per vector (0.0156 ms, 1.7x numpy's time). A search also
    tries fusing every row (an input read out of order, channel_shuffle's channels, is then
    gathered), and several vectors per step. A loop of symbolic extent (a batch) stays outside the
    vectors: a vector needs a static extent.
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    sizes = [extent(sch, loop) for loop in loops]
    work = work_of(sizes)
    batch = max((i + 1 for i, size in enumerate(sizes) if size is None), default=0)
    rows = loops[batch:]
    count = rows_to_fuse(sch, block, [size or 1 for size in sizes[batch:]], lanes) if rows else 0
    if choices.pick("fuse rows", (False, True), False):
        count = len(rows)
    if count > 1:
        loops = [*loops[: len(loops) - count], sch.fuse(*rows[-count:])]
        sizes = [*sizes[: len(sizes) - count], work_of(sizes[-count:])]
    inner, size = loops[-1], sizes[-1]
    if lanes > 1 and size is not None and size > lanes and size % lanes:
        vectors_then_rest(sch, loops[:-1], inner, size - size % lanes, lanes, work)
        return
    if lanes > 1 and size is not None and size > 1:
        outer, inner = sch.split(inner, factors=[None, lanes])
        sch.vectorize(inner)
        if loops[:-1] and math.prod(outside or cores for outside in sizes[:-1]) >= cores:
            parallel_outer(sch, loops[:-1], work)  # whole rows a task: their addresses once a row
            outer, step = choices.split(sch, outer, 1, VECTORS_PER_STEP)
            if step is not None:
                sch.unroll(step)
            return
        loops = [*loops[:-1], outer]
    else:
        loops = loops[:-1]
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    fused, step = choices.split(sch, fused, 1, VECTORS_PER_STEP)
    if step is not None:
        sch.unroll(step)
    parallel_if_worth(sch, fused, work)


def rows_to_fuse(sch: Any, block: Any, sizes: list[int], lanes: int) -> int:
    """How many of the trailing loops (extents `sizes`) the hand fuses: the fewest whose extents
    make whole vectors of `lanes`, among those every input is read along (`read_along`); all of
    those when none make whole vectors; every loop when those hold less than a vector (the
    vectors then gather across rows: a layout transform's 4 lanes of a packed channel)."""
    stmt = sch.get(block)
    variables = [iv.var for iv in stmt.iter_vars][-len(sizes) :] if sizes else []
    most = 1
    while most < len(sizes) and all(read_along(r, variables[-most - 1 :]) for r in stmt.reads):
        most += 1
    for count in range(1, most + 1):
        if math.prod(sizes[-count:]) % lanes == 0:
            return count
    return most if math.prod(sizes[-most:]) >= lanes else len(sizes)


def read_along(read: Any, variables: list[Any]) -> bool:
    """Whether a block's read of a tensor goes along `variables` (the block's trailing ones, in
    order), so that fusing their loops leaves its elements contiguous: its trailing indices are
    those variables and no other index uses them; or no index uses them (a value broadcast over
    the fused loop)."""
    starts = [r.min for r in read.region]

    def uses(index: Any) -> bool:
        return any(any(v.same_as(u) for u in variables) for v in tirx.analysis.undefined_vars(index))

    if not any(uses(index) for index in starts):
        return True
    tail, head = starts[len(starts) - len(variables) :], starts[: len(starts) - len(variables)]
    return (
        len(starts) >= len(variables)
        and all(index.same_as(v) for index, v in zip(tail, variables, strict=True))
        and not any(uses(index) for index in head)
    )


def vectors_then_rest(sch: Any, outside: list[Any], row: Any, whole: int, lanes: int, work: int) -> None:
    """`row` (the innermost loop) as vectors of `lanes` up to `whole` (a multiple of lanes) and
    scalar after; the loops `outside` it in parallel, or the vectors when there are none."""
    vectors, _ = partition(sch, row, whole, whole)
    outer, inner = sch.split(vectors, factors=[None, lanes])
    sch.vectorize(inner)
    if outside:
        parallel_outer(sch, outside, work)
    elif extent(sch, outer) is not None:
        parallel_if_worth(sch, outer, work)


def parallelize_reduction(sch: Any, block: Any) -> None:
    """Reduction block: parallelize its spatial loops (outermost, as TE orders them)."""
    loops = sch.get_loops(block)
    spatial = [
        loop for loop, iv in zip(loops, sch.get(block).iter_vars, strict=True) if int(iv.iter_type) == SPATIAL
    ]
    parallel_outer(sch, spatial, work_of([extent(sch, loop) for loop in loops]))


def partition(sch: Any, loop: Any, lo: int, hi: int) -> list[Any]:
    """Split `loop` (extent n) into the loops of [0, lo), [lo, hi) and [hi, n), leaving out
    empty ones."""
    size = extent(sch, loop)
    bounds = sorted({b for b in (lo, hi) if size is not None and 0 < b < size})
    if not bounds:
        return [loop]
    sizes = [b - a for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]
    return list(sch.loop_partition(loop, [*sizes, None]))


def vectorize_parts(sch: Any, parts: list[Any]) -> None:
    """Vectorize the innermost loop (a vector's lanes) under each loop of `parts`, the pieces a
    loop over vectors was partitioned into."""
    for part in parts:
        (part_block,) = sch.get_child_blocks(part)
        sch.vectorize(sch.get_loops(part_block)[-1])
