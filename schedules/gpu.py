"""GPU scheduling (OpenCL): every output element is a work-item.

The op's block keeps its reduction loops serial inside the work-item; the spatial loops are fused
and split into work-groups of `ScheduleContext.threads` work-items (the target's `work_group`).
"""

from __future__ import annotations

from typing import Any

from schedules.cpu import SPATIAL, blocks
from schedules.registry import ScheduleContext, register_schedule


@register_schedule("gpu")
def generic_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """Fuse the leading spatial loops of each block and bind them to (work-group, work-item);
    intermediate buffers a block writes (argmax's running max) become work-item private."""
    params = {str(param.name) for param in sch.mod["main"].params}
    for block in blocks(sch):
        for index, region in enumerate(sch.get(block).writes):
            if str(region.source.name) not in params:
                sch.set_scope(block, index, "local")
        loops = sch.get_loops(block)
        kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
        leading = 0
        while leading < len(loops) and leading < len(kinds) and kinds[leading] == SPATIAL:
            leading += 1
        spatial = loops[:leading] or [sch.add_unit_loop(loops[0] if loops else block)]
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        groups, items = sch.split(fused, factors=[None, ctx.threads])
        sch.bind(groups, "blockIdx.x")
        sch.bind(items, "threadIdx.x")


@register_schedule("gpu", "argmax")
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
    spatial = loops[:-1] or [sch.add_unit_loop(loops[0])]
    group = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    sch.bind(group, "blockIdx.x")
    sch.compute_at(partial, group)
    lane = sch.get_loops(partial)[1]
    sch.bind(lane, "threadIdx.x")
    for index in range(len(sch.get(partial).writes)):
        sch.set_scope(partial, index, "shared")
    for index, region in enumerate(sch.get(final).writes):
        if str(region.source.name) not in {str(p.name) for p in sch.mod["main"].params}:
            sch.set_scope(final, index, "local")
