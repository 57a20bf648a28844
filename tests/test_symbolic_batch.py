"""A symbolic batch: `--shape Nx64x112x112`, a graph file's `[N, ...]` and an ONNX `dim_param`
give one module for every N. The op matrix (`test_ops_matrix.py`) runs each op's symbolic case at
N = 1, 3 and 32 on every CPU target; here: the shape syntax, what binding allows, the manifest,
the runtime's checks at call time, the model example on x86 and the emulator, and what refuses a
symbolic batch (OpenCL plans, tuning) with one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from deploy.base.errors import UsageError
from deploy.cli.args import parse_shape
from deploy.compiler.manifest import Manifest
from deploy.model import load_model
from deploy.ops import TensorType, bind, get_op
from deploy.ops.spec import sizes_of, symbol
from tests.conftest import invoke

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_N = REPO / "examples" / "pool_add_leaky_htanh_n.onnx"
POOL = {"kernel": 3, "stride": 2, "padding": 1}


@pytest.mark.parametrize(
    "text,shape",
    [("Nx64x112x112", ("N", 64, 112, 112)), ("batchX3", ("batch", 3)), ("2x3", (2, 3))],
)
def test_shape_syntax_takes_a_named_batch_first(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["3xN", "Nx3xM", "xx3", "N-1x3", "Nx0", "N", "MAXx3"])
def test_shape_syntax_refuses_names_after_the_batch(text):
    with pytest.raises(UsageError, match="--shape"):
        parse_shape(text)


def test_one_name_is_one_tvm_variable_across_tensors():
    a, b = TensorType(("N", 8), "float32"), TensorType(("N", 1), "float32")
    assert a.shape[0] is b.shape[0] is symbol("N")
    assert a.to_json() == {"shape": ["N", 8], "dtype": "float32"} and str(a) == "Nx8:float32"
    assert a.at({"N": 3}) == TensorType((3, 8), "float32")


@pytest.mark.parametrize(
    "op,attrs,shapes,output",
    [
        ("add", {}, [("N", 8, 9), ("N", 1, 9)], ["N", 8, 9]),
        ("add", {}, [("N", 3, 5), (1, 3, 5)], ["N", 3, 5]),
        ("add", {}, [("N", 3, 5), (5,)], ["N", 3, 5]),
        ("add", {}, [(2, 300), (2, 300)], [2, 300]),
        ("max_pool2d", POOL, [("N", 5, 17, 19)], ["N", 5, 9, 10]),
        ("argmax", {"axis": -1}, [("N", 3, 40)], ["N", 3]),
    ],
)
def test_ops_infer_through_a_symbolic_batch(op, attrs, shapes, output):
    bound = bind(get_op(op), attrs, [TensorType(s, "float32") for s in shapes])
    assert bound.output.dims() == output


@pytest.mark.parametrize(
    "op,attrs,shapes,message",
    [
        ("add", {}, [("N", 3), (4, 3)], "dim 0 is 4, expected N or 1"),
        ("add", {}, [("N", 3), ("M", 3)], "dim 0 is M, expected N or 1"),
        ("leaky_relu", {}, [(3, "N")], "only the first dim (the batch) may be symbolic"),
        ("argmax", {"axis": 0}, [("N", 3)], "axis=0 reduces the symbolic batch N"),
        ("add", {}, [("N", 1, 3), (2, 1, 1, 3)], "the output of add has shape [2, N, 1, 3]: only the first"),
        ("leaky_relu", {}, [("N", 2**16, 2**16)], "elements per batch item"),
    ],
)
def test_binding_refuses_what_no_batch_size_makes_right(op, attrs, shapes, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        bind(get_op(op), attrs, [TensorType(s, "float32") for s in shapes])


def test_call_time_sizes_come_from_the_arrays_and_must_agree():
    named = [("a", TensorType(("N", 8), "float32")), ("b", TensorType(("N", 1), "float32"))]
    assert sizes_of(named, [(3, 8), (3, 1)]) == {"N": 3}
    with pytest.raises(UsageError, match=r"input b has N=4 \(shape \[4, 1\]\) but input a has N=3"):
        sizes_of(named, [(3, 8), (4, 1)])
    with pytest.raises(UsageError, match=r"input a has shape \[3, 9\]: expected \[N, 8\]"):
        sizes_of(named, [(3, 9), (3, 1)])
    with pytest.raises(UsageError, match=r"input a has N=0 \(shape \[0, 8\]\): expected >= 1"):
        sizes_of(named, [(0, 8), (0, 1)])
    with pytest.raises(
        UsageError, match=r"input a at N=300000000 has shape \[300000000, 8\]: 2.4e\+09 elements"
    ):
        sizes_of(named, [(300_000_000, 8), (300_000_000, 1)])  # int32 indexing: the whole tensor counts


@pytest.mark.parametrize("dim", [2.5, True, None, [3]])
def test_a_dim_is_a_size_or_a_name(dim):
    with pytest.raises(UsageError, match="expected a size or a batch name"):
        TensorType((dim, 3), "float32")
    assert TensorType((np.int64(3),), "float32").shape == (3,)


def test_one_module_runs_every_batch_and_checks_them(tmp_path):
    art = tmp_path / "art"
    built = invoke("build", "--op", "add", "--shape", "Nx8x9x10", "--shape", "Nx1x9x10",
                   "--target", "x86", "-o", str(art))  # fmt: skip
    assert built.exit_code == 0, built.output
    manifest = json.loads((art / "manifest.json").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [["N", 8, 9, 10], ["N", 1, 9, 10]]
    assert manifest["outputs"][0]["shape"] == ["N", 8, 9, 10]
    assert Manifest.read(art).output_types([(32, 8, 9, 10), (32, 1, 9, 10)]) == [
        TensorType((32, 8, 9, 10), "float32")
    ]
    rng = np.random.default_rng(0)
    for n in (1, 3, 32):
        np.save(tmp_path / f"a{n}.npy", rng.standard_normal((n, 8, 9, 10), "float32"))
        np.save(tmp_path / f"b{n}.npy", rng.standard_normal((n, 1, 9, 10), "float32"))
        ran = invoke("run", "--op", "add", "--shape", "Nx8x9x10", "--shape", "Nx1x9x10", "--target", "x86",
                     "-i", str(tmp_path / f"a{n}.npy"), "-i", str(tmp_path / f"b{n}.npy"),
                     "-o", str(tmp_path / "out.npy"), "--check")  # fmt: skip
        assert ran.exit_code == 0, ran.output
        assert f"{n}x8x9x10:float32" in ran.output and np.load(tmp_path / "out.npy").shape == (n, 8, 9, 10)
    mixed = invoke("run", "--op", "add", "--shape", "Nx8x9x10", "--shape", "Nx1x9x10", "--target", "x86",
                   "-i", str(tmp_path / "a3.npy"), "-i", str(tmp_path / "b32.npy"),
                   "-o", str(tmp_path / "x.npy"))  # fmt: skip
    assert mixed.exit_code == 2
    assert "error: input b has N=32 (shape [32, 1, 9, 10]) but input a has N=3" in mixed.output
    assert not (tmp_path / "x.npy").exists()


def leaky_graph(path: Path, shape: str) -> Path:
    """A one-node graph file: leaky_relu of input x of `shape` (YAML)."""
    nodes = "nodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    path.write_text(f"inputs: {{x: {{shape: {shape}}}}}\n{nodes}")
    return path


def onnx_model(path: Path, dims: list[int | str]) -> Path:
    node = helper.make_node("LeakyRelu", ["x"], ["y"], "act", alpha=0.1)
    graph = helper.make_graph(
        [node],
        "act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnx_dim_param_is_the_batch(tmp_path):
    model = load_model(onnx_model(tmp_path / "m.onnx", ["batch", 3, 4]))
    assert model.inputs[0][1].dims() == ["batch", 3, 4]
    with pytest.raises(UsageError, match=r"input 'x' dim 1 is symbolic \('H'\): only the first dim"):
        load_model(onnx_model(tmp_path / "h.onnx", [1, "H", 4]))
    with pytest.raises(UsageError, match="expected a name like N"):
        load_model(onnx_model(tmp_path / "odd.onnx", ["batch size", 3]))


def test_graph_file_takes_a_named_batch(tmp_path):
    assert load_model(leaky_graph(tmp_path / "g.yaml", "[N, 4]")).inputs[0][1].dims() == ["N", 4]
    with pytest.raises(UsageError, match="the first of them may be a symbolic batch"):
        load_model(leaky_graph(tmp_path / "b.yaml", "[4, N]"))


@pytest.mark.parametrize(
    "target,schedule",
    [("x86", "cpu/max_pool2d"), pytest.param("arm", "arm/max_pool2d", marks=pytest.mark.emulator)],
)
def test_the_batched_onnx_example_at_1_3_and_32(target, schedule, example_ops):
    """MaxPool -> Add -> LeakyRelu -> com.example::HardTanh with dim_param N: one fused kernel,
    one module, verified at N = 1, 3 and 32 against numpy and onnxruntime."""
    pytest.importorskip("onnxruntime")
    result = invoke("test", "--model", str(EXAMPLE_N), "--target", target)
    assert result.exit_code == 0, result.output
    assert schedule in result.output
    assert "15 cases passed, 0 failed" in result.output  # (3 numpy + 2 onnxruntime) x 3 sizes


def test_bench_times_a_symbolic_batch_at_1_and_32(tmp_path):
    model = leaky_graph(tmp_path / "n.yaml", "[N, 64, 32]")
    result = invoke("bench", "--model", str(model), "--target", "x86", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["shapes"] for r in rows] == ["1x64x32 (N=1)", "32x64x32 (N=32)"]
    assert rows[1]["mb_moved"] == pytest.approx(32 * 64 * 32 * 4 * 2 / 1e6)


@pytest.mark.parametrize(
    "args,message",
    [
        (["build", "--op", "add", "--shape", "Nx4", "--shape", "Nx4", "--target", "opencl"],
         "target opencl needs static shapes: the batch N is symbolic"),
        (["tune", "--op", "add", "--shape", "Nx4", "--shape", "Nx4", "--target", "x86"],
         "tuning add needs static shapes: the batch N is symbolic"),
    ],
)  # fmt: skip
def test_what_takes_static_shapes_says_so(args, message, tmp_path):
    result = invoke(*args, "-o" if args[0] == "build" else "--db", str(tmp_path / "out"))
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()
