"""max_pool2d, max_pool3d and max_pool2d_indices on OpenCL: computed with the window max's NaN
test as a branch (`branch_max`), one output per work-item (`max_pool2d_gpu`)."""

from __future__ import annotations

import functools
from typing import Any

from deploy.ops.library.pooling import max_pool2d_indices_compute, max_pool_compute
from deploy.ops.nan import any_nan_bits
from deploy.schedules.gpu.generic import bind_work_items
from deploy.schedules.registry import ScheduleContext, register_schedule


def branch_max(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values`, NaN when any is NaN, with the NaN test as an
    if-then-else: TVM writes the plain definition's Select as OpenCL `select(a, b, bool)`, which
    OpenCL C rejects as ambiguous for doubles."""
    from tvm import te, tirx

    nan = tirx.const(float("nan"), dtype)
    return tirx.if_then_else(any_nan_bits(values, dtype), nan, functools.reduce(te.max, values))


def max_pool_branch_max(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d or max_pool3d with its windows maxed by `branch_max`."""
    return max_pool_compute(ctx.bound.attrs, ctx.bound.output, x, window_max=branch_max)


def max_pool2d_indices_branch_max(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d_indices with its windows maxed by `branch_max`."""
    return max_pool2d_indices_compute(ctx.bound.attrs, ctx.bound.output, x, window_max=branch_max)


@register_schedule("gpu", "max_pool2d_indices", compute=max_pool2d_indices_branch_max)
@register_schedule("gpu", "max_pool3d", compute=max_pool_branch_max)
@register_schedule("gpu", "max_pool2d", compute=max_pool_branch_max)
def max_pool2d_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """One output (a max, or where it is) per work-item: TVM does not vectorize the window max's
    NaN branch, and a vector of outputs would run as a loop of them in one work-item."""
    bind_work_items(sch, ctx, vectorize=False)
