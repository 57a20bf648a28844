"""Constant tensors: ONNX initializers and Constant nodes read into the graph, baked into its
artifact once (module.so, the C bundle, an OpenCL plan's constants.bin), listed in the manifest,
and checked against numpy on every kind of target; a bad one refused in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from deploy.base.errors import UsageError
from deploy.compiler.cache import cached_build
from deploy.compiler.constants import BLOB
from deploy.compiler.options import BuildOptions
from deploy.compiler.plan import MAX_BLOB_BYTES, constant_offsets
from deploy.compiler.targets import get_target
from deploy.model import load_model
from deploy.ops.graph import Constant, bind_graph
from deploy.ops.spec import TensorType
from deploy.verify.compare import random_input
from deploy.verify.run import verify
from tests.conftest import REPO, invoke
from tests.test_ops_matrix import sessions  # noqa: F401  (the module's target sessions)

EXAMPLE = REPO / "examples" / "pool_bias_leaky.onnx"
BIAS = np.linspace(-2, 2, 24, dtype=np.float32).reshape(1, 4, 2, 3)


def model(
    tmp_path: Path, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], **kw: Any
) -> Path:
    """A model in `tmp_path` reading x (shape `kw["x"]`, [2, 4, 4, 6] by default; `kw["dtype"]`,
    float32 by default) and writing y (shape `kw["out"]`, [2, 4, 2, 3] by default) with
    `initializers`; `kw["inputs"]` adds inputs."""
    dtype = kw.get("dtype", TensorProto.FLOAT)
    inputs = [helper.make_tensor_value_info("x", dtype, kw.get("x", [2, 4, 4, 6])), *kw.get("inputs", [])]
    output = helper.make_tensor_value_info("y", kw.get("out_dtype", dtype), kw.get("out", [2, 4, 2, 3]))
    graph = helper.make_graph(nodes, "consts", inputs, [output], initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    return path


POOL = helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])


def graphs(tmp_path: Path) -> dict[str, Path]:
    """Models whose constants take each path through a build."""
    half = helper.make_node("Constant", [], ["half"], value_float=0.5)
    ints = helper.make_node("Constant", [], ["k"], value_ints=[1, -2, 3])
    bias = numpy_helper.from_array(BIAS, "bias")
    models: dict[str, tuple[list[onnx.NodeProto], list[onnx.TensorProto], dict[str, Any]]] = {
        # one constant read by two kernels (a pool between them cuts the fusion), a scalar Constant
        "shared": (
            [half, POOL, helper.make_node("Add", ["p", "bias"], ["q"]),
             helper.make_node("MaxPool", ["q"], ["r"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r", "bias"], ["s"]), helper.make_node("Add", ["s", "half"], ["y"])],
            [bias], {},
        ),
        # the output is a constant; the input is read by nothing
        "output": ([], [numpy_helper.from_array(BIAS, "y")], {"out": [1, 4, 2, 3]}),
        # int64 from a Constant's ints, broadcast along the last axis
        "int64": (
            [ints, helper.make_node("Add", ["x", "k"], ["y"])], [],
            {"dtype": TensorProto.INT64, "out": [2, 4, 4, 3], "x": [2, 4, 4, 3]},
        ),
        # an initializer also listed as an input (older exporters): its value is the constant's
        "listed": (
            [POOL, helper.make_node("Add", ["p", "bias"], ["y"])], [bias],
            {"inputs": [helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 4, 2, 3])]},
        ),
        # float16: half storage on a device without cl_khr_fp16
        "float16": (
            [POOL, helper.make_node("Add", ["p", "bias"], ["y"])],
            [numpy_helper.from_array(BIAS.astype(np.float16), "bias")], {"dtype": TensorProto.FLOAT16},
        ),
    }  # fmt: skip
    return {name: model(tmp_path / name, nodes, inits, **kw) for name, (nodes, inits, kw) in models.items()}


@pytest.mark.parametrize(
    ("target", "names"),
    [
        ("x86", ("shared", "output", "int64", "listed", "float16")),
        pytest.param("arm", ("shared", "output"), marks=pytest.mark.emulator),
        ("opencl", ("shared", "float16")),
    ],
)
def test_constants_match_numpy_on_every_kind_of_target(target, names, tmp_path, sessions):  # noqa: F811
    on = sessions.on(get_target(target))
    rng = np.random.default_rng(5)
    made = graphs(tmp_path)
    for name in names:
        graph = bind_graph(load_model(made[name]))
        arrays = [random_input(t, rng, ties=True, specials=True) for t in graph.inputs]
        comparison, _ = verify(on.session, graph, on.target, BuildOptions(), arrays)
        assert comparison.ok, f"{name}: {comparison}"


def test_the_example_lists_its_constants_and_matches_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    graph = load_model(EXAMPLE)
    assert [(c.name, str(c.type)) for c in graph.constants] == [
        ("bias", "1x16x1x1:float32"),
        ("half", "():float32"),
    ]
    assert graph.inputs[0][0] == "x"  # the initializer is no input
    result = invoke("test", "--model", str(EXAMPLE), "--target", "x86")
    assert result.exit_code == 0, result.output
    assert "onnxruntime" in result.output and "15 cases passed, 0 failed" in result.output
    built = invoke("build", "--model", str(EXAMPLE), "--target", "x86", "--bundle", "-o", str(tmp_path / "a"))
    assert built.exit_code == 0, built.output
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    bias = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16, 1, 1)
    sha = [hashlib.sha256(value.tobytes()).hexdigest() for value in (bias, np.float32(0.5))]
    assert manifest["constants"] == [
        {"name": "bias", "shape": [1, 16, 1, 1], "dtype": "float32", "sha256": sha[0]},
        {"name": "half", "shape": [], "dtype": "float32", "sha256": sha[1]},
    ]
    assert not (tmp_path / "a" / BLOB).exists() and not list((tmp_path / "a").glob(".*"))  # in module.so


@pytest.mark.emulator
def test_the_example_matches_onnxruntime_on_the_emulator():
    """Its module on the arm emulator (qemu, TVM's runtime) against numpy and onnxruntime, every
    batch size from one build."""
    pytest.importorskip("onnxruntime")
    result = invoke("test", "--model", str(EXAMPLE), "--target", "arm")
    assert result.exit_code == 0, result.output
    assert "onnxruntime" in result.output and "15 cases passed, 0 failed" in result.output


def test_a_constant_is_stored_once_however_many_kernels_read_it(tmp_path):
    """A 4 MB constant read by two kernels: the module grows by it once."""
    big = np.arange(2 * 4 * 256 * 256, dtype=np.float32).reshape(2, 4, 256, 256) % 97
    nodes = [
        helper.make_node("Add", ["x", "big"], ["q"]),
        helper.make_node("MaxPool", ["q"], ["r"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node(
            "MaxPool", ["r"], ["s"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),  # a kernel of its own
        helper.make_node("Add", ["s", "big"], ["y"]),
    ]
    path = model(tmp_path, nodes, [numpy_helper.from_array(big, "big")], x=big.shape, out=big.shape)
    graph = bind_graph(load_model(path))
    directory, manifest = cached_build(graph, get_target("x86"), BuildOptions())
    assert len(manifest.graph["kernels"]) == 2
    assert big.nbytes < (directory / "module.so").stat().st_size < big.nbytes * 1.2


def external(tmp_path: Path, location: str, offset: int = 0, length: int | None = None) -> Path:
    """A model whose initializer `bias` lives in the file `location` (relative to the model)."""
    bias = numpy_helper.from_array(BIAS, "bias")
    bias.ClearField("raw_data")
    bias.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset), **({"length": str(length)} if length else {})}
    for key, value in entries.items():
        bias.external_data.add(key=key, value=value)
    return model(tmp_path, [POOL, helper.make_node("Add", ["p", "bias"], ["y"])], [bias])


def test_external_data_is_read_from_the_models_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + BIAS.tobytes())
    graph = load_model(external(tmp_path, "weights.bin", offset=8, length=BIAS.nbytes))
    np.testing.assert_array_equal(graph.constants[0].array(), BIAS)


def error(path: Path) -> str:
    with pytest.raises(UsageError) as caught:
        bind_graph(load_model(path))
    message = str(caught.value)
    assert "\n" not in message, message
    return message.removeprefix(f"model {path}: ")


def test_bad_constants_are_one_line(tmp_path):
    (tmp_path / "short.bin").write_bytes(BIAS.tobytes()[:10])
    outside = tmp_path.parent / "outside.bin"
    outside.write_bytes(BIAS.tobytes())
    assert error(external(tmp_path / "a", "../outside.bin")).startswith(
        "initializer 'bias': its external data '../outside.bin' is not a file inside the model's directory"
    )
    assert error(external(tmp_path, str(outside))).startswith("initializer 'bias': its external data '/")
    assert error(external(tmp_path, "missing.bin")) == (
        f"initializer 'bias': its external data file {tmp_path.resolve() / 'missing.bin'} is missing"
    )
    assert error(external(tmp_path, "short.bin")) == (
        f"initializer 'bias': its external data file {tmp_path.resolve() / 'short.bin'} holds 10 bytes at"
        " offset 0, expected 96"
    )
    (tmp_path / "w.bin").write_bytes(BIAS.tobytes())
    for offset in (10**30, 2**63 - 1, -4):  # past what seek takes, past the file, before it
        message = error(external(tmp_path, "w.bin", offset))
        assert message.endswith(f"(offset {offset}, length None) is not 96 bytes inside its file of 96"), (
            message
        )
    assert "is not a file inside the model's directory" in error(external(tmp_path, "a" * 5000))
    assert "is not a file inside the model's directory" in error(external(tmp_path, "w.bin\0x"))
    (tmp_path / "folder").mkdir()
    assert error(external(tmp_path, "folder")).endswith("folder is not a regular file")
    truncated = numpy_helper.from_array(BIAS, "bias")
    truncated.raw_data = truncated.raw_data[:-4]
    add = [POOL, helper.make_node("Add", ["p", "bias"], ["y"])]
    assert error(model(tmp_path, add, [truncated])).startswith(  # onnx's checker finds it first
        "not a valid ONNX model: TensorProto (tensor name: bias) raw_data size (92 bytes) is too small"
    )
    odd = helper.make_tensor("bias", TensorProto.BFLOAT16, [1], [1.0])
    assert error(model(tmp_path, add, [odd])).startswith(
        "initializer 'bias' has element type BFLOAT16: expected one of"
    )
    text = helper.make_node("Constant", [], ["bias"], value_strings=["a"])
    assert error(model(tmp_path, [text, *add], [])) == (
        "Constant node 'bias' has a value_strings value: expected a dense tensor, a float or an int"
        " (or a list of them)"
    )
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("bias", TensorProto.FLOAT, [1], [1.0]),
        helper.make_tensor("i", TensorProto.INT64, [1], [0]),
        [4],
    )
    sparse_node = helper.make_node("Constant", [], ["bias"], sparse_value=sparse)
    assert error(model(tmp_path, [sparse_node, *add], [])).startswith(
        "Constant node 'bias' has a sparse_value value"
    )
    proto = onnx.load(model(tmp_path, add, []))
    proto.graph.sparse_initializer.append(sparse)
    onnx.save(proto, tmp_path / "model.onnx")
    assert error(tmp_path / "model.onnx") == "initializer 'bias' is sparse: expected a dense tensor"


def test_constants_past_what_the_plan_addresses_are_refused():
    """The plan reaches constants at int32 offsets: a blob over 2 GiB is one line, not a wrong
    address (the types say the sizes; no gigabytes are made here)."""
    big = TensorType((2**29 - 32,), "float32")  # 128 bytes short of 2 GiB
    small = TensorType((1,), "int8")  # 64 bytes in the blob
    fits = [Constant("a", small, b"\0"), Constant("w", big, b"")]
    assert constant_offsets(fits) == [0, 64]
    with pytest.raises(UsageError) as refused:
        constant_offsets([*fits, Constant("b", small, b"\0")])
    assert str(refused.value) == (
        f"the graph's 3 constants take {2**31} bytes: expected at most {MAX_BLOB_BYTES} (2 GiB; the plan"
        " addresses them with 32-bit offsets)"
    )
