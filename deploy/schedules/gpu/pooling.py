"""max_pool2d, max_pool3d and max_pool2d_indices on OpenCL, with the window max's NaN test as a
branch (`branch_max`; max_pool2d_indices takes its max so only over windows of more than
STAGED_MAX_TAPS taps, where the max is a stage of its own: `Pool.indices`).

Where a row's columns come in whole vectors (`RowVectors.of`), each work-item computes a vector of
outputs along W from the padded input rows its windows cover, loaded as vectors into registers
(`row_vector_max_pool`: on an H200, one output a work-item with 9 scalar half loads ran at 3.1x
the copy's time); elsewhere, and for max_pool2d_indices, one output per work-item
(`max_pool2d_gpu`)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

from deploy.ops.library.pooling import Pool, max_of, max_pool2d_indices_compute, max_pool_compute
from deploy.ops.nan import any_nan_bits, lowest
from deploy.schedules.gpu.generic import bind_work_items
from deploy.schedules.loops import blocks, extent, fused_or_unit
from deploy.schedules.registry import ScheduleContext, register_schedule


def branch_max(values: list[Any], dtype: str) -> Any:
    """TE expression: the max of float `values`, NaN when any is NaN, with the NaN test as an
    if-then-else: TVM writes the plain definition's Select as OpenCL `select(a, b, bool)`, which
    OpenCL C rejects as ambiguous for doubles."""
    from tvm import te, tirx

    nan = tirx.const(float("nan"), dtype)
    return tirx.if_then_else(any_nan_bits(values, dtype), nan, functools.reduce(te.max, values))


def max_pool_branch_max(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d or max_pool3d with its windows maxed by `branch_max`."""
    return max_pool_compute(ctx.bound.attrs, ctx.bound.output, x, window_max=branch_max)


