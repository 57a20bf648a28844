"""Graphs of registered ops on every target: fused by TVM's FuseOps, each fused kernel scheduled by
its anchor op, compiled into one artifact, run on the target's device and compared with the ops'
numpy references composed (NaN, infinities and ties planted in every case). Then the CLI with
`--model`: a graph file and the ONNX example (max pooling -> add -> leaky_relu -> a custom-domain
HardTanh), against numpy and onnxruntime."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.base.errors import UsageError
from deploy.compiler.cache import cached_build
from deploy.compiler.fusion import kernels
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import get_target
from deploy.model import load_model
from deploy.ops import TensorType, get_op
from deploy.ops.graph import Graph, Node, bind_graph
from deploy.schedules import find_schedule
from deploy.verify.compare import random_input
from deploy.verify.run import verify
from tests.conftest import invoke
from tests.test_ops_matrix import on_every_target, sessions  # noqa: F401  (the module's target sessions)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_ONNX = REPO / "examples" / "pool_add_leaky_htanh.onnx"
EXAMPLE_YAML = REPO / "examples" / "maxpool_add.yaml"
POOL = {"kernel": 3, "stride": 2, "padding": 1}


def graph(
    inputs: dict[str, tuple[int, ...]], dtype: str, *nodes: tuple[str, str, dict[str, Any], tuple[str, ...]]
):
    """A bound graph: `inputs` name -> shape (all `dtype`), nodes (name, op, attrs, inputs); the
    last node's output is the graph's."""
    built = tuple(Node(name, get_op(op), attrs, reads, name) for name, op, attrs, reads in nodes)
    types = tuple((name, TensorType(shape, dtype)) for name, shape in inputs.items())
    return bind_graph(Graph("g", types, built, (built[-1].output,)))


POOL_ADD_CASES = [
    ((4, 64, 112, 112), (4, 1, 56, 56), POOL),
    ((2, 8, 17, 23), (2, 8, 9, 12), POOL),
    ((1, 3, 9, 9), (5,), POOL),
    ((2, 1, 10, 10), (2, 4, 5, 5), POOL),
    ((1, 2, 7, 8), (), {"kernel": 2, "stride": 1, "padding": 0, "ceil_mode": True}),
    ((1, 2, 11, 11), (1, 2, 1, 1), {**POOL, "ceil_mode": True}),
]
"""max pooling -> add (b broadcast numpy-style), as the retired hand-fused maxpool_add was tested."""


def check(on: Any, g: Any, index: int) -> tuple[Any, str]:
    rng = np.random.default_rng(zlib.crc32(f"{g.key()}".encode()))
    arrays = [random_input(t, rng, ties=index % 2 == 1, specials=True) for t in g.inputs]
    return verify(on.session, g, on.target, BuildOptions(), arrays)


@on_every_target(
    "dtype,case",
    [(d, i) for d in ("float32", "float16", "int8") for i in range(len(POOL_ADD_CASES))],
)
def test_pool_then_add_is_one_kernel_like_numpy(target, dtype, case, sessions):  # noqa: F811
    a, b, attrs = POOL_ADD_CASES[case]
    g = graph(
        {"a": a, "b": b}, dtype, ("pool", "max_pool2d", attrs, ("a",)), ("sum", "add", {}, ("pool", "b"))
    )
    assert [k.nodes for k in kernels(g)] == [("pool", "sum")]
    comparison, schedule = check(sessions.on(target), g, case)
    assert comparison.ok, f"{comparison.detail} (max error {comparison.max_error})"
    assert schedule == find_schedule(target.schedules, "max_pool2d").label  # the anchor's


CHAINS: dict[str, tuple[dict[str, tuple[int, ...]], list[Any], list[tuple[str, ...]]]] = {
    "pool-add-leaky": (
        {"a": (2, 8, 17, 23), "b": (2, 1, 9, 12)},
        [("pool", "max_pool2d", POOL, ("a",)), ("sum", "add", {}, ("pool", "b")),
         ("act", "leaky_relu", {"alpha": 0.1}, ("sum",))],
        [("pool", "sum", "act")],
    ),
    "add-then-pool": (
        {"a": (1, 4, 12, 12), "b": (1, 4, 1, 12)},
        [("sum", "add", {}, ("a", "b")), ("pool", "max_pool2d", POOL, ("sum",))],
        [("sum", "pool")],
    ),
    "leaky-argmax": (
        {"x": (4, 100)},
        [("act", "leaky_relu", {"alpha": 0.0}, ("x",)), ("best", "argmax", {"axis": 1}, ("act",))],
        [("act", "best")],
    ),
    "pool-argmax": (
        {"a": (2, 8, 17, 23), "b": (2, 1, 9, 12)},
        [("pool", "max_pool2d", POOL, ("a",)), ("sum", "add", {}, ("pool", "b")),
         ("best", "argmax", {"axis": 1}, ("sum",))],
        [("pool",), ("sum", "best")],
    ),
    "twin-branches": (
        {"x": (4, 10)},
        [("la", "leaky_relu", {}, ("x",)), ("ta", "argmax", {"axis": 1}, ("la",)),
         ("lb", "leaky_relu", {}, ("x",)), ("tb", "argmax", {"axis": 1}, ("lb",)),
         ("s", "add", {}, ("ta", "tb"))],
        [("la", "ta"), ("lb", "tb"), ("s",)],
    ),
    "diamond": (
        {"a": (1, 4, 10, 10)},
        [("pool", "max_pool2d", POOL, ("a",)), ("act", "leaky_relu", {}, ("pool",)),
         ("sum", "add", {}, ("pool", "act"))],
        [("pool", "act", "sum")],
    ),
    "two-pools": (
        {"a": (2, 3, 13, 12), "b": (2, 3, 7, 6)},
        [("p1", "max_pool2d", POOL, ("a",)), ("sum", "add", {}, ("p1", "b")),
         ("p2", "max_pool2d", POOL, ("sum",))],
        [("p1",), ("sum", "p2")],
    ),
}  # fmt: skip
"""Graphs whose fusion takes each path: an injective anchor first or last, a reduction anchor with
an injective producer, a reduction that cuts the graph in two kernels, two branches computing
the same (equal PrimFuncs, each kept its own), a tensor read twice, a windowed op whose taps
would recompute another's window (cut between them)."""


