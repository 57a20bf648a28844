"""The deploy-cpu lowering: stride-2 vector loads become contiguous loads and a shuffle, annotated
loops prefetch their input a line at a time, and the max pooling kernels it produces are vector
code that prefetches."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.ops import TensorType, bind, get_op


def _load(extent: object, base: object, stride: int = 2):
    from tvm import tirx

    buffer = tirx.decl_buffer((extent,), "float32", name="a")
    return tirx.BufferLoad(buffer, [tirx.Ramp(base, stride, 8)])


def _evaluated(expr: Any, values: dict[str, int]) -> int:
    """The integer `expr` is with its variables (by name) at `values`."""
    import tvm.sym.analyzer
    import tvm_ffi
    from tvm import tirx

    bound = tvm_ffi.structural_map(
        expr, [(tirx.Var, lambda v: tirx.const(values[v.name], "int32") if v.name in values else v)]
    )
    return int(tvm.sym.analyzer.Analyzer().simplify(bound))


def _read(rewritten: Any, values: dict[str, int]) -> tuple[list[int], list[range]]:
    """(the element each lane of `rewritten` takes, the elements each of its loads reads) with
    its variables at `values`."""
    starts = [_evaluated(vector.indices[0].base, values) for vector in rewritten.vectors]
    lanes = [int(vector.indices[0].lanes) for vector in rewritten.vectors]
    flat = [start + lane for start, n in zip(starts, lanes, strict=True) for lane in range(n)]
    loads = [range(start, start + n) for start, n in zip(starts, lanes, strict=True)]
    return [flat[int(k)] for k in rewritten.indices], loads


# (extent, index, aligned): index from i and N; aligned: with two-vector shuffles, its vectors
# start at multiples of its 8 lanes
STRIDE2_LOADS = [
    (64, lambda i, n: i * 16, True),
    (64, lambda i, n: i * 16 + 1, True),
    (64, lambda i, n: i * 16 + 5, True),  # three vectors
    (64, lambda i, n: i * 16 + 7, True),
    (lambda n: n * 64, lambda i, n: i * 16 + 7, True),  # a symbolic batch of planes of 64
    (64, lambda i, n: i * 6 + 1, False),  # place in a vector unknown: an even pair
    (64, lambda i, n: i * 3, False),  # parity unknown: an overlapping pair
    (63, lambda i, n: i * 16 + 1, False),  # odd length: an overlapping pair
    (113, lambda i, n: i * 2 + 1, False),  # a padded row of 113
    (lambda n: n * 63, lambda i, n: i * 16, False),
    (lambda n: n * 62, lambda i, n: i * 16 + 1, False),  # not whole vectors: an even pair
]


@pytest.mark.parametrize("shuffles", [False, True], ids=["pairs", "two-vector-shuffles"])
@pytest.mark.parametrize(("extent", "index", "aligned"), STRIDE2_LOADS)
def test_a_stride2_load_becomes_contiguous_loads_and_a_shuffle(
    extent: Any, index: Any, aligned: bool, shuffles: bool
) -> None:
    """Each lane takes the element the stride-2 load did, and no load reads outside the buffer, at
    every in-bounds value of the index. On a target with two-vector shuffles, where the load's
    place in a vector is known and the buffer is whole vectors, the loads are the vectors at
    multiples of the lanes that hold it (the addresses a stage's vector stores wrote); else two."""
    import tvm.sym.analyzer
    from tvm import tirx

    from deploy.compiler.tir_passes import _stride2_to_shuffle

    i, n = tirx.Var("i", "int32"), tirx.Var("N", "int32")
    length = extent(n) if callable(extent) else extent
    rewritten = _stride2_to_shuffle(_load(length, index(i, n)), tvm.sym.analyzer.Analyzer(), shuffles)
    assert isinstance(rewritten, tirx.Shuffle)
    assert all(str(vector.indices[0].stride) == "1" for vector in rewritten.vectors)
    if not (aligned and shuffles):
        assert len(rewritten.vectors) == 2
    for planes in (1, 3):
        size = extent(planes) if callable(extent) else extent
        for step in range(size):
            base = index(step, planes)
            if base + 14 >= size:
                break
            taken, loads = _read(rewritten, {"i": step, "N": planes})
            assert taken == [base + 2 * lane for lane in range(8)]
            assert all(r.start >= 0 and r.stop <= size for r in loads)
            if aligned and shuffles:
                assert all(r.start % 8 == 0 for r in loads)


@pytest.mark.parametrize(
    "load",
    [
        lambda tirx: _load(64, tirx.Var("i", "int32") * 16, stride=3),
        lambda tirx: _load(64, tirx.Var("i", "int32") * 16, stride=1),
        lambda tirx: tirx.BufferLoad(tirx.decl_buffer((8, 8), "float32", name="a"), [0, tirx.Ramp(0, 2, 4)]),
    ],
)
def test_other_loads_are_left_alone(load) -> None:
    """Strides other than 2, and loads of buffers not yet flattened."""
    import tvm.sym.analyzer
    from tvm import tirx

    from deploy.compiler.tir_passes import _stride2_to_shuffle

    original = load(tirx)
    for shuffles in (False, True):
        assert _stride2_to_shuffle(original, tvm.sym.analyzer.Analyzer(), shuffles).same_as(original)


L1_PRFM = "prfm\tpldl1keep"
ARM_TOOLS = ("aarch64-linux-gnu-objdump", "binutils-aarch64-linux-gnu")
DISASSEMBLY = {
    "x86": ("objdump", "binutils", ("vmaxps",), ("vshufps", "vpermps"), ("prefetcht1", "prefetcht0")),
    "arm": (*ARM_TOOLS, ("fmax\tv",), ("uzp", "ld2"), (L1_PRFM,)),
}
"""target -> (disassembler, its Debian package, a vector max, deinterleaves, the prefetches of a
streamed input: into the target's `prefetch_level` (L2 on x86, L1 on aarch64), and where that is
past L1, near ones into L1)."""


def disassembled(compiled: Any, tmp_path: Path, tool: str = "objdump") -> str:
    """The `tool -d` listing of `compiled` exported under `tmp_path`."""
    manifest = export(compiled, tmp_path / "art")
    command = [tool, "-d", str(tmp_path / "art" / manifest.module)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("target", sorted(DISASSEMBLY))
@pytest.mark.parametrize("batch", [2, "N"])
def test_max_pooling_is_vector_code_that_prefetches(tmp_path: Path, target: str, batch: int | str) -> None:
    tool, package, vector_max, deinterleaves, prefetches = DISASSEMBLY[target]
    if shutil.which(tool) is None:
        pytest.skip(f"needs {tool} (Debian package {package})")
    attrs = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), attrs, [TensorType((batch, 8, 32, 32), "float32")])
    text = disassembled(compile_op(bound, get_target(target), BuildOptions()), tmp_path, tool)
    assert any(m in text for m in vector_max), "the max is computed a vector at a time"
    assert any(d in text for d in deinterleaves), "stride-2 taps are deinterleaved with shuffles"
    assert all(p in text for p in prefetches), "the column stage prefetches its input rows"


