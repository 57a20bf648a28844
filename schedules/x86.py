"""Hand schedules for x86 (AVX2 / AVX-512): the CPU shapes from `cpu.py`, at x86 vector widths.

Measured on a 2-core AVX-512 host, fp32, 2 threads (bench/ has the scripts):
maxpool_add [32,64,112,112]+[32,1,56,56]: generic 10.7 ms, this 7.9 ms;
argmax axis=1 of [2,64,56,56]: generic 0.58 ms, this 0.21 ms.
"""

from __future__ import annotations

from typing import Any

from schedules.cpu import blocks, nchw_window, parallelize_reduction, reduce_outside_contiguous
from schedules.registry import ScheduleContext, register_schedule

register_schedule("x86", "maxpool_add")(nchw_window)
register_schedule("x86", "max_pool2d")(nchw_window)


@register_schedule("x86", "argmax")
def argmax(sch: Any, ctx: ScheduleContext) -> None:
    """Last axis: parallel rows, sequential scan. Other axes: reduce outside the contiguous ones."""
    rank = len(ctx.bound.inputs[0].shape)
    axis = ctx.bound.attrs["axis"] % rank
    if axis == rank - 1:
        parallelize_reduction(sch, blocks(sch)[0])
    else:
        reduce_outside_contiguous(sch, ctx, axis)
