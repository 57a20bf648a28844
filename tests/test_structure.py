"""Default CPU schedules by structure (`deploy.schedules.structure`, `cpu.generic`, `vector_math`):
the user ops of bench/fast_ops, written with no schedule code, are classified by what they
compute, scheduled by their structure's rule, and still match numpy, NaN and infinities
included, in every float dtype."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te
from tvm.tirx.stmt import ForKind

from deploy.compiler.compile import compile_op, context, hand_schedule, prim_module
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.compiler.tir_passes import compile_cpu
from deploy.devices import get_device
from deploy.devices.elf import elf_machine
from deploy.devices.platforms import get_platform
from deploy.ops import TensorType, bind, get_op, load_ops_path
from deploy.schedules.cpu.generic import (
    PACKED_BYTES,
    ROW_ACCUMULATORS,
    ROW_BLOCK,
    ROW_VECTORS_SIDE_BY_SIDE,
    ROWS_A_STEP,
    WIDE_ROW_ACCUMULATORS,
    WINDOW_CHANNELS,
    Taken,
    copied_bytes,
    gemv_chunk,
    inline_producers,
    joined_reduction,
    row_block,
    row_lanes,
    schedule_by_structure,
)
from deploy.schedules.loops import blocks
from deploy.schedules.registry import Picked, ScheduleContext
from deploy.schedules.structure import Structure, anchor, block_infos, dot_axes
from deploy.schedules.vector_math import (
    EXP_HI,
    EXP_LO,
    LANES_KEY,
    SHIFTED_KEY,
    ask_vector_math,
    libm_in_vector_loops,
    lower_math,
    shifted_by_row_max,
)
from deploy.verify.measure import check
from tests.conftest import REPO, registry_kept, run_deploy

FAST_OPS = REPO / "bench" / "fast_ops"
CASES: dict[str, tuple[list[tuple[int, ...]], Structure]] = {
    "softmax": ([(2, 3, 64)], Structure.ROW_REDUCTION),
    "layer_norm": ([(4, 64), (64,), (64,)], Structure.ROW_REDUCTION),
    "gelu": ([(3, 64)], Structure.ELEMENTWISE),
    "depthwise_conv": ([(1, 4, 16, 16), (4, 1, 3, 3)], Structure.WINDOW),
    "matmul": ([(8, 32), (32, 32)], Structure.DOT),
    "batch_matmul": ([(2, 8, 16), (2, 16, 32)], Structure.DOT),
    "mean_channels": ([(1, 8, 4, 16)], Structure.OUTER_REDUCTION),
    "transpose_heads": ([(1, 4, 3, 8)], Structure.ELEMENTWISE),
    "pointwise_conv": ([(1, 8, 4, 8), (16, 8, 1, 1)], Structure.DOT),
    "grouped_conv": ([(1, 8, 6, 8), (16, 2, 3, 3)], Structure.WINDOW),
    "log_softmax": ([(2, 3, 64)], Structure.ROW_REDUCTION),
    "transpose2d": ([(128, 16)], Structure.DATA_MOVEMENT),
    "dense": ([(8, 32), (24, 32)], Structure.DOT),
    "image_to_nhwc": ([(1, 3, 4, 37)], Structure.DATA_MOVEMENT),
    "dense_bias": ([(8, 32), (24, 32), (24,)], Structure.DOT),
    "depthwise_bias_relu": ([(1, 4, 16, 16), (4, 1, 3, 3), (4,)], Structure.WINDOW),
    "global_avg_pool": ([(2, 8, 7, 7)], Structure.ROW_REDUCTION),
}
"""Each op at a small shape every rule fits on x86 (whole vectors of 8 floats), and its structure."""


@pytest.fixture(scope="module", autouse=True)
def fast_ops():
    with registry_kept():
        load_ops_path(FAST_OPS)
        yield


def bound_op(name: str, dtype: str = "float32", shapes: list[tuple[int | str, ...]] | None = None):
    return bind(get_op(name), {}, [TensorType(s, dtype) for s in shapes or CASES[name][0]])


def schedule_of(name: str, shapes: list[tuple[int | str, ...]] | None = None):
    bound = bound_op(name, shapes=shapes)
    target = get_target("x86")
    sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
    return sch, context(bound, target, BuildOptions())


@pytest.mark.parametrize("name", CASES)
def test_each_op_is_classified_by_what_it_computes(name):
    sch, _ = schedule_of(name)
    assert anchor(block_infos(sch)).structure is CASES[name][1]


@pytest.mark.parametrize("name", CASES)
def test_each_op_takes_its_structures_rule(name):
    sch, ctx = schedule_of(name)
    taken = schedule_by_structure(sch, ctx)
    assert (taken.rule, taken.fell_through) == (CASES[name][1].value, "")


SUMS_IN_HALF = (
    "layer_norm", "depthwise_conv", "matmul", "batch_matmul", "pointwise_conv", "grouped_conv", "dense",
    "dense_bias", "depthwise_bias_relu", "global_avg_pool",
)  # fmt: skip
"""Ops without float16: their sums round at every term in half, past its tolerance."""


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        (name, dtype)
        for name in CASES
        for dtype in ("float32", "float64", "float16")
        if dtype != "float16" or name not in SUMS_IN_HALF
    ],
)
def test_the_default_by_structure_matches_numpy(name, dtype, local_session, tmp_path):
    """The target's default build (the rules are the cpu family's generic schedule) on random
    inputs, ties and planted NaN and infinities: a WrongAnswer fails the test."""
    bound = bound_op(name, dtype)
    target = get_target("x86")
    compiled = compile_op(bound, target, BuildOptions())
    assert compiled.schedule == "cpu/generic"
    check(local_session, compiled, tmp_path)


TOTAL = """from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register


@register
class Total(Op):
    name = "total"
    inputs = (Input("x", 2, 2),)
    dtypes = ("float32",)
    cases = (Case(((64, 4),)),)

    def infer(self, attrs, inputs):
        return TensorType((1,), inputs[0].dtype)

    def compute(self, attrs, out, x):
        i, j = te.reduce_axis((0, x.shape[1]), "i"), te.reduce_axis((0, x.shape[0]), "j")
        return te.compute(out.shape, lambda _: te.sum(x[j, i], axis=[i, j]), name="total")

    def reference(self, attrs, x):
        return x.sum(keepdims=True).reshape(1)
"""
"""A user op no rule fits: the sum of a whole matrix column by column (the row rule takes it;
its two axes are not one row of elements, and TVM refuses to vectorize the sum's other axis)."""
TOTAL_NOTE = 'rule fell through to the generic schedule: row reduction: Error message: The "vectorize" cannot'


def test_a_rule_that_does_not_fit_falls_to_the_generic_schedule_saying_why(tmp_path):
    (tmp_path / "total.py").write_text(TOTAL)
    with registry_kept():
        load_ops_path(tmp_path)
        sch, ctx = schedule_of("total", [(64, 4)])
        taken = schedule_by_structure(sch, ctx)
    assert taken.rule == "generic" and taken.notes[0].startswith(TOTAL_NOTE)


LINEAR = """from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register


@register
class Linear(Op):
    name = "linear"
    inputs = (Input("x", 3, 3), Input("w", 2, 2))
    dtypes = ("float32", "float64")
    cases = (Case(((2, 7, 16), (16, 24))),)

    def infer(self, attrs, inputs):
        x, w = inputs
        return TensorType((x.shape[0], x.shape[1], w.shape[1]), x.dtype)

    def compute(self, attrs, out, x, w):
        k = te.reduce_axis((0, x.shape[2]), "k")
        return te.compute(out.shape, lambda b, s, n: te.sum(x[b, s, k] * w[k, n], axis=k), name="linear")

    def reference(self, attrs, x, w):
        return (x.astype("float64") @ w.astype("float64")).astype(x.dtype)
"""
"""A user's linear layer over a batch of sequences: its m is the batch and the sequence joined."""

PADDED_DOTS = [
    ("matmul", [("N", 24), (24, 40)], [1, 3, 4, 13]),  # a symbolic m: rows, a sequence length
    ("matmul", [(13, 300), (300, 48)], [13]),  # ragged m, a long k in blocks over copied panels
    ("matmul", [("N", 256), (256, 1032)], [1, 2, 5, 7]),  # b past the cache: 2 to 6 rows stream it
    ("batch_matmul", [("N", 7, 9), ("N", 9, 24)], [1, 3]),  # a symbolic batch, ragged m
    ("pointwise_conv", [("N", 3, 5, 8), (30, 3, 1, 1)], [1, 2]),  # a symbolic batch of images, m 30
    ("linear", [("N", 7, 16), (16, 24)], [1, 3]),  # m a symbolic batch by 7 rows: 7 padded to 8
    ("dense_bias", [("N", 24), (40, 24), (40,)], [1, 5, 13]),  # a symbolic m, then the bias
    ("dense_bias", [("N", 256), (1032, 256), (1032,)], [1, 3, 7]),  # 2 to 6 rows stream w, the bias
]
"""Dot products whose m is not whole tiles of 4 rows (symbolic, or ragged past 6 rows), at the
sizes they run at: m's innermost axis padded up to whole tiles; a 1x1 convolution's images loop
as a batch (joined to its pixels, a symbolic batch fell through: n must be static)."""


@pytest.mark.parametrize(
    ("name", "shapes", "sizes"), PADDED_DOTS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_dot_product_whose_m_is_not_whole_tiles_is_padded_to_them(
    name, shapes, sizes, local_session, tmp_path
):
    """The rule takes it (it fell through for a symbolic m, 50x onnxruntime's time), no row of
    the sum over k tests m (the tests cost 2.1x: matmul 131x768x768 at 4.7 ms against 2.2 for
    128 rows), and every size matches numpy with ties, NaN and infinities, float32 and float64."""
    from deploy.compiler.export import export
    from deploy.verify.compare import random_input
    from deploy.verify.run import against_reference, run_artifact

    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "linear.py").write_text(LINEAR)
    with registry_kept():
        load_ops_path(tmp_path / "ops")
        sch, ctx = schedule_of(name, shapes)
        assert schedule_by_structure(sch, ctx).fell_through == ""
        padded = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "_pad" in sch.get(b).name_hint]
        updates = [b for b in str(sch.mod).split('T.sblock("')[1:] if b.split('"')[0].endswith("_update")]
        assert padded and updates and not any("T.where" in update for update in updates)
        for dtype in ("float32", "float64"):
            bound = bind(get_op(name), {}, [TensorType(s, dtype) for s in shapes])
            directory = tmp_path / dtype
            manifest = export(compile_op(bound, get_target("x86"), BuildOptions()), directory)
            for size in sizes:
                at = bind(
                    get_op(name),
                    {},
                    [TensorType(tuple(size if d == "N" else d for d in s), dtype) for s in shapes],
                )
                for specials in (False, True):
                    inputs = [
                        random_input(t, np.random.default_rng(size), specials=specials) for t in at.inputs
                    ]
                    comparison = against_reference(
                        at, inputs, run_artifact(local_session, directory, manifest, inputs)
                    )
                    assert comparison.ok, (dtype, size, comparison.detail)