@pytest.mark.parametrize("target", sorted(DISASSEMBLY))
def test_an_nhwc_pool_prefetches_its_pixels_channels(tmp_path: Path, target: str) -> None:
    """NHWC's channels are several vectors a pixel: unrolled, they are loads of the pixel loop,
    which prefetches them (the build prefetches no loads of an inner loop)."""
    tool, package, vector_max, _, prefetches = DISASSEMBLY[target]
    if shutil.which(tool) is None:
        pytest.skip(f"needs {tool} (Debian package {package})")
    attrs = {"kernel": 3, "stride": 2, "padding": 1, "layout": "NHWC"}
    bound = bind(get_op("max_pool2d"), attrs, [TensorType((2, 32, 32, 64), "float32")])
    text = disassembled(compile_op(bound, get_target(target), BuildOptions()), tmp_path, tool)
    assert any(m in text for m in vector_max) and all(p in text for p in prefetches)


def _streaming_loop(ahead: int) -> tuple[Any, Any]:
    """A loop over lines of 16 floats whose step loads three rows of an input `x` (two vectors
    each, a line apart by less than 64 bytes), a row of a local stage, and a value indexed by a
    loop inside the step; annotated to prefetch `ahead` bytes ahead. With the stage's buffer."""
    from tvm import tirx

    from deploy.schedules.cpu import PREFETCH

    x = tirx.decl_buffer((4096,), "float32", name="x")
    stage = tirx.decl_buffer((112,), "float32", name="stage")
    out = tirx.decl_buffer((4096,), "float32", name="out")
    line, k = tirx.Var("line", "int32"), tirx.Var("k", "int32")
    rows = [tirx.BufferLoad(x, [tirx.Ramp(line * 16 + row * 112 + half * 8, 1, 8)])
            for row in range(3) for half in range(2)]  # fmt: skip
    total = rows[0]
    for other in [*rows[1:], tirx.BufferLoad(stage, [tirx.Ramp(line * 16, 1, 8)])]:
        total = total + other
    store = tirx.BufferStore(out, total, [tirx.Ramp(line * 16, 1, 8)])
    inner = tirx.For(k, 0, 4, tirx.ForKind.SERIAL, tirx.BufferStore(out, tirx.BufferLoad(x, [k * 64]), [k]))
    body = tirx.SeqStmt([store, inner])
    return tirx.For(line, 0, 7, tirx.ForKind.SERIAL, body, annotations={PREFETCH: ahead}), stage


