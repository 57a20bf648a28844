"""Per-target schedules: `registry.py` maps (family, op) to a strategy (a schedule and the
computation it schedules); importing this package registers every family.

`cpu.py` serves every CPU target; `arm.py` holds only what ARM targets build differently (they
list "arm" before "cpu"; x86 targets list "x86", which needs no module today); `gpu.py` serves
OpenCL. A new family is one module here, imported below, and the targets that list it."""

from schedules import arm, cpu, gpu  # noqa: F401  (registration on import)
from schedules.registry import ScheduleContext, Strategy, find_schedule, register_schedule

__all__ = ["ScheduleContext", "Strategy", "find_schedule", "register_schedule"]
