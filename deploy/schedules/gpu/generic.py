"""The generic GPU schedule (OpenCL): every output element, or every vector of them, is a
work-item.

The op's block keeps its reduction loops serial inside the work-item; the spatial loops are fused
and split into work-groups of `ScheduleContext.threads` work-items (the target's `work_group`).
A block of spatial loops only (elementwise, broadcast, a fill or copy) gives each work-item one
vector of `ScheduleContext.lanes` outputs along the contiguous axis (float4: 16-byte loads and
stores, a quarter of the work-items), when the innermost output dim is whole vectors.
"""

from __future__ import annotations

from typing import Any

from deploy.schedules.loops import SPATIAL, blocks, extent, fused_or_unit
from deploy.schedules.registry import ScheduleContext, register_schedule


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
