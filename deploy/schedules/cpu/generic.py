"""The generic CPU schedule, what an op gets on every CPU target when no family has a schedule of its
own for it: chosen by structure (`deploy.schedules.structure`), for an op without a
hand schedule: one rule per structure of the function's costliest block, after its float32
exp, erf, sigmoid and tanh become vector polynomials (`deploy.schedules.vector_math`) and its
cheap producers are inlined into their one consumer.

- elementwise: today's generic (`elementwise.py`) for each block.
- row reduction (softmax, norms): rows in parallel, a step a block of rows (ROW_BLOCK) with
  each stage run over the block before the next; every stage computed inside the step while
  its rows are in cache; each reduction over the row in ROW_ACCUMULATORS
  (WIDE_ROW_ACCUMULATORS on AVX-512) vectors of lanes (`rfactor`), the lanes combined in halves
  at its end (`halves`); the elementwise stages in vectors. A sum over a plane's rows and
  columns is one row of its elements (`joined_reduction`), and so is an output row of them. A
  row that is not whole vectors runs its whole ones, then one with the lanes past the row masked
  off (`masked_rest`), or where the target masks no lanes, vectors of the widest fraction of a
  vector that divides it (`row_lanes`).
- outer reduction (a mean over channels): the reduction loop outside the contiguous spatial
  loop, which runs in vectors; rows of the output in parallel.
- dot product (matmul, batched matmul, 1x1 convolution): re-indexed [batch..., m, n, k] by
  which operand is read along which output axes (n: the vectors, a 1x1 convolution's pixels);
  output tiles of DOT_ROWS rows (WIDE_ROWS on AVX-512) by three vectors in parallel (an m of up
  to 6 rows one tile, m = 1 streamed along b's rows), the sum over k a register block of vector
  FMAs kept in registers across k; a long k in blocks, each block's panel of b copied contiguous
  first (K_BLOCK); a b past the cache copied a block of its columns at a time (PACKED_BYTES). A
  ragged n ends in a vector tile and a scalar one; an m that is not whole tiles (ragged, or
  symbolic) is padded up to them (`pad_rows`); a 1x1 convolution's images loop as a batch
  (`dot_axes`). A b read along k (a Linear layer's w[n, k], attention's k^T) is copied
  transposed first for the tiles (`transpose_b`); a few rows by it sum each output in vectors
  along k instead (`along_k`). Elementwise stages after the sums (a bias) run after them
  (`stages_after`).
- window (depthwise and grouped convolutions): planes in parallel, each plane's producer
  (padding) computed per plane; vectors along the output row (its whole vectors, then its rest
  as one vector of that length: `window`), the taps unrolled around them; where the sum is over
  input channels too, WINDOW_CHANNELS output channels share each load. Elementwise stages after
  the sums (a bias, a ReLU) run at the output row (`row_stages`).
- data movement (a transpose): tiles of a cache line of the read by a vector of the output in
  parallel, so that each tile reads whole lines and writes whole vectors; where one side is a
  few elements (an image's 3 channels), whole vectors along the other side, interleaved or
  deinterleaved by shuffles (`interleaved_rows`, `deinterleaved_columns`); a shape that does
  not tile keeps the elementwise schedule, with no note (it is as good a default there).

A rule that does not fit (a ragged extent, a primitive TVM refuses) leaves the function to the
next one down, ending at the generic schedule; `schedule_by_structure` returns the rule taken
and, where one fell through, why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm.sym.analyzer
import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx import IndexMap

from deploy.schedules.cpu.elementwise import elementwise_cpu
from deploy.schedules.cpu.vectorize import parallel_if_worth, parallel_outer, partition, vectorize_parallelize
from deploy.schedules.loops import extent, mentions, static, work_of
from deploy.schedules.registry import ScheduleContext, register_schedule
from deploy.schedules.structure import (
    BlockInfo,
    Structure,
    anchor,
    block_infos,
    channel_sum,
    classify,
    dot_axes,
    loads,
    transposed_read,
)
from deploy.schedules.vector_math import (
    LANES_KEY,
    ask_reciprocal_divides,
    ask_vector_math,
    shifted_by_row_max,
)

DOT_ROWS, DOT_VECTORS, ACCUMULATORS, FEW_ROWS = 4, 3, 12, 6
"""A dot product's register block: DOT_ROWS x DOT_VECTORS vectors of accumulators (12 of AVX2's
16 registers with the 3 vectors of b and a broadcast, 16 of NEON's 32), each k step 12 FMAs for
DOT_VECTORS vector loads of b and DOT_ROWS broadcasts (4x2 did 8 for 6 loads: matmul
128x768x768, AVX2, 1 thread, 1.8-2.0 ms against 1.6-1.8 ms). An m of 2 to FEW_ROWS rows is one
tile (b read once), as many vectors wide as ACCUMULATORS allows, where b stays in cache
(PACK_FROM_BYTES); a larger b is streamed as a matrix-vector product's is (GEMV_CHUNK)."""

WIDE_ROWS, WIDE_VECTOR_BITS = 8, 512
"""Rows of a dot product's tile where the target's vectors are WIDE_VECTOR_BITS wide (AVX-512: 32
vector registers, twice AVX2's) and m is whole tiles of them: 8 x DOT_VECTORS, 24 accumulators.
AMD Zen 5, x86-avx512, 1 thread, against tiles of 4 rows: batch_matmul 12x128x64 by 12x64x128
0.118 -> 0.103 ms (onnxruntime 0.110), matmul 128x768x768 0.636 -> 0.611, 1x1 conv 1x64x56x56 by
128x64x1x1 0.214 -> 0.206 (6 rows by 4 vectors were slower: 0.126, 0.643, 0.426). An m that is not
whole tiles of 8 keeps tiles of DOT_ROWS: padded to 8, it would compute up to 7 rows for nothing."""

K_BLOCK = 128, 256
"""The sum over a long k (more than the larger) runs in blocks of the largest divisor of k in
this range, the blocks outside the tiles of m, each block's panel of b (256 x 24 floats, 24 KiB)
copied into a buffer of its own that stays in L1 while every tile of m reads it (matmul
128x768x768, AVX2, 1 thread, loaded machine: 1.6-1.8 ms unblocked, 1.40-1.51 ms blocked and
copied, numpy's 1.5-1.6). Only where the tiles of n and the batch give every core one (the
loops left to run in parallel) and n is whole tiles (a part of n after `loop_partition` reads
all its columns as one region, which the copy would take whole)."""

PACKED_BYTES, PACK_FROM_BYTES = 64 * 1024, 1024 * 1024
"""Where k needs no blocks (K_BLOCK) and b, every batch's, is more than PACK_FROM_BYTES (twice a
core's L2: it does not stay in cache from one call to the next; a symbolic batch counts as 1,
as in `work_of`), n's tiles run in blocks of at most PACKED_BYTES of b (k x the block's
columns), the batch and the blocks in parallel (m's tiles inside them), each block of b copied
first into a buffer of its own that the block's tiles then read from L2. Read in place, a tile's
panel of b (k rows of 96 bytes, a row of b apart) came from memory a line at a time from as many
rows, more streams than the hardware prefetchers follow; the copy reads whole rows of the block.
AVX2, 1 thread, medians against onnxruntime: 1x1 conv 2x64x56x56 by 128x64 1.70-1.72x -> 1.09-1.20x,
matmul 128x256 @ 256x3072 1.31x -> 1.07x. A b that stays in cache (1x64x56x56: 784 KiB) ran
10-20% slower copied. A copy is what b's read covers over a block: a 1x1 convolution's whole
image rows (56 columns), up to 40% more than the block's columns; blocks too few for the cores,
or whose copy would be more than 1.5 x PACKED_BYTES (a stride-2 1x1 convolution's: every other
row and column of what it spans unread), read b in place."""

GEMV_CHUNK, GEMV_STEPS = 64, 4
"""A matrix-vector product (m = 1) streams b along its rows: chunks of at most GEMV_CHUNK
vectors of the output in parallel, each updated by GEMV_STEPS rows of b at a time (a tile of
columns down all of k instead jumped a row of b every 256 bytes, which the prefetchers do not
follow: 1.26x onnxruntime's time for 1x768 @ 768x3072, against 0.7-0.9x streamed). So does an
m of 2 to FEW_ROWS rows whose b does not stay in cache, each vector of b loaded once for all the
rows (AVX2, 1 thread, @ 768x3072: 2 rows 1.17 -> 0.3-0.45 ms, 4 rows 1.93 -> 0.4-0.55, 6 rows
3.67 -> 0.64-0.80; onnxruntime with b a constant it packs ahead: 0.32, 0.49, 0.75)."""

