"""What ARM targets build differently from other CPUs: pooling windows maxed with `llvm.maximum`.

AArch64 has a NaN-propagating max in one NEON instruction (`fmax`); LLVM emits it for
`llvm.maximum` and TVM vectorizes the call. `max_pool2d` is paired with that compute variant
(with the CPU's structures, `cpu.pooling_structure`) and scheduled as on every CPU
(`cpu.pool_window`).
"""

from __future__ import annotations

import functools
from typing import Any

from schedules.cpu import argmax_cpu, pool_window, pooling_structure, reduce_by_axis
from schedules.registry import own_compute_within, register_schedule


def fmax(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values` as a chain of `llvm.maximum` (NaN propagates)."""
    from tvm import tirx

    return functools.reduce(lambda a, b: tirx.call_llvm_pure_intrin(dtype, "llvm.maximum", a, b), values)


pooling_with_fmax = own_compute_within(lambda ctx: pooling_structure(ctx, fmax))
register_schedule("arm", "max_pool2d", compute=pooling_with_fmax)(pool_window)
register_schedule("arm", "argmax", compute=argmax_cpu)(functools.partial(reduce_by_axis, vectors=True))