@pytest.mark.parametrize(
    ("name", "shapes", "branched", "few"),
    [
        ("matmul", [("N", 24), (24, 40)], True, False),  # m symbolic: one row at run time streams b
        ("matmul", [("N", 256), (256, 1032)], True, True),  # and 2 to 6 rows too, b past the cache
        ("batch_matmul", [("N", 7, 9), ("N", 9, 24)], False, False),  # the batch is symbolic, m is 7
        ("linear", [("N", 7, 16), (16, 24)], False, False),  # m is the batch and 7 rows joined
    ],
    ids=["matmul", "matmul-past-cache", "batch_matmul", "linear"],
)
def test_a_symbolic_m_of_few_rows_at_run_time_takes_a_kernel_of_its_own(
    name, shapes, branched, few, tmp_path
):
    """A dot product whose m is one symbolic dim is built as `if N == 1: <one row> else: <tiles>`
    (`compile.branched_by_size`): the row streams b, where the padded tiles read b's panels in
    place (1x768 @ 768x3072: 8.7x onnxruntime's time, 1.15x so). Its parameters are declared
    again as one row over the same data; a symbolic batch or an m joined from two dims keeps one
    kernel. Where b is past the cache, 2 to 6 rows get a kernel each too (`elif N == 2:` ...),
    streaming b with their rows unrolled (4.8-7.7x onnxruntime's time in tiles, 1.24-1.71x as a
    loop over the rows), unpadded. PADDED_DOTS checks the builds against numpy at the sizes of
    each branch."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "linear.py").write_text(LINEAR)
    with registry_kept():
        load_ops_path(tmp_path / "ops")
        bound = bind(get_op(name), {}, [TensorType(s, "float32") for s in shapes])
        script = hand_schedule(bound, get_target("x86"), BuildOptions())[0].script()
    sizes = range(1, 7 if few else 2) if branched else ()
    assert [size for size in range(1, 8) if f"if N == {size}:" in script] == list(sizes)
    for size in sizes:
        branch, rest = script.split(f"if N == {size}:")[1].split("else:", 1)
        assert "a_pad" not in branch and "a_pad" in rest.split("else:")[-1]
        assert f"a.view({size}, {shapes[0][1]}" in branch and f"matmul.view({size}, {shapes[1][1]}" in branch


NOTES_ONLY = """
from types import SimpleNamespace

from deploy.schedules.registry import register_schedule


@register_schedule("cpu", "linear")
def as_computed(sch, ctx):
    return SimpleNamespace(notes=("left as computed",))
