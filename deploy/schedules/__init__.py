"""Per-target schedules: `registry.py` maps (family, op) to a strategy (a schedule and the
computation it schedules); importing this package registers every family.

`cpu.py` serves every CPU target; `arm.py` and `riscv.py` hold only what ARM and RISC-V targets
build differently (they list "arm" or "riscv" before "cpu"; x86 targets list "x86", which needs no
module today); `gpu.py` serves
OpenCL; `fused.py` composes the strategies of a fused group's nodes. A new family is one module
here, imported below, and the targets that list it."""

from deploy.ops.fused import FusedOp
from deploy.schedules import arm, cpu, cpu_rules, gpu, riscv  # noqa: F401  (registration on import)
from deploy.schedules.fused import fused_strategy
from deploy.schedules.registry import ScheduleContext, Strategy, find_schedule, register_schedule


def strategy_for(families: tuple[str, ...], ctx: ScheduleContext) -> Strategy | None:
    """What `families` build `ctx.bound` with: a fused group's composed strategy, else the op's
    hand strategy or the generic one (None: no family schedules it)."""
    if isinstance(ctx.bound.op, FusedOp):
        return fused_strategy(families, ctx)
    return find_schedule(families, ctx.bound.op.name)


__all__ = ["ScheduleContext", "Strategy", "find_schedule", "register_schedule", "strategy_for"]
