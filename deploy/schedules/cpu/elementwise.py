"""The elementwise CPU schedule: every block vectorized along its innermost loops and parallel
outside them, a reduction parallel over its outputs; what the generic schedule
(`deploy/schedules/cpu/generic.py`) gives an elementwise function, and falls back to when no rule
of its structure fits."""

from __future__ import annotations

from typing import Any

from deploy.schedules.cpu.vectorize import parallelize_reduction, vectorize_parallelize
from deploy.schedules.loops import blocks, is_spatial
from deploy.schedules.registry import ScheduleContext


def elementwise_cpu(sch: Any, ctx: ScheduleContext) -> None:
    """Every block: injective ones vectorized + parallel, reductions parallel over outputs."""
    for block in blocks(sch):
        if is_spatial(sch, block):
            dtype = str(sch.get(block).writes[0].source.dtype)
            vectorize_parallelize(sch, block, ctx.lanes(dtype), ctx.cores, ctx.choices)
        else:
            parallelize_reduction(sch, block)
