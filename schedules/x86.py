"""Hand schedules for x86 (AVX2 / AVX-512): the CPU shapes from `cpu.py` at x86 vector widths.

`bench/hand_vs_generic.py` measures them against the generic schedule and numpy.
"""

from __future__ import annotations

from schedules.cpu import nchw_window, reduce_by_axis
from schedules.registry import register_schedule

register_schedule("x86", "maxpool_add")(nchw_window)
register_schedule("x86", "max_pool2d")(nchw_window)
register_schedule("x86", "argmax")(reduce_by_axis)
