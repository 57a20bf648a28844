"""Hand schedules for aarch64 NEON (128-bit: 4 fp32 / 8 fp16 lanes): the CPU shapes from `cpu.py`."""

from __future__ import annotations

from schedules.cpu import nchw_window, reduce_by_axis
from schedules.registry import register_schedule

register_schedule("arm", "maxpool_add")(nchw_window)
register_schedule("arm", "max_pool2d")(nchw_window)
register_schedule("arm", "argmax")(reduce_by_axis)