def _prefetched_offsets(loop: Any, line: Any, per_step: int = 16) -> list[int]:
    """Elements past `line * per_step` of each prefetch leading the loop's body, in order."""
    import tvm.sym.analyzer
    from tvm import tirx

    assert isinstance(loop.body, tirx.SeqStmt)
    calls = [s.value for s in loop.body.seq if isinstance(s, tirx.Evaluate)]
    assert all("llvm.prefetch" in str(call) for call in calls)
    analyzer = tvm.sym.analyzer.Analyzer()
    addresses = [call.args[1] for call in calls]  # args[0]: the intrinsic's id
    return [int(analyzer.simplify(a.args[0].indices[0] - line * per_step)) for a in addresses]


def localities(loop: Any) -> list[int]:
    """The locality of each prefetch leading the loop's body (3: into L1, 2: into L2)."""
    return [int(s.value.args[3]) for s in loop.body.seq if "llvm.prefetch" in str(s)]


def with_level(loop: Any, level: int) -> Any:
    """`loop` annotated to prefetch into cache level `level` as well."""
    from tvm import tirx

    from deploy.schedules.cpu import PREFETCH_LEVEL

    annotations = {**loop.annotations, PREFETCH_LEVEL: level}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, None, annotations)


def test_a_prefetch_per_input_row_and_line_ahead_of_the_step() -> None:
    from deploy.compiler.tir_passes import _prefetched
    from deploy.schedules.cpu import PREFETCH, PREFETCH_LEVEL

    loop, stage = _streaming_loop(16384)
    lowered = _prefetched(loop, [stage])
    # one per row of x, 4096 floats ahead: not one per vector, none for the stage or the inner loop
    assert _prefetched_offsets(lowered, loop.loop_var) == [4096, 4096 + 112, 4096 + 224]
    assert PREFETCH not in lowered.annotations
    assert localities(lowered) == [3, 3, 3]  # into L1 unless the loop says another level
    into_l2 = _prefetched(with_level(loop, 2), [stage])
    assert localities(into_l2) == [2, 2, 2] and PREFETCH_LEVEL not in into_l2.annotations
    unannotated, _ = _streaming_loop(0)
    assert _prefetched(unannotated, [stage]).body.same_as(unannotated.body)  # 0: none


