"""CPU scheduling shared by every CPU target: the vectorize-and-parallelize helpers and the
generic schedule an op gets when no family has a hand schedule for it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from tvm import tirx

from deploy.ops.library.pooling import Pool2d, WindowMax, columns_maxed_first, nan_test_max, windows_maxed_by
from deploy.schedules.registry import HAND, Choices, ScheduleContext, own_compute_within, register_schedule

SPATIAL, REDUCE = 0, 2
MIN_PARALLEL_WORK = 4096
"""Fewer output elements than this run on one thread: a parallel launch costs more."""


def blocks(sch: Any) -> list[Any]:
    """The top-level blocks of the function `sch` works on."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def extent(sch: Any, loop: Any) -> int | None:
    """The loop's extent; None for a symbolic one (a batch, known when the module runs)."""
    value = sch.get(loop).extent
    return int(value) if isinstance(value, tirx.IntImm) else None


def work_of(sizes: list[int | None]) -> int:
    """Iterations of loops of extents `sizes` for one batch item (a symbolic extent counts as 1):
    what deciding on threads goes by, so a batch-1 call does not pay for a launch it cannot use."""
    return math.prod(size or 1 for size in sizes)


def is_spatial(sch: Any, block: Any) -> bool:
    return all(int(iv.iter_type) == SPATIAL for iv in sch.get(block).iter_vars)


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


def generic_cpu(sch: Any, ctx: ScheduleContext) -> None:
    """Every block: injective ones vectorized + parallel, reductions parallel over outputs."""
    for block in blocks(sch):
        if is_spatial(sch, block):
            dtype = str(sch.get(block).writes[0].source.dtype)
            vectorize_parallelize(sch, block, ctx.lanes(dtype), ctx.cores, ctx.choices)
        else:
            parallelize_reduction(sch, block)


def partition(sch: Any, loop: Any, lo: int, hi: int) -> list[Any]:
    """Split `loop` (extent n) into the loops of [0, lo), [lo, hi) and [hi, n), leaving out
    empty ones."""
    size = extent(sch, loop)
    bounds = sorted({b for b in (lo, hi) if size is not None and 0 < b < size})
    if not bounds:
        return [loop]
    sizes = [b - a for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]
    return list(sch.loop_partition(loop, [*sizes, None]))


COLUMNS_FIRST = "max columns first"
"""The pick of the pooling structure (`deploy.ops.library.pooling.columns_maxed_first`): where windows overlap
the hand schedule maxes each window's columns in a stage per output row first (contiguous loads,
no stride-2 gathers but one per output vector); a search also tries the stage per plane, and
every tap at once (the hand's where windows do not overlap)."""

PREFETCH = "software_prefetch_bytes"
"""Loop annotation: prefetch, at the start of each step, this many bytes past where the step's
contiguous loads of function inputs start, one per cache line (lowered by the CPU build:
`deploy.compiler.shared_object.software_prefetch`; gathers and loads in inner loops get none)."""

PREFETCH_BYTES = 16384
"""How far ahead the hand schedule prefetches a streamed input. One thread stalls on memory while
it computes (the hardware prefetcher does not run far enough ahead): prefetching 16 KiB ahead
took the x86 pooling kernel (32x64x112x112 k3 s2 p1, one thread) from 7.9 to 3.2 ms on our
2-core EPYC VM (4 KiB: 4.1 ms, 64 KiB: 3.3 ms)."""

CACHE_LINE = 64
"""Bytes per cache line (x86-64 and the AArch64 cores we target): what one prefetch fetches."""


