"""Per-target schedules: `registry.py` maps (family, op) to a strategy (a schedule and the
computation it schedules); importing this package registers every family.

`cpu.py` serves every CPU target (x86 and arm list "x86"/"arm" before "cpu", for what differs per
ISA: nothing in the schedules today; ARM's NaN-propagating max is chosen in ops/pooling.py); `gpu.py`
serves OpenCL."""

from schedules import cpu, gpu  # noqa: F401  (registration on import)
from schedules.registry import ScheduleContext, Strategy, find_schedule, register_schedule

__all__ = ["ScheduleContext", "Strategy", "find_schedule", "register_schedule"]