ALONG_K_SUMS = 8
"""Vector sums side by side in a step of a few rows by a b read along k (`along_k`: a Linear
layer's weight as PyTorch keeps it, w[n, k]), outputs of n times m's rows. AVX-512, 1 thread,
a[m, 768] @ w[3072, 768]^T against onnxruntime's Gemm with transB and w a constant (0.085 ms
for 1 row, 0.091 for 4): 1 row in steps of 3, 8 and 12 outputs 0.093, 0.083 and 0.110 ms; 2
rows in steps of 2, 4 and 6 0.102, 0.092, 0.094; 4 rows of 2 and 3 0.107 and 0.132-0.144; 6
rows of 2 0.166-0.200. Before, streamed with the vectors along n gathered a row of w apart: 0.61
ms for 1 row, 0.63 for 4; copied transposed first (`transpose_b`) 0.89-0.95 ms, the copy all
of w each call."""

WINDOW_CHANNELS = 8
"""Output channels of a window's register block when its reduction sums input channels too (a
grouped convolution): 8 vector accumulators, each tap one load of the input's vector and 8
broadcasts of weights."""


ROW_ACCUMULATORS, WIDE_ROW_ACCUMULATORS = 2, 1
"""Vectors a row's sum or max accumulates in side by side, where the row is whole pairs: the
adds of one accumulator wait for each other (4 cycles each on AVX2 and NEON). Two made
layer_norm 1x128x768 1.5x faster; four made it faster still, but softmax 1x12x128x128 (rows of
16 vectors) 10% slower. Where vectors are WIDE_VECTOR_BITS wide, one (a search tries both:
ROW_VECTORS_SIDE_BY_SIDE): AVX-512 on Zen 5, 1 thread, against onnxruntime, two -> one: softmax
1x12x128x128 1.12x -> 0.90x, log_softmax 1.01x -> 0.82x, softmax over rows of 64 and 512 1.23x
-> 0.95x and 0.94x -> 0.89x, layer_norm over rows of 256, 768 and 1024 the same or faster; only
layer_norm over rows of 2048 slower (0.27x -> 0.32x). Our reading: the second accumulator adds
a halving step a row (`halves`) to break a chain that vectors twice as wide make half as long."""

ROW_VECTORS_SIDE_BY_SIDE = "row vectors side by side"
"""The pick of ROW_ACCUMULATORS or WIDE_ROW_ACCUMULATORS (each is an option)."""


ROW_BLOCK, ROW_BLOCK_BYTES, ROW_BLOCK_STEPS = 8, 32 * 1024, 4
"""A step of the row loop takes up to ROW_BLOCK rows (of at most ROW_BLOCK_BYTES together, in L1
with their stages) and runs each stage over all of them before the next: a row's stages depend
on each other through a horizontal combine and a scalar (softmax's 1 / sum, log_softmax's log),
a chain the next row's work hid only a block away. AVX2, 1 thread, loaded machine, min of 41
interleaved rounds against onnxruntime: softmax 1x12x128x128 1.11x -> 1.01x, log_softmax
1.34x -> 1.14x, layer_norm 1x128x768 0.44x -> 0.33x. Each core keeps ROW_BLOCK_STEPS steps."""


ROWS_A_STEP = "rows a step"
"""The pick of a row reduction's block of rows (`row_blocks`): the default is `row_block`'s."""


class DoesNotFit(Exception):
    """A rule's structure does not fit the function (the reason names what)."""


class ElementwiseFits(DoesNotFit):
    """A rule does not fit, and the elementwise schedule is as good a default: no note."""


CACHE_LINE_BYTES = 64
"""A cache line on every CPU target: a transpose's tile reads this many bytes of each input row."""
SHORT_ROW_BYTES = 256
"""Output rows this short, unless one vector each, keep the elementwise schedule: its fused rows
read each input line again while it is in cache (NCHW to NHWC of 64 channels ran 1.2-1.5x slower
in tiles, 13x on an Intel Xeon VM; 112-float rows 3-4x faster in tiles; AVX2, 1 thread). A row
of one vector (a packed layout's few channels, `transpose`) is a tile's whole write: NCHW to
NCHW8c of 32x64x112x112 float32 in tiles, against the elementwise schedule's gathers, Intel
Xeon VM, 1 / 2 threads: x86 (AVX2) 9.9 / 5.4 ms against 12.2 / 7.1, x86-avx512 (8-lane
vectors) 10.1 / 5.3 against 20.8 / 11.3 (16 lanes across two pixels); NCHW4c 1.6-1.8x faster.
An older measurement of NCHW8c on a loaded AMD VM had tiles 1.1-1.4x slower."""


@dataclass(frozen=True)
class Taken:
    """The rule a function was scheduled by, and why a better-fitting one fell through (if one
    did)."""

    rule: str
    fell_through: str = ""
    at_one: str = ""
    """A symbolic dim (its name) whose size 1 gets a kernel of its own: a dot product's m, whose
    tiles pad one row to DOT_ROWS and read b's panels in place, where one row streams b."""
    few_rows: int = 0
    """Sizes 2 to this of `at_one` get one each too (0: none): a dot product's few rows by a b
    past the cache, streamed (GEMV_CHUNK), their rows unrolled."""

    @property
    def notes(self) -> tuple[str, ...]:
        """The line a build prints when a rule fell through (`registry.Report`)."""
        if not self.fell_through:
            return ()
        return (f"rule fell through to the generic schedule: {self.fell_through}",)


INLINED_LOADS = 16
"""The most loads an elementwise producer's copies may make where its consumer reads it at more
than one place: a map repeated (an add read twice, 4), not a window (25 taps read 24 times)."""


def inline_producers(sch: Any, among: list[BlockInfo] | None = None) -> list[BlockInfo]:
    """Inline every elementwise block but the output (or of those `among` it) that has one
    consumer (a cast, a scale, a padding into a reduction's read); one with several (softmax's
    exp, read by the sum and the output) stays a stage, computed once, and so does one whose
    copies would load more than INLINED_LOADS elements (a window's max that each tap of a search
    for it compares with: inlined, 25 taps took 30 s to compile). The blocks inlined."""
    inlined = []
    for info in block_infos(sch)[:-1] if among is None else among:
        consumers = sch.get_consumers(info.block)
        if info.structure is Structure.ELEMENTWISE and len(consumers) == 1:
            written = sch.get(info.block).writes[0].source
            copies = sum(load.source.same_as(written) for load in loads(sch.get(consumers[0]).body))
            if copies > 1 and copies * len(loads(sch.get(info.block).body)) > INLINED_LOADS:
                continue
            try:
                sch.compute_inline(info.block)
            except s_tir.ScheduleError:
                continue
            inlined.append(info)
    return inlined


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


def row_lanes(lanes: int, size: int | None) -> int:
    """Lanes of the vectors along a row of `size` elements that `masked_rest` leaves: the
    target's `lanes`, else the widest half, quarter... of them that divides the row, else
    `lanes` (a row that is no whole vectors, left scalar)."""
    if size is None:
        return lanes
    fits = [lanes >> i for i in range(lanes.bit_length()) if lanes >> i >= 2 and size % (lanes >> i) == 0]
    return fits[0] if fits else lanes


def in_vectors(ctx: ScheduleContext, width: int, lanes: int) -> bool:
    """Whether a row reduction runs in `width` lanes side by side (vectors of `lanes`). Not on
    RVV in one vector (rows of 4, 12 or 20 floats: no whole pairs of vectors of 4), which stays
    scalar: log_softmax over rows of 20 failed to build there, TVM's vector-length-agnostic
    rewrite assigning the sum's vector of exp polynomials to one element (`MatchType` in its
    dtype legalizer); in two vectors (rows of 16, 24) it builds and runs."""
    return width > lanes or ctx.predicated_vectors


def masked_rest(ctx: ScheduleContext, lanes: int, size: int | None) -> bool:
    """Whether a row of `size` elements that is not whole vectors of `lanes` runs its whole
    vectors, then the rest in one vector with the lanes past the row masked off (LANES_KEY):
    where the target masks lanes (not RVV) and the row is at least two vectors. A classifier's
    rows of 1000 floats on AVX-512, 1 thread, against onnxruntime: left scalar, softmax 8x1000
    2.87x and 64x1000 5.54x; in vectors of 8 (`row_lanes`) 0.85x and 1.43x; so, 0.51x and 0.86x
    (64 rows of 1024 take 0.86x)."""
    return ctx.predicated_vectors and size is not None and size % lanes != 0 and size >= 2 * lanes


