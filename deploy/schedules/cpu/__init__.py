"""The schedules every CPU target shares (family "cpu": x86 targets list it after "x86", which
needs no module today; ARM and RISC-V targets after their own family, `deploy/schedules/arm.py`
and `riscv.py`), a file per job:

- `vectorize.py`: vectors and threads, the helpers every CPU schedule builds with;
- `prefetch.py`: software prefetch of streamed inputs (`PREFETCH`, which the CPU build lowers);
- `generic.py`: the schedule of an op no family has a schedule of its own for, chosen by the
  structure of its computation (`deploy/schedules/structure.py`);
- `elementwise.py`: every block in vectors and threads, what `generic.py` falls back to;
- `pooling.py`: max_pool2d, its computation as CPUs build it and its schedule;
- `argmax.py`: argmax, the computations CPUs build it as and their schedule.
"""

from deploy.schedules.cpu import argmax, generic, pooling  # noqa: F401  (registration on import)
from deploy.schedules.cpu.prefetch import CACHE_LINE, PREFETCH, PREFETCH_LEVEL, PREFETCH_NEAR

__all__ = ["CACHE_LINE", "PREFETCH", "PREFETCH_LEVEL", "PREFETCH_NEAR"]
