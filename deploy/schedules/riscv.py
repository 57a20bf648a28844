"""What RISC-V vector targets build differently from other CPUs: pooling windows maxed with
`llvm.maximum`, which LLVM lowers to RVV's `vfmax.vv` with NaN kept (a NaN-propagating max is
vfmax.vv plus a compare of each operand with itself: vfmax alone returns the number of a NaN and a
number). The CPU's NaN test compiled to vfabs/vmflt/vmerge per tap instead. `max_pool2d` and
`max_pool3d` are paired with that compute variant and scheduled as on every CPU (`cpu/pooling.py`).
"""

from __future__ import annotations

from deploy.schedules.cpu.pooling import pool_window, pooling_with_llvm_maximum
from deploy.schedules.registry import register_schedule

register_schedule("riscv", "max_pool2d", compute=pooling_with_llvm_maximum)(pool_window)
register_schedule("riscv", "max_pool3d", compute=pooling_with_llvm_maximum)(pool_window)
