"""argmax on OpenCL: computed as strided partials per output, a work-group's work-items each
reducing one (`strided_argmax_gpu`), then their argmax (`argmax_gpu`)."""

from __future__ import annotations

from typing import Any

from deploy.ops.library.argmax_compute import along_one_axis, strided_argmax, vector_strided_argmax
from deploy.schedules.gpu.generic import generic_gpu, make_private
from deploy.schedules.loops import SPATIAL, blocks, extent, fused_or_unit
from deploy.schedules.registry import ScheduleContext, register_schedule


def strided_argmax_gpu(ctx: ScheduleContext, x: Any) -> Any:
    """Argmax as `ctx.threads` strided partials per output (one per work-item of a work-group, so
    a tuned work-group size changes the kernel), then their argmax: over the innermost axis each
    work-item reads a vector a step (`vector_strided_argmax`, where `vector_width` allows), else
    one element; the plain reduction when the axis has a single element or the channels of
    another layout are reduced."""
    bound = ctx.bound
    rank = len(bound.inputs[0].shape)
    axis = bound.attrs["axis"] % rank
    extent = bound.inputs[0].shape[axis]
    last = bound.attrs["select_last"]
    if extent < 2 or not along_one_axis(bound.attrs):
        return bound.op.compute(bound.attrs, bound.output, x)
    width = vector_width(ctx, extent) if axis == rank - 1 else 1
    if width > 1:
        return vector_strided_argmax(x, bound.output, min(ctx.threads, extent // width), width, last)
    lanes = min(ctx.threads, extent)
    return strided_argmax(x, bound.output, axis, bound.attrs["keepdims"], lanes, last)


VECTOR_DTYPES = ("float32", "int32")
"""Input dtypes (as computed: float16 stored as half is float32) whose argmax reads vectors. Their
compares give int4 masks, as wide as the int32 positions: OpenCL's `select` needs the mask's
element width equal to the operands', and TVM casts a select's condition to int whatever they
are, so 64-bit values (long4 positions) gave wrong answers on NVIDIA's driver; 8- and 16-bit
ones (char4/short4 masks) and native half stay scalar."""


def vector_width(ctx: ScheduleContext, extent: int) -> int:
    """Elements a work-item loads a step along the innermost axis: a vector (`ctx.lanes`) where
    the input's dtype is in VECTOR_DTYPES, the extent is whole vectors and fits int32, else 1."""
    dtype = str(ctx.bound.inputs[0].dtype)
    width = ctx.lanes(dtype)
    fits = extent <= 2**31  # positions are int32
    return width if dtype in VECTOR_DTYPES and extent % width == 0 and extent >= 2 * width and fits else 1


UNROLL = 4
"""Steps of an argmax partial unrolled together: four independent loads in flight per work-item
before their compares (one at a time left the H100 at 1.2 of its 2.8 TB/s)."""


@register_schedule("gpu", "argmax", compute=strided_argmax_gpu)
def argmax_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """One work-group per output: its work-items each reduce a strided slice into shared memory
    (argmax_partial; a vector of partials each where it reads vectors, the vector innermost so
    a step is one vector load), then every work-item combines the slices (the same value,
    written once per work-item). Falls back to the generic schedule for the single-stage form."""
    stages = blocks(sch)
    if len(stages) != 2:
        generic_gpu(sch, ctx)
        return
    partial, final = stages
    copies = [sch.cache_write(partial, index, "local") for index in range(len(sch.get(partial).writes))]
    loops = sch.get_loops(final)
    reduced = sum(int(iv.iter_type) != SPATIAL for iv in sch.get(final).iter_vars)
    group = fused_or_unit(sch, loops[:-reduced], loops[0])
    sch.bind(group, "blockIdx.x")
    for copy in reversed(copies):
        sch.compute_at(copy, group)
    sch.compute_at(partial, group)
    lane, *inner = sch.get_loops(partial)[1:]
    sch.bind(lane, "threadIdx.x")
    if len(inner) == 2:  # (element, step): the vector form
        vector, step = inner
        sch.reorder(step, vector)
        sch.vectorize(vector)
        sch.decompose_reduction(partial, step)
        step = sch.get_loops(partial)[-2]
    else:
        step = inner[0] if inner else None
    steps = extent(sch, step) if step is not None else None
    if steps is not None and steps >= 2 * UNROLL:  # fewer: the split's remainder test costs more
        _, unrolled = sch.split(step, factors=[None, UNROLL])
        sch.unroll(unrolled)
    for copy in copies:
        sch.reverse_compute_at(copy, lane)
        sch.set_scope(copy, 0, "shared")
    make_private(sch, final)