def max_pool2d_indices_branch_max(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d_indices with its staged windows' max by `branch_max` (`Pool.indices`)."""
    return max_pool2d_indices_compute(ctx.bound.attrs, ctx.bound.output, x, window_max=branch_max)


@dataclass(frozen=True)
class RowVectors:
    """How a work-item of `row_vector_max_pool` reads its rows: it computes `lanes` outputs along W
    (W the innermost axis) and loads each row its windows cover as `vectors` vectors of `lanes`
    columns, the first from column lanes * stride * tile - `shift` (`shift`: the padding rounded up
    to whole vectors, so every vector starts at a multiple of `lanes`)."""

    lanes: int
    shift: int
    vectors: int

    @classmethod
    def of(
        cls, pool: Pool, shape: tuple[Any, ...], out: tuple[Any, ...], lanes: int, bits: int
    ) -> RowVectors | None:
        """The row vectors of `pool` over an input of `shape` to an output of `out` (spatial dims
        static), in vectors of `lanes` elements of `bits`. None unless W is innermost and whole
        vectors in both (a vector is wholly inside the input or in its padding, and a tile's
        outputs are one vector store), the vector is at least 2 lanes, every window is contiguous
        (no dilation, and along W at least as wide as its stride, so no vector loaded lies wholly
        between two windows) and a tile's rows for one row of outputs fit in `REGISTERS` (a
        window of 8x8 would take 256: a private array that spills, and one of 16x16 did not
        compile in 400 s)."""
        w = pool.spatial[-1]
        if lanes < 2 or w != len(shape) - 1:
            return None
        k, s, p = pool.kernel[-1], pool.stride[-1], pool.padding[-1]
        if any(d != 1 for d in pool.dilation) or k < s or shape[w] % lanes or out[w] % lanes:
            return None
        shift = lanes * math.ceil(p / lanes)
        last = shift - p + (lanes - 1) * s + k - 1  # the tile's last column, from its first vector's
        vectors = last // lanes + 1
        fits = math.prod(pool.kernel[:-1]) * row_registers(vectors, lanes, bits) <= REGISTERS
        return cls(lanes, shift, vectors) if fits else None


def row_registers(vectors: int, lanes: int, bits: int) -> int:
    """32-bit registers that a row of `vectors` vectors of `lanes` elements of `bits` takes."""
    return vectors * math.ceil(lanes * bits / 32)


OUTPUT_ROWS = "output rows a work-item"
"""The pick of a work-item's rows of outputs (along the axis before W): 1, 2 or 4, among those that
divide them and keep its input rows in `REGISTERS`; the most by default. On an H200, max_pool2d
k3 s2 p1 of 256x64x112x112 took 0.427, 0.368 and 0.338 ms in float32 at 1, 2 and 4 rows (the
copy of its bytes 0.306), 0.248, 0.228 and 0.217 in float16 stored as half (0.156). Tiles of
twice the lanes (`vload8`, `vload_half8`) took 1.7-1.9x as long (docs/performance.md)."""
REGISTERS = 128
"""32-bit registers a work-item's rows may take (a thread of an NVIDIA SM has up to 255; measured on
an H200 only: embedded GPUs such as Mali and Adreno lose occupancy past about 64, where fewer
rows may win, which a tuner searching `OUTPUT_ROWS` would find)."""


def row_vector_max_pool(ctx: ScheduleContext, x: Any) -> Any:
    """max_pool2d or max_pool3d as a vector of outputs along W per work-item where the rows come in
    whole vectors (`RowVectors.of`; else `max_pool_branch_max`), in two stages:

    - `row_vectors` (the output's shape with each window axis but W as long as its windows' padded
      extent, W in tiles of `lanes` outputs, then vectors x lanes): the padded input rows each tile
      reads, loaded a vector at a time; a vector in the padding (a whole one, W being whole vectors)
      or a row in it is the padding's value, -inf or the integer minimum, which never wins a max
      (every window holds an input element), under a condition uniform across the lanes.
    - `out`: each output the `branch_max` of its window's taps of that stage, at positions that
      are constants once the tile's outputs are unrolled (registers, not memory).

    A search may pick the one-output form instead (`row_vectors`)."""
    import tvm
    from tvm import te, tirx

    bound = ctx.bound
    pool, dtype = Pool.from_attrs(bound.attrs), str(x.dtype)
    shape, out = tuple(bound.inputs[0].shape), tuple(bound.output.shape)
    rows = RowVectors.of(pool, shape, out, ctx.lanes(dtype), tvm.DataType(dtype).bits)
    if rows is None or not ctx.choices.pick("row_vectors", (True, False), True):
        return max_pool_branch_max(ctx, x)
    *axes, w = pool.spatial
    lanes, s, p = rows.lanes, pool.stride[-1], pool.padding[-1]
    padded = {axis: (out[axis] - 1) * pool.stride[i] + pool.kernel[i] for i, axis in enumerate(axes)}
    pad = lowest(dtype)

    def first(tile: Any, vector: Any) -> Any:
        """The input column a tile's vector starts at: a multiple of lanes."""
        return tile * (lanes * s) - rows.shift + vector * lanes

    def load(*index: Any) -> Any:
        *at, vector, lane = index
        inside = []
        for i, axis in enumerate(axes):
            at[axis] = at[axis] - pool.padding[i]
            if pool.padding[i] > 0:
                inside.append(at[axis] >= 0)
            if padded[axis] - pool.padding[i] > shape[axis]:
                inside.append(at[axis] < shape[axis])
        start = first(at[w], vector)
        at[w] = start + lane
        if rows.shift > 0:
            inside.append(start >= 0)
        if first(out[w] // lanes - 1, rows.vectors - 1) >= shape[w]:  # the last tile's last vector
            inside.append(start < shape[w])
        value = x[tuple(at)]
        return tirx.if_then_else(functools.reduce(tirx.And, inside), value, pad) if inside else value

    stage_shape = [padded.get(axis, size) for axis, size in enumerate(out)]
    stage_shape[w] = out[w] // lanes
    stage = te.compute((*stage_shape, rows.vectors, lanes), load, name="row_vectors")

    def window(*index: Any) -> Any:
        taps = []
        for step in itertools.product(*(range(k) for k in pool.kernel)):
            at = list(index)
            for i, axis in enumerate(axes):
                at[axis] = index[axis] * pool.stride[i] + step[i]
            column = rows.shift - p + index[w] % lanes * s + step[-1]
            at[w] = index[w] // lanes
            taps.append(stage[(*at, column // lanes, column % lanes)])
        return max_of(taps, dtype, branch_max)

    return te.compute(out, window, name="out")


@register_schedule("gpu", "max_pool3d", compute=row_vector_max_pool)
@register_schedule("gpu", "max_pool2d", compute=row_vector_max_pool)
def row_vector_pool_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """`row_vector_max_pool`'s two stages in one kernel: the output (a fused group's last block)
    in tiles of `lanes` along W (by `OUTPUT_ROWS` rows where the rows divide), a work-item each,
    whose rows (`row_vectors`) are loaded a vector at a time into registers, its outputs computed
    unrolled into registers and stored a vector a row. The one-output form gets
    `max_pool2d_gpu` (as would a stage that a fused group's producers left beside the two, each
    stage a kernel of its own)."""
    stages = blocks(sch)
    if len(stages) != 2 or sch.get(stages[0]).name_hint != "row_vectors":
        max_pool2d_gpu(sch, ctx)
        return
    stage, last = stages
    lanes = extent(sch, sch.get_loops(stage)[-1]) or 1
    store = sch.cache_write(last, 0, "local")
    *leading, h, w = sch.get_loops(store)
    tile, within = sch.split(w, factors=[None, lanes])
    vectors = extent(sch, sch.get_loops(stage)[-2]) or 1
    per_row = row_registers(vectors, lanes, sch.get(stage).writes[0].source.dtype.bits)
    rows = output_rows(ctx, extent(sch, h) or 1, per_row)
    outer, inner = sch.split(h, factors=[None, rows])
    sch.reorder(outer, tile, inner, within)
    fused = fused_or_unit(sch, [*leading, outer, tile], store)
    groups, items = sch.split(fused, factors=[None, ctx.threads])
    sch.bind(groups, "blockIdx.x")
    sch.bind(items, "threadIdx.x")
    sch.vectorize(within)
    sch.unroll(inner)
    sch.compute_at(last, items)
    sch.compute_at(stage, items)
    sch.set_scope(stage, 0, "local")
    for loop in sch.get_loops(last)[2:]:
        sch.unroll(loop)
    *outer_loops, lane = sch.get_loops(stage)[2:]
    sch.vectorize(lane)
    for loop in outer_loops:
        sch.unroll(loop)


def output_rows(ctx: ScheduleContext, height: int, per_row: int) -> int:
    """A work-item's rows of outputs (`OUTPUT_ROWS`) along an axis `height` long, the one before W
    (the pool's H, unless a fused group's last block has other loops: a reshape after the pool),
    each input row it reads taking `per_row` registers."""
    pool = Pool.from_attrs(ctx.bound.attrs)
    *above, (k, s) = zip(pool.kernel[:-1], pool.stride[:-1], strict=True)
    plane = math.prod(k for k, _ in above) * per_row  # a row's registers times the rows above H's
    fitting = [n for n in (1, 2, 4) if height % n == 0 and ((n - 1) * s + k) * plane <= REGISTERS]
    return ctx.choices.pick(OUTPUT_ROWS, tuple(fitting), fitting[-1]) if len(fitting) > 1 else 1


@register_schedule("gpu", "max_pool2d_indices", compute=max_pool2d_indices_branch_max)
def max_pool2d_gpu(sch: Any, ctx: ScheduleContext) -> None:
    """One output (a max, or where it is) per work-item: TVM does not vectorize a staged window
    max's NaN branch, and a vector of outputs would run as a loop of them in one work-item."""
    bind_work_items(sch, ctx, vectorize=False)
