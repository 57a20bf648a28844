"""GPU scheduling (OpenCL): every output element, or every vector of them, is a work-item.

The op's block keeps its reduction loops serial inside the work-item; the spatial loops are fused
and split into work-groups of `ScheduleContext.threads` work-items (the target's `work_group`).
A block of spatial loops only (elementwise, broadcast, a fill or copy) gives each work-item one
vector of `ScheduleContext.lanes` outputs along the contiguous axis (float4: 16-byte loads and
stores, a quarter of the work-items), when the innermost output dim is whole vectors.
"""

from __future__ import annotations

import functools
from typing import Any

from deploy.ops.library.pooling import windows_maxed_by
from deploy.ops.nan import any_nan_bits
from deploy.schedules.cpu import SPATIAL, blocks, extent, fused_or_unit
from deploy.schedules.registry import ScheduleContext, own_compute_within, register_schedule


def make_private(sch: Any, block: Any) -> None:
    """Intermediate buffers that only `block` touches (argmax's running max) become work-item
    private; those other blocks read stay global (the runner allocates them as scratch)."""
    params = {str(param.name) for param in sch.mod["main"].params}
    others = [b for b in blocks(sch) if not sch.get(b).same_as(sch.get(block))]
    read_elsewhere = {str(r.source.name) for b in others for r in sch.get(b).reads}
    for index, region in enumerate(sch.get(block).writes):
        name = str(region.source.name)
        if name not in params and name not in read_elsewhere:
            sch.set_scope(block, index, "local")


def vector_lanes(sch: Any, block: Any, loops: list[Any], leading: int, ctx: ScheduleContext) -> int:
    """Outputs per work-item: `ctx.lanes` of the block's dtype when every loop is spatial and the
    innermost extent is whole vectors of them (so a vector never crosses a row), else 1."""
    dtype = str(sch.get(block).writes[0].source.dtype)
    lanes = ctx.lanes(dtype)
    if dtype == "bool" or lanes == 1 or not loops or leading != len(loops):  # OpenCL has no bool4
        return 1
    innermost = extent(sch, loops[-1])
    return lanes if innermost is not None and innermost % lanes == 0 else 1


@register_schedule("gpu")
def generic_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """Fuse the leading spatial loops of each block and bind them to (work-group, work-item),
    each work-item a vector of `vector_lanes` outputs: one kernel per block, in order."""
    bind_work_items(sch, ctx, vectorize=True)


def bind_work_items(sch: Any, ctx: ScheduleContext, vectorize: bool) -> None:
    """The generic GPU schedule; `vectorize=False` gives every output its own work-item."""
    for block in blocks(sch):
        make_private(sch, block)
        loops = sch.get_loops(block)
        kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
        leading = 0
        while leading < len(loops) and leading < len(kinds) and kinds[leading] == SPATIAL:
            leading += 1
        lanes = vector_lanes(sch, block, loops, leading, ctx) if vectorize else 1
        fused = fused_or_unit(sch, loops[:leading], loops[0] if loops else block)
        if lanes > 1:
            fused, vector = sch.split(fused, factors=[None, lanes])
            sch.vectorize(vector)
        groups, items = sch.split(fused, factors=[None, ctx.threads])
        sch.bind(groups, "blockIdx.x")
        sch.bind(items, "threadIdx.x")


def branch_max(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values`, NaN when any is NaN, with the NaN test as an
    if-then-else: TVM writes the plain definition's Select as OpenCL `select(a, b, bool)`, which
    OpenCL C rejects as ambiguous for doubles."""
    from tvm import te, tirx

    nan = tirx.const(float("nan"), dtype)
    return tirx.if_then_else(any_nan_bits(values, dtype), nan, functools.reduce(te.max, values))


pooling_with_branch_max = own_compute_within(lambda ctx: windows_maxed_by(branch_max))


@register_schedule("gpu", "max_pool2d_indices", compute=pooling_with_branch_max)
@register_schedule("gpu", "max_pool2d", compute=pooling_with_branch_max)
def max_pool2d_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """One output (a max, or where it is) per work-item: TVM does not vectorize the window max's
    NaN branch, and a vector of outputs would run as a loop of them in one work-item."""
    bind_work_items(sch, ctx, vectorize=False)


def strided_argmax_gpu(ctx: ScheduleContext, x: Any) -> Any:
    """Argmax as `ctx.threads` strided partials per output (one per work-item of a work-group, so
    a tuned work-group size changes the kernel), then their argmax: over the innermost axis each
    work-item reads a vector a step (`vector_strided_argmax`, where `vector_width` allows), else
    one element; the plain reduction when the axis has a single element or the channels of
    another layout are reduced."""
    from deploy.ops.library.argmax import along_one_axis, strided_argmax, vector_strided_argmax

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