def per_cache_line(sch: Any, ctx: ScheduleContext, loop: Any, vector_bytes: int) -> Any:
    """`loop` (over whole vectors) split so that a step of the outer loop, returned, covers a
    cache line, its vectors unrolled (as many as divide the loop when a line's worth do not): a
    prefetch per step is then one per line, not one per vector. A search tries other counts."""
    steps = extent(sch, loop) or 1
    most = max(1, CACHE_LINE // vector_bytes)
    default = max(d for d in range(1, most + 1) if steps % d == 0)
    outer, inner = ctx.choices.split(sch, loop, default, VECTORS_PER_STEP)
    if inner is not None:
        sch.unroll(inner)
    return outer


def prefetch_ahead(sch: Any, ctx: ScheduleContext, loops: list[Any]) -> None:
    """Annotate `loops` (steps through a streamed input) to prefetch PREFETCH_BYTES ahead; a
    search also tries none, a quarter and four times as far. The loops are kept from being
    unrolled by an unroll depth of an outer loop (a search's): lowering unrolls before it
    prefetches, which would drop the annotation with the loop."""
    options = (0, PREFETCH_BYTES // 4, PREFETCH_BYTES, 4 * PREFETCH_BYTES)
    ctx.choices.annotate(sch, loops, PREFETCH, PREFETCH_BYTES, options)
    for loop in loops:
        sch.annotate(loop, "pragma_auto_unroll_max_step", 0)


@contextmanager
def pooling_structure(ctx: ScheduleContext, window_max: WindowMax = nan_test_max) -> Iterator[None]:
    """The pooling computation as CPUs build it: windows maxed by `window_max`, their columns
    first where a vector holds a row of pixels (NCHW) and the windows' rows overlap (kernel >
    stride: the stage saves taps; 32x64x112x112 k2 s2 measured 3.45 ms with the stage, 3.41
    without), every tap at once where channels are innermost (a vector holds a pixel's
    channels: its taps are contiguous already), unless `ctx.choices` picks otherwise."""
    pool = Pool2d.from_attrs(ctx.bound.attrs)
    by_rows = not pool.layout.channels_inner and pool.kernel[0] > pool.stride[0]
    staged = ctx.choices.pick(COLUMNS_FIRST, (by_rows, not by_rows), by_rows)
    with windows_maxed_by(window_max), columns_maxed_first(staged):
        yield


pooling_on_cpus = own_compute_within(pooling_structure)


def llvm_maximum(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values` as a chain of `llvm.maximum` (NaN propagates),
    which LLVM lowers to a vector unit's max instruction where it has one (`arm.py`, `riscv.py`)."""
    return functools.reduce(lambda a, b: tirx.call_llvm_pure_intrin(dtype, "llvm.maximum", a, b), values)


def vector_max(ctx: ScheduleContext) -> WindowMax:
    """`llvm_maximum`, but for a dtype the vector unit lacks (`ScheduleContext.scalar_dtypes`:
    float64 on armv7, where VFPv4 has no double max and LLVM cannot select `llvm.maximum` of
    doubles) the NaN test."""
    return nan_test_max if ctx.bound.output.dtype in ctx.scalar_dtypes else llvm_maximum


pooling_with_llvm_maximum = own_compute_within(lambda ctx: pooling_structure(ctx, vector_max(ctx)))
"""The pooling computation with windows maxed by the vector unit's max (`vector_max`)."""


@register_schedule("cpu", "max_pool2d", compute=pooling_on_cpus)
def pool_window(sch: Any, ctx: ScheduleContext) -> None:
    """Pooling in the op's layout: `channels_inner_window` where a vector holds a pixel's
    channels (NHWC, NCHW4c, NCHW8c), `nchw_window` where it holds a row of pixels (NCHW)."""
    if Pool2d.from_attrs(ctx.bound.attrs).layout.channels_inner:
        channels_inner_window(sch, ctx)
    else:
        nchw_window(sch, ctx)


def pooling_lanes(ctx: ScheduleContext) -> int:
    """Lanes per vector of a pooling schedule: the target's full width for the output dtype; a
    search also tries half (from 4 lanes up)."""
    full = ctx.lanes(ctx.bound.output.dtype)
    return ctx.choices.pick("lanes", (full, full // 2) if full >= 4 else (full,), full)


def channels_inner_window(sch: Any, ctx: ScheduleContext) -> None:
    """Pooling where channels are the innermost axis: each step is a vector of one output pixel's
    channels (a packed layout's p lanes: one NEON fp32 vector for NCHW4c, one AVX2 vector for
    NCHW8c), every tap a contiguous vector load of the same channels at a clamped pixel (the
    clamps are scalars: no gathers at all; the border pixels of each row are split off, so the
    interior's taps are plain loads, a row's taps one prefetch stream); output rows run in
    parallel, the input prefetched PREFETCH_BYTES ahead per pixel. A search also tries
    half-width vectors and the column stage (computed per row, vectorized alike)."""
    *stages, block = blocks(sch)
    pool = Pool2d.from_attrs(ctx.bound.attrs)
    h_axis, w_axis = pool.layout.spatial
    loops = sch.get_loops(block)
    rows, pixels = loops[h_axis], loops[-2]
    lanes = pooling_lanes(ctx)
    for stage in stages:
        sch.compute_at(stage, rows)
        vectorize_channels(sch, sch.get_loops(stage)[-1], lanes)
    parts = partition(sch, pixels, *pool.interior(1, ctx.bound.inputs[0].shape[w_axis]))
    for part in parts:  # the border pixels, and the interior's with plain indices
        (part_block,) = sch.get_child_blocks(part)
        vectorize_channels(sch, sch.get_loops(part_block)[-1], lanes)
    prefetch_ahead(sch, ctx, parts)
    parallel_outer(sch, loops[: h_axis + 1], ctx.bound.output.elements())


def vectorize_channels(sch: Any, loop: Any, lanes: int) -> None:
    """Vectorize `loop` (the innermost, over channels): whole when it fits `lanes` (a packed
    layout's p), else as vectors of `lanes` and a remainder."""
    size = extent(sch, loop) or 1
    if size <= lanes:
        sch.vectorize(loop)
        return
    chunks, _ = sch.split(loop, factors=[None, lanes])
    vectorize_parts(sch, partition(sch, chunks, 0, size // lanes))


def nchw_window(sch: Any, ctx: ScheduleContext) -> None:
    """NCHW pooling-style block (each output reads a window): N*C planes in parallel, rows in
    order, vectorized along W. Keeping H out of the parallel loop avoids div/mod per vector.

    Each output row first maxes its window's kh input rows at every column (`COLUMNS_FIRST`:
    a stage of one row, in L1), with contiguous vector loads a cache line per step, prefetching
    the input PREFETCH_BYTES ahead; the output then maxes kw columns of that row (one
    deinterleave per vector at stride 2). Its row clamps are per row, so the output splits only
    W: the border vector of each row is split off, and in the interior the taps' clamped indices
    (see `Pool2d.windows`) simplify to plain strided vector loads. A search also tries the stage
    per plane, half-width vectors, one loop without border splits, unrolling inside each plane,
    other prefetch distances, and every tap at once (no stage; the border rows split off too)."""
    *stages, block = blocks(sch)
    *outer, height, width = sch.get_loops(block)
    lanes = pooling_lanes(ctx)
    borders = ctx.choices.pick("split borders", (True, False), True)
    work = ctx.bound.output.elements()
    fused = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    pool = Pool2d.from_attrs(ctx.bound.attrs)
    in_h, in_w = ctx.bound.inputs[0].shape[2:]
    for stage in stages:
        per = ctx.choices.pick("column stage per", ("row", "plane"), "row")
        by_row = per == "row" or fused is None
        sch.compute_at(stage, height if by_row else fused)
        depth = (fused is not None) + by_row  # the output's loops the stage sits in
        own = sch.get_loops(stage)[depth:]
        if not own or extent(sch, own[-1]) != in_w:  # its W loop is gone: a row of one element
            continue
        steps = [own[-1]]
        if lanes > 1:
            chunks, _ = sch.split(steps[0], factors=[None, lanes])
            steps = partition(sch, chunks, 0, in_w // lanes)  # whole vectors, the rest
            whole = ctx.predicated_vectors or in_w % lanes == 0
            vectorize_parts(sch, steps if whole else steps[:1])  # a ragged rest: scalar
            vector_bytes = lanes * np.dtype(ctx.bound.inputs[0].dtype).itemsize
            steps = [per_cache_line(sch, ctx, steps[0], vector_bytes), *steps[1:]]
        prefetch_ahead(sch, ctx, steps)
    if lanes > 1:
        sch.split(width, factors=[None, lanes])
    rows = partition(sch, height, *pool.interior(0, in_h)) if borders and not stages else [height]
    if lanes > 1:
        lo, hi = pool.interior(1, in_w)
        first, last = -(-lo // lanes), hi // lanes
        ragged = not ctx.predicated_vectors and ctx.bound.output.shape[-1] % lanes != 0
        for row_loop in rows:
            row_block = sch.get_child_blocks(row_loop)[-1]
            chunk_loop = sch.get_loops(row_block)[-2]
            parts = partition(sch, chunk_loop, first, max(first, last)) if borders else [chunk_loop]
            vectorize_parts(sch, parts[:-1] if ragged else parts)  # a ragged last vector: scalar
            if not stages:
                prefetch_ahead(sch, ctx, parts)
    if fused is not None:
        ctx.choices.unroll(sch, fused, 0)
    parallel_outer(sch, [fused] if fused is not None else [], work)


def vectorize_parts(sch: Any, parts: list[Any]) -> None:
    """Vectorize the innermost loop (a vector's lanes) under each loop of `parts`, the pieces a
    loop over vectors was partitioned into."""
    for part in parts:
        (part_block,) = sch.get_child_blocks(part)
        sch.vectorize(sch.get_loops(part_block)[-1])


MIN_SPAN = 256
"""Fewest contiguous elements a task of `reduce_in_slices` reads per step of the reduction:
argmax over 1000 channels of a 7x7 plane split in two ran 1.13x slower on two threads than on
one (each thread's rows of 21-28 floats defeat the prefetcher); split in 1 it is not."""

SLICE_WORK = 16 * MIN_PARALLEL_WORK
"""Fewest input elements a slice of `argmax_slices` reads: a thread's share must outweigh its
wake-up. Argmax over the channels of 1xCx7x7 on two x86 threads: C = 2000 (two slices of 49K
elements) ran no faster than one slice (0.0124 ms), C = 4000 ran 1.8x faster (0.0122 against
0.0218 ms)."""


def contiguous_chunks(limit: int, after: list[int | None]) -> int:
    """Tasks the first of the contiguous axes `after` a reduced one splits into: the most that
    divides its extent (a ragged split puts a bounds test in the innermost loop, which then does
    not vectorize: argmax over the channels of 8x1000x56x56 in 12 chunks of 56 rows took 9.7x
    a copy on two x86 threads), at most `limit` and leaving each task MIN_SPAN elements a step
    (a symbolic extent counts as MIN_SPAN)."""
    span = math.prod(size or MIN_SPAN for size in after)
    most = max(1, min(limit, after[0] or 1, span // MIN_SPAN))
    return max(d for d in range(1, most + 1) if (after[0] or 1) % d == 0)


def argmax_slices(ctx: ScheduleContext) -> int:
    """Contiguous slices of argmax's non-innermost axis for `sliced_argmax`: one, unless the
    axes before it and a split of the axes after it (`contiguous_chunks`) give fewer tasks than
    cores: then one slice a core, each at least SLICE_WORK elements. A symbolic batch counts as
    1, so a batch-1 call uses the cores."""
    shape = ctx.bound.inputs[0].shape
    axis = ctx.bound.attrs["axis"] % len(shape)
    sizes = [size if isinstance(size, int) else None for size in shape]
    outer = work_of(sizes[:axis])
    tasks = outer * contiguous_chunks(-(-ctx.cores // outer), sizes[axis + 1 :])
    if tasks >= ctx.cores:
        return 1
    return max(1, min(ctx.cores, shape[axis], work_of(sizes) // SLICE_WORK))


def reduce_in_slices(sch: Any, ctx: ScheduleContext, axis: int, vectors: bool) -> None:
    """`sliced_argmax` over a non-innermost `axis`: a task is one slice of the axes before it
    and of a split of the first axis after it, split only as far as the axes before it leave
    cores idle (one task per core, a search also tries two and four a core; see
    `contiguous_chunks`): whole rows stream better (8x1000x56x56 on two x86 threads: 6.5 ms in
    8 tasks of whole rows, 9.5 in 16 of half rows). It walks its rows with the contiguous axes
    after them fused innermost into a running (value, position) of its own (written back at its
    end: the slices' results share cache lines). The combine of a few values per output runs
    after, on the caller. LLVM vectorizes the fused loop, except where it does not (aarch64's 2x16x8x32):
    `vectors` splits the innermost axis into vectors instead where whole — not on x86, where
    LLVM turns such a vector's select-and-store into `vmaskmovps`, microcoded on AMD (0.20
    against 0.057 ms for 2x64x56x56)."""
    partial = blocks(sch)[0]
    loops = sch.get_loops(partial)
    before, part, after, row = loops[:axis], loops[axis], loops[axis + 1 : -1], loops[-1]
    tasks = ctx.choices.pick("tasks per core", (1, 2, 4), 1)
    outer = work_of([extent(sch, loop) for loop in [*before, part]])  # the slices are tasks too
    chunks = contiguous_chunks(-(-ctx.cores * tasks // outer), [extent(sch, loop) for loop in after])
    chunk, rest = sch.split(after[0], factors=[chunks, None])
    sch.reorder(*before, part, chunk, row, rest, *after[1:])
    task = parallel_outer(sch, [*before, part, chunk], ctx.bound.inputs[0].elements())
    copies = [sch.cache_write(partial, i, "global") for i in range(len(sch.get(partial).writes))]
    for copy in copies:
        sch.reverse_compute_at(copy, task)
    inner = [rest, *after[1:]]
    lanes = ctx.lanes(str(ctx.bound.inputs[0].dtype))
    if vectors and lanes > 1 and (extent(sch, inner[-1]) or 1) % lanes == 0:
        sch.vectorize(sch.split(inner[-1], factors=[None, lanes])[1])
    elif all(extent(sch, loop) for loop in inner[1:]):
        sch.fuse(*inner)
    sch.decompose_reduction(partial, row)


STEPS_UNROLLED = 16
"""Most steps of a vector scan a search may unroll (the hand schedule unrolls none)."""


def per_output_stages(sch: Any, ctx: ScheduleContext) -> None:
    """Multi-stage reduction whose stages each hold a few values per output (e.g. argmax's
    vector partials, row max, partial first index): every stage is computed per output, inside
    the last stage's loop over outputs (in parallel); a stage over (lane, step) steps through
    the input a vector at a time, one lane each, prefetching PREFETCH_BYTES ahead (argmax over
    256x100000: 2.95 -> 2.43 ms, 1.20 -> 0.88x floor, one thread); a search also unrolls its
    steps."""
    *stages, final = blocks(sch)
    loops = sch.get_loops(final)
    spatial = loops if is_spatial(sch, final) else loops[:-1]
    outer = fused_or_unit(sch, spatial, loops[0] if loops else final)
    for stage in reversed(stages):
        sch.compute_at(stage, outer)
    vector_stages = []
    for stage in stages:
        inner = sch.get_loops(stage)[1:]
        if len(inner) == 2:
            lane, step = inner
            sch.reorder(step, lane)
            if ctx.lanes(str(ctx.bound.inputs[0].dtype)) > 1:  # else the lanes stay a loop
                sch.vectorize(lane)
            vector_stages.append((stage, step))
    parallel_if_worth(sch, outer, ctx.bound.inputs[0].elements() // 16)
    for stage, step in vector_stages:
        sch.decompose_reduction(stage, step)
        steps, unrolled = ctx.choices.split(sch, step, 1, STEPS_UNROLLED)
        if unrolled is not None:
            sch.unroll(unrolled)
        prefetch_ahead(sch, ctx, [steps])


def fused_or_unit(sch: Any, loops: list[Any], anchor: Any) -> Any:
    """`loops` fused into one, or a unit loop added above `anchor` when there are none."""
    if not loops:
        return sch.add_unit_loop(anchor)
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


CPU_LANES = 16
"""Argmax partials per output over the innermost axis: two AVX2 vectors, four NEON ones; half as
many when that divides the axis and this does not (a ragged end re-reads with gathers)."""


def argmax_cpu(ctx: ScheduleContext, x: Any) -> Any:
    """Argmax over the innermost axis as max-then-find (one vector pass, see `max_then_find`)
    when the axis is long enough; over another axis as an ordered scan in slices (see
    `sliced_argmax`, `argmax_slices`); else the op's plain reduction."""
    from deploy.ops.library.argmax import along_one_axis, max_then_find, sliced_argmax

    bound = ctx.bound
    rank = len(bound.inputs[0].shape)
    extent = bound.inputs[0].shape[-1]
    axis = bound.attrs["axis"] % rank
    if not along_one_axis(bound.attrs):
        return bound.op.compute(bound.attrs, bound.output, x)
    last = bound.attrs["select_last"]
    if axis != rank - 1:
        return sliced_argmax(x, bound.output, axis, bound.attrs["keepdims"], argmax_slices(ctx), last)
    if extent >= 2 * CPU_LANES:
        exact = [lanes for lanes in (CPU_LANES, CPU_LANES // 2) if extent % lanes == 0]
        return max_then_find(x, bound.output, exact[0] if exact else CPU_LANES, last)
    return bound.op.compute(bound.attrs, bound.output, x)


@register_schedule("cpu", "argmax", compute=argmax_cpu)
def reduce_by_axis(sch: Any, ctx: ScheduleContext, vectors: bool = False) -> None:
    """Single-input reduction over attribute `axis` (argmax): max-then-find over the innermost
    axis -> per-output stages; the channels of a layout that keeps them innermost, or an
    innermost axis too short for it -> parallel outputs, sequential scan; another axis -> slices
    (`reduce_in_slices`, in TVM's vectors where `vectors`)."""
    from deploy.ops.library.argmax import along_one_axis

    rank = len(ctx.bound.inputs[0].shape)
    axis = ctx.bound.attrs["axis"] % rank
    if along_one_axis(ctx.bound.attrs) and axis != rank - 1:
        reduce_in_slices(sch, ctx, axis, vectors)
    elif len(blocks(sch)) > 1:
        per_output_stages(sch, ctx)
    else:
        parallelize_reduction(sch, blocks(sch)[0])
