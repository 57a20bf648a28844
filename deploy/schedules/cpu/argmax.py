"""argmax on CPUs: which of argmax's computations a CPU builds it as (`argmax_cpu`: one vector
pass over the innermost axis, ordered slices over another) and their schedule (`reduce_by_axis`),
registered for family "cpu" (ARM's vectorizes the slices: `deploy/schedules/arm.py`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from deploy.ops.library.argmax_compute import along_one_axis, max_then_find, sliced_argmax
from deploy.schedules.cpu.prefetch import prefetch_ahead
from deploy.schedules.cpu.vectorize import (
    MIN_PARALLEL_WORK,
    parallel_if_worth,
    parallel_outer,
    parallelize_reduction,
)
from deploy.schedules.loops import REDUCE, SPATIAL, blocks, extent, fused_or_unit, is_spatial, work_of
from deploy.schedules.registry import ScheduleContext, register_schedule

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
        kinds = [int(iv.iter_type) for iv in sch.get(stage).iter_vars]
        if len(inner) >= 2 and kinds[-2:] == [SPATIAL, REDUCE]:  # (segments, lane, step)
            *segments, lane, step = inner
            sch.reorder(step, *segments, lane)
            for segment in segments:
                sch.unroll(segment)
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


CPU_LANES = 16
"""Argmax partials per output over the innermost axis: two AVX2 vectors, four NEON ones; half as
many when that divides the axis and this does not (a ragged end re-reads with gathers)."""


SCAN_STREAMS = 4
"""Segments of a long row the vector pass reads at once (`max_then_find`'s `segments`), a vector
of partials each. One core draws more from memory out of several streams than out of one, even
prefetched (the hardware prefetcher runs only so far ahead of each stream): argmax of 256x100000
float32 on a 2-core Intel Xeon (Emerald Rapids) VM, one stream against four, 1 / 2 threads,
interleaved medians of 21: x86-avx512 8.34 -> 7.76 / 4.74 -> 4.32 ms, x86 (AVX2) 9.75 -> 8.64 /
5.46 -> 4.92 ms."""


SCAN_STREAM_BYTES = 16384
"""Fewest bytes of a row per stream for SCAN_STREAMS: shorter rows are in cache, or read one
after another as one stream anyway."""


def scan_streams(ctx: ScheduleContext, extent: int) -> int:
    """Streams of argmax's vector pass over rows of `extent` elements: SCAN_STREAMS where each
    gets SCAN_STREAM_BYTES, else 1; a search also tries 1, 2 and 4."""
    itemsize = np.dtype(str(ctx.bound.inputs[0].dtype)).itemsize
    default = SCAN_STREAMS if extent * itemsize >= SCAN_STREAMS * SCAN_STREAM_BYTES else 1
    return int(ctx.choices.pick("scan streams", (1, 2, 4), default))


def argmax_cpu(ctx: ScheduleContext, x: Any) -> Any:
    """Argmax over the innermost axis as max-then-find (one vector pass, see `max_then_find`)
    when the axis is long enough; over another axis as an ordered scan in slices (see
    `sliced_argmax`, `argmax_slices`); else the op's plain reduction."""
    bound = ctx.bound
    rank = len(bound.inputs[0].shape)
    extent = bound.inputs[0].shape[-1]
    axis = bound.attrs["axis"] % rank
    if not along_one_axis(bound.attrs):
        return bound.op.compute(bound.attrs, bound.output, x)
    last = bound.attrs["select_last"]
    if axis != rank - 1:
        return sliced_argmax(x, bound.output, axis, bound.attrs["keepdims"], argmax_slices(ctx), last)
    streams = scan_streams(ctx, extent) if extent >= 2 * CPU_LANES else 1
    per_stream = min(ctx.lanes(str(bound.inputs[0].dtype)), ctx.lanes("int32"))  # a position vector each
    if streams > 1 and extent >= 2 * streams * per_stream:
        return max_then_find(x, bound.output, per_stream, last, streams)
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
    rank = len(ctx.bound.inputs[0].shape)
    axis = ctx.bound.attrs["axis"] % rank
    if along_one_axis(ctx.bound.attrs) and axis != rank - 1:
        reduce_in_slices(sch, ctx, axis, vectors)
    elif len(blocks(sch)) > 1:
        per_output_stages(sch, ctx)
    else:
        parallelize_reduction(sch, blocks(sch)[0])