@on_every_target("dtype,chain", [(d, c) for d in ("float32", "float16") for c in CHAINS])
def test_chains_fuse_and_match_numpy(target, dtype, chain, sessions):  # noqa: F811
    inputs, nodes, expected_kernels = CHAINS[chain]
    g = graph(inputs, dtype, *nodes)
    assert [k.nodes for k in kernels(g)] == expected_kernels
    for index in (0, 1):
        comparison, _ = check(sessions.on(target), g, index)
        assert comparison.ok, f"{comparison.detail} (max error {comparison.max_error})"


def test_the_artifact_lists_its_kernels_and_schedules(tmp_path):
    out = tmp_path / "art"
    result = invoke("build", "--model", str(EXAMPLE_YAML), "--target", "x86", "--cores", "2", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["entry"] == "plan" and manifest["op"] == "maxpool_add"
    assert manifest["arena"] == [], "one fused kernel: nothing between kernels"
    assert [i["name"] for i in manifest["inputs"]] == ["a", "b"]
    assert manifest["graph"]["kernels"] == [
        {
            "name": "fused_max_pool2d_add",
            "nodes": ["pool", "sum"],
            "schedule": "cpu/max_pool2d",
            "layout": "NCHW",
        }
    ]
    assert manifest["graph"]["layout"] == "NCHW"
    assert [n["op"] for n in manifest["graph"]["nodes"]] == ["max_pool2d", "add"]
    assert "kernel fused_max_pool2d_add in NCHW (cpu/max_pool2d schedule): nodes pool, sum" in result.output


def test_opencl_graphs_are_one_plan(tmp_path, sessions):  # noqa: F811
    sessions.on(get_target("opencl"))  # skips without an OpenCL platform
    g = graph({"a": (2, 8, 17, 23), "b": (2, 1, 9, 12)}, "float32", *CHAINS["pool-argmax"][1])
    directory, _ = cached_build(g, get_target("opencl"), BuildOptions())
    plan = json.loads((directory / "launch.json").read_text())
    assert [k["name"] for k in plan["kernels"]] == ["k0_max_pool2d_kernel", "k1_fused_add_argmax_kernel"]
    assert [b["name"] for b in plan["buffers"]] == ["a", "b", "best"]
    assert plan["scratch"][0] == {"buffer": "tensor pool", "dtype": "float32", "shape": [2, 8, 9, 12]}


def test_run_model_checks_inputs_and_result(tmp_path, example_ops):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 8, 32, 32), "float32"), rng.standard_normal((1, 1, 16, 16), "float32")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "out.npy"
    model = str(EXAMPLE_ONNX)
    ran = invoke("run", "--model", model, "--target", "x86", "-i", str(tmp_path / "a.npy"),
                 "-i", str(tmp_path / "b.npy"), "-o", str(out), "--check")  # fmt: skip
    assert ran.exit_code == 0, ran.output
    assert "check passed" in ran.output
    pooled = get_op("max_pool2d").reference({"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1),
                                             "ceil_mode": False, "layout": "NCHW"}, a) + b  # fmt: skip
    expected = np.clip(np.where(pooled > 0, pooled, pooled * np.float32(0.1)), np.float32(-0.1), 1)
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-6)
    swapped = invoke("run", "--model", model, "--target", "x86", "-i", str(tmp_path / "b.npy"),
                     "-i", str(tmp_path / "a.npy"), "-o", str(out))  # fmt: skip
    assert swapped.exit_code == 2
    assert "input a of model pool_add_leaky_htanh is 1x8x32x32:float32" in swapped.output


def test_test_model_compares_with_numpy_and_onnxruntime(example_ops):
    pytest.importorskip("onnxruntime")
    result = invoke("test", "--model", str(EXAMPLE_ONNX), "--target", "x86")
    assert result.exit_code == 0, result.output
    assert "vs onnxruntime" in result.output and "vs numpy" in result.output
    assert "5 cases passed, 0 failed" in result.output  # numpy on 3 input sets, onnxruntime on 2 (no NaN)


