"""max_pool2d on CPUs: its computation as CPUs build it (the window max and the column stage
`deploy.ops.library.pooling.max_pool_compute` takes: `pooling_on_cpus`, and
`pooling_with_llvm_maximum` for the families with a vector max) and its schedule
(`pool_window`), registered for family "cpu": every x86 target's, and with the ARM and RISC-V
families' compute (`deploy/schedules/arm.py`, `riscv.py`) theirs."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from tvm import tirx

from deploy.ops.library.pooling import Pool, WindowMax, max_pool_compute, nan_test_max
from deploy.ops.spec import is_symbolic
from deploy.schedules.cpu.prefetch import CACHE_LINE, per_cache_line, prefetch_ahead
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
took 10.8 / 5.5: the prefetches of one then run into the other's rows. On a 2-core AMD EPYC
(Zen 3) VM, x86, the other way round: one plane at a time took 0.78-0.82 / 0.92 of four's time
(0.71-0.85 / 0.78 without the near prefetches too), two 1.06: its default there
(`deploy.schedules.cpu_models.ZEN3`; docs/performance.md)."""


def plane_streams(ctx: ScheduleContext, planes: int | None) -> int:
    """Of its `planes` (None: symbolic), the planes an NCHW pool reads at once: PLANE_STREAMS (the
    device's CPU model's count where it has one, `ScheduleContext.cpu_model`), or the most of 2
    and 4 up to it that divides the planes and leaves each core a step; 1 where none does or the
    planes are symbolic. A search tries every such count."""
    options = (1, *(k for k in (2, PLANE_STREAMS) if planes and planes % k == 0 and planes // k >= ctx.cores))
    most = ctx.cpu_model.plane_streams if ctx.cpu_model else PLANE_STREAMS
    return ctx.choices.pick("planes at once", options, max(k for k in options if k <= most))


MOST_ROWS_PER_LINE = 4
"""Most output rows `rows_per_line` groups (a row of 56 floats needs 2, of 60 floats 4)."""


def rows_per_line(ctx: ScheduleContext, streams: int) -> int:
    """Output rows an NCHW pool reading `streams` planes at once writes together: the fewest
    whose bytes are whole cache lines (2 rows of 56 floats: 7 lines), where its output is
    written with streaming stores (`ScheduleContext.streaming_store_bytes`), a row is not whole
    lines itself, the rows divide into such groups (at most MOST_ROWS_PER_LINE) and the batch
    into the streams (each stream's planes whole images: TVM can follow their indices); else 1.

    A streaming store fills a line in a write-combining buffer, which holds it until the line is
    whole; a row ending mid-line leaves its last line there until the plane's next row, after
    the other planes' rows. In C, the pool's loop (four planes, 16 KiB and 1 KiB prefetches, 21
    interleaved rounds against the floor's fold, 1 / 2 threads): rows stored as computed 1.33 /
    1.38x the fold, two rows at a time as whole lines 1.21 / 1.18x, no output at all 1.02 / 1.01.
    A search also tries 1."""
    out = ctx.bound.output
    batch, *_, rows, width = out.shape
    if streams == 1 or ctx.fused or ctx.streaming_store_bytes is None:
        return 1
    if is_symbolic(batch) or batch % streams:  # a stream's planes whole images: affine regions
        return 1
    if out.nbytes() < ctx.streaming_store_bytes:
        return 1
    row_bytes = width * np.dtype(out.dtype).itemsize
    lines = CACHE_LINE // math.gcd(row_bytes, CACHE_LINE)
    if lines == 1 or lines > MOST_ROWS_PER_LINE or rows % lines:
        return 1
    return ctx.choices.pick("output rows at once", (lines, 1), lines)


def rows_in_whole_lines(
    sch: Any, ctx: ScheduleContext, block: Any, streams: int, lines: int, lanes: int
) -> tuple[Any, Any, Any, Any]:
    """Restructure the NCHW pool's output `block` (its loops not yet touched) to read `streams`
    planes far apart at once and write its rows `lines` at a time: the block computes into a
    buffer indexed (stream, plane of the stream, row, column), and a copy writes each group of
    `lines` rows of the `streams` planes out as whole lines, `lanes` a vector. The buffer's own
    axes keep TVM's regions exact (the planes P/streams apart would otherwise be bounded by
    every plane between them). Returns the block's loops: planes of a stream (parallel),
    rows of a group, streams, columns."""
    *planes_shape, _, _ = ctx.bound.output.shape
    group = math.prod(planes_shape) // streams

    def index(*axes: Any) -> tuple[Any, ...]:
        dims = zip(axes[1:-2], planes_shape[1:], strict=True)
        plane = functools.reduce(lambda flat, dim: flat * dim[1] + dim[0], dims, axes[0])
        return (plane // group, plane % group, axes[-2], axes[-1])

    dtype = str(sch.get(block).iter_vars[0].var.ty)  # the block's index type
    mapping = tirx.IndexMap.from_func(index, ndim=len(planes_shape) + 2, index_dtype=dtype)
    copy = sch.cache_write(block, 0, "global")
    sch.transform_block_layout(copy, mapping)
    sch.transform_block_layout(block, mapping)
    sch.transform_layout(block, ("write", 0), mapping)
    stream, plane, height, width = sch.get_loops(copy)
    rows, row = sch.split(height, factors=[None, lines])
    sch.reorder(plane, rows, stream, row, width)
    sch.compute_at(block, rows)
    if lanes > 1:
        sch.vectorize(sch.split(sch.fuse(row, width), factors=[None, lanes])[1])
    block_stream, block_row, block_width = sch.get_loops(block)[2:]
    sch.reorder(block_row, block_stream)
    return plane, block_row, block_stream, block_width


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
    (`plane_streams`) and runs their rows in turn: the input is read as that many streams. Where
    the output is streamed and its rows end mid-line, they go out a few at a time as whole
    lines (`rows_per_line`, `rows_in_whole_lines`)."""
    *stages, block = blocks(sch)
    *outer, height, width = sch.get_loops(block)
    lanes = pooling_lanes(ctx)
    borders = ctx.choices.pick("split borders", (True, False), True)
    work = ctx.bound.output.elements()
    pool = Pool.from_attrs(ctx.bound.attrs)
    h_axis, w_axis = len(pool.kernel) - 2, len(pool.kernel) - 1  # of the window's axes
    in_h, in_w = ctx.bound.inputs[0].shape[-2:]
    per = ctx.choices.pick("column stage per", ("row", "plane"), "row") if stages else "row"
    by_row = per == "row" or not outer
    planes_shape = ctx.bound.output.shape[:-2]
    planes = None if any(map(is_symbolic, planes_shape)) else math.prod(planes_shape)
    streams = plane_streams(ctx, planes) if stages and by_row and outer else 1
    lines = rows_per_line(ctx, streams)
    if lines > 1:  # streams as below, the output's rows `lines` at a time through a buffer
        fused, height, row, width = rows_in_whole_lines(sch, ctx, block, streams, lines, lanes)
    else:
        fused = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
        row = height
        if streams > 1:  # planes p, p + P/streams, ...: each a stream of its own
            together, fused = sch.split(fused, factors=[streams, None])
            sch.reorder(fused, height, together)
            row = together
    for stage in stages:
        sch.compute_at(stage, row if by_row else fused)
        depth = (fused is not None) + by_row + (streams > 1) + (lines > 1)  # the output's loops around it
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
