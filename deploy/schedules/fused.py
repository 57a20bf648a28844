"""Strategies for fused groups of graph nodes (`deploy.ops.fused.FusedOp`), composed from the nodes' own.

The computation is each node's computation as the target family builds it (its strategy's
variant, else the op's own), composed in one PrimFunc. The schedule inlines every node's output
block into its consumers except the last node's, whose block writes the group's output, so that
one block remains, reading the group's inputs (pooling's window taps, an added bias, ...), beside
the anchor's own stages; then the anchor's schedule applies, as it would to the anchor alone, with
the group's output type. When that fails (a reduction's result cannot be inlined into the block
after it), the family's generic schedule applies instead: every strategy here is tried on the
hand's choices when it is looked up, so the label it reports is the schedule that applies.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deploy.base.stopping import raise_if_stopped
from deploy.ops.fused import FusedOp
from deploy.ops.graph import BoundNode
from deploy.schedules.registry import (
    GENERIC,
    HAND,
    ComputeFn,
    ScheduleContext,
    ScheduleFn,
    Strategy,
    computed_module,
    find_schedule,
)


def node_compute(families: tuple[str, ...], ctx: ScheduleContext) -> Any:
    """(node, input tensors) -> its output tensor as the families compute it (`ctx` with the
    node's bound op: a variant may depend on its attributes and on the choices)."""

    def compute(n: BoundNode, inputs: list[Any]) -> Any:
        strategy = find_schedule(families, n.bound.op.name)
        if strategy is not None and strategy.compute is not None:
            return strategy.compute(replace(ctx, bound=n.bound), *inputs)
        return n.bound.op.compute(n.bound.attrs, n.bound.output, *inputs)

    return compute


def inline_into_last(sch: Any, op: FusedOp, last: int | None = None) -> None:
    """Inline each node's output block before node `last` (default: the last node) into its
    consumers, where it can be (a spatial block; a reduction's stays)."""
    for index in range(len(op.nodes) - 1 if last is None else last):
        block = sch.get_sblock(op.block_name(index))
        try:
            sch.compute_inline(block)
        except Exception:
            raise_if_stopped()
            continue


def anchored(schedule: ScheduleFn, op: FusedOp) -> ScheduleFn:
    """`schedule` (the anchor's) applied to the fused PrimFunc after `inline_into_last`, seeing the
    anchor's bound op with the group's output type."""
    anchor = op.nodes[op.anchor].bound

    def apply(sch: Any, ctx: ScheduleContext) -> None:
        inline_into_last(sch, op)
        schedule(sch, replace(ctx, bound=replace(anchor, output=ctx.bound.output), fused=True))

    return apply


def ends_in_views(op: FusedOp) -> bool:
    """Whether the nodes after the group's anchor are all views (`Op.view`: reshapes), as where
    a 1-D pool runs as a 2-D pool between reshapes (`max_pool2d.py`)."""
    after = op.nodes[op.anchor + 1 :]
    return bool(after) and all(n.bound.op.view for n in after)


def viewed(schedule: ScheduleFn, op: FusedOp) -> ScheduleFn:
    """`schedule` (the anchor's) applied to the fused PrimFunc of a group that `ends_in_views`:
    the nodes before the anchor inlined into it, the views after it inlined into its block
    (`reverse_compute_inline`: the anchor writes the group's output at the view's index of each
    element, the same address), so that the anchor's own loops remain, which its schedule was
    written for; it sees the anchor's own bound op."""
    anchor = op.nodes[op.anchor].bound

    def apply(sch: Any, ctx: ScheduleContext) -> None:
        inline_into_last(sch, op, op.anchor)
        for index in range(op.anchor + 1, len(op.nodes)):
            sch.reverse_compute_inline(sch.get_sblock(op.block_name(index)))
        schedule(sch, replace(ctx, bound=anchor, fused=True))

    return apply


def fused_strategy(families: tuple[str, ...], ctx: ScheduleContext) -> Strategy | None:
    """The strategy of the fused group `ctx.bound.op`: its nodes' computations composed; the
    anchor's hand schedule where it applies (the group writes the anchor's output shape, or a
    broadcast of it: the loops that schedule was written for, which a layout_transform after the
    anchor changes; or it ends in views, `viewed`; and TVM takes every step on the hand's
    choices), else the generic."""
    op = ctx.bound.op
    assert isinstance(op, FusedOp)

    def compute(c: ScheduleContext, *inputs: Any) -> Any:
        return op.compose(node_compute(families, c), *inputs)

    anchor = find_schedule(families, op.nodes[op.anchor].bound.op.name, generic=False)
    own, written = op.nodes[op.anchor].bound.output.shape, ctx.bound.output.shape
    same_loops = len(own) == len(written) and all(a in (b, 1) for a, b in zip(own, written, strict=True))
    if anchor is not None:
        hand = anchored(anchor.schedule, op) if same_loops else None
        if hand is None and ends_in_views(op):
            hand = viewed(anchor.schedule, op)
        if hand is not None and _applies(hand, compute, replace(ctx, choices=HAND)):
            return Strategy(anchor.label, hand, compute)
    generic = find_schedule(families, GENERIC)
    return None if generic is None else Strategy(generic.label, anchored(generic.schedule, op), compute)


def _applies(schedule: ScheduleFn, compute: ComputeFn, ctx: ScheduleContext) -> bool:
    """Whether `schedule` schedules the PrimFunc of `compute` without TVM refusing a step."""
    import tvm

    sch = tvm.s_tir.Schedule(computed_module(ctx, compute))
    try:
        schedule(sch, ctx)
    except Exception:
        raise_if_stopped()
        return False
    return True