"""
"""A user's schedule of LINEAR returning notes and nothing else (registered in a `deploy`
subprocess only)."""


def test_a_schedule_may_return_notes_alone(tmp_path):
    """docs/writing-fast-ops.md: a schedule returns what the build says, an object with `notes`;
    the sizes its dims get kernels of at run time (`Report`'s `at_one`, `few_rows`) are optional
    (a build read `at_one` of every report: an object without it was a traceback)."""
    (tmp_path / "linear.py").write_text(LINEAR)
    (tmp_path / "linear_cpu.py").write_text(NOTES_ONLY)
    proc = run_deploy("--ops-path", str(tmp_path), "build", "--op", "linear", "--shape", "Nx7x16",
                      "--shape", "16x24", "--target", "x86", "-o", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "note: linear: left as computed" in proc.stderr


RAGGED_DOTS = [
    ("matmul", [(5, 7), (7, 3)]),  # m and n less than a tile, n less than a vector
    ("matmul", [(33, 64), (64, 40)]),  # a row past whole tiles; tiles, one vector, no rest
    ("matmul", [(6, 24), (24, 1003)]),  # n = 1000-odd: tiles, a vector, a scalar rest
    ("matmul", [(1, 96), (96, 200)]),  # one row (a matrix-vector product): streamed along b's rows
    ("matmul", [(1, 10), (10, 203)]),  # streamed vectors then a scalar rest; k not whole steps of 4
    ("batch_matmul", [(3, 1, 8), (3, 8, 40)]),  # one row a batch
    ("matmul", [(4, 256), (256, 1032)]),  # few rows by a b past the cache: streamed, summed aside
    ("matmul", [(6, 255), (255, 1035)]),  # streamed vectors then a scalar rest; k not whole steps
    ("batch_matmul", [(2, 3, 128), (2, 128, 1040)]),  # few rows a batch, streamed
    ("pointwise_conv", [(1, 32, 96, 96), (3, 32, 1, 1)]),  # 3 channels by 1.1 MiB of pixels
    ("batch_matmul", [(3, 5, 9), (3, 9, 27)]),
    ("dense", [(5, 7), (3, 7)]),  # w[n, k], k no whole vectors: w copied transposed
    ("dense", [(3, 16), (10, 16)]),  # few rows by w[n, k]: sums along k, 2 of n a step
    ("dense", [(1, 40), (24, 40)]),  # one row: 8 of n a step
    ("dense", [(2, 24), (7, 24)]),  # an odd n: w copied transposed
    ("dense", [(9, 24), (20, 24)]),  # more rows than FEW_ROWS: w copied transposed, 9 padded to 12
    ("dense_bias", [(1, 40), (24, 40), (24,)]),  # one row, then its bias
    ("dense_bias", [(3, 16), (10, 16), (10,)]),  # few rows summed along k, then the bias
    ("dense_bias", [(9, 24), (20, 24), (20,)]),  # 9 padded to 12, the bias over the 9
    ("dense_bias", [(5, 7), (3, 7), (3,)]),  # w copied transposed; rows of 3 for the bias
    ("pointwise_conv", [(2, 3, 5, 7), (5, 3, 1, 1)]),  # pixels 5x7 joined: 35, past a tile
    ("grouped_conv", [(2, 8, 5, 8), (12, 2, 3, 3)]),  # 12 output channels: a block of 8 and 4
]
"""Dot products whose extents are not whole register blocks: the rule cuts them into tiles and
rests, and none falls to the generic schedule."""


@pytest.mark.parametrize(
    ("name", "shapes"), RAGGED_DOTS, ids=lambda v: "x".join(map(str, v[0])) if isinstance(v, list) else v
)
def test_ragged_dot_products_take_the_rule_and_match_numpy(name, shapes, local_session, tmp_path):
    """Tiles plus a remainder (not the generic schedule), checked against numpy on random
    inputs, ties and planted NaN and infinities, float32 and float64."""
    sch, ctx = schedule_of(name, shapes)
    assert schedule_by_structure(sch, ctx).fell_through == ""
    target = get_target("x86")
    for dtype in ("float32", "float64"):
        bound = bind(get_op(name), {}, [TensorType(s, dtype) for s in shapes])
        check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)


def loop_kinds(sch, block) -> list[tuple[int, ForKind]]:
    """(extent, kind) of each loop around `block` (a name, or a handle where names repeat),
    outermost first."""
    loops = sch.get_loops(sch.get_sblock(block) if isinstance(block, str) else block)
    return [(int(sch.get(loop).extent), ForKind(int(sch.get(loop).kind))) for loop in loops]


def test_a_1x1_convolution_runs_vectors_along_its_pixels():
    """The dot rule reads which operand is contiguous along which output axes (w[co, ci] by
    x[ci, h*w]): 2 tiles of the 4x12 pixels joined by 4 of the 16 output channels in parallel,
    the 8 input channels, then 4 channel rows by 3 vectors of pixels, not rows of 12 pixels."""
    sch, ctx = schedule_of("pointwise_conv", [(1, 8, 4, 12), (16, 8, 1, 1)])
    schedule_by_structure(sch, ctx)
    assert loop_kinds(sch, "pointwise_conv_update") == [
        (8, ForKind.PARALLEL), (8, ForKind.SERIAL), (4, ForKind.UNROLLED), (3, ForKind.SERIAL),
        (8, ForKind.VECTORIZED),
    ]  # fmt: skip


def test_avx512_tiles_a_dot_product_of_whole_8_row_tiles_by_8_rows(local_session, tmp_path):
    """On x86-avx512 (32 vector registers) an m of whole 8-row tiles runs 8 rows by 3 vectors (24
    accumulators), an m of 4-row tiles keeps 4 rows; checked against numpy with ties, NaN and
    infinities where the host has AVX-512."""
    target = get_target("x86-avx512")
    for rows, tile in ((16, 8), (12, 4)):
        bound = bind(
            get_op("matmul"), {}, [TensorType((rows, 32), "float32"), TensorType((32, 96), "float32")]
        )
        sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
        assert schedule_by_structure(sch, context(bound, target, BuildOptions())) == Taken("dot product")
        assert loop_kinds(sch, "matmul_update")[-4:] == [
            (32, ForKind.SERIAL), (tile, ForKind.UNROLLED), (3, ForKind.SERIAL), (16, ForKind.VECTORIZED),
        ]  # fmt: skip
        if not get_device("local").missing_cpu_flags(target.cpu_flags):
            check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)


def test_a_weight_read_along_its_sum_is_copied_transposed_or_summed_along_k():
    """x[m, k] @ w[n, k]^T (a Linear layer's weight as PyTorch keeps it): many rows read a copy
    of w transposed to [k, n], whole vectors along n (in place, each vector gathered a row of w
    apart: 9.8 ms against 0.66 copied, 128x768 @ 768x768^T), or their panels of b copy it
    transposed, where the dot rule copies them; a few rows sum each output along
    k, in vectors of x's and w's contiguous rows, several of n a step (ALONG_K_SUMS)."""
    sch, ctx = schedule_of("dense", [(8, 32), (24, 32)])
    assert schedule_by_structure(sch, ctx) == Taken("dot product")
    (copy,) = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint == "w_global"]
    assert [int(d) for d in sch.get(copy).writes[0].source.shape] == [32, 24]
    assert loop_kinds(sch, copy)[-2:] == [(16, ForKind.UNROLLED), (8, ForKind.VECTORIZED)]
    assert loop_kinds(sch, "dense_update")[-1] == (8, ForKind.VECTORIZED)
    assert "w_global" in str(sch.get(sch.get_sblock("dense_update")).reads)

    sch, ctx = schedule_of("dense", [(128, 768), (768, 768)])  # b's panels copied: w read by them
    assert schedule_by_structure(sch, ctx) == Taken("dot product")
    update = sch.get_sblock("dense_update")
    (panel,) = [b for b in sch.get_producers(update) if sch.get(b).name_hint != "dense_init"]
    (read,) = sch.get(panel).reads
    assert read.source.name == "w" and [int(d) for d in sch.get(panel).writes[0].source.shape] == [768, 768]

    sch, ctx = schedule_of("dense", [(2, 32), (24, 32)])
    assert schedule_by_structure(sch, ctx) == Taken("dot product")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert "w_global" not in names
    assert loop_kinds(sch, "dense_rf_update") == [  # too little work for threads
        (6, ForKind.SERIAL), (4, ForKind.SERIAL), (4, ForKind.UNROLLED), (2, ForKind.UNROLLED),
        (8, ForKind.VECTORIZED),
    ]  # fmt: skip


@pytest.mark.parametrize("shapes", [[(128, 768), (768, 768)], [(1, 40), (24, 40)], [(9, 24), (20, 24)]])
def test_a_dot_products_elementwise_stage_runs_after_its_sums_in_vectors(shapes):
    """A Linear layer with its bias, a sum then `+ b[n]` (TVM inlines no consumer into a sum),
    takes the dot rule: its sums are scheduled as dense's without the bias, then the bias runs
    over the output in the elementwise schedule, in vectors (it fell to the generic schedule:
    x[128, 768] @ w[768, 768]^T + b took 87x onnxruntime's time)."""
    plain, ctx = schedule_of("dense", shapes)
    schedule_by_structure(plain, ctx)
    sch, ctx = schedule_of("dense_bias", [*shapes, (shapes[1][0],)])
    assert schedule_by_structure(sch, ctx).fell_through == ""
    kinds = [
        loop_kinds(plain, b)
        for b in named_blocks(plain, "dense")
        if plain.get(b).name_hint.endswith("update")
    ]
    ours = [
        loop_kinds(sch, b) for b in named_blocks(sch, "product") if sch.get(b).name_hint.endswith("update")
    ]
    assert kinds and ours == kinds, "the sums as dense's"
    bias = named_blocks(sch, "dense_bias")
    assert loop_kinds(sch, bias[0])[-1] == (8, ForKind.VECTORIZED)  # the whole vectors, then a rest
    names = [sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))]
    assert "product_pad" not in names, "no copy out of padded rows: the bias reads them"


DEPTHWISE_SHIFT_RELU = """import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register


@register
class DepthwiseShiftRelu(Op):
    name = "depthwise_shift_relu"
    inputs = (Input("x", 4, 4), Input("w", 4, 4), Input("b", 1, 1))
    dtypes = ("float32", "float64")
    cases = (Case(((1, 8, 14, 14), (8, 1, 3, 3), (8,))),)

    def infer(self, attrs, inputs):
        return inputs[0]

    def compute(self, attrs, out, x, w, b):
        _, _, h, wd = x.shape
        zero = tirx.const(0, x.dtype)
        padded = te.compute(
            (x.shape[0], x.shape[1], h + 2, wd + 2),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= 1, y < h + 1, z >= 1, z < wd + 1), x[n, c, y - 1, z - 1], zero
            ),
            name="padded",
        )
        i, j = te.reduce_axis((0, 3), name="i"), te.reduce_axis((0, 3), name="j")
        shift = te.compute(b.shape, lambda c: b[c] * tirx.const(0.5, x.dtype), name="shift")
        conv = te.compute(
            out.shape, lambda n, c, y, z: te.sum(padded[n, c, y + i, z + j] * w[c, 0, i, j], axis=[i, j]),
            name="conv",
        )
        biased = lambda n, c, y, z: shift[c] + conv[n, c, y, z]  # noqa: E731
        return te.compute(
            out.shape, lambda *i: tirx.Select(biased(*i) < zero, zero, biased(*i)), name="relu"
        )  # NaN stays NaN

    def reference(self, attrs, x, w, b):
        padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = sum(
            padded[:, :, i : i + x.shape[2], j : j + x.shape[3]] * w[None, :, 0, i, j, None, None]
            for i in range(3) for j in range(3)
        )
        with np.errstate(invalid="ignore"):
            biased = out + b[None, :, None, None] * 0.5
            return np.where(biased < 0, 0, biased).astype(x.dtype)
"""
"""A user's depthwise 3x3 with a bias and a ReLU: a padded input, the window's sums, a stage of
half the bias (which only the stage after the sums reads), then one elementwise stage after the
sums."""


GROUPED_BIAS_RELU = """import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Int


@register
class GroupedBiasRelu(Op):
    name = "grouped_bias_relu"
    inputs = (Input("x", 4, 4), Input("w", 4, 4), Input("b", 1, 1))
    attrs = (Attr("mirror", Int(0, 1), 0, "the bias stage reads each row of sums backwards"),)
    dtypes = ("float32", "float64")
    cases = (Case(((1, 8, 7, 7), (16, 2, 3, 3), (16,))),)

    def infer(self, attrs, inputs):
        x, w, _ = inputs
        return TensorType((x.shape[0], w.shape[0], *x.shape[2:]), x.dtype)

    def compute(self, attrs, out, x, w, b):
        _, _, h, wd = x.shape
        per_group = out.shape[1] // (x.shape[1] // w.shape[1])
        zero = tirx.const(0, x.dtype)
        padded = te.compute(
            (x.shape[0], x.shape[1], h + 2, wd + 2),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= 1, y < h + 1, z >= 1, z < wd + 1), x[n, c, y - 1, z - 1], zero
            ),
            name="padded",
        )
        c = te.reduce_axis((0, w.shape[1]), "c")
        i, j = te.reduce_axis((0, 3), "i"), te.reduce_axis((0, 3), "j")
        conv = te.compute(
            out.shape,
            lambda n, o, y, z: te.sum(
                padded[n, o // per_group * w.shape[1] + c, y + i, z + j] * w[o, c, i, j], axis=[c, i, j]
            ),
            name="conv",
        )
        last = out.shape[3] - 1
        at = (lambda z: last - z) if attrs["mirror"] else (lambda z: z)
        biased = te.compute(out.shape, lambda n, o, y, z: conv[n, o, y, at(z)] + b[o], name="biased")
        return te.compute(
            out.shape, lambda *i: tirx.Select(biased[i] < zero, zero, biased[i]), name="relu"
        )

    def reference(self, attrs, x, w, b):
        padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
        group_c, per_group = w.shape[1], w.shape[0] // (x.shape[1] // w.shape[1])
        out = np.zeros((x.shape[0], w.shape[0], *x.shape[2:]))
        with np.errstate(invalid="ignore"):
            for o in range(w.shape[0]):
                taps = padded[:, o // per_group * group_c : (o // per_group + 1) * group_c]
                for i in range(3):
                    for j in range(3):
                        window = taps[:, :, i : i + x.shape[2], j : j + x.shape[3]]
                        out[:, o] += (window * w[o, :, i, j, None, None]).sum(axis=1)
            biased = (out[..., ::-1] if attrs["mirror"] else out) + b[None, :, None, None]
            return np.where(biased < 0, 0, biased).astype(x.dtype)
"""
"""A user's grouped 3x3 with a bias, then a ReLU, as two stages after the window's sums; the
bias stage reads the sums at its own point, or mirrored along the row."""


@pytest.mark.parametrize(
    "name, shapes, attrs, row",
    [
        ("depthwise_shift_relu", [(1, 8, 14, 14), (8, 1, 3, 3), (8,)], {}, [14, 1, 1, 1]),
        ("depthwise_shift_relu", [(2, 16, 32, 32), (16, 1, 3, 3), (16,)], {}, [32, 1, 1, 1]),
        ("grouped_bias_relu", [(1, 8, 7, 7), (16, 2, 3, 3), (16,)], {}, [7, 1, WINDOW_CHANNELS, 1]),
        ("grouped_bias_relu", [(2, 6, 9, 16), (12, 3, 3, 3), (12,)], {}, None),  # a ragged block of 8
        ("grouped_bias_relu", [(1, 8, 7, 7), (16, 2, 3, 3), (16,)], {"mirror": 1}, None),
    ],
)
def test_stages_after_a_windows_sums_run_at_its_row(name, shapes, attrs, row, local_session, tmp_path):
    """A window's sums with a bias and a ReLU after them take the window rule (they fell to the
    generic schedule): a stage the ReLU alone reads (half the bias) and the bias stage are
    inlined into the ReLU, which runs at the window's output `row` (its loops inside the parallel
    one: the row's, then one image, the channels of a block, one row), in vectors (1x32x112x112,
    x86-avx512: 0.34 / 0.17 ms as a pass of its own after the sums, 0.23 / 0.11 so, 1 / 2
    threads); where the register block of output channels does not divide them, or the stage
    reads the sums at another point, it runs as a pass after the sums. All match numpy with NaN
    and infinities."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "depthwise_shift_relu.py").write_text(DEPTHWISE_SHIFT_RELU)
    (tmp_path / "ops" / "grouped_bias_relu.py").write_text(GROUPED_BIAS_RELU)
    with registry_kept():
        load_ops_path(tmp_path / "ops")
        bound = bind(get_op(name), attrs, [TensorType(s, "float32") for s in shapes])
        sch = tvm.s_tir.Schedule(prim_module(bound, get_target("x86"), BuildOptions()))
        assert schedule_by_structure(sch, context(bound, get_target("x86"), BuildOptions())).rule == "window"
        assert not named_blocks(sch, "shift") and not named_blocks(sch, "biased")
        assert all(loop_kinds(sch, part)[-1][1] == ForKind.VECTORIZED for part in named_blocks(sch, "relu"))
        padded, relu = (  # relu: the block around its row's partitions, if any; padded: per plane
            next(
                b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.startswith(n)
            )
            for n in ("padded", "relu")
        )
        assert sch.get(sch.get_loops(relu)[0]).same_as(sch.get(sch.get_loops(padded)[0])) == bool(row)
        assert not row or [size for size, _ in loop_kinds(sch, relu)[1:5]] == row
        for dtype in ("float32", "float64"):
            bound = bind(get_op(name), attrs, [TensorType(s, dtype) for s in shapes])
            check(local_session, compile_op(bound, get_target("x86"), BuildOptions()), tmp_path)


def named_blocks(sch: Any, name: str, under: Any = None) -> list[Any]:
    """Handles of the innermost blocks of `sch` whose names start with `name` (a loop's
    partitions are `name_n0`, `name_n1`, ...), in order."""
    found = []
    for block in sch.get_child_blocks(under or sch.get_sblock("root")):
        inner = named_blocks(sch, name, block)
        found += inner or ([block] if sch.get(block).name_hint.startswith(name) else [])
    return found


def test_a_window_max_that_each_tap_compares_with_stays_a_stage():
    """max_pool2d_indices over 25 taps finds each window's max in a stage (`top`) that the search
    for its position compares every tap with: inlined there, each comparison recomputed the 25
    taps (ONNX's 5x5 MaxPool with indices took 30 s to compile). A map read twice (a cast, an
    add) is still inlined."""
    bound = bind(
        get_op("max_pool2d_indices"), {"kernel": 5, "padding": 2}, [TensorType((1, 1, 5, 5), "float32")]
    )
    target = get_target("x86")
    sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
    schedule_by_structure(sch, context(bound, target, BuildOptions()))
    assert [info.name for info in block_infos(sch)] == ["top", "out"]
    x, y = (te.placeholder((4, 8), "float16", name=name) for name in "xy")
    wide = te.compute(x.shape, lambda i, j: x[i, j].astype("float32"), name="wide")
    summed = te.compute(x.shape, lambda i, j: wide[i, j] + y[i, j].astype("float32"), name="summed")
    square = te.compute(x.shape, lambda i, j: summed[i, j] * summed[i, j], name="square")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y, square]))
    inline_producers(sch)
    assert [info.name for info in block_infos(sch)] == ["square"]


def test_a_few_rows_by_a_b_past_the_cache_stream_b_along_its_rows():
    """4 rows by a 1 MiB b: chunks of 43 vectors in parallel, 4 of b's rows a step, each vector of
    b loaded once for the 4 rows (1x768 @ 768x3072's way; tiles read its panels in place, 4 rows
    at 1.9 ms against 0.5 so), summed in a buffer of their own and copied out."""
    sch, ctx = schedule_of("matmul", [(4, 256), (256, 1032)])
    schedule_by_structure(sch, ctx)
    assert loop_kinds(sch, "matmul_update") == [
        (3, ForKind.PARALLEL), (64, ForKind.SERIAL), (43, ForKind.SERIAL), (4, ForKind.UNROLLED),
        (4, ForKind.UNROLLED), (8, ForKind.VECTORIZED),
    ]  # fmt: skip
    assert [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))] == [
        "matmul_init", "matmul_update", "matmul_global",
    ]  # fmt: skip


def test_a_streamed_dot_product_gives_each_core_as_many_chunks():
    """3072 floats of n on AVX-512 are 192 vectors: 3 chunks of 64 left one of 2 cores two (2
    threads ran 4x768 @ 768x3072 at 0.088 ms, 0.069 in 4 chunks of 48); on AVX2's 384 vectors 6
    chunks of 64 share already, and one core takes the most; counts no split shares keep theirs."""
    assert [gemv_chunk(192, 2), gemv_chunk(384, 2), gemv_chunk(192, 1), gemv_chunk(129, 2)] == [
        48,
        64,
        64,
        43,
    ]
    bound = bind(get_op("matmul"), {}, [TensorType((4, 768), "float32"), TensorType((768, 3072), "float32")])
    target = get_target("x86-avx512")
    sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
    schedule_by_structure(sch, replace(context(bound, target, BuildOptions()), cores=2))
    assert loop_kinds(sch, "matmul_update")[:3] == [
        (4, ForKind.PARALLEL),
        (192, ForKind.SERIAL),
        (48, ForKind.SERIAL),
    ]


@pytest.mark.parametrize(
    ("name", "shapes", "axes"),
    [
        ("pointwise_conv", [(2, 8, 4, 12), (16, 8, 1, 1)], ([0], [1], [2, 3])),  # images: a batch
        ("pointwise_conv", [("N", 8, 4, 12), (16, 8, 1, 1)], ([0], [1], [2, 3])),
        ("matmul", [(8, 32), (32, 40)], ([], [0], [1])),
        ("batch_matmul", [(2, 8, 16), (2, 16, 32)], ([0], [1], [2])),
    ],
)
def test_a_dot_product_joins_into_n_only_what_b_holds_after_its_sums(name, shapes, axes):
    """n is b's own variables read after its reduction variables: a 1x1 convolution's pixels,
    not its image (x[image, ci, y, x]), which loops as a batch, static or symbolic."""
    sch, _ = schedule_of(name, shapes)
    (block,) = [info.block for info in block_infos(sch)]
    assert dot_axes(sch.get(block)) == axes


@pytest.mark.parametrize("n", [48, 64])
def test_a_long_sum_runs_in_blocks_over_a_copied_panel_of_b(n, local_session, tmp_path):
    """k = 512 in 2 blocks of 256 outside the 5 tiles of 18 rows (the last skips 2), each block's
    256-row panel of b copied into a buffer of its own in vectors; the tiles of n in parallel:
    3 vectors wide (48: 2 tiles), or 2 where that makes n whole tiles (64: 4 tiles, not 2 and a
    rest, which would not be copied). Checked against numpy with ties, NaN and infinities,
    float32 and float64 (4 lanes)."""
    shapes: list[tuple[int | str, ...]] = [(18, 512), (512, n)]
    sch, ctx = schedule_of("matmul", shapes)
    assert schedule_by_structure(sch, ctx).fell_through == ""
    vectors = 3 if n == 48 else 2
    tiles = n // (8 * vectors)
    blocks = [(tiles, ForKind.PARALLEL), (2, ForKind.SERIAL)]
    copy = [(256, ForKind.SERIAL), (vectors, ForKind.SERIAL), (8, ForKind.VECTORIZED)]
    assert loop_kinds(sch, "b_global") == [*blocks, *copy]
    assert loop_kinds(sch, "matmul_update")[:3] == [*blocks, (5, ForKind.SERIAL)]
    target = get_target("x86")
    for dtype in ("float32", "float64"):
        bound = bind(get_op("matmul"), {}, [TensorType(s, dtype) for s in shapes])
        check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)


def test_a_grouped_convolution_blocks_output_channels_around_each_input_vector():
    """Its sum over the group's 2 channels is not a window tap: 8 output channels share each
    input vector's load, the 3x3 taps unrolled, the channel loop not."""
    sch, ctx = schedule_of("grouped_conv")
    schedule_by_structure(sch, ctx)
    assert loop_kinds(sch, "grouped_conv_update")[-5:] == [
        (2, ForKind.SERIAL), (3, ForKind.UNROLLED), (3, ForKind.UNROLLED), (8, ForKind.UNROLLED),
        (8, ForKind.VECTORIZED),
    ]  # fmt: skip


def test_a_window_row_of_whole_vectors_runs_in_vectors_of_the_target():
    """A row of 16 floats: 2 vectors of AVX2's 8 lanes, not one vector of 16 (which LLVM splits
    anyway, but a grouped convolution's channel block would shrink to fit it)."""
    sch, ctx = schedule_of("depthwise_conv", [(1, 4, 16, 16), (4, 1, 3, 3)])
    assert schedule_by_structure(sch, ctx) == Taken("window")
    assert loop_kinds(sch, "depthwise_conv_update")[-1] == (8, ForKind.VECTORIZED)


SHORT_ROWS = [
    ("depthwise_conv", [(1, 4, 7, 3), (4, 1, 3, 3)], {}),  # rows of 3
    ("depthwise_conv", [(2, 3, 9, 5), (3, 1, 3, 3)], {"stride": 2}),  # rows of 3, every other column
    ("grouped_conv", [(1, 8, 3, 3), (16, 2, 3, 3)], {}),  # rows of 3 by a block of 8 channels
]
"""Windows whose output rows are shorter than a vector of 4 doubles (or 8 floats)."""


RAGGED_ROWS = [
    ("depthwise_conv", [(1, 4, 14, 14), (4, 1, 3, 3)], {}),  # a vector, then one of 6 lanes
    ("depthwise_conv", [(1, 2, 5, 37), (2, 1, 3, 3)], {}),  # 4 vectors, then one of 5 lanes
    ("depthwise_conv", [(1, 3, 9, 75), (3, 1, 3, 3)], {"stride": 2}),  # rows of 38, every other column
    ("grouped_conv", [(1, 8, 5, 14), (16, 2, 3, 3)], {}),  # rows of 14 by a block of 8 channels
    ("grouped_conv", [(1, 8, 5, 35), (16, 2, 3, 3)], {}),  # rows of 35 by a block of 8 channels
]
"""Windows whose output rows are longer than a vector and not whole vectors, of 8 floats or of
4 doubles."""


@pytest.mark.parametrize(
    ("name", "shapes", "attrs"), RAGGED_ROWS, ids=lambda v: str(v) if isinstance(v, str) else ""
)
def test_a_window_row_longer_than_a_vector_runs_whole_vectors_then_one_of_the_rest(
    name, shapes, attrs, local_session, tmp_path
):
    """The window rule, not the generic schedule (which took 8.7x its time: depthwise 3x3 on
    1x32x75x75, AVX2, 1 thread, 1.11 ms against 0.128): the row's whole vectors, then its rest
    as one vector of its length, the taps unrolled around each; checked against numpy with
    ties, NaN and infinities in float32 and float64, and built for arm, armv7 and riscv64 with
    no note."""
    for dtype in ("float32", "float64"):
        bound = bind(get_op(name), attrs, [TensorType(s, dtype) for s in shapes])
        target = get_target("x86")
        lanes = 8 if dtype == "float32" else 4
        sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
        assert schedule_by_structure(sch, context(bound, target, BuildOptions())) == Taken("window")
        row = bound.output.shape[-1]
        kinds = [
            loop_kinds(sch, block)[-1]
            for block in (sch.get_sblock(f"{name}_z0_update"), sch.get_sblock(f"{name}_z1_update"))
        ]
        assert kinds == [(lanes, ForKind.VECTORIZED), (row % lanes, ForKind.VECTORIZED)]
        check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)
    built_elsewhere_with_no_note(name, shapes, attrs)