def vector_reduction(sch: Any, block: Any, size: int, width: int, axis: int) -> list[tuple[Any, int, int]]:
    """`block`'s reduction along its row of `size` elements in `width` lanes side by side
    (`rfactor` at `axis`), the lanes then combined in `halves`: each rfactor block with its whole
    steps and the lanes of a last step past them that are in the row (0: none)."""
    _, lane = sch.split(sch.get_loops(block)[-1], factors=[None, width])  # the last step's test:
    rf = sch.rfactor(lane, factor_axis=axis)  # compute_at drops it, LANES_KEY puts it back
    steps = [(step, 0, 0) for step in halves(sch, block, axis)]
    return [(rf, size // width, size % width), *steps]


def row_vectors(sch: Any, ctx: ScheduleContext, loop: Any, lanes: int) -> None:
    """An elementwise stage's `loop` along the row in vectors: of `lanes` where the row is whole
    ones; its whole vectors then the rest as one vector of that length where the reductions mask
    theirs (`masked_rest`); else in `row_lanes`."""
    size = extent(sch, loop)
    if size is not None and masked_rest(ctx, lanes, size):
        vectors, rest = partition(sch, loop, size - size % lanes, size - size % lanes)
        vector_split(sch, vectors, lanes)
        sch.vectorize(rest)
        return
    vector_split(sch, loop, row_lanes(lanes, size))


def rows(sch: Any, ctx: ScheduleContext) -> None:
    """Row reductions: see the module."""
    inline_producers(sch)
    infos = block_infos(sch)
    lanes = ctx.lanes(str(sch.get(infos[-1].block).writes[0].source.dtype))
    accumulators = (ROW_ACCUMULATORS, WIDE_ROW_ACCUMULATORS)[ctx.vector_bits >= WIDE_VECTOR_BITS]
    vector_reductions: list[tuple[Any, int, int]] = []  # (rfactor block, whole steps, lanes after)
    kept = min((row_axes(sch, i) for i in infos if i.structure is Structure.ROW_REDUCTION), default=0)
    for info in infos:
        if info.structure is Structure.ROW_REDUCTION:
            joined_reduction(sch, info)
            inner = sch.get_loops(info.block)[-1]
            size = extent(sch, inner)
            masked = masked_rest(ctx, lanes, size)
            along = lanes if masked else row_lanes(lanes, size)
            if along > 1 and size is not None and (masked or size % along == 0) and size >= 2 * along:
                side_by_side = ctx.choices.pick(
                    ROW_VECTORS_SIDE_BY_SIDE, (ROW_ACCUMULATORS, WIDE_ROW_ACCUMULATORS), accumulators
                )
                width = max(
                    along * n
                    for n in range(1, side_by_side + 1)
                    if (masked or size % (along * n) == 0) and size >= 2 * along * n
                )
                if in_vectors(ctx, width, along):
                    vector_reductions += vector_reduction(sch, info.block, size, width, len(info.spatial))
        elif info.structure is not Structure.ELEMENTWISE:
            raise DoesNotFit(f"block {info.name} is a {info.structure.value}")
    output = infos[-1]
    loops = sch.get_loops(output.block)
    # an output row of several axes (an instance norm's plane: the axes past its sums'): one loop
    if output.structure is Structure.ELEMENTWISE and len(loops) - 1 > kept:
        loops = [*loops[:kept], sch.fuse(*loops[kept:])]
    outer = loops[:-1] if output.structure is Structure.ELEMENTWISE else loops[: len(output.spatial)]
    if not outer:
        raise DoesNotFit("a single row (the sums are of the whole output): no rows to run in parallel")
    work = work_of([extent(sch, loop) for loop in loops])
    rows_of = (
        extent(sch, outer[-1]),
        work_of([extent(sch, loop) for loop in outer]),
        row_bytes(
            sch, output.block, extent(sch, loops[-1]) if output.structure is Structure.ELEMENTWISE else None
        ),
    )
    row = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    block_rows = ctx.choices.pick(
        ROWS_A_STEP, row_blocks(*rows_of, ctx.cores), row_block(*rows_of, ctx.cores)
    )
    if block_rows > 1:
        row, _ = sch.split(row, factors=[None, block_rows])
    parallel_if_worth(sch, row, work)
    for block in reversed(sch.get_child_blocks(sch.get_sblock("root"))[:-1]):
        sch.compute_at(block, row)
    if block_rows > 1:
        for block in sch.get_child_blocks(row):
            rows_first(sch, block, row, len(outer) - 1)
    if output.structure is Structure.ELEMENTWISE:
        row_vectors(sch, ctx, sch.get_loops(output.block)[-1], lanes)
    for block in sch.get_child_blocks(row)[:-1]:  # the stages (the output is done)
        inner = sch.get_loops(block)[1:]
        if inner and classify(sch.get(block))[0] is Structure.ELEMENTWISE:
            row_vectors(sch, ctx, inner[-1], lanes)
    for rf, whole, rest in vector_reductions:
        lane, steps = sch.get_loops(rf)[-2:]  # compute_at made them in the order of its iterators
        sch.reorder(steps, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(rf, steps)
        if rest:  # the whole vectors, then one with only `rest` lanes in the row
            (last,) = sch.get_child_blocks(partition(sch, steps, whole, whole)[-1])
            sch.annotate(sch.get_loops(last)[-1], LANES_KEY, rest)
    if not ctx.bound.exact and ctx.predicated_vectors:  # not RVV: its vectorizer fails on them
        ask_reciprocal_divides(sch, row)  # the step, outermost of every block


def joined_reduction(sch: Any, info: BlockInfo) -> None:
    """A row reduction over several axes of static extents that every read of them has as its
    trailing dims, in order and whole (a global average pool's rows and columns, x[n, c, i, j];
    not x[n, c, i + 1, j], a crop, nor a weight s[j]), summed as one row of their elements: its
    loops (the block's last, in that order) fused. Each loop alone was too short for the vectors
    (14 columns), and the rule's vector reduction split the wrong loop: a global average pool of
    1x256x14x14 fell to the generic schedule."""
    stmt = sch.get(info.block)
    reduce = [iv for iv in stmt.iter_vars if any(iv.var.same_as(v) for v in info.reduce)]
    loops = sch.get_loops(info.block)[-len(reduce) :]
    sizes = [extent(sch, loop) for loop in loops]
    if len(reduce) < 2 or None in sizes or sizes != [static(iv.dom.extent) for iv in reduce]:
        return
    for read in stmt.reads:
        index = [r.min for r in read.region]
        if not any(mentions(i, v) for i in index for v in info.reduce):
            continue
        if (
            len(index) < len(reduce)
            or any(mentions(i, v) for i in index[: -len(reduce)] for v in info.reduce)
            or not all(i.same_as(iv.var) for i, iv in zip(index[-len(reduce) :], reduce, strict=True))
            or [static(d) for d in read.source.shape[-len(reduce) + 1 :]] != sizes[1:]
        ):
            return
    sch.fuse(*loops)


def row_axes(sch: Any, info: BlockInfo) -> int:
    """The axes a reduction's rows run over: its spatial axes but trailing ones of extent 1
    (sums kept as (n, c, 1, 1), as numpy's and ONNX's keepdims keep them)."""
    variables = sch.get(info.block).iter_vars
    spatial = [static(iv.dom.extent) for iv in variables if any(iv.var.same_as(v) for v in info.spatial)]
    while spatial and spatial[-1] == 1:
        spatial.pop()
    return len(spatial)


def row_block(last: int | None, rows: int, row_bytes: int, cores: int) -> int:
    """Rows a step of the row loop runs each stage over, one stage after the other: the largest
    divisor of the innermost row extent `last` (a block never straddles an outer index) up to
    ROW_BLOCK whose rows fit ROW_BLOCK_BYTES, leaving each of `cores` ROW_BLOCK_STEPS steps of
    the `rows` (1: a row a step)."""
    fits = [
        n
        for n in row_blocks(last, rows, row_bytes, cores)
        if n <= ROW_BLOCK and n * row_bytes <= ROW_BLOCK_BYTES
    ]
    return max(n for n in (1, *fits) if n == 1 or rows // n >= ROW_BLOCK_STEPS * cores)


def row_blocks(last: int | None, rows: int, row_bytes: int, cores: int) -> tuple[int, ...]:
    """The blocks of rows a search tries (ROWS_A_STEP): each power of two up to 2 ROW_BLOCK that
    divides the innermost row extent `last`, fits 2 ROW_BLOCK_BYTES and leaves each of `cores` a
    step of the `rows`."""
    if last is None:
        return (1,)
    powers = [2**i for i in range(1, (2 * ROW_BLOCK).bit_length())]
    fits = [n for n in powers if last % n == 0 and rows // n >= cores]
    return (1, *[n for n in fits if n * row_bytes <= 2 * ROW_BLOCK_BYTES])


def row_bytes(sch: Any, block: Any, elements: int | None = None) -> int:
    """Bytes of one row of `block`'s output (its last axis, or a row of `elements`; past any
    block for a symbolic one)."""
    buffer = sch.get(block).writes[0].source
    elements = static(buffer.shape[-1]) if elements is None else elements
    return elements * buffer.dtype.bits // 8 if elements is not None else 2 * ROW_BLOCK_BYTES + 1


def rows_first(sch: Any, block: Any, row: Any, axis: int) -> None:
    """`block`, computed at the step `row` of a block of rows, loops over those rows outermost
    (compute_at put their loop where its iterator is, after the reduction's lanes): the loop
    bound to the index of its write's row `axis` (the innermost row axis)."""
    outer = sch.get(row).loop_var
    loops = sch.get_loops(block)
    inner = loops[[sch.get(loop).loop_var.same_as(outer) for loop in loops].index(True) + 1 :]
    realize = sch.get(inner[-1]).body
    index = sch.get(block).writes[0].region[axis].min
    bound = [
        value
        for var, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
        if mentions(index, var.var)
    ]
    found = [loop for loop in inner if any(mentions(value, sch.get(loop).loop_var) for value in bound)]
    if len(found) != 1:
        raise DoesNotFit(f"block {sch.get(block).name_hint}: no one loop over the block of rows")
    over_rows = sch.get(found[0]).loop_var
    sch.reorder(found[0], *[loop for loop in inner if not sch.get(loop).loop_var.same_as(over_rows)])


def halves(sch: Any, block: Any, axis: int) -> list[Any]:
    """The lanes `block` reduces combined in halves (16 -> 8 -> 4 -> 2, each step a block that
    is one vector operation a row) rather than one after another: a chain of 16 dependent adds
    or maxes took 64 cycles a row, as long as all of softmax's row at onnxruntime's speed. The
    last two combine in `block`; the steps, to be vectorized like the lanes, are returned."""
    steps = []
    while (size := extent(sch, sch.get_loops(block)[-1])) is not None and size >= 4 and size % 2 == 0:
        _, half = sch.split(sch.get_loops(block)[-1], factors=[2, None])
        steps.append(sch.rfactor(half, factor_axis=axis))
    return steps


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


@dataclass(frozen=True)
class AtRunTime:
    """A symbolic dim whose small sizes get kernels of their own (`Taken.at_one`, `few_rows`)."""

    symbol: str
    few_rows: int = 0


def dot(sch: Any, ctx: ScheduleContext) -> AtRunTime | None:
    """Dot products: see the module. Returns m's symbol where m is one symbolic dim, with the few
    rows that stream where b is past the cache (`Taken.at_one`, `few_rows`): the build schedules
    each of those sizes again, static.

    Elementwise stages after the sums (a Linear layer's bias) run after them: `stages_after`."""
    inline_producers(sch)
    info, *after = block_infos(sch)
    if info.structure is not Structure.DOT:
        raise DoesNotFit(f"block {info.name} is a {info.structure.value}, not the sums of a dot product")
    for stage in after:
        if stage.structure is not Structure.ELEMENTWISE:
            raise DoesNotFit(
                f"block {stage.name} after the sums is a {stage.structure.value}, not elementwise"
            )
    at_run_time = dot_product(sch, ctx, info)
    stages_after(sch, ctx, after)
    return at_run_time


def stages_after(sch: Any, ctx: ScheduleContext, after: list[BlockInfo]) -> None:
    """The elementwise stages `after` a dot product's or a window's sums (a bias, an activation:
    consumers TVM cannot inline into a reduction) that do not run at a window's row
    (`row_stages`), or stages a window's sums do not read: each a pass of its own over what it
    reads, in the elementwise schedule. x86-avx512, 1 / 2 threads: x[128, 768] @ w[768,
    768]^T + b 91 / 52 ms in the generic schedule (where every such op fell), 1.14 / 0.72 so
    (onnxruntime's Gemm with the bias 1.05 / 0.92); depthwise 3x3 of 1x32x112x112 with a bias
    and a ReLU 2.20 / 1.12, 0.29 / 0.14 so (before `row_stages`), 0.17 / 0.07 without them."""
    for stage in after:
        stmt = sch.get(stage.block)
        # loops of its own: a symbolic m's branches (`branched_by_size`) share the function's
        # loop variables, each at its own extent there
        if stmt.iter_vars:
            index = str(stmt.iter_vars[0].var.ty)
            sch.transform_block_layout(
                stage.block, IndexMap.from_func(lambda *v: v, ndim=len(stmt.iter_vars), index_dtype=index)
            )
        dtype = str(stmt.writes[0].source.dtype)
        vectorize_parallelize(sch, stage.block, ctx.lanes(dtype), ctx.cores, ctx.choices)


def dot_product(sch: Any, ctx: ScheduleContext, info: BlockInfo) -> AtRunTime | None:
    """The sum block `info` of a dot product, scheduled: see `dot`."""
    lanes = ctx.lanes(str(sch.get(info.block).writes[0].source.dtype))
    loops = sch.get_loops(info.block)
    if len(info.reduce) != 1 or len(loops) != len(info.spatial) + 1:
        raise DoesNotFit("not [batch..., m, n] over one k")
    if lanes < 2:
        raise DoesNotFit("no vector lanes for the dtype")
    sizes = [extent(sch, loop) for loop in loops]
    work = work_of(sizes)
    stmt = sch.get(info.block)
    across, step, transposed = transposed_read(stmt), None, None
    if across is not None:
        _, ms, ns = dot_axes(stmt)
        step = along_k_step(math.prod(sizes[i] or math.inf for i in ms), sizes[ns[-1]], sizes[-1], lanes)
        if step is None:
            transposed = transpose_b(sch, info.block, *across, lanes, work)
            stmt = sch.get(info.block)
    outer, ms, ns = dot_axes(stmt)
    if not ms or not ns:
        raise DoesNotFit("no m or no n axis")
    if any(sizes[i] is None for i in ms[1:] + ns):  # the first of m's axes may be a batch
        raise DoesNotFit("n, or an inner axis of m, of symbolic extent")
    rows = math.prod(size or math.inf for size in (sizes[i] for i in ms))  # symbolic: a batch's
    first = sch.get(loops[ms[0]]).extent
    at_one = str(first.name) if len(ms) == 1 and isinstance(first, tirx.Var) else None
    whole_tiles = rows != math.inf and rows % DOT_ROWS == 0
    padded = rows > FEW_ROWS and not whole_tiles
    if padded and pad_rows(sch, info.block, ms[-1], lanes, work):
        stmt, sizes = sch.get(info.block), [extent(sch, loop) for loop in sch.get_loops(info.block)]
    layout = IndexMap.from_func(  # [batch..., m, n, k]: one loop each, n partitioned below
        lambda *v: (*(v[i] for i in outer), joined(v, ms, sizes), joined(v, ns, sizes), v[-1]),
        ndim=len(loops),
        index_dtype=str(stmt.iter_vars[0].var.ty),
    )
    sch.transform_block_layout(info.block, layout)
    *batch, m, n, k = sch.get_loops(info.block)
    rows, size = extent(sch, m) or math.inf, extent(sch, n) or 1
    if step is not None:
        along_k(sch, info.block, int(rows), step, lanes, work)
        return None
    b = b_read(sch.get(info.block))
    past_cache = b is not None and read_bytes(b[1]) > PACK_FROM_BYTES
    streamed = rows == 1 or (rows <= FEW_ROWS and past_cache)
    tile_rows, cols = int(rows) if streamed else 1, lanes  # `stream`'s
    if not streamed:
        if rows <= FEW_ROWS:
            tile_rows, cols = int(rows), ACCUMULATORS // int(rows) * lanes
        else:
            copied = k_block(extent(sch, k)) is not None and panel_read(sch.get(info.block)) is not None
            wide_rows = ctx.vector_bits >= WIDE_VECTOR_BITS and rows % WIDE_ROWS == 0
            tile_rows = WIDE_ROWS if wide_rows else DOT_ROWS
            cols = tile_vectors(size, lanes, copied) * lanes
    tiles, vectors = size - size % cols, size - size % lanes
    widths = [w for w in [tiles, *[lanes] * ((vectors - tiles) // lanes), size - vectors] if w]
    sch.reorder(n, *batch, m)
    parts = sch.loop_partition(n, [*widths[:-1], None]) if len(widths) > 1 else [n]
    batches = math.prod(sizes[axis] or 1 for axis in outer)  # a symbolic batch counts as 1
    for i, (part, width) in enumerate(zip(parts, widths, strict=True)):
        (block,) = sch.get_child_blocks(part) if len(parts) > 1 else (info.block,)
        if streamed and i == 0 and width == vectors:
            chunk = gemv_chunk(vectors // lanes, ctx.cores)
            stmt = sch.get(block)
            aside = len(parts) == 1 and along_n(stmt, stmt.writes[0])
            stream(sch, block, chunk, lanes, work, tile_rows, accumulated=aside)
        else:
            tiled = i == 0 and width == tiles
            vector = lanes if width % lanes == 0 else 1
            steps = width // cols * batches
            blocks, packed = None, None
            if len(parts) == 1 and rows > tile_rows and steps >= ctx.cores:
                kb, panel = k_block(extent(sch, sch.get_loops(block)[-1])), panel_read(sch.get(block))
                blocks = (kb, panel) if kb and panel is not None else None
            if tiled and blocks is None and rows > tile_rows:
                packed = packed_blocks(sch, block, width // cols, cols, batches, ctx.cores)
            if packed is not None:  # tried on a copy of the schedule: what b's read covers a block
                trial = sch.copy()
                copy = register_block(trial, block, cols, vector, tile_rows, work, None, packed)
                packed = None if copied_bytes(trial, copy) > PACKED_BYTES * 3 // 2 else packed
            register_block(sch, block, cols if tiled else None, vector, tile_rows, work, blocks, packed)
    if transposed is not None:
        transposed_into_copies(sch, transposed)
    return AtRunTime(at_one, FEW_ROWS if past_cache else 0) if at_one else None


def transposed_into_copies(sch: Any, transposed: Any) -> None:
    """`transpose_b`'s copy inlined where only copies read it (`register_block`'s panels of b or
    blocks of its columns), which then read b transposed themselves: one copy of b, not two
    (matmul 128x768 @ 768x768^T over matmul's time, 1 thread, AMD Zen 5: AVX2 1.06-1.32 -> 1.02-1.05,
    AVX-512 1.28-1.29 -> 1.10-1.11)."""
    if all(classify(sch.get(c))[0] is Structure.ELEMENTWISE for c in sch.get_consumers(transposed)):
        sch.compute_inline(transposed)


def transpose_b(sch: Any, block: Any, position: int, swap: int, lanes: int, work: int) -> Any:
    """The read at `position` of a dot product's `block` (`transposed_read`: n at index `swap`, k
    last) copied first, in parallel tiles, into a buffer of its own with n and k swapped, which
    the block then reads as b[k, n]: the tiles' vectors along n loaded whole instead of gathered
    a row of b apart (matmul 128x768 @ 768x768^T, AVX-512, 1 thread: 9.8 ms gathered, 0.66 ms
    so, 0.58 ms for b[k, n]; onnxruntime's Gemm with transB and b a constant 0.57). Returns the
    copy's block."""
    read = sch.get(block).reads[position]
    ndim = len(read.region)
    order = [*range(swap), ndim - 1, *range(swap + 1, ndim - 1), swap]
    copy = sch.cache_read(block, position, "global")
    swapped = IndexMap.from_func(
        lambda *v: [v[i] for i in order], ndim=ndim, index_dtype=str(sch.get(block).iter_vars[0].var.ty)
    )
    sch.transform_layout(copy, ("write", 0), swapped)
    loops = sch.get_loops(copy)
    line = max(1, CACHE_LINE_BYTES // (read.source.dtype.bits // 8))
    transposed_tiles(sch, copy, loops[-1], loops[swap], line, lanes, work)
    return copy


def along_k_step(rows: float, size: int | None, terms: int | None, lanes: int) -> int | None:
    """Outputs along n that a step of `along_k` sums side by side for a dot product of `rows`
    rows, n of `size` and k of `terms`: the largest divisor of n up to ALONG_K_SUMS // rows, at
    least 2. None where `along_k` does not fit: more than FEW_ROWS rows (their tiles read b
    copied transposed: `transpose_b`), a symbolic n or k, a k not whole vectors, an odd n."""
    if rows > FEW_ROWS or size is None or terms is None or terms % lanes or lanes < 2:
        return None
    step = max(d for d in range(1, max(2, ALONG_K_SUMS // int(rows)) + 1) if size % d == 0)
    return step if step >= 2 else None


def along_k(sch: Any, block: Any, rows: int, step: int, lanes: int, work: int) -> None:
    """A dot product's [batch..., m, n, k] block of at most FEW_ROWS `rows` whose b is read
    along k (`transposed_read`): both operands' rows are contiguous, so each output sums in a
    vector of `lanes` along k, `step` outputs of n by m's rows side by side (`rfactor`: b's
    rows read once for all of m's), the lanes added after the sum; steps of n in parallel."""
    *batch, m, n, k = sch.get_loops(block)
    n_out, n_in = sch.split(n, factors=[None, step])
    k_out, lane = sch.split(k, factors=[None, lanes])
    inner = [n_in, *([m] if rows > 1 else []), lane]  # m's loop of one row stays outermost
    sch.reorder(n_out, *batch, k_out, *inner)
    rf = sch.rfactor(lane, factor_axis=len(batch) + 2)
    *outer, k_out = sch.get_loops(rf)[: -len(inner)]
    fused = parallel_outer(sch, outer, work)
    for loop in sch.get_loops(rf)[-len(inner) : -1]:
        sch.unroll(loop)
    sch.vectorize(sch.get_loops(rf)[-1])
    sch.decompose_reduction(rf, k_out)
    sch.reverse_compute_at(block, fused)  # the lanes added while the step's sums are in cache
    lane, *rest = sch.get_loops(block)[-len(inner) :]
    sch.reorder(*rest, lane)


def transposed_tiles(sch: Any, block: Any, along: Any, inner: Any, line: int, lanes: int, work: int) -> None:
    """A transposing copy `block` in tiles of `line` steps of `along` (the loop its read is
    contiguous along: a cache line of each row read) by a vector of `lanes` steps of `inner` (the
    loop its write is contiguous along), the tiles in parallel; where the extents are not whole
    tiles, its loops in parallel as they are."""
    rows, cols = extent(sch, along), extent(sch, inner)
    loops = sch.get_loops(block)
    if lanes < 2 or rows is None or cols is None or rows % line or cols % lanes:
        parallel_outer(sch, loops[:-1], work)
        return
    _, row = sch.split(along, factors=[None, line])
    _, lane = sch.split(inner, factors=[None, lanes])
    inside = (sch.get(row), sch.get(lane))
    tiles = [loop for loop in sch.get_loops(block) if not any(sch.get(loop).same_as(x) for x in inside)]
    sch.reorder(*tiles, row, lane)
    sch.vectorize(lane)
    sch.unroll(row)
    parallel_outer(sch, tiles, work)


def pad_rows(sch: Any, block: Any, axis: int, lanes: int, work: int) -> bool:
    """Whether a dot product's `block`, whose m (its spatial variables at the positions `dot_axes`
    says, joined) is not whole tiles of DOT_ROWS rows (ragged, or symbolic: a sequence length, a
    batch of rows), now computes whole tiles: m's innermost variable, at `axis`, padded up to a
    multiple of DOT_ROWS (`pad_einsum`: the operand read along m copied into a buffer of zero
    rows past m, the output computed into one and copied out; the copies in vectors where their
    rows are whole ones, in parallel where `work` is worth threads; a copy out that a stage after
    the sums reads, inlined into that stage). A tile's rows otherwise
    each test m inside the sum over k (matmul 131x768x768, AVX2, 1 thread: 4.7 ms against 2.2
    for 128 rows; padded 2.8, onnxruntime's 2.8). False where TVM refuses (an index that is not
    a plain variable): m's tiles then test their rows."""
    padding = [1] * len(sch.get(block).iter_vars)
    padding[axis] = DOT_ROWS
    before = {sch.get(b).name_hint for b in sch.get_producers(block)}  # `transpose_b`'s copy
    try:
        sch.pad_einsum(block, padding)
    except s_tir.ScheduleError:
        return False
    copies_in = [copy for copy in sch.get_producers(block) if sch.get(copy).name_hint not in before]
    copies_out = []
    for copy in sch.get_consumers(block):
        if sch.get_consumers(copy):  # a stage after the sums reads the padded rows instead
            try:
                sch.compute_inline(copy)
                continue
            except s_tir.ScheduleError:  # the copy is an output too: it stays a copy
                pass
        copies_out.append(copy)
    for copy in [*copies_in, *copies_out]:
        loops = sch.get_loops(copy)
        vector_split(sch, loops[-1], lanes)
        parallel_outer(sch, loops[:-1], work)
    return True


def tile_vectors(size: int, lanes: int, copied: bool) -> int:
    """Vectors of a tile of n's `size` columns: DOT_VECTORS, or one fewer where that makes n
    whole tiles and b's panels are to be `copied` (K_BLOCK: a part of n is not). matmul
    256x1024x1024, AVX2, 1 thread: 9.1 ms in tiles of 3 vectors and a rest, 5.9 ms in tiles of
    2 vectors copied (b's rows 4 KiB apart all fall in one L1 set)."""
    whole = size // lanes if size % lanes == 0 else 0
    if copied and whole % DOT_VECTORS and whole % (DOT_VECTORS - 1) == 0:
        return DOT_VECTORS - 1
    return DOT_VECTORS


def k_block(size: int | None) -> int | None:
    """The block of a sum over `size` terms (K_BLOCK); None where it needs none or none divides."""
    low, high = K_BLOCK
    if size is None or size <= high:
        return None
    return next((d for d in range(high, low - 1, -1) if size % d == 0), None)


def b_read(stmt: Any) -> tuple[int, Any] | None:
    """(position among the reads, the read) of the one read of a dot product's block, its
    variables [batch..., m, n, k], that mentions n and not m (b); None unless exactly one does."""
    *_, m, n, _ = (iv.var for iv in stmt.iter_vars)
    found = [
        (position, read)
        for position, read in enumerate(stmt.reads)
        if any(mentions(r.min, n) for r in read.region) and not any(mentions(r.min, m) for r in read.region)
    ]
    return found[0] if len(found) == 1 else None


def read_bytes(read: Any) -> int:
    """Bytes of the buffer a block's `read` reads from (a symbolic dim counts as 1, as in `work_of`)."""
    dims = [int(d) if isinstance(d, tirx.IntImm) else 1 for d in read.source.shape]
    return read.source.dtype.bits // 8 * math.prod(dims)


def packed_blocks(
    sch: Any, block: Any, tile_count: int, cols: int, batches: int, cores: int
) -> tuple[int, int] | None:
    """(tiles a block, b's position among the reads) where a dot product's block, its loops [n,
    batch..., m, k], runs n's `tile_count` tiles of `cols` columns in blocks with b copied
    (PACKED_BYTES); None where k needs blocks, b stays in cache, no block of several tiles fits,
    or the blocks times the `batches` are fewer than the `cores`."""
    found = b_read(sch.get(block))
    terms = extent(sch, sch.get_loops(block)[-1])
    if found is None or terms is None or k_block(terms) is not None:
        return None
    position, read = found
    item_bytes = read.source.dtype.bits // 8
    if read_bytes(read) <= PACK_FROM_BYTES:
        return None
    most = PACKED_BYTES // (terms * cols * item_bytes)
    per_block = max((d for d in range(1, most + 1) if tile_count % d == 0), default=1)
    if per_block == 1 or tile_count // per_block * batches < cores:
        return None
    return per_block, position


def copied_bytes(sch: Any, copy: Any) -> int:
    """Bytes of the buffer `copy` (a block of `sch` copying a read into one, inside the loop it is
    computed at, the outermost) is lowered to: the most each of its own loops runs."""
    loops = [sch.get(loop) for loop in sch.get_loops(copy)]
    analyzer = tvm.sym.analyzer.Analyzer()
    for loop in loops:
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    most = [analyzer.const_int_bound(loop.extent).max_value for loop in loops[1:]]
    return math.prod(most) * sch.get(copy).writes[0].source.dtype.bits // 8


def panel_read(stmt: Any) -> int | None:
    """b's position among a [batch..., m, n, k] block's reads (`b_read`) when the last index of
    its read is n itself (a panel of it is rows of `cols` floats); else None (a 1x1
    convolution's joined pixels, `n // w` and `n % w`)."""
    found = b_read(stmt)
    return found[0] if found and along_n(stmt, found[1]) else None


def along_n(stmt: Any, access: Any) -> bool:
    """Whether `access` (a read or write region of a [batch..., m, n, k] block) is at n itself
    along its last axis (a chunk of n is a range of it), not at n joined from several (a 1x1
    convolution's pixels, `n // w` and `n % w`: the rows a chunk touches)."""
    *_, n, _ = (iv.var for iv in stmt.iter_vars)
    return bool(access.region[-1].min.same_as(n))


def gemv_chunk(count: int, cores: int) -> int:
    """Vectors of the output a chunk of a streamed dot product takes (`stream`): the most, up to
    GEMV_CHUNK, that divide its `count` vectors into chunks a whole number a core; else the most
    that divide it. 3072 floats on AVX-512 are 192 vectors: chunks of 64 were 3, one core took
    two, and 2 threads ran 6x768 @ 768x3072 slower than one (0.157 against 0.138 ms)."""
    divisors = [d for d in range(1, GEMV_CHUNK + 1) if count % d == 0]
    shared = [d for d in divisors if count // d % cores == 0]
    return max(shared or divisors)


def stream(
    sch: Any, block: Any, chunk: int, lanes: int, work: int, rows: int = 1, accumulated: bool = False
) -> None:
    """A dot product's [n, batch..., m, k] loops, m of `rows` rows (GEMV_CHUNK): chunks of
    `chunk` vectors of `lanes` in parallel, each updated GEMV_STEPS rows of b at a time, each
    vector of b loaded once for all of m's rows (unrolled). With `accumulated`
    (the output written `along_n`, else a copy takes whole rows; not after `loop_partition`,
    whose part a cache_write takes whole) a chunk of several rows sums into a buffer of its own
    and is copied out after: the output's rows, a row of n apart, fell in the same L1 sets as
    b's (4x768 @ 768x3072, AVX2, 1 thread: 0.5-1.2 ms in place, 0.4-0.55 ms so)."""
    n, *batch, m, k = sch.get_loops(block)[-len(sch.get(block).iter_vars) :]
    n_tile, n_vector, lane = sch.split(n, factors=[None, chunk, lanes])
    steps = GEMV_STEPS if (extent(sch, k) or 1) % GEMV_STEPS == 0 else 1
    k_out, k_in = sch.split(k, factors=[None, steps])
    if rows == 1:
        sch.reorder(n_tile, *batch, m, k_out, n_vector, k_in, lane)
    else:
        sch.reorder(n_tile, *batch, k_out, n_vector, m, k_in, lane)
        sch.unroll(m)
    sch.vectorize(lane)
    sch.unroll(k_in)
    fused = parallel_outer(sch, [n_tile, *batch, *([m] if rows == 1 else [])], work)  # a complete block
    if rows > 1 and accumulated:
        sums = sch.cache_write(block, 0, "global")  # lowered to a rows x chunk buffer a step
        sch.reverse_compute_at(sums, fused)
        vector_split(sch, sch.get_loops(sums)[-1], lanes)
    sch.decompose_reduction(block, k_out)  # the init copies the vector loop


def joined(variables: tuple[Any, ...], axes: list[int], sizes: list[int | None]) -> Any:
    """The variables at `axes` as one row-major index (their static extents `sizes`)."""
    index = variables[axes[0]]
    for i in axes[1:]:
        index = index * sizes[i] + variables[i]
    return index


def register_block(
    sch: Any,
    block: Any,
    cols: int | None,
    lanes: int,
    rows: int,
    work: int,
    kb: tuple[int, int] | None = None,
    packed: tuple[int, int] | None = None,
) -> Any | None:
    """One part of a dot product's [n, batch..., m, k] loops in tiles of `rows` rows by `cols`
    columns (None: the part's columns, a loop that may not start at 0, which `split` refuses),
    in vectors of `lanes` (1: scalar); tiles in parallel, the sum over k accumulated in the
    output tile, which LLVM keeps in registers across k (the buffers are noalias; a local
    cache_write after `loop_partition` saw the whole part as each tile's region and copied it
    all back a tile). A tile past a ragged m skips its rows past m: the predicate is outside
    the vector lanes, which stay vectors. With `kb` (K_BLOCK: its terms, and the position of b
    among the block's reads) the sum runs in blocks of that many terms outside the tiles of m,
    each block's panel of b copied first into a buffer of its own (rows of `cols` floats one
    after the other: b's rows, 3 KiB apart in a 768-wide b, fall in 4 of L1's 64 sets), and
    only the tiles of n and the batch run in parallel. With `packed` (PACKED_BYTES: tiles a block,
    and b's position; not with `kb`) n's tiles run in blocks inside the batch, each block's
    columns of b copied into a buffer of its own first, the batch and the blocks in parallel and
    m's tiles inside them. Returns that copy's block (None without `packed`)."""
    n, *batch, m, k = sch.get_loops(block)[-len(sch.get(block).iter_vars) :]
    n_tile, n_in = sch.split(n, factors=[None, cols]) if cols else (None, n)
    m_tile, m_in = sch.split(m, factors=[None, rows])
    k_out, k = sch.split(k, factors=[None, kb[0]]) if kb else (None, k)
    if packed:
        n_block, n_tile = sch.split(n_tile, factors=[None, packed[0]])
        tiles = [*batch, n_block]
        sch.reorder(*tiles, n_tile, m_tile, k, m_in, n_in)
    else:
        panels = [loop for loop in (n_tile, *batch) if loop is not None]
        tiles = panels if k_out else [*panels, m_tile]
        sch.reorder(*panels, *([k_out] if k_out else []), m_tile, k, m_in, n_in)
    sch.unroll(m_in)
    if lanes > 1:
        sch.vectorize(sch.split(n_in, factors=[None, lanes])[1] if cols else n_in)
    fused, copy = parallel_outer(sch, tiles, work), None  # before decompose: a complete block
    if packed:
        copy = sch.cache_read(block, packed[1], "global")  # lowered to a buffer a block of n
        sch.compute_at(copy, fused)
        vector_split(sch, sch.get_loops(copy)[-1], lanes)
    if kb and k_out is not None:
        panel = sch.cache_read(block, kb[1], "global")  # lowered to a kb x cols buffer a block
        sch.compute_at(panel, k_out)
        vector_split(sch, sch.get_loops(panel)[-1], lanes)
    sch.decompose_reduction(block, k_out or k)  # the init copies the vector loop
    return copy


def window(sch: Any, ctx: ScheduleContext) -> None:
    """Sliding windows: see the module. An output row that is not whole vectors (7, 14, 28 or 56
    columns: a network's late maps) runs its whole vectors, then its rest as one vector of that
    length, which LLVM splits into vectors of the target's widths (28 floats on AVX2: 3 vectors,
    then one of 4); a row shorter than one vector is one vector of its length. Depthwise 3x3 on
    1x96x14x14, AVX2, 1 thread: 0.081 ms in the generic schedule, 0.013 ms as one vector of 14,
    0.007 ms so (onnxruntime 0.04-0.07). Rows of up to 4 vectors ran as one vector of their
    length, with as many fewer output channels in a block (WINDOW_CHANNELS) as it is the target's
    vectors: on a 2-core AMD Zen 5, 1 thread, grouped 3x3 (16 channels a group) took 0.074 ->
    0.039 ms on 1x64x14x14 and 0.294 -> 0.159 on 1x64x28x28 (AVX2), 0.98 -> 0.33 on 1x64x56x56
    and 0.234 -> 0.086 on 1x64x28x28 (AVX-512), against onnxruntime's 0.049, 0.150, 0.53 and
    0.15. Elementwise stages after the sums (a bias, an activation) run at the output row
    (`row_stages`), inlined into one another where each has one reader."""
    infos = block_infos(sch)
    at = [i for i, info in enumerate(infos) if info.structure is Structure.WINDOW]
    if len(at) != 1 or any(
        info.structure is not Structure.ELEMENTWISE for info in infos if info is not infos[at[0]]
    ):
        raise DoesNotFit("not one window between elementwise stages")
    output, after = infos[at[0]], infos[at[0] + 1 :]
    before: list[BlockInfo] = []
    for info in reversed(infos[: at[0]]):  # computed per plane: what only the window's plane reads
        readers = {sch.get(b).name_hint for b in sch.get_consumers(info.block)}
        if readers <= {output.name, *(b.name for b in before)}:
            before.insert(0, info)
        else:
            after.insert(0, info)
    lanes = ctx.lanes(str(sch.get(output.block).writes[0].source.dtype))
    loops = sch.get_loops(output.block)
    spatial, taps = loops[: len(output.spatial)], loops[len(output.spatial) :]
    if len(spatial) < 3:
        raise DoesNotFit("fewer than 3 spatial axes: no plane and row")
    *planes, y, x = spatial
    size, work = extent(sch, x), work_of([extent(sch, loop) for loop in loops])
    if lanes < 2:
        raise DoesNotFit("no vector lanes for the dtype")
    if size is None:
        raise DoesNotFit("output rows of symbolic length")
    whole = size - size % lanes  # the rest (a row shorter than a vector: all) is one vector
    sums, channel = channel_sum(sch.get(output.block))
    block = []  # a register block of output channels sharing each input vector's load
    exact = channel is None or (extent(sch, planes[channel]) or 1) % WINDOW_CHANNELS == 0
    if channel is not None:  # (a ragged last block's region of a row is past the channels)
        planes[channel], channel_in = sch.split(planes[channel], factors=[None, WINDOW_CHANNELS])
        block = [channel_in]
    sch.reorder(*planes, y, x, *taps, *block)
    # stages with one reader inlined into it, those before the window too (then computed for
    # each point: a bias's per-channel scale), so that a stage's producers can all be at the row
    inlined = {id(info) for info in inline_producers(sch, [info for info in after if info is not infos[-1]])}
    after = [info for info in after if id(info) not in inlined]
    at_row = row_stages(sch, output, after) if exact else []
    for info in at_row:  # before the planes are fused: TVM's region of a row under them is exact
        sch.reverse_compute_at(info.block, y, preserve_unit_loops=True)
    plane = parallel_outer(sch, planes, work)
    for info in reversed(before):
        sch.compute_at(info.block, plane, preserve_unit_loops=True)
    for info in at_row:  # in vectors as the window's row (not `row_vectors`' masked rest or
        # fractions of vectors): its whole vectors, then the rest as one vector of its length
        parts = partition(sch, sch.get_loops(info.block)[-1], whole, whole)
        if whole:
            vector_split(sch, parts[0], lanes)
        if whole < size:
            sch.vectorize(parts[-1])
    unrolled = [i for i, _ in enumerate(taps) if i not in sums]
    parts = sch.loop_partition(x, [whole, None]) if 0 < whole < size else [x]
    for part in parts:
        (part_block,) = sch.get_child_blocks(part) if len(parts) > 1 else (output.block,)
        part_loops = sch.get_loops(part_block)
        row, part_taps = part_loops[-len(taps) - len(block) - 1], part_loops[-len(taps) - len(block) :]
        if part is parts[0] and whole:
            row_out, row = sch.split(row, factors=[None, lanes])
            sch.reorder(row_out, *part_taps, row)
        else:  # a row shorter than a vector, or a longer row's rest: a vector of its length
            sch.reorder(*part_taps, row)
        window_steps(sch, part_block, len(taps), unrolled, len(block))
    placed = {id(info) for info in at_row}
    stages_after(sch, ctx, [info for info in after if id(info) not in placed])


def row_stages(sch: Any, output: BlockInfo, after: list[BlockInfo]) -> list[BlockInfo]:
    """The stages of `after` (in order) that read the window's sums `output`, or a stage of
    these, and no other stage, each only at the point they write (TE writes a stage at its own
    point): computed at the window's output row while the row's sums are in L1 (TVM computes a
    block there only with all its producers there). Depthwise 3x3 of 1x32x112x112 with a bias
    and a ReLU, x86-avx512, 1 / 2 threads: 0.34 / 0.17 ms as a pass after the sums, 0.23 / 0.11
    so, the window alone 0.21 / 0.11. Placed at the row after the planes' loops are fused, the
    stage took the window's time but gave wrong answers: TVM's region of the row under the fused
    parallel loop was every channel, which each thread computed from sums the other had not
    written yet."""
    rows, at_row = {output.name}, []
    for info in after:
        stmt = sch.get(info.block)
        producers = [sch.get(b) for b in sch.get_producers(info.block)]
        points = [v.var for v in stmt.iter_vars]
        written = [p.writes[0].source for p in producers]
        shape = stmt.writes[0].source.shape  # not a crop of the sums
        if (
            written
            and {p.name_hint for p in producers} <= rows
            and all(tvm_ffi.structural_equal(b.shape, shape) for b in written)
            and all(
                len(read.region) == len(points)
                and all(static(r.extent) == 1 for r in read.region)
                and all(r.min.same_as(v) for r, v in zip(read.region, points, strict=True))
                for read in stmt.reads
                if any(read.source.same_as(b) for b in written)
            )
        ):
            rows.add(info.name)
            at_row.append(info)
    return at_row


def window_steps(sch: Any, block: Any, taps: int, unrolled: list[int], channels: int) -> None:
    """A window's `block` whose loops end in its `taps` reduction loops, `channels` loops of a
    register block of output channels and the vector loop: the vector loop vectorized, the taps
    at `unrolled` (not the sums over input channels) and the channel block unrolled, the init
    split off before the taps (it copies the vector loop)."""
    loops = sch.get_loops(block)
    tap_loops, channel_loops = loops[-1 - channels - taps : -1 - channels], loops[-1 - channels : -1]
    sch.vectorize(loops[-1])
    for loop in [*(tap_loops[i] for i in unrolled), *channel_loops]:
        sch.unroll(loop)
    sch.decompose_reduction(block, tap_loops[0])


FEW_COLUMNS = 8
"""Most elements the short side of a transpose may have for `interleaved_rows` and
`deinterleaved_columns` (measured at 3 and 8): LLVM groups interleaved loads and stores of up
to 8 (its default `max-interleave-group-factor`); a wider side keeps the elementwise schedule."""


def transpose(sch: Any, ctx: ScheduleContext) -> None:
    """Data movement: see the module. transpose2d 1024x1024 float32, AVX2, 1 thread: 0.6 ms in
    tiles of 16x8 where the elementwise schedule's gathers took 3.6-5 ms (onnxruntime 1.1). Output
    rows shorter than a vector (NCHW4c, and NCHW8c with AVX-512) are tiled with vectors of a row
    (SHORT_ROW_BYTES); output rows of 2 to FEW_COLUMNS columns, fewer than a vector, interleave
    whole vectors of the read (`interleaved_rows`); read rows of 2 to FEW_COLUMNS elements, fewer
    than a vector, are deinterleaved (`deinterleaved_columns`). One element is a copy: the
    elementwise schedule's."""
    inline_producers(sch)
    infos = block_infos(sch)
    at = infos[0].along if len(infos) == 1 else None  # the loop the read is contiguous along
    if at is None:
        raise ElementwiseFits("not one transposing block after inlining")
    (info,) = infos
    dtype = str(sch.get(info.block).writes[0].source.dtype)
    size = np.dtype(dtype).itemsize
    lanes, line = ctx.lanes(dtype), max(1, CACHE_LINE_BYTES // size)
    loops = sch.get_loops(info.block)
    along, inner = loops[at], loops[-1]
    rows, cols, work = extent(sch, along), extent(sch, inner), work_of([extent(sch, loop) for loop in loops])
    if cols is not None and 4 <= cols < lanes and lanes % cols == 0:
        lanes = cols  # a packed layout's few channels: one narrower vector a row
    elif (
        cols is not None
        and rows is not None
        and 2 <= cols <= FEW_COLUMNS
        and cols < lanes <= rows
        and at == len(loops) - 2
    ):
        interleaved_rows(sch, info.block, loops[:at], along, rows, lanes, work)
        return
    elif cols is not None and rows is not None and 2 <= rows <= FEW_COLUMNS and rows < lanes <= cols:
        deinterleaved_columns(sch, loops, at, cols, lanes, ctx.cores, work)
        return
    if lanes < 2 or rows is None or cols is None or rows % line or cols % lanes:
        raise ElementwiseFits(f"{rows}x{cols} not whole {line}x{lanes} tiles")
    if cols * size <= SHORT_ROW_BYTES and cols > lanes:
        raise ElementwiseFits(f"output rows of {cols * size} bytes: the elementwise schedule reuses lines")
    transposed_tiles(sch, info.block, along, inner, line, lanes, work)


def interleaved_rows(
    sch: Any, block: Any, outside: list[Any], along: Any, rows: int, lanes: int, work: int
) -> None:
    """A transpose whose output rows (the innermost loop, along which its write is contiguous)
    are a few columns, fewer than a vector: vectors of `lanes` steps of `along` (the loop its
    read is contiguous along, `rows` steps), the row's columns unrolled around them. Each step
    loads one whole vector a column and stores them interleaved, which LLVM turns into shuffles
    and whole stores (NCHW to NHWC of an image's 3 channels). What `along` holds past its whole
    vectors runs scalar; the loops `outside` it run in parallel, or its vectors where those are
    one step. 1x3x224x224 float32, Intel Xeon VM, x86-avx512, 1 / 2 threads: 0.015 / 0.009 ms,
    against 0.226 / 0.123 in the elementwise schedule's per-lane loads (onnxruntime's Transpose
    0.10 / 0.09)."""
    vectors = partition(sch, along, rows - rows % lanes, rows - rows % lanes)[0]
    (part,) = sch.get_child_blocks(vectors)
    columns = sch.get_loops(part)[-1]
    chunks, lane = sch.split(vectors, factors=[None, lanes])
    sch.reorder(chunks, columns, lane)
    sch.vectorize(lane)
    sch.unroll(columns)
    fused = parallel_outer(sch, outside, work)
    if fused is None or extent(sch, fused) == 1:
        parallel_if_worth(sch, chunks, work)


def deinterleaved_columns(
    sch: Any, loops: list[Any], at: int, cols: int, lanes: int, cores: int, work: int
) -> None:
    """A transpose whose read rows (`loops[at]`, the loop its read is contiguous along) are a
    few elements, fewer than a vector, and whose output rows (the innermost loop, `cols` long)
    at least one: that loop moved innermost and unrolled, the output's row loop left to LLVM's
    loop vectorizer, which loads whole vectors and deinterleaves them with shuffles (TVM's
    strided vector loads are a load a lane); the loops outside in parallel, or where those are
    one step the row in up to 4 parts a core (a divisor of it, each 2 vectors at least).
    NHWC to NCHW of an image's 3 channels, x86-avx512, Intel Xeon VM, 1 / 2 threads: 1x224x224x3
    0.047 / 0.031 -> 0.024 / 0.017 ms (onnxruntime's Transpose 0.058 / 0.030), 16x224x224x3
    1.21 / 1.00 -> 0.85 / 0.71; x86 (AVX2) 0.037 -> 0.026 ms; 8 channels (AVX-512) 0.008 ->
    0.005 ms."""
    others = [loop for index, loop in enumerate(loops) if index != at]
    sch.reorder(*others, loops[at])
    sch.unroll(loops[at])
    fused = parallel_outer(sch, others[:-1], work)
    if fused is None or extent(sch, fused) == 1:
        parts = max(
            d for d in range(1, 4 * cores + 1) if d == 1 or (cols % d == 0 and cols // d >= 2 * lanes)
        )
        if parts > 1:
            parallel_if_worth(sch, sch.split(others[-1], factors=[parts, None])[0], work)


RULES: dict[Structure, Callable[[Any, ScheduleContext], AtRunTime | None]] = {
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
    tried on a copy first, so a rule that does not fit leaves `sch` to the generic schedule. Its
    calls become vector math (`ask_vector_math`, asked last: see MATH_KEY)."""
    shifted = shifted_by_row_max(sch.mod["main"])
    taken = _rule_taken(sch, ctx)
    ask_vector_math(sch, ctx, shifted=shifted)
    return taken


def _rule_taken(sch: Any, ctx: ScheduleContext) -> Taken:
    """The rule `schedule_by_structure` applies, and what it took; the vector math is asked for
    after it, once the loops are final."""
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
    sized = rule(sch, ctx)
    if sized is None:
        return Taken(structure.value)
    return Taken(structure.value, at_one=sized.symbol, few_rows=sized.few_rows)


def schedule_reason(error: Exception) -> str:
    """TVM's reason for a refused primitive, in one line (its message's first line that says
    more than that an error occurred)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if "An error occurred" not in line and not line.startswith("Traceback")]
    return (said or lines or ["refused"])[-1][:200]
