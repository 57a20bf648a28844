"""Per-target schedules: `registry.py` maps (family, op) to a schedule; importing this package
registers every family (generic CPU, x86, arm, gpu)."""

from schedules import arm, cpu, gpu, x86  # noqa: F401  (registration on import)
from schedules.registry import ScheduleContext, find_schedule, register_schedule

__all__ = ["ScheduleContext", "find_schedule", "register_schedule"]