@pytest.mark.parametrize(
    ("name", "shapes", "attrs"), SHORT_ROWS, ids=lambda v: str(v) if isinstance(v, str) else ""
)
def test_a_window_of_rows_shorter_than_a_vector_runs_each_row_as_one_vector(
    name, shapes, attrs, local_session, tmp_path
):
    """A 3x3 map's rows: the window rule still (one vector of the row's length, the taps
    unrolled), not the generic schedule; checked against numpy with ties, NaN and infinities in
    float32 and float64, and built for arm, armv7 and riscv64 with no note."""
    for dtype in ("float32", "float64"):
        bound = bind(get_op(name), attrs, [TensorType(s, dtype) for s in shapes])
        target = get_target("x86")
        sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
        assert schedule_by_structure(sch, context(bound, target, BuildOptions())) == Taken("window")
        row = bound.output.shape[-1]
        assert loop_kinds(sch, f"{name}_update")[-1] == (row, ForKind.VECTORIZED)
        check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)
    built_elsewhere_with_no_note(name, shapes, attrs)


def built_elsewhere_with_no_note(name: str, shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> None:
    """The op in float32 builds for arm, armv7 and riscv64 by the default schedule with no note."""
    for target_name in ("arm", "armv7", "riscv64"):
        compiled = compile_op(bind(get_op(name), attrs, [TensorType(s, "float32") for s in shapes]),
                              get_target(target_name), BuildOptions())  # fmt: skip
        assert compiled.schedule == "cpu/generic" and compiled.notes == ()


def build_fast_op(out, *args: str):
    """`deploy --ops-path bench/fast_ops build --target x86 ARGS -o OUT` in a subprocess."""
    built = run_deploy("--ops-path", str(FAST_OPS), "build", "--target", "x86", *args, "-o", str(out))
    assert built.returncode == 0, built.stderr
    return built


def test_a_build_names_the_rule_that_fell_through_in_one_line(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "total.py").write_text(TOTAL)
    built = run_deploy("--ops-path", str(tmp_path / "ops"), "build", "--target", "x86", "--op", "total",
                       "--shape", "64x4", "-o", str(tmp_path / "total"))  # fmt: skip
    assert built.returncode == 0, built.stderr
    (line,) = built.stderr.splitlines()
    assert line.startswith(f"note: total: {TOTAL_NOTE}") and "note" not in built.stdout
    manifest = json.loads((tmp_path / "total" / "manifest.json").read_text())
    assert manifest["notes"] == [line.removeprefix("note: total: ")]


def test_a_build_that_keeps_libm_in_a_vector_loop_says_so(tmp_path):
    """float64 erf stays libm's (the polynomials are float32's); float32's is vector code."""
    built = build_fast_op(tmp_path / "f64", "--op", "gelu", "--shape", "3x64", "--dtype", "float64")
    assert built.stderr == "note: gelu: scalar libm calls inside a vector loop, one per lane: erf\n"
    assert build_fast_op(tmp_path / "f32", "--op", "gelu", "--shape", "3x64").stderr == ""


def test_deploy_test_shows_each_note_once_per_op_not_per_case():
    tested = run_deploy("--ops-path", str(FAST_OPS), "test", "--target", "x86", "--op", "gelu")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    line = "note: gelu (float64, 2 cases): scalar libm calls inside a vector loop, one per lane: erf"
    assert tested.stdout.count("note:") == 1 and line in tested.stdout.splitlines()


VECTOR_FMA = {
    "arm": r"fmla\s+v\d+\.4s",
    "armv7": r"vfma\.f32\s+q\d+",
    "riscv64": r"vfm(acc|add)\.v[vf]\s+v\d+",
}
"""target -> its vector FMA as objdump prints it. LLVM picks armv7's fused vfma (not vmla) for
the NEONv2 targets, and on riscv64 vfmadd (the product overwrites a factor) as often as vfmacc
(it overwrites the addend): layer_norm's variance is 16 vfmadd and one vfmacc."""


@pytest.mark.parametrize("target_name", sorted(VECTOR_FMA))
@pytest.mark.parametrize("name", ["matmul", "layer_norm", "pointwise_conv", "grouped_conv", "dense"])
def test_the_default_builds_use_the_vector_fma(tmp_path, target_name, name):
    """The dot product's register block (matmul, the 1x1 convolution), the grouped
    convolution's block of output channels and the row rule's vector reductions are vector FMAs
    on every cross target (issue #51: emulated times are not speed, the instructions are)."""
    target = get_target(target_name)
    objdump = get_platform(target.arch).tool("objdump")
    if shutil.which(objdump) is None:
        pytest.skip(f"needs {objdump} ({target.cross_package})")
    compiled = compile_op(bound_op(name), target, BuildOptions())
    assert compiled.schedule == "cpu/generic" and compiled.notes == ()
    kernels = tmp_path / "kernels.o"  # the object module.so and the bundle link (see test_arm)
    compiled.executable.mod.write_to_file(str(kernels))
    assert elf_machine(kernels) == target.arch
    listing = subprocess.run([objdump, "-d", str(kernels)], capture_output=True, text=True, check=True).stdout
    assert re.search(VECTOR_FMA[target_name], listing), f"no vector FMA in {name} for {target_name}"


X86_LANE_LOAD = r"vinsertps \$0x[0-9a-f]+,-?(0x[0-9a-f]+)?\("
LANE_LOADS = {"x86": X86_LANE_LOAD, "x86-avx512": X86_LANE_LOAD, "arm": r"ld1\s+\{v\d+\.s\}\[\d\]"}
"""target -> a load into one lane of a vector as objdump prints it."""


@pytest.mark.parametrize("target_name", sorted(LANE_LOADS))
def test_a_stride2_window_loads_whole_vectors_not_a_lane_at_a_time(tmp_path, target_name, local_session):
    """A depthwise 3x3 at stride 2 reads every other column of its input padded into rows of 69
    (odd): TVM loaded such taps a lane at a time (27 lane loads on x86, 45 on x86-avx512, 14 on
    arm; 1x32x112x112 took 0.357 ms at 1 thread on x86-avx512), and the lowering now loads two
    overlapping vectors for each (0.113 ms). Checked against numpy where this host runs it."""
    shapes = [(1, 4, 9, 67), (4, 1, 3, 3)]
    bound = bind(get_op("depthwise_conv"), {"stride": 2}, [TensorType(s, "float32") for s in shapes])
    target = get_target(target_name)
    objdump = get_platform(target.arch).tool("objdump")
    if shutil.which(objdump) is None:
        pytest.skip(f"needs {objdump} ({target.cross_package})")
    compiled = compile_op(bound, target, BuildOptions())
    assert compiled.schedule == "cpu/generic" and compiled.notes == ()
    kernels = tmp_path / "kernels.o"
    compiled.executable.mod.write_to_file(str(kernels))
    listing = subprocess.run([objdump, "-d", str(kernels)], capture_output=True, text=True, check=True).stdout
    assert not re.search(LANE_LOADS[target_name], listing)
    check_where_it_runs(bound, target_name, local_session, tmp_path)


def rf_steps(sch, name: str) -> list[tuple[int, ForKind]]:
    """(extent, kind) of the innermost loop of each of reduction `name`'s rfactor stages, in
    order (the stages sit in the row loop of `name`)."""
    row = sch.get_loops(sch.get_sblock(name))[0]
    steps = [b for b in sch.get_child_blocks(row) if sch.get(b).name_hint == f"{name}_rf_update"]
    return [loop_kinds(sch, step)[-1] for step in steps]


def rf_lanes(sch, name: str) -> list[int]:
    """Lanes of each vector step of reduction `name`'s rfactor stages, in order."""
    return [extent for extent, kind in rf_steps(sch, name) if kind == ForKind.VECTORIZED]


def test_a_rows_sums_run_in_two_vectors_and_combine_in_halves():
    """softmax over rows of 128 floats: the max and the sum each in 2 vectors of 8 side by side
    (16 lanes), then combined 16 -> 8 -> 4 -> 2 a vector step each, the last 2 in the block: no
    chain of 16 dependent maxes or adds a row (its results are checked against numpy with
    specials in test_the_default_by_structure_matches_numpy)."""
    sch, ctx = schedule_of("softmax", [(4, 128)])
    assert schedule_by_structure(sch, ctx).rule == "row reduction"
    for name in ("high", "total"):
        assert loop_kinds(sch, name)[-1] == (2, ForKind.SERIAL)
        assert rf_steps(sch, name) == [
            (16, ForKind.VECTORIZED),
            (8, ForKind.VECTORIZED),
            (4, ForKind.VECTORIZED),
            (2, ForKind.VECTORIZED),
        ]


@pytest.mark.parametrize(
    ("name", "shapes"),
    [("softmax", [(4, 16, 64)]), ("log_softmax", [(64, 24)]), ("layer_norm", [(64, 128), (128,), (128,)])],
)
def test_a_step_of_the_rows_runs_each_stage_over_a_block_of_rows(name, shapes, local_session, tmp_path):
    """64 rows: a parallel step takes ROW_BLOCK (8) of them and each stage (the max, the sum,
    the output) loops over all 8 before the next stage starts (a stage of one value a row, in
    one vector across them); checked against numpy on random
    inputs, ties and planted NaN and infinities, in each dtype the op takes. Too little work for
    threads (64 x 24 floats) keeps the steps serial."""
    sch, ctx = schedule_of(name, shapes)
    assert schedule_by_structure(sch, ctx).rule == "row reduction"
    step = sch.get_loops(sch.get_sblock(name))[0]
    assert int(sch.get(step).extent) == 64 // ROW_BLOCK
    kind = ForKind.SERIAL if name == "log_softmax" else ForKind.PARALLEL
    for block in sch.get_child_blocks(step):
        loops = loop_kinds(sch, block)
        assert loops[0] == (64 // ROW_BLOCK, kind)
        across_rows = [
            (1, ForKind.SERIAL),
            (ROW_BLOCK, ForKind.VECTORIZED),
        ]  # a scalar a row: layer_norm's mean
        assert loops[1] == (ROW_BLOCK, ForKind.SERIAL) or loops[1:] == across_rows
    target = get_target("x86")
    for dtype in get_op(name).dtypes:
        bound = bind(get_op(name), {}, [TensorType(s, dtype) for s in shapes])
        check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)


def test_a_step_takes_one_row_where_a_block_would_leave_a_core_idle():
    """12 rows on 2 cores: blocks of 2 or 4 would leave a core fewer than 4 steps; a block
    divides the innermost row extent (it never straddles an outer index) and fits 32 KiB."""
    assert [row_block(12, 12, 512, 2), row_block(12, 12, 512, 1), row_block(64, 64, 4096, 1)] == [1, 2, 8]
    assert row_block(64, 64, 8192, 1) == 4  # 8 rows of 8 KiB would not stay in L1 with their stages
    assert row_block(3, 96, 512, 1) == 1  # rows of 32 x 3: no block of 3 or more divides 3
    assert row_block(None, 96, 512, 1) == 1


def test_a_search_tries_each_block_of_rows():
    """The block of rows is a structural pick: a search builds each of them (64 rows of 64
    floats on 2 cores: 1 to 16 rows a step), the hand takes ROW_BLOCK."""
    sch, ctx = schedule_of("softmax", [(4, 16, 64)])
    seen = Picked()
    schedule_by_structure(sch, replace(ctx, cores=2, choices=seen))
    assert (ROWS_A_STEP, (1, 2, 4, 8, 16), ROW_BLOCK) in seen.seen
    sch, ctx = schedule_of("softmax", [(4, 16, 64)])
    schedule_by_structure(sch, replace(ctx, cores=2, choices=Picked({ROWS_A_STEP: 16})))
    assert int(sch.get(sch.get_loops(sch.get_sblock("softmax"))[0]).extent) == 64 // 16


def test_a_row_of_ragged_vectors_still_takes_the_rows_rule():
    """A row of 20 floats (not whole vectors of 8): no vector reduction, rows still in parallel."""
    sch, ctx = schedule_of("softmax", [(3, 20)])
    assert schedule_by_structure(sch, ctx).rule == "row reduction"


@pytest.mark.parametrize("shape", [(2, 8, 7, 7), (1, 64, 14, 14)])
def test_a_sum_over_a_planes_rows_and_columns_is_one_row_of_its_elements(shape):
    """A global average pool sums each plane over two axes: joined into one loop of 49 or 196
    elements, in vectors of 8 combined in halves (each axis alone, 7 or 14, is too short for
    two vectors; the rule vectorized the wrong loop and fell to the generic schedule: 1x256x14x14
    took 0.020 ms, 0.0028 so, onnxruntime's GlobalAveragePool 0.013-0.021, x86-avx512). Its
    answers are checked in test_the_default_by_structure_matches_numpy."""
    sch, ctx = schedule_of("global_avg_pool", [shape])
    assert schedule_by_structure(sch, ctx) == Taken("row reduction")
    assert rf_lanes(sch, "sums") == [8, 4, 2]


INSTANCE_NORM = """import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Int


@register
class InstanceNorm(Op):
    name = "instance_norm"
    inputs = (Input("x", 4, 4),)
    attrs = (Attr("keepdims", Int(0, 1), 0, "the sums shaped (n, c, 1, 1), as numpy keeps them"),)
    dtypes = ("float32", "float64")
    cases = (Case(((1, 4, 7, 7),)),)

    def infer(self, attrs, inputs):
        return inputs[0]

    def compute(self, attrs, out, x):
        n, c, h, w = x.shape
        kept = ((n, c, 1, 1), lambda a, b: (a, b, 0, 0)), ((n, c), lambda a, b: (a, b))
        shape, at = kept[0] if attrs["keepdims"] else kept[1]
        size = tirx.const(float(int(h) * int(w)), x.dtype)
        i, j = te.reduce_axis((0, h), "i"), te.reduce_axis((0, w), "j")
        total = te.compute(shape, lambda a, b, *_: te.sum(x[a, b, i, j], axis=[i, j]), name="total")
        mean = te.compute(shape, lambda *v: total[v] / size, name="mean")
        k, m = te.reduce_axis((0, h), "k"), te.reduce_axis((0, w), "m")
        centered = lambda a, b, y, z: x[a, b, y, z] - mean[at(a, b)]  # noqa: E731
        square = lambda a, b, y, z: centered(a, b, y, z) * centered(a, b, y, z)  # noqa: E731
        squares = te.compute(shape, lambda a, b, *_: te.sum(square(a, b, k, m), axis=[k, m]), name="squares")
        eps = tirx.const(1e-5, x.dtype)
        spread = lambda a, b: te.sqrt(squares[at(a, b)] / size + eps)  # noqa: E731
        normed = lambda a, b, y, z: centered(a, b, y, z) / spread(a, b)  # noqa: E731
        return te.compute(x.shape, normed, name="norm")

    def reference(self, attrs, x):
        wide = x.astype("float64")
        mean = wide.mean(axis=(2, 3), keepdims=True)
        with np.errstate(invalid="ignore"):
            variance = ((wide - mean) ** 2).mean(axis=(2, 3), keepdims=True)
            return ((wide - mean) / np.sqrt(variance + 1e-5)).astype(x.dtype)
"""
"""A user's instance norm: a mean and a variance over each plane's rows and columns, then every
element of the plane normalized; the sums shaped (n, c), or (n, c, 1, 1) with `keepdims`."""


@pytest.mark.parametrize(
    ("shape", "keepdims"), [((1, 4, 7, 7), 0), ((2, 3, 14, 14), 0), ((1, 64, 56, 56), 0), ((2, 3, 14, 14), 1)]
)
def test_a_row_reductions_output_row_of_several_axes_is_one_loop(shape, keepdims, local_session, tmp_path):
    """An instance norm's sums are over a plane (two axes, joined into one row) and its output
    row is that plane: its two loops are one row too, in vectors (the rule indexed past the
    sums' axes and crashed, or fell to the generic schedule; 1x64x56x56 on x86-avx512 takes
    0.049 ms, onnxruntime's InstanceNormalization 0.076-0.097; with the sums kept (n, c, 1, 1),
    each row's sums were computed again for each of its rows). Checked against numpy with NaN
    and infinities in float32 and float64."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "instance_norm.py").write_text(INSTANCE_NORM)
    with registry_kept():
        load_ops_path(tmp_path / "ops")
        bound = bind(get_op("instance_norm"), {"keepdims": keepdims}, [TensorType(shape, "float32")])
        sch = tvm.s_tir.Schedule(prim_module(bound, get_target("x86"), BuildOptions()))
        taken = schedule_by_structure(sch, context(bound, get_target("x86"), BuildOptions()))
        assert taken == Taken("row reduction"), taken.fell_through
        assert loop_kinds(sch, named_blocks(sch, "total")[0])[-1] == (16, ForKind.VECTORIZED)  # 2 x 8
        norm = named_blocks(sch, "norm")
        assert all(loop_kinds(sch, part)[-1][1] == ForKind.VECTORIZED for part in norm)
        assert shape[2] not in {size for part in norm for size, _ in loop_kinds(sch, part)}  # no row's loop
        for dtype in ("float32", "float64"):
            bound = bind(get_op("instance_norm"), {"keepdims": keepdims}, [TensorType(shape, dtype)])
            check(local_session, compile_op(bound, get_target("x86"), BuildOptions()), tmp_path)


def test_a_sum_over_a_symbolic_axis_is_not_joined():
    """A batch's statistics summed over a symbolic batch and each plane (x[n, c, i, j] over n,
    i and j), and a matrix summed over its symbolic rows: not one row of elements (the extent
    is known at run time only); the join raised TypeError and failed the build."""
    n = te.var("n")
    x = te.placeholder((n, 8, 7, 7), "float32", name="x")
    b, i, j = te.reduce_axis((0, n), "b"), te.reduce_axis((0, 7), "i"), te.reduce_axis((0, 7), "j")
    stats = te.compute((8,), lambda c: te.sum(x[b, c, i, j], axis=[b, i, j]), name="stats")
    m = te.placeholder((n, 64), "float32", name="m")
    k, col = te.reduce_axis((0, n), "k"), te.reduce_axis((0, 64), "col")
    total = te.compute((1,), lambda _: te.sum(m[k, col], axis=[k, col]), name="total")
    for tensors, loops in (([x, stats], 4), ([m, total], 3)):
        sch = tvm.s_tir.Schedule(te.create_prim_func(tensors))
        (info,) = block_infos(sch)
        joined_reduction(sch, info)
        assert len(sch.get_loops(info.block)) == loops


def test_rows_that_are_not_whole_vectors_run_whole_ones_then_a_masked_one(local_session, tmp_path):
    """Rows of 1000 floats (a classifier's softmax) on x86-avx512 sum 62 vectors of 16, then one
    with only its first 8 lanes in the row (LANES_KEY: TVM's compute_at drops the split's test);
    rows of 20 on x86 two vectors of 8 and 4 lanes of a third; rows of 12, shorter than two
    vectors, vectors of 4 (`row_lanes`), and rows of 7 stay scalar. Each is checked against numpy
    with ties, NaN and infinities (x86-avx512 where the host has it); the lanes past a row of the
    last one would read past the tensor."""
    assert [row_lanes(16, 1000), row_lanes(8, 20), row_lanes(8, 7), row_lanes(16, None)] == [8, 4, 8, 16]
    for target_name, rows, lanes, rest in (
        ("x86-avx512", 1000, 16, 8), ("x86", 20, 8, 4), ("x86", 12, 4, 0), ("x86", 7, 0, 0),
    ):  # fmt: skip
        target = get_target(target_name)
        for name in ("softmax", "log_softmax"):
            bound = bind(get_op(name), {}, [TensorType((3, rows), "float32")])
            sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
            assert schedule_by_structure(sch, context(bound, target, BuildOptions())).rule == "row reduction"
            script = sch.mod.script()
            assert (f"T.vectorized({lanes})" in script) == bool(lanes)
            assert (f'"{LANES_KEY}": {rest}' in script) == bool(rest)
            if not get_device("local").missing_cpu_flags(target.cpu_flags):
                check(local_session, compile_op(bound, target, BuildOptions()), tmp_path)


def test_rvv_row_sums_of_one_vector_stay_scalar_and_build():
    """On riscv64 log_softmax over rows of 8, 12 or 20 floats (no whole pairs of vectors of 4)
    failed to build (TVM's `MatchType`): their sums stay scalar and build; rows of 16 still sum
    in two vectors of 4."""
    target = get_target("riscv64")
    for rows, lanes in ((8, []), (12, []), (20, []), (16, [8, 4, 2])):
        bound = bind(get_op("log_softmax"), {}, [TensorType((4, rows), "float32")])
        sch = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
        assert schedule_by_structure(sch, context(bound, target, BuildOptions())).rule == "row reduction"
        assert rf_lanes(sch, "total") == lanes
        assert compile_op(bound, target, BuildOptions()).schedule == "cpu/generic"


def test_avx512_rows_accumulate_in_one_vector_and_a_search_tries_two():
    """softmax over rows of 128 floats: AVX-512 sums a row in one vector of 16 lanes
    (WIDE_ROW_ACCUMULATORS), combined 16 -> 8 -> 4 -> 2; two side by side (AVX2's
    ROW_ACCUMULATORS) would add a step, 32 -> 16; a search tries both."""
    target = get_target("x86-avx512")
    bound = bind(get_op("softmax"), {}, [TensorType((16, 128), "float32")])
    for picks, lanes in (
        ({}, [16, 8, 4, 2]),
        ({ROW_VECTORS_SIDE_BY_SIDE: ROW_ACCUMULATORS}, [32, 16, 8, 4, 2]),
    ):
        sch, seen = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions())), Picked(picks)
        schedule_by_structure(sch, replace(context(bound, target, BuildOptions()), choices=seen))
        taken = picks.get(ROW_VECTORS_SIDE_BY_SIDE, WIDE_ROW_ACCUMULATORS)
        assert (ROW_VECTORS_SIDE_BY_SIDE, (ROW_ACCUMULATORS, WIDE_ROW_ACCUMULATORS), taken) in seen.seen
        assert rf_lanes(sch, "total") == lanes


def elementwise(fn, n: int = 64, dtype: str = "float32"):
    x = te.placeholder((n,), dtype, name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    return tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, y])}))


def fake_context() -> ScheduleContext:
    return context(bound_op("gelu"), get_target("x86"), BuildOptions())


def shifted_exp(other_row: bool = False, reducer=te.max, name: str = "x") -> tvm.IRModule:
    """exp(name - high) over rows of 16, high each row's max (or another reduction), read at the
    same row or (`other_row`) at the next one."""
    x = te.placeholder((4, 16), "float32", name=name)
    k = te.reduce_axis((0, 16), name="k")
    high = te.compute((4,), lambda i: reducer(x[i, k], axis=k), name="high")
    y = te.compute((4, 16), lambda i, j: te.exp(x[i, j] - high[(i + 1) % 4 if other_row else i]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def test_exp_of_a_value_minus_its_rows_max_is_known_nonpositive():
    """softmax's exp(x - max(x)) is clamped from below only (no EXP_HI in its lowering); an exp
    of x minus another row's max, or minus a row's sum, keeps both clamps."""
    assert shifted_by_row_max(shifted_exp()["main"]) == ["x-high"]
    for op in ("softmax", "log_softmax"):
        sch, ctx = schedule_of(op, [(4, 64)])
        assert shifted_by_row_max(sch.mod["main"]) == ["x-high"]
        schedule_by_structure(sch, ctx)
        lowered = lower_math(sch.mod["main"]).script()
        assert f"{EXP_LO}" in lowered and f"{EXP_HI}" not in lowered and SHIFTED_KEY not in lowered
    assert shifted_by_row_max(shifted_exp(other_row=True)["main"]) == []
    assert shifted_by_row_max(shifted_exp(reducer=te.sum)["main"]) == []
    assert shifted_by_row_max(shifted_exp(name="x-y")["main"]) == []  # "x-y-high" names no one pair
    sch = tvm.s_tir.Schedule(shifted_exp(other_row=True))
    assert ask_vector_math(sch, fake_context(), shifted=shifted_by_row_max(sch.mod["main"]))
    assert f"{EXP_HI}" in lower_math(sch.mod["main"]).script()


def test_libm_calls_are_rewritten_unless_asked_for():
    sch = elementwise(te.erf)
    assert not ask_vector_math(sch, fake_context(), libm=True)
    assert "T.erf(" in str(lower_math(sch.mod["main"]))
    assert ask_vector_math(sch, fake_context())
    assert "T.erf(" in str(sch.mod) and "T.erf(" not in str(lower_math(sch.mod["main"]))


SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 88.7, 88.8, -87.3, -87.4, -104.0], "float32"
)
GRID = np.concatenate([np.linspace(-20, 20, 40001, dtype=np.float32), SPECIALS])


def run_elementwise(fn, grid: np.ndarray = GRID) -> np.ndarray:
    sch = elementwise(fn, grid.size, str(grid.dtype))
    vectors = sch.split(sch.get_loops(sch.get_sblock("y"))[0], factors=[None, 8])[1]
    sch.vectorize(vectors)
    ask_vector_math(sch, fake_context())
    assert libm_in_vector_loops(lower_math(sch.mod["main"])) == []
    built = compile_cpu(sch.mod, get_target("x86").tvm_target(), two_vector_shuffles=False)
    out = tvm.runtime.empty(grid.shape, str(grid.dtype), tvm.cpu())
    built.mod["main"](tvm.runtime.tensor(grid, tvm.cpu()), out)
    return out.numpy()


@pytest.mark.parametrize(
    ("fn", "exact", "rtol", "atol"),
    [
        (te.exp, np.exp, 3e-7, 2.0**-125),  # flushed to 0 below 2**-125 (EXP_LO)
        (te.erf, None, 0.0, 3e-7),
        (te.tanh, np.tanh, 1e-6, 1e-7),
        (te.sigmoid, lambda x: 1 / (1 + np.exp(-x)), 1e-6, 1e-38),
    ],
    ids=["exp", "erf", "tanh", "sigmoid"],
)
def test_vector_math_is_accurate_and_keeps_nan_and_infinities(fn, exact, rtol, atol):
    """Each polynomial against float64 over [-20, 20] and the specials (NaN, +-inf, +-0, the edges
    of exp's range: 88.7 finite, 88.8 +inf, -87.3 flushed to 0): NaN where and only where the
    exact result is, infinities where it has them, else within the stated bound."""
    from scipy.special import erf

    wide = GRID.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = (exact or erf)(wide).astype(np.float32)
        got = run_elementwise(fn)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(np.isinf(got[finite]), np.isinf(want[finite]))
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


def test_a_libm_call_left_in_a_vector_loop_is_found():
    sch = elementwise(te.exp)
    sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("y"))[0], factors=[None, 8])[1])
    assert libm_in_vector_loops(sch.mod["main"]) == ["exp"]
    ask_vector_math(sch, fake_context())
    assert libm_in_vector_loops(lower_math(sch.mod["main"])) == []


def test_a_libm_call_in_a_scalar_loop_is_not_reported():
    sch = elementwise(te.log)
    assert libm_in_vector_loops(sch.mod["main"]) == []


@pytest.mark.parametrize("name", ["softmax", "gelu", "log_softmax"])
def test_a_tuning_record_rebuilt_from_its_trace_keeps_the_vector_math(name: str):
    """A record is rebuilt by replaying its trace on the computation (`records.apply_record`), and
    so is every candidate a search measures: the vector math and a row's reciprocal are steps of
    the trace (annotations the CPU build lowers), so the replayed schedule builds no libm call.
    (Rewritten in place, untraced, a tuned softmax rebuilt at 5x the time measured for it.)"""
    from deploy.schedules.cpu.generic import generic_cpu
    from deploy.schedules.space import design_spaces
    from deploy.tune.records import apply_record

    sch, ctx = schedule_of(name)
    hand = design_spaces(generic_cpu, ctx)(sch)[0]
    record = type("Record", (), {"trace": hand.trace})
    replayed = apply_record(sch.mod, record)
    assert tvm_ffi.structural_equal(lower_math(replayed["main"]), lower_math(hand.mod["main"]))
    assembly = compile_cpu(
        replayed, get_target("x86").tvm_target(), two_vector_shuffles=False
    ).mod.inspect_source("asm")
    assert not re.search(r"\b(exp|erf|log)f\b", assembly), name


def row_normalized(rows: np.ndarray) -> np.ndarray:
    """x / sum(x) along rows of `rows`, scheduled by the row rule for x86 and run."""
    x = te.placeholder(rows.shape, "float32", name="x")
    k = te.reduce_axis((0, rows.shape[1]), name="k")
    total = te.compute((rows.shape[0],), lambda i: te.sum(x[i, k], axis=k), name="total")
    y = te.compute(rows.shape, lambda i, j: x[i, j] / total[i], name="y")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, y])}))
    assert schedule_by_structure(sch, fake_context()).rule == "row reduction"
    built = compile_cpu(sch.mod, get_target("x86").tvm_target(), two_vector_shuffles=False)
    out = tvm.runtime.empty(rows.shape, "float32", tvm.cpu())
    built.mod["main"](tvm.runtime.tensor(rows, tvm.cpu()), out)
    return out.numpy()


def test_a_row_divide_is_a_reciprocal_a_row_even_for_denormal_sums():
    """A divisor the same along the row is inverted once (softmax multiplies by 1 / total), and a
    row whose divisor is denormal (1 / b overflows for |b| < 2**-128) keeps its divides."""
    sch, ctx = schedule_of("softmax")
    schedule_by_structure(sch, ctx)
    assert "= e[v_i0, v_i1, v_i2] * (T.float32(1.0) / total[v_i0, v_i1])" in str(lower_math(sch.mod["main"]))
    rows = np.full((4, 16), 1e-45, np.float32)
    rows[1] *= 7
    rows[2] = np.linspace(-3, 5, 16, dtype=np.float32)
    rows[3, 0] = 0
    rows[3, 1:] = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0] * 3, np.float32)[:15]
    with np.errstate(invalid="ignore", divide="ignore"):
        want = rows / rows.sum(axis=1, keepdims=True)
    got = row_normalized(rows)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[:3], want[:3], rtol=2.5e-7)


def float32_range() -> np.ndarray:
    """Every 4099th positive float32 bit pattern (denormals to +inf), every 37th from 0.7 to
    1.42 (where log is near 0), every 97th denormal, their negatives and the specials."""

    def patterns(start: int, stop: int, step: int) -> np.ndarray:
        return np.arange(start, stop, step, dtype=np.int64).astype(np.uint32).view(np.float32)

    positive = np.concatenate([patterns(0, 0x7F800001, 4099), patterns(0x3F333333, 0x3FB504F3, 37),
                               patterns(1, 2**23, 97)])  # fmt: skip
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0**-149, 2.0**-126], np.float32)
    return np.concatenate([positive, -positive[1::7], specials])


def test_vector_exp_is_within_one_ulp_where_its_result_is_normal():
    """float32 exp against float64's, in ulps of the float32 result, on every 4999th bit pattern
    whose exp is a normal float32 of at least 2**-125 (x from -86.9 to ln(FLT_MAX)): 0.95 at most
    here."""
    patterns = np.arange(0, 2**32, 4999, dtype=np.int64).astype(np.uint32).view(np.float32)
    grid = patterns[(patterns > np.float32(-86.9)) & (patterns < np.float32(88.72))]
    got = run_elementwise(te.exp, grid)
    want = np.exp(grid.astype(np.float64))
    assert (np.abs(got - want) / np.spacing(want.astype(np.float32))).max() <= 1.0


def test_vector_log_is_within_one_ulp_over_the_whole_float32_range():
    """float32 log against float64's, in ulps of the float32 result: NaN and x < 0 give NaN,
    +-0 -inf, +inf +inf, denormals their log; float16 within one half ulp of float16's."""
    grid = float32_range()
    got = run_elementwise(te.log, grid)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(grid.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    limits = np.isinf(want)
    assert np.array_equal(got[limits], want[limits].astype(np.float32))
    finite = np.isfinite(want)
    ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 1.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        half = np.concatenate([grid[::97].astype(np.float16), np.array([6e-8, 65504], np.float16)])
        want_half = np.log(half.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(run_elementwise(te.log, half), want_half)


def test_a_transpose_is_data_movement_and_a_broadcast_or_head_split_is_not():
    """A read contiguous along an outer output axis is data movement; b[i] of out[i, j] (a
    broadcast) and attention's head split (rows of d kept whole) stay elementwise; a transpose
    of short output rows keeps the elementwise schedule, with no note."""
    x = te.placeholder((64, 32), "float32", name="x")
    b = te.placeholder((64,), "float32", name="b")
    y = te.compute((64, 32), lambda i, j: x[i, j] + b[i], name="y")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, b, y])}))
    assert anchor(block_infos(sch)).structure is Structure.ELEMENTWISE
    sch, ctx = schedule_of("transpose2d", [(64, 16)])
    assert anchor(block_infos(sch)).structure is Structure.DATA_MOVEMENT
    taken = schedule_by_structure(sch, ctx)
    assert (taken.rule, taken.notes) == ("elementwise", ())


