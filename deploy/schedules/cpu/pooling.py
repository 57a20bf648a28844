"""max_pool2d on CPUs: its computation as CPUs build it (the window max and the column stage
`deploy.ops.library.pooling.max_pool_compute` takes: `pooling_on_cpus`, and
`pooling_with_llvm_maximum` for the families with a vector max) and its schedule
(`pool_window`), registered for family "cpu": every x86 target's, and with the ARM and RISC-V
families' compute (`deploy/schedules/arm.py`, `riscv.py`) theirs."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from tvm import tirx

from deploy.ops.library.pooling import Pool, WindowMax, max_pool_compute, nan_test_max
from deploy.schedules.cpu.prefetch import per_cache_line, prefetch_ahead
from deploy.schedules.cpu.vectorize import parallel_outer, partition, vectorize_parts
from deploy.schedules.loops import blocks, extent
from deploy.schedules.registry import ScheduleContext, register_schedule

COLUMNS_FIRST = "max columns first"
"""The pick of the pooling structure (`columns_first`): where windows overlap the hand schedule
maxes each window's columns in a stage per output row first (contiguous loads, no stride-2
gathers but one per output vector); a search also tries the stage per plane, and every tap at
once (the hand's where windows do not overlap)."""


def columns_first(ctx: ScheduleContext) -> bool:
    """Whether CPUs max each window's columns in a stage first: where a vector holds a row of
    pixels (NCHW) and the windows' rows overlap (kernel > stride: the stage saves taps;
    32x64x112x112 k2 s2 measured 3.45 ms with the stage, 3.41 without; a 3-D pool's D or H), not
    where channels are
    innermost (a vector holds a pixel's channels: its taps are contiguous already), unless
    `ctx.choices` picks otherwise (`COLUMNS_FIRST`)."""
    pool = Pool.from_attrs(ctx.bound.attrs)
    overlap = any(k > s for k, s in zip(pool.kernel[:-1], pool.stride[:-1], strict=True))
    by_rows = not pool.layout.channels_inner and overlap
    return ctx.choices.pick(COLUMNS_FIRST, (by_rows, not by_rows), by_rows)


def pooling_on_cpus(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d as CPUs compute it: windows maxed by the plain definition's NaN test, their
    columns first where `columns_first` says."""
    bound = ctx.bound
    return max_pool_compute(
        bound.attrs, bound.output, x, window_max=nan_test_max, columns_first=columns_first(ctx)
    )


def llvm_maximum(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values` as a chain of `llvm.maximum` (NaN propagates),
    which LLVM lowers to a vector unit's max instruction where it has one (`arm.py`, `riscv.py`)."""
    return functools.reduce(lambda a, b: tirx.call_llvm_pure_intrin(dtype, "llvm.maximum", a, b), values)


def vector_max(ctx: ScheduleContext) -> WindowMax:
    """`llvm_maximum`, but for a dtype the vector unit lacks (`ScheduleContext.scalar_dtypes`:
    float64 on armv7, where VFPv4 has no double max and LLVM cannot select `llvm.maximum` of
    doubles) the NaN test."""
    return nan_test_max if ctx.bound.output.dtype in ctx.scalar_dtypes else llvm_maximum


def pooling_with_llvm_maximum(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d as CPUs with a NaN-propagating vector max compute it (`arm.py`, `riscv.py`):
    windows maxed by `vector_max`, their columns first where `columns_first` says."""
    bound = ctx.bound
    return max_pool_compute(
        bound.attrs, bound.output, x, window_max=vector_max(ctx), columns_first=columns_first(ctx)
    )


@register_schedule("cpu", "max_pool3d", compute=pooling_on_cpus)
@register_schedule("cpu", "max_pool2d", compute=pooling_on_cpus)
def pool_window(sch: Any, ctx: ScheduleContext) -> None:
    """Pooling in the op's layout: `channels_inner_window` where a vector holds a pixel's
    channels (NHWC, NCHW4c, NCHW8c), `nchw_window` where it holds a row of pixels (NCHW, and
    max_pool3d's NCDHW, its D beside N and C)."""
    if Pool.from_attrs(ctx.bound.attrs).layout.channels_inner:
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
    NCHW8c; NHWC's as vectors unrolled: `vectorize_channels`), every tap a contiguous vector
    load of the same channels at a clamped pixel (the clamps are scalars: no gathers at all;
    the border pixels of each row are split off, so the interior's taps are plain loads, a
    row's taps one prefetch stream); output rows run in parallel, the input prefetched
    PREFETCH_BYTES ahead per pixel. A search also tries half-width vectors and the column stage
    (computed per row, vectorized alike)."""
    *stages, block = blocks(sch)
    pool = Pool.from_attrs(ctx.bound.attrs)
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


UNROLLED_CHUNKS = 16
"""Most vectors of a pixel's channels `vectorize_channels` unrolls (measured up to 16: NHWC
32x56x56x256 on x86-avx512); more stay a loop, whose loads the pixel loop does not prefetch."""


def vectorize_channels(sch: Any, loop: Any, lanes: int) -> None:
    """Vectorize `loop` (the innermost, over channels): whole when it fits `lanes` (a packed
    layout's p), else as vectors of `lanes` and a remainder, unrolled (at most UNROLLED_CHUNKS):
    a pixel's vectors are then loads of the pixel loop, which it prefetches; the build
    prefetches no loads of an inner loop. NHWC max_pool2d k3 s2 p1, interleaved, 1 / 2 threads:
    32x112x112x64 0.92 / 0.90x the time with the vectors a loop on x86-avx512, 0.90 / 0.88 on
    x86 (AVX2); 32x56x56x256 0.90 / 0.95 on x86-avx512."""
    size = extent(sch, loop) or 1
    if size <= lanes:
        sch.vectorize(loop)
        return
    chunks, _ = sch.split(loop, factors=[None, lanes])
    parts = partition(sch, chunks, 0, size // lanes)
    vectorize_parts(sch, parts)
    if -(-size // lanes) <= UNROLLED_CHUNKS:
        for part in parts:
            sch.unroll(part)


PLANE_STREAMS = 4
"""Planes an NCHW pool reads at once, each a stream (`plane_streams`). One core draws more from
memory out of several streams than out of one, even prefetched (the hardware prefetcher runs
only so far ahead of each): max_pool2d k3 s2 p1 of 32x64x112x112 on a 2-core Intel Xeon
(Emerald Rapids) VM, x86-avx512, planes 512 apart, 1 / 2 threads: one at a time 9.25 / 5.12
ms, two 8.70 / 4.55, four 8.43 / 4.46, eight 9.81 / 4.95 (against four in the same run: 9.43 /
4.53); x86 (AVX2) one 11.46 / 5.53, four 9.78 / 4.72. Neighbouring planes instead (p, p + 1)
took 10.8 / 5.5: the prefetches of one then run into the other's rows."""


def plane_streams(sch: Any, ctx: ScheduleContext, planes_loop: Any) -> int:
    """Planes of `planes_loop` an NCHW pool reads at once: PLANE_STREAMS, or the most of 2 and
    4 that divides the planes and leaves each core a step; 1 where none does or the planes are
    symbolic. A search tries every such count."""
    planes = extent(sch, planes_loop) or 0
    options = (1, *(k for k in (2, PLANE_STREAMS) if planes and planes % k == 0 and planes // k >= ctx.cores))
    return ctx.choices.pick("planes at once", options, options[-1])


def nchw_window(sch: Any, ctx: ScheduleContext) -> None:
    """NCHW pooling-style block (each output reads a window): N*C planes (N*C*D of NCDHW) in
    parallel, rows in order, vectorized along W. Keeping H out of the parallel loop avoids
    div/mod per vector.

    Each output row first maxes its window's kh input rows (kd * kh of NCDHW) at every column
    (`COLUMNS_FIRST`:
    a stage of one row, in L1), with contiguous vector loads a cache line per step, prefetching
    the input PREFETCH_BYTES ahead; the output then maxes kw columns of that row (one
    deinterleave per vector at stride 2). Its row clamps are per row, so the output splits only
    W: the border vector of each row is split off, and in the interior the taps' clamped indices
    (see `Pool.windows`) simplify to plain strided vector loads. A search also tries the stage
    per plane, half-width vectors, one loop without border splits, unrolling inside each plane,
    other prefetch distances, and every tap at once (no stage; the border rows split off too).

    With the stage per row, each step of the parallel loop takes PLANE_STREAMS planes far apart
    (`plane_streams`) and runs their rows in turn: the input is read as that many streams."""
    *stages, block = blocks(sch)
    *outer, height, width = sch.get_loops(block)
    lanes = pooling_lanes(ctx)
    borders = ctx.choices.pick("split borders", (True, False), True)
    work = ctx.bound.output.elements()
    fused = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    pool = Pool.from_attrs(ctx.bound.attrs)
    h_axis, w_axis = len(pool.kernel) - 2, len(pool.kernel) - 1  # of the window's axes
    in_h, in_w = ctx.bound.inputs[0].shape[-2:]
    per = ctx.choices.pick("column stage per", ("row", "plane"), "row") if stages else "row"
    by_row = per == "row" or fused is None
    row = height
    streams = plane_streams(sch, ctx, fused) if stages and by_row and fused is not None else 1
    if streams > 1:  # planes p, p + P/streams, ...: each a stream of its own
        together, fused = sch.split(fused, factors=[streams, None])
        sch.reorder(fused, height, together)
        row = together
    for stage in stages:
        sch.compute_at(stage, row if by_row else fused)
        depth = (fused is not None) + by_row + (streams > 1)  # the output's loops the stage sits in
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
    rows = partition(sch, height, *pool.interior(h_axis, in_h)) if borders and not stages else [height]
    if lanes > 1:
        lo, hi = pool.interior(w_axis, in_w)
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
