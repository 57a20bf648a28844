"""What ARM targets build differently from other CPUs: pooling windows maxed with `llvm.maximum`.

AArch64 has a NaN-propagating max in one NEON instruction (`fmax`), armv7's NEON one for float32
(`vmax.f32`); LLVM emits it for `llvm.maximum` and TVM vectorizes the call. `max_pool2d` and
`max_pool3d` are
paired with that compute variant (`pooling_with_llvm_maximum`, with the CPU's structures) and
scheduled as on every CPU (`pool_window`, both in `cpu/pooling.py`); argmax is computed as on every
CPU and its slices scanned in TVM's vectors (`cpu/argmax.py`).
"""

from __future__ import annotations

import functools

from deploy.schedules.cpu.argmax import argmax_cpu, reduce_by_axis
from deploy.schedules.cpu.pooling import pool_window, pooling_with_llvm_maximum
from deploy.schedules.registry import register_schedule

register_schedule("arm", "max_pool2d", compute=pooling_with_llvm_maximum)(pool_window)
register_schedule("arm", "max_pool3d", compute=pooling_with_llvm_maximum)(pool_window)
register_schedule("arm", "argmax", compute=argmax_cpu)(functools.partial(reduce_by_axis, vectors=True))
