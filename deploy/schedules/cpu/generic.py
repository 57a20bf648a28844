"""The generic CPU schedule, what an op gets on every CPU target when no family has a schedule of its
own for it: chosen by structure (`deploy.schedules.structure`), for an op without a
hand schedule: one rule per structure of the function's costliest block, after its float32
exp, erf, sigmoid and tanh become vector polynomials (`deploy.schedules.vector_math`) and its
cheap producers are inlined into their one consumer.

- elementwise: today's generic (`elementwise.py`) for each block.
- row reduction (softmax, norms): rows in parallel; every stage of a row computed inside the
  row's loop while the row is in cache; each reduction over the row in vectors of lanes
  (`rfactor`), one horizontal combine at its end; the elementwise stages in vectors.
- outer reduction (a mean over channels): the reduction loop outside the contiguous spatial
  loop, which runs in vectors; rows of the output in parallel.
- dot product (matmul, batched matmul): output tiles of DOT_ROWS rows by two vectors in
  parallel, the sum over k a register block of vector FMAs (a local accumulator the tile's k
  loop updates, written back once).
- window (depthwise convolution): planes in parallel, each plane's producer (padding) computed
  per plane; vectors along the output row, the taps unrolled around them.
- data movement (a transpose): tiles of a cache line of the read by a vector of the output in
  parallel, so that each tile reads whole lines and writes whole vectors; a shape that does not
  tile keeps the elementwise schedule, with no note (it is as good a default there).

A rule that does not fit (a ragged extent, a primitive TVM refuses) leaves the function to the
next one down, ending at the generic schedule; `schedule_by_structure` returns the rule taken
and, where one fell through, why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm_ffi
from tvm import s_tir, tirx

from deploy.schedules.cpu.elementwise import elementwise_cpu
from deploy.schedules.cpu.vectorize import parallel_outer
from deploy.schedules.loops import extent, work_of
from deploy.schedules.registry import ScheduleContext, register_schedule
from deploy.schedules.structure import Structure, anchor, block_infos, classify
from deploy.schedules.vector_math import F32, rewrite_calls

DOT_ROWS = 4
"""Output rows of a dot product's register block: DOT_ROWS x 2 vectors of accumulators (8 of
AVX2's 16 registers, 8 of NEON's 32), each k step 2 vector loads of b and DOT_ROWS broadcasts."""


class DoesNotFit(Exception):
    """A rule's structure does not fit the function (the reason names what)."""


class ElementwiseFits(DoesNotFit):
    """A rule does not fit, and the elementwise schedule is as good a default: no note."""


CACHE_LINE_BYTES = 64
"""A cache line on every CPU target: a transpose's tile reads this many bytes of each input row."""
SHORT_ROW_BYTES = 256
"""Output rows this short keep the elementwise schedule: its fused rows read each input line
again while it is in cache (NCHW to NHWC of 64 channels ran 1.2-1.5x slower in tiles, NCHW to
NCHW8c 1.1-1.4x; 112-float rows 3-4x faster in tiles; AVX2, 1 thread, loaded machine)."""


@dataclass(frozen=True)
class Taken:
    """The rule a function was scheduled by, and why a better-fitting one fell through (if one
    did)."""

    rule: str
    fell_through: str = ""

    @property
    def notes(self) -> tuple[str, ...]:
        """The line a build prints when a rule fell through (`registry.Report`)."""
        if not self.fell_through:
            return ()
        return (f"rule fell through to the generic schedule: {self.fell_through}",)


def inline_producers(sch: Any) -> None:
    """Inline every elementwise block but the output that has one consumer (a cast, a scale, a
    padding into a reduction's read); one with several (softmax's exp, read by the sum and the
    output) stays a stage, computed once."""
    for info in block_infos(sch)[:-1]:
        if info.structure is Structure.ELEMENTWISE and len(sch.get_consumers(info.block)) == 1:
            try:
                sch.compute_inline(info.block)
            except s_tir.ScheduleError:
                continue


def inlined_elementwise(sch: Any, ctx: ScheduleContext) -> None:
    """Cheap producers inlined, then the elementwise schedule: elementwise blocks in vectors,
    their outer loops in parallel; reductions parallel over their outputs."""
    inline_producers(sch)
    elementwise_cpu(sch, ctx)


