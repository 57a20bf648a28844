"""The schedule registry: (family, op name) -> function that schedules that op's PrimFunc.

A target lists its families in lookup order (x86: "x86", then "cpu"); an op without a hand
schedule in any of them gets the family's generic schedule, registered under op name "*".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ops.spec import BoundOp

GENERIC = "*"


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule may depend on: the bound op, vector bits, the core count and, for GPU
    targets, the work-items per work-group."""

    bound: BoundOp
    vector_bits: int
    cores: int
    threads: int = 64

    def lanes(self, dtype: str) -> int:
        bits = int("".join(ch for ch in dtype if ch.isdigit()) or 8)
        return max(1, self.vector_bits // bits)


ScheduleFn = Callable[[Any, ScheduleContext], None]
"""Schedules `sch` (a tvm.s_tir.Schedule of the op's PrimFunc) in place."""

_SCHEDULES: dict[tuple[str, str], ScheduleFn] = {}


def register_schedule(family: str, op_name: str = GENERIC) -> Callable[[ScheduleFn], ScheduleFn]:
    def add(fn: ScheduleFn) -> ScheduleFn:
        _SCHEDULES[(family, op_name)] = fn
        return fn

    return add


def find_schedule(families: tuple[str, ...], op_name: str) -> tuple[str, ScheduleFn] | None:
    """The first hand schedule for `op_name` in `families`, else the first generic; with its name."""
    for name in (op_name, GENERIC):
        for family in families:
            if (family, name) in _SCHEDULES:
                label = f"{family}/{'generic' if name == GENERIC else name}"
                return label, _SCHEDULES[(family, name)]
    return None
