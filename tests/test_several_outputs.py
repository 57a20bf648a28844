"""Graphs with several outputs (#39): an ONNX model's outputs or a graph file's `output: [a, b]`,
in the model's order through build, run (`-o` once each), test, bench and bundles, on every kind
of target; an output another kernel reads, one that is an input, and the bad ones refused in one
line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from deploy.base.errors import UsageError
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.model import load_model
from deploy.ops.graph import bind_graph
from deploy.verify.compare import random_input
from deploy.verify.run import verify
from tests.conftest import invoke
from tests.test_ops_matrix import sessions  # noqa: F401  (the module's target sessions)

OUTPUTS = ("pool", "act", "idx")


def model(tmp_path: Path, batch: int | str = "N", outputs: tuple[str, ...] = OUTPUTS) -> Path:
    """x -> pool (an output that the next kernel reads too) -> + bias -> leaky_relu `act` ->
    argmax over the channels `idx`; the outputs `outputs` in that order."""
    shapes = {"pool": [batch, 4, 4, 4], "act": [batch, 4, 4, 4], "idx": [batch, 4, 4], "x": [batch, 4, 8, 8]}
    types = {"idx": TensorProto.INT64}
    bias = numpy_helper.from_array(np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4, 1, 1), "bias")
    nodes = [
        helper.make_node("MaxPool", ["x"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["pool", "bias"], ["s"]),
        helper.make_node("LeakyRelu", ["s"], ["act"], alpha=0.1),
        helper.make_node("ArgMax", ["act"], ["idx"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "multi",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shapes["x"])],
        [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), shapes[n]) for n in outputs],
        [bias],
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "multi.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize(
    "target", ["x86", pytest.param("arm", marks=pytest.mark.emulator), "opencl", "armv7", "riscv64"]
)
def test_every_output_matches_numpy_on_every_kind_of_target(target, tmp_path, sessions):  # noqa: F811
    """The module (TVM's runtime), the OpenCL plan and the runner's bundle (armv7, riscv64) each
    write the three outputs, in order, at N = 3."""
    on = sessions.on(get_target(target))
    graph = bind_graph(load_model(model(tmp_path, 3)))
    assert graph.graph.outputs == OUTPUTS
    arrays = [random_input(t, np.random.default_rng(2), ties=True, specials=True) for t in graph.inputs]
    comparison, _ = verify(on.session, graph, on.target, BuildOptions(), arrays)
    assert comparison.ok, comparison.detail


def test_run_writes_each_output_and_the_bundle_does_too(tmp_path):
    path = model(tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    written = [str(tmp_path / f"{name}.npy") for name in OUTPUTS]
    ran = invoke("run", "--model", str(path), "--target", "x86", "-i", str(tmp_path / "x.npy"),
                 *[w for o in written for w in ("-o", o)], "--check")  # fmt: skip
    assert ran.exit_code == 0, ran.output
    assert "check passed" in ran.output and f"{written[2]} 3x4x4:int64" in ran.output
    expected = bind_graph(load_model(path)).references(x)
    for name, want in zip(written, expected, strict=True):
        np.testing.assert_array_equal(np.load(name), want)
    one = invoke(
        "run", "--model", str(path), "--target", "x86", "-i", str(tmp_path / "x.npy"), "-o", written[0]
    )
    assert one.exit_code == 2
    assert "model multi writes 3 output(s) (pool, act, idx): give -o once for each, got 1" in one.output

    built = invoke("build", "--model", str(path), "--target", "x86", "--bundle", "-o", str(tmp_path / "b"))
    assert built.exit_code == 0, built.output
    assert "-o pool.npy -o act.npy -o idx.npy" in built.output
    manifest = Manifest.read(tmp_path / "b")
    assert manifest.output_names == list(OUTPUTS) and manifest.outputs[2]["dtype"] == "int64"
    header = (tmp_path / "b" / "multi.h").read_text()
    assert "int multi(const DLTensor* x, DLTensor* pool, DLTensor* act, DLTensor* idx);" in header
    assert "#define MULTI_NUM_OUTPUTS 3" in header
    runner = [str(tmp_path / "b" / "deploy-run"), str(tmp_path / "b"), "-i", str(tmp_path / "x.npy")]
    again = [str(tmp_path / f"c-{name}.npy") for name in OUTPUTS]
    done = subprocess.run([*runner, *[w for o in again for w in ("-o", o)]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name, want in zip(again, expected, strict=True):
        np.testing.assert_array_equal(np.load(name), want)
    short = subprocess.run([*runner, "-o", again[0]], capture_output=True, text=True)
    assert short.returncode == 2
    assert (
        short.stderr
        == "deploy-run: multi writes 3 output(s) (pool, act, idx): give -o once for each, got 1\n"
    )


def test_test_and_bench_take_every_output(tmp_path):
    pytest.importorskip("onnxruntime")
    path = model(tmp_path)
    tested = invoke("test", "--model", str(path), "--target", "x86")
    assert tested.exit_code == 0, tested.output
    assert "15 cases passed, 0 failed" in tested.output  # numpy 3 x 3 sizes, onnxruntime 2 x 3
    benched = invoke("bench", "--model", str(path), "--target", "x86", "--repeat", "1", "--json")
    assert benched.exit_code == 0, benched.output
    at_one = json.loads(benched.stdout)[0]  # N = 1: x and the bias read, pool, act and idx written
    assert at_one["mb_moved"] == pytest.approx((4 * 8 * 8 * 4 + 16 + 2 * 4 * 4 * 4 * 4 + 4 * 4 * 8) / 1e6)


def test_a_graph_file_lists_its_outputs_in_order(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(
        "inputs: {a: {shape: [2, 3, 8, 8]}}\n"
        "nodes:\n"
        "  - {name: pool, op: max_pool2d, attrs: {kernel: 2}, inputs: [a]}\n"
        "  - {name: act, op: leaky_relu, inputs: [pool]}\n"
        "output: [act, pool, a]\n"  # an input passed through too
    )
    graph = bind_graph(load_model(path))
    assert graph.graph.outputs == ("act", "pool", "a")
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    from deploy.devices import get_device

    with get_device("local").open() as session:
        comparison, _ = verify(session, graph, get_target("x86"), BuildOptions(), [x])
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (("pool", "pool"), "graph multi: output 'pool' is given twice: each output once"),
        (("pool", "nothing"), "not a valid ONNX model: Graph output 'nothing' is not an output of any node"),
    ],
)
def test_bad_outputs_are_one_line(tmp_path, outputs, expected):
    path = model(tmp_path, outputs=("pool",))
    proto = onnx.load(path)
    del proto.graph.output[:]
    proto.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4, 4, 4]) for n in outputs
    )
    onnx.save(proto, path)
    with pytest.raises(UsageError) as caught:
        bind_graph(load_model(path))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_opencl_refuses_an_output_no_kernel_writes(tmp_path):
    path = tmp_path / "through.yaml"
    path.write_text(
        "inputs: {a: {shape: [2, 3, 8, 8]}}\n"
        "nodes: [{name: act, op: leaky_relu, inputs: [a]}]\n"
        "output: [act, a]\n"
    )
    built = invoke("build", "--model", str(path), "--target", "opencl", "-o", str(tmp_path / "cl"))
    assert (
        built.exit_code == 1
        and "output 'a' is no kernel's (an input or a constant passed through)" in built.output
    )