def test_a_near_prefetch_into_l1_follows_the_far_ones() -> None:
    """Far prefetches into L2, then one into L1 a little ahead of each line: the core's loads
    then find their lines in L1 (`PREFETCH_NEAR`); none without the annotation or the far."""
    from tvm import tirx

    from deploy.compiler.tir_passes import _prefetched
    from deploy.schedules.cpu import PREFETCH, PREFETCH_NEAR

    def near(loop: Any, distance: int) -> Any:
        annotations = {**loop.annotations, PREFETCH_NEAR: distance}
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, None, annotations)

    loop, stage = _streaming_loop(16384)
    lowered = _prefetched(near(with_level(loop, 2), 1024), [stage])
    rows = [0, 112, 224]  # elements past a row-0 line: each of x's three rows
    assert _prefetched_offsets(lowered, loop.loop_var) == [4096 + r for r in rows] + [256 + r for r in rows]
    assert localities(lowered) == [2, 2, 2, 3, 3, 3]
    assert PREFETCH_NEAR not in lowered.annotations and PREFETCH not in lowered.annotations
    assert localities(_prefetched(near(with_level(loop, 2), 0), [stage])) == [2, 2, 2]  # 0: none
    unannotated, _ = _streaming_loop(0)
    assert _prefetched(near(unannotated, 1024), [stage]).body.same_as(unannotated.body)  # no far: none


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils (objdump)")
def test_inner_loops_shows_the_pooling_rows_loop_with_its_prefetches() -> None:
    script = Path(__file__).parents[1] / "bench" / "inner_loops.py"
    pool = ["-a", "kernel=3", "-a", "stride=2", "-a", "padding=1"]
    shown = subprocess.run([sys.executable, str(script), "--target", "x86", "--shape", "1x8x32x32", *pool],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert shown.startswith("max_pool2d 1x8x32x32:float32 for x86 (cpu/max_pool2d), objdump:")
    loops = [line for line in shown.splitlines() if line.startswith("  loop ")]
    assert any("vmaxps" in line and "prefetcht1" in line for line in loops), shown


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils (objdump)")
@pytest.mark.parametrize("depth", [16, 512])
def test_a_searched_unroll_depth_keeps_the_prefetches(tmp_path: Path, depth: int) -> None:
    """Lowering unrolls before it prefetches: a search's unroll depth on the plane loop must not
    unroll the annotated stage loop away with its annotation."""
    from deploy.compiler.compile import compile_scheduled, hand_schedule
    from deploy.schedules.registry import Choices

    class Unrolled(Choices):
        def unroll(self, sch: Any, loop: Any, default: int) -> None:
            super().unroll(sch, loop, depth)

    attrs = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), attrs, [TensorType((1, 8, 32, 32), "float32")])
    target = get_target("x86")
    mod, name = hand_schedule(bound, target, BuildOptions(), Unrolled())
    assert "prefetcht1" in disassembled(compile_scheduled(bound, target, BuildOptions(), mod, name), tmp_path)


EDGES = [
    ((1, 4, 1, 1), {"kernel": 1}),  # a row of one element: the stage has no W loop (found by fuzzing)
    ((1, 2, 5, 1), {"kernel": 3, "stride": 2, "padding": 1}),
    ((1, 3, 4, 3), {"kernel": 2, "ceil_mode": True}),  # W shorter than a vector
]


@pytest.mark.parametrize(("shape", "attrs"), EDGES, ids=lambda v: str(v))
@pytest.mark.parametrize("per", ["row", "plane"])
def test_the_column_stage_builds_at_the_edges(tmp_path: Path, shape: tuple, attrs: dict, per: str) -> None:
    """Rows of one element or shorter than a vector, the stage per row or per plane, build and
    match numpy on random data, ties, NaN and infinities."""
    from deploy.compiler.compile import compile_scheduled, hand_schedule
    from deploy.devices import get_device
    from deploy.schedules.registry import Picked
    from deploy.verify.measure import check

    bound = bind(get_op("max_pool2d"), attrs, [TensorType(shape, "float32")])
    target = get_target("x86")
    mod, name = hand_schedule(bound, target, BuildOptions(), Picked({"column stage per": per}))
    with get_device("local").open() as session:
        check(session, compile_scheduled(bound, target, BuildOptions(), mod, name), tmp_path)