def by_structure(bound: Any, target: str, options: BuildOptions | None = None) -> tuple[Any, Any]:
    """`bound` scheduled by structure for `target`: (its schedule, the rule taken)."""
    options = options or BuildOptions()
    sch = tvm.s_tir.Schedule(prim_module(bound, get_target(target), options))
    return sch, schedule_by_structure(sch, context(bound, get_target(target), options))


def transposed(
    target: str, attrs: dict[str, Any], shape: tuple[int, ...], dtype: str = "float32"
) -> tuple[Any, Any]:
    """layout_transform with `attrs` on `shape` scheduled by structure for `target`, which must
    take the data-movement rule with nothing falling through; (its schedule, the bound op)."""
    bound = bind(get_op("layout_transform"), attrs, [TensorType(shape, dtype)])
    sch, taken = by_structure(bound, target)
    assert (taken.rule, taken.fell_through) == (Structure.DATA_MOVEMENT.value, "")
    return sch, bound


def check_where_it_runs(bound: Any, target: str, session: Any, tmp_path: Any) -> None:
    """`bound`'s build for `target` against numpy where this host runs the target (arm's run in the
    op matrix, on qemu)."""
    runs_here = get_platform(get_target(target).arch).native_here()
    if runs_here and not get_device("local").missing_cpu_flags(get_target(target).cpu_flags):
        check(session, compile_op(bound, get_target(target), BuildOptions()), tmp_path)