def vector_split(sch: Any, loop: Any, lanes: int) -> Any | None:
    """`loop` split into vectors of `lanes` (the inner loop vectorized, returned), when its
    extent is whole vectors; None (left as is) otherwise."""
    size = extent(sch, loop)
    if lanes < 2 or size is None or size < lanes or size % lanes:
        return None
    _, inner = sch.split(loop, factors=[None, lanes])
    sch.vectorize(inner)
    return inner


FLT_MIN = 2.0**-126
"""Below this a float32 divisor's reciprocal may overflow (1 / b is +inf for |b| < 2**-128)."""


def reciprocal_divides(sch: Any, block: Any) -> None:
    """float32 `a / b` in `block` with `b` the same across its innermost axis (a row's sum) as
    `a * (1 / b)`: one divide a row and a multiply an element, where a vector divide costs
    several multiplies (layer_norm 1x128x768, AVX2, 1 thread: 0.036 -> 0.032 ms), within 2 ulp
    of the divide. The store branches on the row's divisors: where one is below FLT_MIN the
    row keeps its divides (a branch per vector that is the same all along the row). Exact ops
    keep their divides, and so does RVV: TVM's vectorizer fails on softmax's multiply there
    ("Cannot match type float32xvscalex4 vs float32xvscalex16")."""
    stmt = sch.get(block)
    inner = stmt.iter_vars[-1].var
    divisors: list[Any] = []

    def multiply(div: Any) -> Any:
        if str(div.ty) != F32 or any(v.same_as(inner) for v in tirx.analysis.undefined_vars(div.b)):
            return div
        divisors.append(div.b)
        return div.a * (tirx.const(1.0, F32) / div.b)

    def store(value: Any) -> Any:
        divisors.clear()
        fast = tvm_ffi.structural_map(value, [(tirx.Div, multiply)])
        if not divisors:
            return value
        tiny = [tirx.abs(b) < tirx.const(FLT_MIN, F32) for b in divisors]
        condition = functools.reduce(tirx.Or, tiny[1:], tiny[0])
        return tirx.IfThenElse(condition, value, fast)

    new = tvm_ffi.structural_map(stmt, [(tirx.BufferStore, store)])
    if not new.same_as(stmt):
        sch.state.replace(sch.get_sref(block), new, {stmt: new})