WHOLE_LINES = [
    ("max_pool2d", (4, 3, 16, 16), 2),  # rows of 8 floats (32 bytes): two rows a line
    ("max_pool2d", (8, 2, 24, 24), 4),  # rows of 12 floats (48 bytes): four rows, three lines
    ("max_pool3d", (4, 2, 4, 16, 16), 2),  # NCDHW: its planes N*C*D
]


@pytest.mark.parametrize(("op", "shape", "lines"), WHOLE_LINES, ids=lambda v: str(v))
@pytest.mark.parametrize("target", ["x86", "x86-avx512"])
def test_a_streamed_pools_rows_go_out_as_whole_lines(
    tmp_path: Path, op: str, shape: tuple, lines: int, target: str
) -> None:
    """An NCHW pool whose output is streamed to memory and whose rows end mid-line writes them
    `lines` at a time through a buffer (`rows_per_line`), and still matches numpy on random
    data, ties, NaN and infinities (streaming every output here, however small). A batch the
    streams do not divide keeps its rows as computed."""
    from dataclasses import replace

    from deploy.compiler.compile import compile_scheduled, hand_schedule
    from deploy.devices import get_device
    from deploy.schedules.registry import Picked
    from deploy.verify.measure import check

    local = get_device("local")
    if target == "x86-avx512" and local.missing_cpu_flags(("avx512f",)):
        pytest.skip("this host has no AVX-512")
    streamed = replace(get_target(target), streaming_store_bytes=1)
    bound = bind(get_op(op), {"kernel": 3, "stride": 2, "padding": 1}, [TensorType(shape, "float32")])
    choices = Picked()
    mod, name = hand_schedule(bound, streamed, BuildOptions(), choices)
    assert ("output rows at once", (lines, 1), lines) in choices.seen
    with local.open() as session:
        check(session, compile_scheduled(bound, streamed, BuildOptions(), mod, name), tmp_path)
    one_image = bind(get_op(op), bound.attrs, [TensorType((1, *shape[1:]), "float32")])
    for unpaired, on in ((bound, get_target(target)), (one_image, streamed)):  # too small; a batch of 1
        plain = Picked()
        hand_schedule(unpaired, on, BuildOptions(), plain)
        assert all(name != "output rows at once" for name, _, _ in plain.seen)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils (objdump)")
def test_the_argmax_scan_prefetches_its_rows(tmp_path: Path) -> None:
    bound = bind(get_op("argmax"), {"axis": -1}, [TensorType((8, 1024), "float32")])
    assert "prefetcht1" in disassembled(compile_op(bound, get_target("x86"), BuildOptions()), tmp_path)


def test_a_sliding_window_is_one_stream() -> None:
    """A packed pooling row: taps one pixel (8 floats) before, at and after 2 * ow; a step
    advances two pixels, so the tap after is the tap before one step later, and the one at is
    on its line: one prefetch serves all three."""
    from tvm import tirx

    from deploy.compiler.tir_passes import _prefetched
    from deploy.schedules.cpu import PREFETCH

    x = tirx.decl_buffer((1 << 20,), "float32", name="x")
    out = tirx.decl_buffer((1 << 20,), "float32", name="out")
    ow = tirx.Var("ow", "int32")
    taps = [tirx.BufferLoad(x, [tirx.Ramp(ow * 16 + offset, 1, 8)]) for offset in (-8, 0, 8)]
    store = tirx.BufferStore(out, taps[0] + taps[1] + taps[2], [tirx.Ramp(ow * 8, 1, 8)])
    loop = tirx.For(ow, 0, 56, tirx.ForKind.SERIAL, store, annotations={PREFETCH: 16384})
    assert len(_prefetched_offsets(_prefetched(loop, []), ow, per_step=16)) == 1