@pytest.mark.parametrize(
    ("target", "dst", "lanes"),
    [("x86", "NCHW8c", 8), ("x86-avx512", "NCHW8c", 8), ("x86-avx512", "NCHW4c", 4)],
)
def test_a_packed_layouts_short_rows_are_tiles_of_a_vector_each(target, dst, lanes, local_session, tmp_path):
    """NCHW to a packed layout: output rows of a few channels, shorter than SHORT_ROW_BYTES but one
    vector each, are each tile's writes (16 pixels by the row's channels, AVX-512's lanes
    narrowed to the row); the elementwise schedule gathered 16 lanes across two pixels (2x
    slower). Checked against numpy."""
    sch, bound = transposed(target, {"src": "NCHW", "dst": dst}, (2, 16, 8, 32))
    (block,) = blocks(sch)
    assert loop_kinds(sch, block)[-2:] == [(16, ForKind.UNROLLED), (lanes, ForKind.VECTORIZED)]
    check_where_it_runs(bound, target, local_session, tmp_path)


@pytest.mark.parametrize(
    ("target", "dtype", "width", "lanes"),
    [
        ("x86", "float32", 37, 8),
        ("x86-avx512", "float32", 37, 16),
        ("x86-avx512", "int8", 131, 64),
        ("x86-avx512", "float64", 16, 8),
        ("arm", "float32", 37, 4),
    ],
)
def test_an_images_few_channels_are_interleaved_from_whole_vectors(
    target, dtype, width, lanes, local_session, tmp_path
):
    """NCHW to NHWC of 3 channels (output rows of 3, fewer than a vector and no divisor of one):
    vectors along W, one whole load a channel, the 3 channels unrolled around them and stored
    interleaved; what W holds past its whole vectors scalar. The elementwise schedule loaded
    each lane on its own, 16x slower. Checked against numpy where this host runs the target (the
    op's case (1, 3, 2, 37) runs on every target in the op matrix)."""
    sch, bound = transposed(target, {"src": "NCHW", "dst": "NHWC"}, (2, 3, 4, width), dtype)
    vectors, rest = ("out_i20", "out_i21") if width % lanes else ("out", None)  # `loop_partition`'s names
    assert loop_kinds(sch, vectors)[-3:] == [
        (width // lanes, ForKind.SERIAL),
        (3, ForKind.UNROLLED),
        (lanes, ForKind.VECTORIZED),
    ]
    if rest is not None:
        assert loop_kinds(sch, rest)[-2:] == [(width % lanes, ForKind.SERIAL), (3, ForKind.SERIAL)]
    check_where_it_runs(bound, target, local_session, tmp_path)


@pytest.mark.parametrize(
    ("target", "dtype", "channels", "width"),
    [
        ("x86", "float32", 3, 37),
        ("x86-avx512", "float32", 3, 37),
        ("x86-avx512", "float32", 8, 37),
        ("x86-avx512", "int8", 5, 131),
    ],
)
def test_an_images_few_channels_are_deinterleaved_by_llvm(
    target, dtype, channels, width, local_session, tmp_path
):
    """NHWC to NCHW of a few channels (read rows fewer than a vector, output rows at least one):
    the channels' loop innermost and unrolled, the output's rows a serial loop LLVM vectorizes
    (whole loads, shuffles); the loops outside in parallel. Checked against numpy where this
    host runs the target (the op's case (1, 2, 37, 3) runs on every target in the op matrix)."""
    sch, bound = transposed(target, {"src": "NHWC", "dst": "NCHW"}, (4, 16, width, channels), dtype)
    assert loop_kinds(sch, "out") == [
        (64, ForKind.PARALLEL),
        (width, ForKind.SERIAL),
        (channels, ForKind.UNROLLED),
    ]
    check_where_it_runs(bound, target, local_session, tmp_path)


@pytest.mark.parametrize(
    ("attrs", "shape"),
    [
        ({"src": "NCHW", "dst": "NHWC"}, (1, 12, 4, 64)),  # 12 columns: past what LLVM interleaves
        ({"src": "NHWC", "dst": "NCHW"}, (1, 4, 64, 12)),
        ({"src": "NCHW", "dst": "NHWC"}, (1, 1, 4, 64)),  # one channel: a copy
        ({"src": "NHWC", "dst": "NCHW"}, (1, 4, 64, 1)),
    ],
)
def test_a_side_past_few_columns_or_of_one_keeps_the_elementwise_schedule(attrs, shape):
    """The interleaving rules stop at FEW_COLUMNS (8) elements; a side of one element is a
    contiguous copy, which the elementwise schedule's fused rows do in whole vectors."""
    _, taken = by_structure(
        bind(get_op("layout_transform"), attrs, [TensorType(shape, "float32")]), "x86-avx512"
    )
    assert taken.rule == Structure.ELEMENTWISE.value


@pytest.mark.parametrize(
    ("shape", "kinds"),
    [
        ((3, 4096), [(256, ForKind.PARALLEL), (3, ForKind.UNROLLED), (16, ForKind.VECTORIZED)]),
        ((4096, 3), [(8, ForKind.PARALLEL), (512, ForKind.SERIAL), (3, ForKind.UNROLLED)]),
    ],
)
def test_a_few_columns_with_no_loop_outside_run_in_parallel_still(shape, kinds, local_session, tmp_path):
    """A 2-D transpose with a side of 3 (transpose2d, a user op) has no loop outside the long
    side: the vectors run in parallel (3x4096 to 4096x3), or the output's row in 4 parts a core
    (4096x3 to 3x4096; 2 cores here). Checked against numpy."""
    bound = bound_op("transpose2d", shapes=[shape])
    sch, taken = by_structure(bound, "x86-avx512", BuildOptions(cores=2))
    assert (taken.rule, taken.fell_through) == (Structure.DATA_MOVEMENT.value, "")
    assert loop_kinds(sch, "transpose2d") == kinds
    check_where_it_runs(bound, "x86-avx512", local_session, tmp_path)


@pytest.mark.parametrize(
    ("name", "shapes", "copied", "update", "most"),
    [
        (
            "pointwise_conv",
            [(2, 64, 56, 56), (128, 64, 1, 1)],
            "x_global",
            "pointwise_conv_ax20_update",
            86016,
        ),
        ("matmul", [(16, 256), (256, 1056)], "b_global", "matmul_update", 49152),
    ],
)
def test_a_b_past_the_cache_is_copied_a_block_of_columns_at_a_time(
    name, shapes, copied, update, most, local_session, tmp_path
):
    """b of more than PACK_FROM_BYTES (1.53 MiB of pixels; 1.03 MiB of a matrix with k = 256,
    which needs no K_BLOCK) is copied a block of n's tiles at a time into a buffer of its own
    inside the parallel loop over the batch and the blocks: 64 rows of 6 image rows (the 240
    columns of 10 tiles span 6), 256 rows of 2 tiles; the block's tiles, then m's, run inside
    it and read the copy. Checked against numpy with ties, NaN and infinities."""
    sch, ctx = schedule_of(name, shapes)
    assert schedule_by_structure(sch, ctx).fell_through == ""
    copy = sch.get_sblock(copied)
    outer = sch.get(sch.get_loops(copy)[0])
    assert ForKind(int(outer.kind)) == ForKind.PARALLEL and int(outer.extent) >= ctx.cores
    assert copied_bytes(sch, copy) == most <= PACKED_BYTES * 3 // 2
    tiles = loop_kinds(sch, update)
    assert tiles[0][1] == ForKind.PARALLEL and tiles[1][1] == tiles[2][1] == ForKind.SERIAL
    assert tiles[2][0] == 32 if name == "pointwise_conv" else 4  # m's tiles inside the block's
    check(
        local_session, compile_op(bound_op(name, shapes=shapes), get_target("x86"), BuildOptions()), tmp_path
    )


STRIDED = """from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register


@register
class Strided(Op):
    name = "strided_pointwise_conv"
    inputs = (Input("x", 4, 4), Input("w", 4, 4))
    dtypes = ("float32",)
    cases = (Case(((1, 64, 112, 112), (128, 64, 1, 1))),)

    def infer(self, attrs, inputs):
        x, w = inputs
        return TensorType((x.shape[0], w.shape[0], x.shape[2] // 2, x.shape[3] // 2), x.dtype)

    def compute(self, attrs, out, x, w):
        ci = te.reduce_axis((0, x.shape[1]), "ci")
        return te.compute(
            out.shape,
            lambda n, co, y, z: te.sum(x[n, ci, 2 * y, 2 * z] * w[co, ci, 0, 0], axis=ci),
            name="strided",
        )

    def reference(self, attrs, x, w):
        return (w[:, :, 0, 0].astype("float64") @ x[:, :, ::2, ::2].reshape(64, -1)).reshape(1, 128, 56, 56)
"""
"""A ResNet downsampling 1x1 convolution (stride 2) as a user writes it: 3.1 MiB of x."""


IN_PLACE: list[tuple[str, list[tuple[int | str, ...]]]] = [
    ("pointwise_conv", [(1, 64, 56, 56), (128, 64, 1, 1)]),
    ("pointwise_conv", [("N", 64, 56, 56), (128, 64, 1, 1)]),
    ("strided_pointwise_conv", [(1, 64, 112, 112), (128, 64, 1, 1)]),
]


def test_a_b_that_stays_in_cache_or_whose_block_would_copy_too_much_is_read_in_place(tmp_path):
    """One image of 1x64x56x56 (784 KiB) stays in L2 between calls, and a symbolic batch counts
    as one image; a stride-2 1x1 convolution's block of 240 output pixels would copy 11 rows of
    111 columns of its 64 channels (305 KiB, every other row and column unread), past 1.5 x
    PACKED_BYTES."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "strided.py").write_text(STRIDED)
    with registry_kept():
        load_ops_path(tmp_path / "ops")
        for name, shapes in IN_PLACE:
            sch, ctx = schedule_of(name, shapes)
            assert schedule_by_structure(sch, ctx).fell_through == ""
            assert "_global" not in str(sch.mod), name
