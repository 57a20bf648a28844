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