def test_test_model_of_custom_nodes_only_says_onnxruntime_ran_none(example_ops, tmp_path):
    """Issue #51: a model of custom-domain nodes only had rows "vs onnxruntime", though
    onnxruntime ran no node of it (our numpy references computed every one); a mixed model's
    rows say how many nodes onnxruntime ran."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("HardTanh", ["x"], ["y"], "ht", domain="com.example")
    graph = helper.make_graph(
        [node], "custom_only", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = tmp_path / "custom_only.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), model)
    result = invoke("test", "--model", str(model), "--target", "x86")
    assert result.exit_code == 0, result.output
    assert "vs onnxruntime" not in result.output and "3 cases passed, 0 failed" in result.output
    assert "onnxruntime runs no node of this model" in " ".join(result.output.split())
    mixed = invoke("test", "--model", str(EXAMPLE_ONNX), "--target", "x86")
    said = "vs onnxruntime: onnxruntime ran 3 of 4 nodes, our numpy references the custom-domain ones"
    assert said in " ".join(mixed.output.split())


def test_test_model_says_when_onnxruntime_is_missing(example_ops, monkeypatch):
    """An ONNX model's second reference is onnxruntime's; without it, one line says so."""
    from deploy.verify import onnx_reference

    monkeypatch.setattr(onnx_reference, "onnxruntime", None)
    result = invoke("test", "--model", str(EXAMPLE_ONNX), "--target", "x86")
    assert result.exit_code == 0, result.output
    assert "onnxruntime is not installed: compared with numpy only" in result.output
    assert "vs onnxruntime" not in result.output and "3 cases passed, 0 failed" in result.output


def test_bench_model_reports_the_graph_against_the_roofline():
    result = invoke("bench", "--model", str(EXAMPLE_YAML), "--target", "x86", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["op"] == "maxpool_add" and row["schedule"] == "cpu/max_pool2d"
    assert row["mb_moved"] == pytest.approx(
        (32 * 64 * 112 * 112 + 32 * 56 * 56 + 32 * 64 * 56 * 56) * 4 / 1e6
    )


@pytest.mark.emulator
def test_onnx_model_with_a_custom_op_on_the_emulator(example_ops):
    """Done-when of #16: MaxPool -> Add -> LeakyRelu -> com.example::HardTanh, one fused kernel,
    cross-compiled for arm, verified on the emulator against onnxruntime and numpy."""
    pytest.importorskip("onnxruntime")
    result = invoke("test", "--model", str(EXAMPLE_ONNX), "--target", "arm")
    assert result.exit_code == 0, result.output
    assert "arm/max_pool2d" in result.output and "5 cases passed, 0 failed" in result.output


@pytest.mark.slow
def test_tune_model_tunes_the_fused_kernel(tmp_path):
    model = tmp_path / "small.yaml"
    model.write_text(
        "inputs: {a: {shape: [1, 16, 28, 28]}, b: {shape: [1, 1, 14, 14]}}\n"
        "nodes:\n"
        "  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}\n"
        "  - {name: sum, op: add, inputs: [pool, b]}\n"
        "output: sum\n"
    )
    db = tmp_path / "db"
    tuned = invoke("tune", "--model", str(model), "--target", "x86", "--trials", "4", "--db", str(db),
                   "--layout", "NCHW")  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    assert "kernel fused_max_pool2d_add: nodes pool, sum" in tuned.output
    task, verdict = sorted((db / "x86").iterdir())  # the kernel's task; the layout --layout gave
    assert task.name.startswith("fused_max_pool2d_add-")
    assert json.loads((verdict / "layout.json").read_text())["layout"] == "NCHW"
    out = tmp_path / "art"
    built = invoke("build", "--model", str(model), "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert built.exit_code == 0, built.output
    (kernel,) = json.loads((out / "manifest.json").read_text())["graph"]["kernels"]
    assert kernel["schedule"] == "tuned" or kernel.get("tuning") == "hand, tuning found nothing faster"
    (line,) = [line for line in built.output.splitlines() if "kernel fused_max_pool2d_add" in line]
    said = f"record {kernel.get('tuning_record')}): " if kernel["schedule"] == "tuned" else "nothing faster"
    assert said in line, line
    report = invoke("tune", "--report", "--target", "x86", "--db", str(db))
    assert report.exit_code == 0, report.output
    (row,) = json.loads((db / "x86" / "report.json").read_text())["rows"]
    assert (row["op"], row["task"], row["label"]) == (
        "fused_max_pool2d_add",
        task.name,
        "fused_max_pool2d_add 1x16x28x28 1x1x14x14",
    )
    assert row["hand_schedule"] == "cpu/max_pool2d" and row["trials"] >= 1


@pytest.mark.parametrize("source", ["yaml", "onnx", "laid-out"])
def test_a_fused_kernel_is_bound_again_from_its_task_file(source, tmp_path, example_ops):
    """`deploy tune --report` rebuilds a model's fused kernels from task.json: the same key (so
    the same records: its ops, attributes and wiring) and the same block names, which a tuned
    trace names."""
    from deploy.ops.fused import FusedOp
    from deploy.ops.layouts import LAYOUTS
    from deploy.ops.relayout import relayout
    from deploy.tune import records
    from deploy.tune.report import task_bound

    g = bind_graph(load_model(EXAMPLE_ONNX if source == "onnx" else EXAMPLE_YAML))
    if source == "laid-out":
        g = relayout(g, LAYOUTS["NCHW8c"])
    fused = [(k.bound, k.bound.op) for k in kernels(g) if isinstance(k.bound.op, FusedOp)]
    assert fused
    for bound, op in fused:
        directory = records.task_dir(tmp_path, bound, "x86")
        directory.mkdir(parents=True)
        records.write_json(directory / records.TASK, {**bound.key(), "target": "x86", "device": "local"})
        again = task_bound(directory)
        assert again.key() == bound.key()
        assert isinstance(again.op, FusedOp)
        blocks = range(len(op.nodes))
        assert [again.op.block_name(i) for i in blocks] == [op.block_name(i) for i in blocks]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a.update(anchor=2), "anchor 2 is no node's index"),
        (lambda a: a.update(anchor=True), "anchor True is no node's index"),
        (lambda a: a["nodes"][1].update(reads=["pool"]), "its nodes read 1 tensor(s) from outside, given 2"),
        (lambda a: a.update(nodes="pool"), "(expected a mapping with a list of nodes)"),
        (
            lambda a: a["nodes"].__setitem__(0, [1]),
            "(node 0: expected a mapping of op, attrs, reads and writes)",
        ),
        (lambda a: a["nodes"][1].update(reads=[["pool"]]), "(node 1: expected a mapping of op, attrs, reads"),
        (
            lambda a: (a["nodes"][0].update(reads=["sum"]), a["nodes"][1].update(reads=["a", "b"])),
            "(node 0 reads 'sum' before a node writes it)",
        ),
        (lambda a: a["nodes"][0].update(op="no_such_op"), "unknown op 'no_such_op'"),
        (lambda a: a["nodes"][0]["attrs"].update(kernel=-3), "kernel"),
        (lambda a: a["nodes"][0].update(attrs=[]), "(node 0: expected a mapping of op, attrs"),
        (lambda a: a.pop("anchor"), "not the attributes of a fused group and its inputs (anchor None is no"),
    ],
)
def test_a_bad_fused_task_file_is_one_line(change, message, tmp_path):
    from deploy.tune import records
    from deploy.tune.report import task_bound

    (bound,) = (k.bound for k in kernels(bind_graph(load_model(EXAMPLE_YAML))))
    directory = records.task_dir(tmp_path, bound, "x86")
    directory.mkdir(parents=True)
    task = json.loads(json.dumps(bound.key()))
    change(task["attrs"])
    records.write_json(directory / records.TASK, task)
    with pytest.raises(UsageError, match=r"^cannot read .*task\.json: ") as raised:
        task_bound(directory)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "body,message",
    [
        (
            {"op": "hard_tanh", "attrs": {}, "inputs": [{"shape": [4], "dtype": "float32"}]},
            "unknown op 'hard_tanh'",
        ),
        ("[1, 2", "Expecting ',' delimiter"),
        ({"op": "add", "attrs": {}}, "inputs null: expected a list of {shape, dtype}, one per input"),
        ({"op": ["add"], "attrs": {}, "inputs": []}, 'op ["add"]: expected the name of an op'),
        ({"op": "add", "attrs": [], "inputs": []}, "attrs []: expected a mapping of attribute names"),
        (
            {"op": "add", "attrs": {}, "inputs": [[2, 8]]},
            "input [2, 8]: expected {shape: [dims], dtype: name}",
        ),
        (
            {"op": "add", "attrs": {}, "inputs": [{"shape": [2], "dtype": ["f"]}]},
            'input {"shape": [2], "dtype"',
        ),
        (
            {"op": "add", "attrs": {}, "inputs": [{"shape": [[2]], "dtype": "float32"}]},
            "dim [2]: expected a size",
        ),
        ("[1, 2]", "[1, 2]: expected a mapping of op, attrs and inputs"),
        ("\x1b[2J", "Expecting value"),
    ],
)
def test_a_task_that_cannot_be_rebuilt_is_named_in_one_line(body, message, tmp_path):
    """An op whose file is not loaded (no --ops-path) is named as unknown, not taken for a fused
    group; a broken file is one printable line."""
    from deploy.tune import records
    from deploy.tune.report import task_bound

    directory = tmp_path / "x86" / "hard_tanh-000000000000"
    directory.mkdir(parents=True)
    (directory / records.TASK).write_text(body if isinstance(body, str) else json.dumps(body))
    with pytest.raises(UsageError, match=r"^cannot read .*task\.json: ") as raised:
        task_bound(directory)
    assert message in str(raised.value) and str(raised.value).isprintable()


def test_a_task_file_of_another_task_is_refused(tmp_path):
    from deploy.tune import records
    from deploy.tune.report import task_bound

    (bound,) = (k.bound for k in kernels(bind_graph(load_model(EXAMPLE_YAML))))
    directory = tmp_path / "x86" / "fused_max_pool2d_add-000000000000"
    directory.mkdir(parents=True)
    records.write_json(directory / records.TASK, bound.key())
    with pytest.raises(UsageError, match="describes another task than fused_max_pool2d_add-000000000000"):
        task_bound(directory)


def test_a_long_chain_of_ops_that_read_their_input_thrice_is_cut_into_kernels(local_session):
    """Inlining copies a node into every read of its output: ten leaky_relu (three reads each) in
    one kernel would hold 3**9 copies of the first, and TVM took minutes to compile it. Each
    kernel inlines a node at most MAX_COPIES times; the graph still matches numpy."""
    from deploy.compiler.fusion import MAX_COPIES

    chain = [("n0", "leaky_relu", {"alpha": 0.5}, ("x",))]
    chain += [(f"n{i}", "leaky_relu", {"alpha": 0.5}, (f"n{i - 1}",)) for i in range(1, 10)]
    g = graph({"x": (4, 4)}, "float32", *chain)
    found = kernels(g)
    assert [len(k.nodes) for k in found] == [2, 4, 4], "3**3 = 27 copies fit, 3**4 = 81 do not"
    assert 3 ** (max(len(k.nodes) for k in found) - 1) <= MAX_COPIES
    assert [n for k in found for n in k.nodes] == [name for name, *_ in chain]
    comparison, _ = verify(local_session, g, get_target("x86"), BuildOptions(), [
        random_input(t, np.random.default_rng(0), specials=True) for t in g.inputs
    ])  # fmt: skip
    assert comparison.ok, comparison.detail
    pool_add = bind_graph(load_model(EXAMPLE_YAML))
    assert len(kernels(pool_add)) == 1, "nine taps read once each: the pool still fuses into the add"


@pytest.mark.parametrize("kernel,size,sizes", [(1, 8, [3, 4, 4]), (2, 128, [1] * 7)])
def test_a_chain_of_pools_is_cut_before_it_takes_minutes_to_compile(kernel, size, sizes, local_session):
    """Each pooling reads every tap twice (the tap and its NaN test): ten of kernel 1 in one kernel
    did not compile in 13 minutes (nested 9 deep), five of kernel 2 took 35 s (64 copies in three).
    Cut at 3 deep (`MAX_NESTING`) and 32 copies, ten of kernel 1 build in under 3 s; a pool of
    kernel 2 reads 4 taps, a window, so each is a kernel of its own (no window inlined into
    another's taps); the graph still matches numpy."""
    chain = [
        (f"p{i}", "max_pool2d", {"kernel": kernel}, (f"p{i - 1}" if i else "x",)) for i in range(sum(sizes))
    ]
    g = graph({"x": (1, 2, size, size)}, "float32", *chain)
    found = kernels(g)
    assert [len(k.nodes) for k in found] == sizes
    if kernel == 2:
        comparison, _ = verify(local_session, g, get_target("x86"), BuildOptions(), [
            random_input(t, np.random.default_rng(0), specials=True) for t in g.inputs
        ])  # fmt: skip
        assert comparison.ok, comparison.detail


@pytest.mark.parametrize("name", ["x86", "opencl"])
def test_a_pool_after_a_pool_reads_a_buffer_so_each_kernel_stays_small(name):
    """pool -> add -> pool as one kernel inlined the first pool's 9 taps, each read twice (the tap
    and its NaN test), into each of the second's 9 taps and their NaN tests: over 300 loads, 8 s to
    schedule and compile for OpenCL. Cut between the two windowed ops, the second reads a buffer
    the first wrote, and each scheduled kernel holds a few dozen loads (counted, not timed)."""
    from deploy.compiler.compile import lay_out, schedule_op
    from deploy.compiler.fusion import _loads

    inputs, nodes, _ = CHAINS["two-pools"]
    target, options = get_target(name), BuildOptions()
    laid = lay_out(graph(inputs, "float32", *nodes), target, options)
    sizes = [len(_loads(schedule_op(k.bound, target, options).mod["main"])) for k in laid.kernels]
    assert max(sizes) <= 9 * 2 * 2, f"{sizes} loads: over 9 taps of the add's 2 inputs, each read twice"


@pytest.mark.parametrize(
    "tail,sizes",
    [
        ((("d", "add", {}, ("b", "c")),), [3, 4]),  # b read by c (3 times) and d: a3 would be 36 copies
        ((("d", "add", {}, ("c", "c")),), [3, 4]),  # c read twice by d: a3 would be 54
        ((("d", "argmax", {"axis": 1}, ("c",)),), None),  # a reduction, its own kernel or an anchor
    ],
)
def test_cut_kernels_of_a_dag_compute_what_numpy_does(tail, sizes, local_session):
    """Where a group is cut, no kernel's inner tensor is read outside it, and the graph matches
    numpy; copies add up over every path (a diamond, a node read twice)."""
    leaky = {"alpha": 0.5}
    chain = [("a", "leaky_relu", leaky, ("x",)), ("a2", "leaky_relu", leaky, ("a",))]
    chain += [("a3", "leaky_relu", leaky, ("a2",)), ("a4", "leaky_relu", leaky, ("a3",))]
    chain += [("b", "leaky_relu", leaky, ("a4",)), ("c", "leaky_relu", leaky, ("b",))]
    g = graph({"x": (4, 4)}, "float32", *chain, *tail)
    found = kernels(g)
    assert sizes is None or [len(k.nodes) for k in found] == sizes
    for k in found:
        inner = set(k.nodes) - {k.writes}
        assert not any(t in inner for other in found if other is not k for t in other.reads)
    comparison, _ = verify(local_session, g, get_target("x86"), BuildOptions(), [
        random_input(t, np.random.default_rng(0), specials=True) for t in g.inputs
    ])  # fmt: skip
    assert comparison.ok, comparison.detail


def test_a_graph_build_is_cached_by_its_nodes(local_session):
    x86, options = get_target("x86"), for_device(BuildOptions(), local_session)
    one = graph({"x": (8, 8)}, "float32", ("act", "leaky_relu", {"alpha": 0.1}, ("x",)))
    two = graph({"x": (8, 8)}, "float32", ("act", "leaky_relu", {"alpha": 0.2}, ("x",)))
    assert cached_build(one, x86, options)[0] != cached_build(two, x86, options)[0]
    assert cached_build(one, x86, options)[0] == cached_build(one, x86, options)[0]


def test_float16_kernels_of_a_storage_target_come_from_the_float32_graph():
    """On a device without half arithmetic a float16 graph is fused and scheduled as float32 (its
    buffers stay half): the kernels come from the widened graph, and a float16 kernel handed to
    the scheduler alone (tuning) is refused in one line that says how to tune it."""
    from deploy.base.errors import UsageError
    from deploy.compiler.compile import as_computed_graph, hand_schedule

    g = graph({"x": (1, 4, 8, 8), "b": (1, 1, 4, 4)}, "float16", ("p", "max_pool2d", POOL, ("x",)),
              ("s", "add", {}, ("p", "b")))  # fmt: skip
    storage = BuildOptions(fp16_storage=True)
    assert {t.dtype for t in as_computed_graph(g, storage).types.values()} == {"float32"}
    assert as_computed_graph(g, BuildOptions()) is g
    (kernel,) = kernels(g)
    with pytest.raises(UsageError, match="tune the model with float32 inputs"):
        hand_schedule(kernel.bound, get_target("opencl"), storage)


LAID_OUT: dict[str, tuple[dict[str, tuple[int, ...]], list[Any], list[str]]] = {
    "chain": (
        {"a": (2, 7, 13, 11), "b": (2, 1, 7, 6), "c": (2, 7, 7, 6)},
        [("pool", "max_pool2d", POOL, ("a",)), ("act", "leaky_relu", {"alpha": 0.1}, ("pool",)),
         ("sum", "add", {}, ("act", "b")), ("both", "add", {}, ("sum", "c")),
         ("pool2", "max_pool2d", {"kernel": 2}, ("both",)), ("best", "argmax", {"axis": 1}, ("pool2",))],
        ["a>", "pool", "act", "b>*", "sum", "c>", "both", "pool2", "best"],
    ),
    "twins": (
        {"a": (1, 7, 8, 8), "c": (1, 7, 8, 8)},
        [("pool", "max_pool2d", {"kernel": 1}, ("a",)), ("sum", "add", {}, ("pool", "c"))],
        ["a>", "pool", "c>", "sum", "sum<"],
    ),
    "disagree": (
        {"a": (1, 7, 9, 10), "v": (5,), "w": (1,)},
        [("pool", "max_pool2d", POOL, ("a",)), ("row", "add", {}, ("pool", "v")),
         ("col", "add", {}, ("pool", "w")), ("both", "add", {}, ("row", "col")),
         ("pool2", "max_pool2d", {"kernel": 2}, ("both",))],
        ["a>", "pool", "pool<", "row", "col", "both", "both>", "pool2", "pool2<"],
    ),
}  # fmt: skip
"""Graphs for the layout pass, each with the nodes it expects after it (`x>`: a conversion of x
into the layout, `x<`: back to NCHW; `x>*`: in NHWC only, as a packed layout broadcasts a
one-channel NCHW operand as it is). In "chain" every node runs in the layout once its input is
packed (pooling, leaky_relu, add with a one-channel and a full operand, argmax over channels,
whose output has no channels), so a and c are converted on the way in and nothing on the way
out. In "disagree" `row` and `col` add a vector along W and a scalar-like [1], which a layout
other than NCHW does not broadcast: pool is converted back once for both, `both` (reading no
moved tensor) stays NCHW, and its result is converted for pool2. "twins" converts two inputs
the same way (equal kernels, each kept its own)."""

PACKED = ("NHWC", "NCHW4c", "NCHW8c")


def laid_out_names(g: Any) -> list[str]:
    """The node names of a laid-out graph, conversions written `x>` (into a layout) or `x<`."""
    return [
        f"{n.node.name.rsplit('_', 1)[0]}{'<' if n.bound.attrs['dst'] == 'NCHW' else '>'}"
        if n.bound.op.name == "layout_transform"
        else n.node.name
        for n in g.nodes
    ]


@pytest.mark.parametrize("layout", PACKED)
@pytest.mark.parametrize("name", list(LAID_OUT))
def test_the_layout_pass_converts_only_where_neighbours_disagree(name, layout):
    from deploy.ops.layouts import LAYOUTS
    from deploy.ops.relayout import relayout

    inputs, nodes, expected = LAID_OUT[name]
    g = graph(inputs, "float32", *nodes)
    laid = relayout(g, LAYOUTS[layout])
    packed = LAYOUTS[layout].packed
    assert laid_out_names(laid) == [e.rstrip("*") for e in expected if not (packed and e.endswith("*"))]
    assert laid.graph.inputs == g.graph.inputs and laid.graph.outputs == g.graph.outputs  # the interface
    assert laid.outputs == g.outputs
    assert all(
        n.bound.attrs["layout"] == n.node.layout == layout
        for n in laid.nodes
        if n.bound.op.name == "max_pool2d"
    )
    rng = np.random.default_rng(3)
    arrays = [random_input(t, rng, specials=True) for t in g.inputs]
    np.testing.assert_array_equal(laid.references(*arrays)[0], g.references(*arrays)[0])  # NaN where NaN
    assert relayout(g, LAYOUTS["NCHW"]) is g


def test_a_moved_output_read_by_another_node_keeps_its_name():
    """The graph's output `pool` moves to the layout and is read by a node that follows it:
    that node reads the packed tensor (under its own name), and the conversion back writes
    `pool`, which the graph returns."""
    from deploy.ops.layouts import LAYOUTS
    from deploy.ops.relayout import relayout

    g = bind_graph(
        Graph(
            "g",
            (("a", TensorType((1, 7, 8, 8), "float32")),),
            (
                Node("pool", get_op("max_pool2d"), POOL, ("a",), "pool"),
                Node("act", get_op("leaky_relu"), {}, ("pool",), "act"),
            ),
            ("pool", "act"),  # act an output too: a node no output reads is dropped
        )
    )
    laid = relayout(g, LAYOUTS["NCHW8c"])
    writers = {n.node.output: n for n in laid.nodes}
    assert laid.graph.outputs == ("pool", "act") and writers["pool"].bound.op.name == "layout_transform"
    packed = writers["pool"].node.inputs[0]
    named = {n.node.name: n for n in laid.nodes}
    assert named["act"].node.inputs == (packed,) and writers[packed].node.name == "pool"
    rng = np.random.default_rng(4)
    a = random_input(g.inputs[0], rng, specials=True)
    np.testing.assert_array_equal(laid.references(a)[0], g.references(a)[0])


def test_the_layout_pass_leaves_graphs_without_pooling_and_explicit_layouts_alone():
    from deploy.ops.layouts import LAYOUTS
    from deploy.ops.relayout import relayout

    elementwise = graph({"a": (1, 8, 4, 4), "b": (1, 8, 4, 4)}, "float32", ("s", "add", {}, ("a", "b")))
    assert relayout(elementwise, LAYOUTS["NCHW4c"]) is elementwise
    explicit = graph(
        {"a": (1, 2, 6, 6, 4)}, "float32", ("p", "max_pool2d", {**POOL, "layout": "NCHW4c"}, ("a",))
    )
    assert relayout(explicit, LAYOUTS["NCHW8c"]) is explicit


def test_a_conversion_is_a_kernel_of_its_own():
    """Fused into its neighbour, a conversion makes that kernel's loops one layout and its reads
    the other, under the generic schedule; on its own each kernel keeps its layout's schedule."""
    from deploy.ops.layouts import LAYOUTS
    from deploy.ops.relayout import relayout

    inputs, nodes, _ = LAID_OUT["chain"]
    laid = relayout(graph(inputs, "float32", *nodes), LAYOUTS["NCHW4c"])
    found = kernels(laid)
    assert [k.nodes for k in found] == [
        ("a_NCHW4c",),
        ("c_NCHW4c",),
        ("pool",),  # a window: not inlined into pool2's taps
        ("act", "sum", "both", "pool2"),
        ("best",),
    ]
    assert [k.layouts for k in found] == [("NCHW -> NCHW4c",)] * 2 + [("NCHW4c",)] * 3


def without(mark: pytest.MarkDecorator, *ids: str) -> pytest.MarkDecorator:
    """A parametrize mark of `on_every_target` without the parameters named `ids`."""
    argnames, params = mark.args
    return pytest.mark.parametrize(argnames, [p for p in params if p.id not in ids])


@without(
    on_every_target(
        "dtype,layout,name",
        [("float32", layout, name) for layout in PACKED for name in LAID_OUT]
        + [("float16", "NCHW8c", "chain"), ("int8", "NCHW4c", "disagree")],
    ),
    "opencl-float32-NCHW4c-chain",
    "opencl-float32-NCHW8c-chain",
    "x86-avx512-float32-NCHW4c-chain",
)
def test_laid_out_graphs_match_numpy(target, dtype, layout, name, sessions):  # noqa: F811
    """The ncnn way: each graph laid out in each layout (7 channels: padding lanes in both
    packings), built and run on every target, against the NCHW graph's numpy reference. The chain,
    whose fused pair of poolings takes 8 s (x86) to 27 s (OpenCL) to lower, runs in every layout
    on x86; x86-avx512 leaves out NCHW4c (its kernels are NCHW8c's with 4 for 8), OpenCL runs it in
    NHWC and in NCHW8c in float16 (the float32 kernels are those with float for half)."""
    inputs, nodes, _ = LAID_OUT[name]
    g = graph(inputs, dtype, *nodes)
    on = sessions.on(target)
    rng = np.random.default_rng(zlib.crc32(f"{name}{layout}{dtype}".encode()))
    for ties in (False, True):
        arrays = [random_input(t, rng, ties=ties, specials=True) for t in g.inputs]
        comparison, _ = verify(on.session, g, on.target, BuildOptions(layout=layout), arrays)
        assert comparison.ok, f"{comparison.detail} (max error {comparison.max_error})"


def test_build_layout_puts_conversions_at_the_boundaries(tmp_path):
    out = tmp_path / "art"
    result = invoke("build", "--model", str(EXAMPLE_YAML), "--target", "x86", "--cores", "2",
                    "--layout", "NCHW8c", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["graph"]["layout"] == "NCHW8c" and manifest["graph"]["outputs"] == ["sum"]
    assert [(k["nodes"], k["layout"], k["schedule"]) for k in manifest["graph"]["kernels"]] == [
        (["a_NCHW8c"], "NCHW -> NCHW8c", "cpu/generic"),
        (["pool", "sum"], "NCHW8c", "cpu/max_pool2d"),
        (["sum_NCHW"], "NCHW8c -> NCHW", "cpu/generic"),
    ]
    assert manifest["schedule"] == "cpu/generic (2 kernels) + cpu/max_pool2d"  # each label once
    assert manifest["inputs"][0]["shape"] == [32, 64, 112, 112] and manifest["outputs"][0]["shape"] == [
        32,
        64,
        56,
        56,
    ]
    assert "kernel fused_max_pool2d_add in NCHW8c (cpu/max_pool2d schedule): nodes pool, sum" in result.output


def test_a_layout_is_part_of_the_build_key():
    from deploy.compiler.cache import build_key

    g = graph({"a": (1, 8, 8, 8)}, "float32", ("p", "max_pool2d", POOL, ("a",)))
    x86 = get_target("x86")
    assert build_key(g, x86, BuildOptions()) != build_key(g, x86, BuildOptions(layout="NCHW8c"))


@pytest.mark.slow
def test_tune_model_measures_the_targets_layout_and_builds_follow(tmp_path):
    """`deploy tune --model` times the graph in NCHW and in the target's layout for its dtype
    (x86 float32: NCHW8c), conversions included, and writes the verdict; `--tuned` builds lay
    the graph out as it says. Which one wins is the device's to say: packed pooling on 4x4 maps
    of 1024 channels measured 0.59x NCHW here, with its conversions."""
    model = tmp_path / "tiny.yaml"
    model.write_text(
        "inputs: {a: {shape: [1, 1024, 7, 7]}, b: {shape: [1, 1, 4, 4]}}\n"
        "nodes:\n"
        "  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}\n"
        "  - {name: sum, op: add, inputs: [pool, b]}\n"
        "output: sum\n"
    )
    db = tmp_path / "db"
    tuned = invoke("tune", "--model", str(model), "--target", "x86", "--trials", "1", "--db", str(db))
    assert tuned.exit_code == 0, tuned.output
    (verdict_file,) = (db / "x86").glob("graph-tiny-*/layout.json")
    verdict = json.loads(verdict_file.read_text())
    assert verdict["candidate"] == "NCHW8c" and verdict["layout"] in (None, "NCHW8c")
    assert ("layout NCHW8c:" if verdict["layout"] else "layout NCHW stays") in tuned.output
    out = tmp_path / "art"
    built = invoke("build", "--model", str(model), "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert built.exit_code == 0, built.output
    assert json.loads((out / "manifest.json").read_text())["graph"]["layout"] == (verdict["layout"] or "NCHW")
    again = invoke("tune", "--model", str(model), "--target", "x86", "--trials", "1", "--db", str(db))
    assert again.exit_code == 0, again.output  # goes on with the kernels of the layout chosen
    assert f"layout measured before on local (delete {verdict_file} to measure again):" in again.output
    assert json.loads(verdict_file.read_text()) == verdict


@pytest.mark.parametrize(
    "change,stands",
    [
        ({}, True),
        ({"device": "board"}, False),
        ({"candidate": "NCHW4c"}, False),
        ({"nchw_ms": "fast"}, False),
        ({"packed_ms": True}, False),
        ({"rejected": None}, False),
        ({"layout": "NCHW16c"}, False),
        ({"packed_ms": 3.0}, False),  # packed, but slower than NCHW: not what tuning writes
        ({"layout": None, "packed_ms": 1.9}, True),  # NCHW stays: faster, within the spread
        ({"layout": None, "packed_ms": None}, True),  # the packed build was rejected
        ({"nchw_ms": 0}, False),
        ({"nchw_ms": -1.0}, False),
        ({"nchw_ms": float("nan")}, False),
        ({"nchw_ms": 10**400}, False),
        ({"rejected": [{"a": 1}]}, False),
    ],
)
def test_a_layout_verdict_stands_for_its_candidate_on_its_device(change, stands, tmp_path):
    """Running `deploy tune --model` again keeps the layout measured on the same device."""
    from deploy.devices import get_device
    from deploy.ops.layouts import LAYOUTS
    from deploy.tune.layouts import layout_path, standing, write_layout

    g = bind_graph(load_model(EXAMPLE_YAML))
    measured = {"layout": "NCHW8c", "candidate": "NCHW8c", "nchw_ms": 2.0, "packed_ms": 1.0, "rejected": []}
    write_layout(tmp_path, g, "x86", {**measured, "device": "local", **change})
    found = standing(tmp_path, g, "x86", LAYOUTS["NCHW8c"], get_device("local"))
    assert (found is not None) == stands
    if found is not None:
        assert found.standing == layout_path(tmp_path, g, "x86")
        assert found.body() == {**measured, "device": "local", "nchw_spread_ms": 0.0, **change}


def test_tuned_builds_lay_a_graph_out_as_its_verdict_says(tmp_path):
    """The layout verdict is data read from disk: one naming a layout lays the graph out in it,
    `--layout` overrides it, and one that is not a verdict is refused in one warning line (the
    build stays NCHW)."""
    from deploy.tune.layouts import layout_path

    g = bind_graph(load_model(str(EXAMPLE_YAML)))
    db = tmp_path / "db"
    verdict = layout_path(db, g, "x86")
    verdict.parent.mkdir(parents=True)

    def built_layout(*extra: str) -> tuple[str, str]:
        out = tmp_path / f"art{len(list(tmp_path.iterdir()))}"
        result = invoke("build", "--model", str(EXAMPLE_YAML), "--target", "x86", "--cores", "2",
                        "--tuned", str(db), *extra, "-o", str(out))  # fmt: skip
        assert result.exit_code == 0, result.output
        return json.loads((out / "manifest.json").read_text())["graph"]["layout"], result.output

    verdict.write_text(json.dumps({"layout": "NCHW4c", "candidate": "NCHW4c"}))
    assert built_layout()[0] == "NCHW4c"
    assert built_layout("--layout", "NCHW")[0] == "NCHW"
    bad: object
    for bad in ({"layout": "NCHW3c"}, {"layout": []}, {}, [1]):
        verdict.write_text(json.dumps(bad))
        layout, output = built_layout()
        assert layout == "NCHW" and output.count("is not a layout verdict of deploy tune") == 1, output
        assert "building the graph in NCHW" in output
    verdict.write_text("[" * 100_000 + "]" * 100_000)
    layout, output = built_layout()
    assert layout == "NCHW" and output.count(f"cannot read {verdict}: nested too deeply") == 1, output
    verdict.unlink()
    os.mkfifo(verdict)  # would block a reader forever
    layout, output = built_layout()
    assert layout == "NCHW" and output.count(f"cannot read {verdict}: not a regular file") == 1, output
    assert "this op and these shapes" not in output  # a graph says it per kernel
    assert f"nodes pool, sum; it was not tuned in {db}: using the cpu/max_pool2d schedule" in output


def test_a_1d_pool_runs_between_its_reshapes_under_the_pools_schedule(local_session):
    """A 1-D MaxPool runs as a 2-D pool between reshapes (`maxpool_by_rank`); a kernel ending in
    a reshape got the generic schedule (its output's loops were the reshape's). The pool writes
    the reshape's output in its own loops (`viewed`)."""
    from deploy.ops.library.max_pool2d import maxpool_by_rank

    shape = (2, 4, 37)
    chain = maxpool_by_rank({"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, shape)
    assert chain is not None
    nodes = [(f"n{i}", op, attrs, (f"n{i - 1}" if i else "x",)) for i, (op, attrs) in enumerate(chain)]
    g = graph({"x": shape}, "float32", *nodes)
    target = get_target("x86")
    _, manifest = cached_build(g, target, for_device(BuildOptions(), local_session))
    assert manifest.graph is not None
    assert [k["schedule"] for k in manifest.graph["kernels"]] == ["cpu/max_pool2d"]
    assert manifest.graph["kernels"][0]["nodes"][-1] == "n2", "the reshape is in the kernel"
    rng = np.random.default_rng(3)
    comparison, _ = verify(
        local_session, g, target, BuildOptions(), [random_input(g.inputs[0], rng, specials=True)]
    )
    assert comparison.ok, comparison.detail
