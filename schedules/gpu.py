"""GPU scheduling (OpenCL): every output element is a work-item.

The op's block keeps its reduction loops serial inside the work-item; the spatial loops are fused
and split into work-groups of `ScheduleContext.threads` work-items (the target's `work_group`).
"""

from __future__ import annotations

import functools
from typing import Any

from ops.nan import any_nan_bits
from ops.pooling import windows_maxed_by
from schedules.cpu import SPATIAL, blocks, fused_or_unit
from schedules.registry import ScheduleContext, own_compute_within, register_schedule


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


@register_schedule("gpu")
def generic_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """Fuse the leading spatial loops of each block and bind them to (work-group, work-item):
    one kernel per block, in order."""
    for block in blocks(sch):
        make_private(sch, block)
        loops = sch.get_loops(block)
        kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
        leading = 0
        while leading < len(loops) and leading < len(kinds) and kinds[leading] == SPATIAL:
            leading += 1
        fused = fused_or_unit(sch, loops[:leading], loops[0] if loops else block)
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
register_schedule("gpu", "max_pool2d", compute=pooling_with_branch_max)(generic_gpu)


def strided_argmax_gpu(ctx: ScheduleContext, x: Any) -> Any:
    """Argmax as `ctx.threads` strided partials per output (one per work-item of a work-group, so
    a tuned work-group size changes the kernel), then their argmax; the plain reduction when the
    axis has a single element."""
    from ops.argmax import strided_argmax

    bound = ctx.bound
    rank = len(bound.inputs[0].shape)
    axis = bound.attrs["axis"] % rank
    extent = bound.inputs[0].shape[axis]
    if extent < 2:
        return bound.op.compute(bound.attrs, bound.output, x)
    return strided_argmax(x, bound.output, axis, bound.attrs["keepdims"], min(ctx.threads, extent))


@register_schedule("gpu", "argmax", compute=strided_argmax_gpu)
def argmax_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """One work-group per output: its work-items each reduce a strided slice into shared memory
    (argmax_partial), then every work-item combines the slices (the same value, written once per
    work-item). Falls back to the generic schedule for the single-stage form."""
    stages = blocks(sch)
    if len(stages) != 2:
        generic_gpu(sch, ctx)
        return
    partial, final = stages
    loops = sch.get_loops(final)
    group = fused_or_unit(sch, loops[:-1], loops[0])
    sch.bind(group, "blockIdx.x")
    sch.compute_at(partial, group)
    lane = sch.get_loops(partial)[1]
    sch.bind(lane, "threadIdx.x")
    for index in range(len(sch.get(partial).writes)):
        sch.set_scope(partial, index, "shared")
    make_private(sch, final)