def rows(sch: Any, ctx: ScheduleContext) -> None:
    """Row reductions: see the module."""
    inline_producers(sch)
    infos = block_infos(sch)
    if not ctx.bound.exact and ctx.predicated_vectors:  # not RVV: its vectorizer fails on them
        for info in infos:
            if info.structure is Structure.ELEMENTWISE:
                reciprocal_divides(sch, info.block)
    lanes = ctx.lanes(str(sch.get(infos[-1].block).writes[0].source.dtype))
    vector_reductions = []
    for info in infos:
        if info.structure is Structure.ROW_REDUCTION:
            inner = sch.get_loops(info.block)[-1]
            size = extent(sch, inner)
            if lanes > 1 and size is not None and size >= 2 * lanes and size % lanes == 0:
                _, lane = sch.split(inner, factors=[None, lanes])
                vector_reductions.append(sch.rfactor(lane, factor_axis=len(info.spatial)))
        elif info.structure is not Structure.ELEMENTWISE:
            raise DoesNotFit(f"block {info.name} is a {info.structure.value}")
    output = infos[-1]
    loops = sch.get_loops(output.block)
    outer = loops[:-1] if output.structure is Structure.ELEMENTWISE else loops[: len(output.spatial)]
    if not outer:
        raise DoesNotFit("a single row: no rows to run in parallel")
    row = parallel_outer(sch, outer, work_of([extent(sch, loop) for loop in loops]))
    for block in reversed(sch.get_child_blocks(sch.get_sblock("root"))[:-1]):
        sch.compute_at(block, row)
    if output.structure is Structure.ELEMENTWISE:
        vector_split(sch, sch.get_loops(output.block)[-1], lanes)
    for block in sch.get_child_blocks(row)[:-1]:  # the stages (the output is done)
        inner = sch.get_loops(block)[1:]
        if inner and classify(sch.get(block))[0] is Structure.ELEMENTWISE:
            vector_split(sch, inner[-1], lanes)
    for rf in vector_reductions:
        lane, steps = sch.get_loops(rf)[-2:]  # compute_at made them in the order of its iterators
        sch.reorder(steps, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(rf, steps)


def outer_reduction(sch: Any, ctx: ScheduleContext) -> None:
    """A reduction along an outer axis: see the module."""
    inline_producers(sch)
    infos = block_infos(sch)
    reductions = [info for info in infos if info.structure is not Structure.ELEMENTWISE]
    if len(reductions) != 1 or len(infos) - infos.index(reductions[0]) > 2:
        raise DoesNotFit("more than one reduction, or more than one stage after it")
    (info,) = reductions
    lanes = ctx.lanes(str(sch.get(info.block).writes[0].source.dtype))
    loops = sch.get_loops(info.block)
    spatial, reduce = loops[: len(info.spatial)], loops[len(info.spatial) :]
    if len(spatial) < 2 or extent(sch, spatial[-1]) is None:
        raise DoesNotFit("no static contiguous axis to run in vectors")
    sch.reorder(*spatial[:-1], *reduce, spatial[-1])
    row = parallel_outer(sch, spatial[:-1], work_of([extent(sch, loop) for loop in loops]))
    vector_split(sch, sch.get_loops(info.block)[-1], lanes)
    sch.decompose_reduction(info.block, reduce[0])
    init = sch.get_child_blocks(row)[0]
    vector_split(sch, sch.get_loops(init)[-1], lanes)
    if info.block is not infos[-1].block:
        sch.reverse_compute_at(infos[-1].block, row)
        vector_split(sch, sch.get_loops(infos[-1].block)[-1], lanes)


def dot(sch: Any, ctx: ScheduleContext) -> None:
    """Dot products: see the module."""
    inline_producers(sch)
    infos = block_infos(sch)
    if len(infos) != 1:
        raise DoesNotFit(f"{len(infos)} blocks after inlining, not one dot product")
    (info,) = infos
    lanes = ctx.lanes(str(sch.get(info.block).writes[0].source.dtype))
    loops = sch.get_loops(info.block)
    if len(info.spatial) < 2 or len(info.reduce) != 1 or len(loops) != len(info.spatial) + 1:
        raise DoesNotFit("not [batch..., m, n] over one k")
    *batch, m, n, k = loops
    work = work_of([extent(sch, loop) for loop in loops])
    cols = 2 * lanes
    if lanes < 2 or (extent(sch, n) or 1) % cols or (extent(sch, m) or 1) % DOT_ROWS:
        raise DoesNotFit(f"n not whole {cols}-column tiles or m not whole {DOT_ROWS}-row tiles")
    m_tile, m_in = sch.split(m, factors=[None, DOT_ROWS])
    n_tile, n_in = sch.split(n, factors=[None, cols])
    sch.reorder(*batch, n_tile, m_tile, k, m_in, n_in)
    accumulators = sch.cache_write(info.block, 0, "local")
    sch.reverse_compute_at(accumulators, m_tile)
    _, lane = sch.split(n_in, factors=[None, lanes])
    sch.vectorize(lane)
    sch.unroll(m_in)
    vector_split(sch, sch.get_loops(accumulators)[-1], lanes)
    parallel_outer(sch, [*batch, n_tile, m_tile], work)  # before decompose: a complete block
    sch.decompose_reduction(info.block, k)  # the init copies the vector loop


def window(sch: Any, ctx: ScheduleContext) -> None:
    """Sliding windows: see the module."""
    infos = block_infos(sch)
    output = infos[-1]
    if output.structure is not Structure.WINDOW or any(
        info.structure is not Structure.ELEMENTWISE for info in infos[:-1]
    ):
        raise DoesNotFit("not elementwise stages into one window output")
    lanes = ctx.lanes(str(sch.get(output.block).writes[0].source.dtype))
    loops = sch.get_loops(output.block)
    spatial, taps = loops[: len(output.spatial)], loops[len(output.spatial) :]
    if len(spatial) < 3:
        raise DoesNotFit("fewer than 3 spatial axes: no plane and row")
    *planes, y, x = spatial
    size, work = extent(sch, x), work_of([extent(sch, loop) for loop in loops])
    if lanes < 2 or size is None or size % lanes:
        raise DoesNotFit(f"output rows of {size}: not whole vectors of {lanes}")
    x_out, x_in = sch.split(x, factors=[None, lanes])
    sch.reorder(*planes, y, x_out, *taps, x_in)
    plane = parallel_outer(sch, planes, work)
    for info in reversed(infos[:-1]):
        sch.compute_at(info.block, plane, preserve_unit_loops=True)
    sch.vectorize(x_in)
    for tap in taps:
        sch.unroll(tap)
    sch.decompose_reduction(output.block, taps[0])  # the init copies the vector loop


def transpose(sch: Any, ctx: ScheduleContext) -> None:
    """Data movement: see the module. transpose2d 1024x1024 float32, AVX2, 1 thread: 0.6 ms in
    tiles of 16x8 where the elementwise schedule's gathers took 3.6-5 ms (onnxruntime 1.1)."""
    inline_producers(sch)
    infos = block_infos(sch)
    if len(infos) != 1 or infos[0].along is None:
        raise ElementwiseFits("not one transposing block after inlining")
    (info,) = infos
    dtype = str(sch.get(info.block).writes[0].source.dtype)
    size = int("".join(filter(str.isdigit, dtype))) // 8
    lanes, line = ctx.lanes(dtype), max(1, CACHE_LINE_BYTES // size)
    loops = sch.get_loops(info.block)
    along, inner = loops[info.along], loops[-1]
    rows, cols, work = extent(sch, along), extent(sch, inner), work_of([extent(sch, loop) for loop in loops])
    if lanes < 2 or rows is None or cols is None or rows % line or cols % lanes:
        raise ElementwiseFits(f"{rows}x{cols} not whole {line}x{lanes} tiles")
    if cols * size <= SHORT_ROW_BYTES:
        raise ElementwiseFits(f"output rows of {cols * size} bytes: the elementwise schedule reuses lines")
    _, row = sch.split(along, factors=[None, line])
    _, lane = sch.split(inner, factors=[None, lanes])
    tiles = sch.get_loops(info.block)[:-1]
    tiles = [loop for loop in tiles if not sch.get(loop).same_as(sch.get(row))]
    sch.reorder(*tiles, row, lane)
    sch.vectorize(lane)
    sch.unroll(row)
    parallel_outer(sch, tiles, work)


RULES: dict[Structure, Callable[[Any, ScheduleContext], None]] = {
    Structure.DOT: dot,
    Structure.WINDOW: window,
    Structure.ROW_REDUCTION: rows,
    Structure.OUTER_REDUCTION: outer_reduction,
    Structure.DATA_MOVEMENT: transpose,
}
"""The rule of each structure but elementwise (the fallback of every rule)."""


@register_schedule("cpu")
def generic_cpu(sch: Any, ctx: ScheduleContext) -> Taken:
    """The cpu family's generic schedule (what an op without a hand schedule gets): by the
    structure of its function (`schedule_by_structure`); the rule taken, for the build's notes.
    A fused kernel keeps the elementwise schedule: the stages `fused.inline_into_last` left are
    there because inlining them (a pooling window into another's) explodes the expression, and
    the rules would try again."""
    if ctx.fused:
        elementwise_cpu(sch, ctx)
        return Taken(Structure.ELEMENTWISE.value)
    return schedule_by_structure(sch, ctx)


def schedule_by_structure(sch: Any, ctx: ScheduleContext) -> Taken:
    """Schedule `sch` by the structure of its costliest block (see the module): the rule taken,
    tried on a copy first, so a rule that does not fit leaves `sch` to the generic schedule."""
    rewrite_calls(sch, ctx)
    structure = anchor(block_infos(sch)).structure
    rule = RULES.get(structure)
    if rule is None:
        inlined_elementwise(sch, ctx)
        return Taken(structure.value)
    try:
        rule(sch.copy(), ctx)
    except ElementwiseFits:
        inlined_elementwise(sch, ctx)
        return Taken(Structure.ELEMENTWISE.value)
    except (DoesNotFit, s_tir.ScheduleError) as why:
        reason = str(why).splitlines()[0] if isinstance(why, DoesNotFit) else schedule_reason(why)
        inlined_elementwise(sch, ctx)
        return Taken("generic", f"{structure.value}: {reason}")
    rule(sch, ctx)
    return Taken(structure.value)


def schedule_reason(error: Exception) -> str:
    """TVM's reason for a refused primitive, in one line (its message's first line that says
    more than that an error occurred)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if "An error occurred" not in line and not line.startswith("Traceback")]
    return (said or lines or ["refused"])[-1][:200]