SCAN = (1563, 16)
"""Steps and floats a step of argmax's scan of a segment (25008 floats) of a row of 100000."""


@pytest.mark.parametrize(("pitch", "wraps"), [(100000, True), (25008, False), (20000, False)])
def test_a_segment_prefetches_its_next_rows_segment(pitch: int, wraps: bool) -> None:
    """Argmax's scan reads four segments of a row at once: past the end of a segment its
    prefetches go where that segment's load reads next (the same segment of the next row,
    `pitch` floats on), not into the next segment (read at the same time) — unless the next row
    starts where the segment ends (one stream) or before (read again: in cache)."""
    from tvm import tirx

    from deploy.compiler.tir_passes import _prefetched
    from deploy.schedules.cpu import PREFETCH

    steps, per_step = SCAN
    span, ahead = steps * per_step, 16384 // 4
    x = tirx.decl_buffer((1 << 24,), "float32", name="x")
    out = tirx.decl_buffer((64,), "float32", name="out")
    row, step = tirx.Var("row", "int32"), tirx.Var("step", "int32")
    starts = [row * pitch + segment * span + step * per_step for segment in range(4)]
    loads = [tirx.BufferLoad(x, [tirx.Ramp(start, 1, per_step)]) for start in starts]
    total = loads[0] + loads[1] + loads[2] + loads[3]
    store = tirx.BufferStore(out, total, [tirx.Ramp(tirx.const(0, "int32"), 1, per_step)])
    loop = tirx.For(step, 0, steps, tirx.ForKind.SERIAL, store, annotations={PREFETCH: 16384})
    lowered = _prefetched(loop, [])
    addresses = [s.value.args[1].args[0].indices[0] for s in lowered.body.seq[:-1]]
    assert len(addresses) == 4
    for r, k in [(0, 0), (3, 0), (3, span // per_step - ahead // per_step - 1), (3, 1307), (7, 1562)]:
        past = k * per_step + ahead >= span
        for segment, address in enumerate(addresses):
            linear = r * pitch + segment * span + k * per_step + ahead
            expected = linear + pitch - span if wraps and past else linear
            assert _evaluated(address, {"row": r, "step": k}) == expected, (r, k, segment)


STREAMING = {
    "x86": ("objdump", "binutils", "vmovntps", "sfence"),
    "arm": ("aarch64-linux-gnu-objdump", "binutils-aarch64-linux-gnu", "stnp", "dmb"),
}
"""target -> (disassembler, its Debian package, a streaming store, the fence after them)."""


@pytest.mark.parametrize("target", sorted(STREAMING))
def test_an_output_from_the_targets_size_on_streams(tmp_path: Path, target: str) -> None:
    """#53: an op's output of at least `streaming_store_bytes` is written with non-temporal
    stores, fenced before the kernel returns; a smaller one with plain stores."""
    from dataclasses import replace

    tool, package, store, fence = STREAMING[target]
    if shutil.which(tool) is None:
        pytest.skip(f"needs {tool} (Debian package {package})")
    bound = bind(get_op("add"), {}, [TensorType((2, 8, 32, 32), "float32")] * 2)
    small = replace(get_target(target), streaming_store_bytes=bound.output.nbytes() + 1)
    plain = disassembled(compile_op(bound, small, BuildOptions()), tmp_path / "plain", tool)
    assert store not in plain and fence not in plain
    large = replace(small, streaming_store_bytes=bound.output.nbytes())
    streamed = disassembled(compile_op(bound, large, BuildOptions()), tmp_path / "streamed", tool)
    assert store in streamed and fence in streamed


def test_streamed_outputs_match_numpy_and_only_the_graphs_own_output_streams(local_session) -> None:
    """A graph streams the output of its last kernel, never a tensor a later kernel reads (it
    would be read back from memory), and runs like numpy; so does a streamed op."""
    from dataclasses import replace

    import numpy as np

    from deploy.compiler.compile import ScheduledKernel, schedule_op
    from deploy.compiler.fusion import kernels
    from deploy.compiler.shared_object import _calls
    from deploy.compiler.streaming import STREAMED
    from deploy.ops.graph import Graph, Node, bind_graph
    from deploy.verify.compare import random_input
    from deploy.verify.run import verify

    target = replace(get_target("x86"), streaming_store_bytes=1)
    chain = [("n0", "leaky_relu", {"alpha": 0.5}, ("x",))]
    chain += [(f"n{i}", "leaky_relu", {"alpha": 0.5}, (f"n{i - 1}",)) for i in range(1, 5)]
    nodes = tuple(Node(name, get_op(op), attrs, reads, name) for name, op, attrs, reads in chain)
    g = bind_graph(Graph("g", (("x", TensorType((3, 40), "float32")),), nodes, ("n4",)))
    found = kernels(g)
    assert len(found) == 2, "3**4 copies of the first node would not fit one kernel"
    scheduled = [ScheduledKernel(k, schedule_op(k.bound, target, BuildOptions())) for k in found]
    calls = _calls(g, scheduled, target, 64)
    names = [[p.name for p in func.params] for _, func, _, _ in calls]
    assert not any(n.startswith(STREAMED) for n in names[0]), "the first kernel's output is read next"
    assert names[1][-1].startswith(STREAMED) and not names[1][0].startswith(STREAMED)
    rng = np.random.default_rng(53)
    for item in (g, bind(get_op("add"), {}, [TensorType((5, 37), "float32")] * 2)):
        arrays = [random_input(t, rng, specials=True) for t in item.inputs]
        comparison, _ = verify(local_session, item, target, BuildOptions(), arrays)
        assert comparison.ok, comparison.detail


IR = """target triple = "{triple}"
define i32 @kernel(ptr %{mark}out, ptr %a) {{
entry:
  br label %loop
loop:
  %p = phi ptr [ %{mark}out, %entry ], [ %next, %loop ]
  %v = load <4 x float>, ptr %a, align 16
  store <4 x float> %v, ptr %p, align 16, !tbaa !1
  store <4 x float> %v, ptr %a, align 16
  %next = getelementptr inbounds float, ptr %p, i64 4
  br i1 true, label %done, label %loop
done:
  ret i32 0
}}
define i32 @reads_back(ptr %{mark}out) {{
  %q = getelementptr inbounds float, ptr %{mark}out, i64 4
  %w = load float, ptr %q, align 4
  store float %w, ptr %{mark}out, align 4
  ret i32 0
}}
!1 = !{{!"x"}}
"""


@pytest.mark.parametrize(("triple", "fence"), [("x86_64-linux-gnu", "call void @llvm.x86.sse.sfence()"),
                                               ("aarch64-linux-gnu", "fence seq_cst")])  # fmt: skip
def test_stores_through_a_streamed_pointer_are_marked_in_the_ir(triple: str, fence: str) -> None:
    """Stores through the mark's pointer and what is derived from it (a phi, a getelementptr
    below its use) get `!nontemporal`, other stores do not, and a function that reads the buffer
    back streams nothing; the streaming function fences before it returns."""
    from deploy.compiler.streaming import STREAMED, stream_ir

    assert stream_ir(IR.format(triple=triple, mark="")) is None, "no marked buffer, nothing to do"
    text = stream_ir(IR.format(triple=triple, mark=STREAMED))
    assert text is not None
    lines = text.splitlines()
    marked = [line.strip() for line in lines if "!nontemporal" in line]
    assert marked == ["store <4 x float> %v, ptr %p, align 16, !tbaa !1, !nontemporal !2"]
    assert lines[-1] == "!2 = !{i32 1}"
    assert lines.count(f"  {fence}") == 1 and lines[lines.index(f"  {fence}") + 1] == "  ret i32 0"
    assert ("declare void @llvm.x86.sse.sfence()" in lines) == triple.startswith("x86")
