"""Software prefetch of a streamed input: the loop annotation CPU schedules set (`PREFETCH`), which
the CPU build lowers, and the steps of a cache line it is issued at."""

from __future__ import annotations

from typing import Any

from deploy.schedules.cpu.vectorize import VECTORS_PER_STEP
from deploy.schedules.loops import extent
from deploy.schedules.registry import ScheduleContext

PREFETCH = "software_prefetch_bytes"
"""Loop annotation: prefetch, at the start of each step, this many bytes past where the step's
contiguous loads of function inputs start, one per cache line (lowered by the CPU build:
`deploy.compiler.tir_passes.software_prefetch`; gathers and loads in inner loops get none)."""


PREFETCH_BYTES = 16384
"""How far ahead the hand schedule prefetches a streamed input. One thread stalls on memory while
it computes (the hardware prefetcher does not run far enough ahead): prefetching 16 KiB ahead
took the x86 pooling kernel (32x64x112x112 k3 s2 p1, one thread) from 7.9 to 3.2 ms on our
2-core EPYC VM (4 KiB: 4.1 ms, 64 KiB: 3.3 ms)."""


PREFETCH_LEVEL = "software_prefetch_level"
"""Loop annotation beside PREFETCH: the cache level the prefetches fill (`Target.prefetch_level`;
absent: 1, L1)."""


PREFETCH_NEAR = "software_prefetch_near_bytes"
"""Loop annotation beside PREFETCH where its level is past L1: also prefetch, into L1, this many
bytes ahead of each line the far prefetch reaches (absent or 0: none), so that the core's own
loads find their lines in L1 rather than each waiting on a miss to L2 (`NEAR_PREFETCH_BYTES`)."""


NEAR_PREFETCH_BYTES = 1024
"""How far ahead a schedule whose prefetches fill L2 (x86) also prefetches into L1: far (L2, 16
KiB) and near (L1) is the two-level scheme streaming kernels use. Interleaved, 21 rounds, on a
2-core Intel Xeon (Emerald Rapids) VM, 1 / 2 threads, x86-avx512: max_pool2d 32x64x112x112 k3 s2
p1 0.96-0.97 / 0.93-0.97 of the time with L2's alone (512 and 2048 bytes alike), argmax
256x100000 0.92-0.93 / 0.93; x86 (AVX2): the pool 0.96 / 0.98, argmax 1.01 / 0.98. On an AMD
EPYC (Zen 3) VM they gain nothing or cost: without them the pool took 1.04 / 0.88 of the time
(0.71-0.85 / 0.78 with one plane at a time), argmax 0.94 at 1 thread: none there
(`deploy.schedules.cpu_models.ZEN3`; a search tries none everywhere)."""


CACHE_LINE = 64
"""Bytes per cache line (x86-64 and the AArch64 cores we target): what one prefetch fetches."""


def per_cache_line(sch: Any, ctx: ScheduleContext, loop: Any, vector_bytes: int) -> Any:
    """`loop` (over whole vectors) split so that a step of the outer loop, returned, covers a
    cache line, its vectors unrolled (as many as divide the loop when a line's worth do not): a
    prefetch per step is then one per line, not one per vector. A search tries other counts."""
    steps = extent(sch, loop) or 1
    most = max(1, CACHE_LINE // vector_bytes)
    default = max(d for d in range(1, most + 1) if steps % d == 0)
    outer, inner = ctx.choices.split(sch, loop, default, VECTORS_PER_STEP)
    if inner is not None:
        sch.unroll(inner)
    return outer


def prefetch_ahead(sch: Any, ctx: ScheduleContext, loops: list[Any]) -> None:
    """Annotate `loops` (steps through a streamed input) to prefetch PREFETCH_BYTES ahead into
    the target's cache level (PREFETCH_LEVEL), and where that is past L1 also
    NEAR_PREFETCH_BYTES ahead into L1 (PREFETCH_NEAR); a search also tries none, a quarter and
    four times as far, and no near prefetch. The loops are kept from being unrolled by an
    unroll depth of an outer loop (a search's): lowering unrolls before it prefetches, which
    would drop the annotation with the loop. The device's CPU model (`ScheduleContext.cpu_model`)
    may say how far ahead the near prefetches run by default, or none."""
    options = (0, PREFETCH_BYTES // 4, PREFETCH_BYTES, 4 * PREFETCH_BYTES)
    ctx.choices.annotate(sch, loops, PREFETCH, PREFETCH_BYTES, options)
    if ctx.prefetch_level > 1:
        near = ctx.cpu_model.near_prefetch_bytes if ctx.cpu_model else NEAR_PREFETCH_BYTES
        ctx.choices.annotate(sch, loops, PREFETCH_NEAR, near, (0, NEAR_PREFETCH_BYTES))
    for loop in loops:
        sch.annotate(loop, PREFETCH_LEVEL, ctx.prefetch_level)
        sch.annotate(loop, "pragma_auto_unroll_max_step", 0)
