"""The generic CPU schedule: what an op gets on every CPU target when no family has a schedule of
its own for it."""

from __future__ import annotations

from typing import Any

from deploy.schedules.cpu.vectorize import parallelize_reduction, vectorize_parallelize
from deploy.schedules.loops import blocks, is_spatial
from deploy.schedules.registry import ScheduleContext, register_schedule


@register_schedule("cpu")
def generic_cpu(sch: Any, ctx: ScheduleContext) -> None:
    """Every block: injective ones vectorized + parallel, reductions parallel over outputs."""
    for block in blocks(sch):
        if is_spatial(sch, block):
            dtype = str(sch.get(block).writes[0].source.dtype)
            vectorize_parallelize(sch, block, ctx.lanes(dtype), ctx.cores, ctx.choices)
        else:
            parallelize_reduction(sch, block)
