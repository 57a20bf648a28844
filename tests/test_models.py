"""Model files -> graphs: our graph file (YAML/JSON), ONNX import and its op mappings, and the
onnxruntime reference against the ops' numpy references. No compilation, no device."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from deploy.base.errors import UsageError
from deploy.model import load_model
from deploy.ops import TensorType, load_ops_path, registry
from deploy.ops.graph import bind_graph
from deploy.ops.onnx_mapping import OnnxOp
from deploy.ops.registry import op_for_onnx
from deploy.verify.compare import compare
from deploy.verify.onnx_reference import AGREES_ON_NAN, agrees_on_nan, onnxruntime_reference
from tests.conftest import REPO, invoke

EXAMPLE_YAML = REPO / "examples" / "maxpool_add.yaml"
EXAMPLE_ONNX = REPO / "examples" / "pool_add_leaky_htanh.onnx"


def error(path: Path) -> str:
    """The one-line message loading and binding `path` fails with."""
    with pytest.raises(UsageError) as caught:
        bind_graph(load_model(path))
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# Graph files


def test_example_graph_file_reads_and_binds() -> None:
    graph = load_model(EXAMPLE_YAML)
    assert graph.name == "maxpool_add" and graph.outputs == ("sum",)
    assert [(name, t.shape, t.dtype) for name, t in graph.inputs] == [
        ("a", (32, 64, 112, 112), "float32"),
        ("b", (32, 1, 56, 56), "float32"),
    ]
    assert [(n.name, n.op.name, n.inputs, n.output) for n in graph.nodes] == [
        ("pool", "max_pool2d", ("a",), "pool"),
        ("sum", "add", ("pool", "b"), "sum"),
    ]
    bound = bind_graph(graph)
    assert bound.outputs[0].shape == (32, 64, 56, 56) and bound.nodes[0].bound.attrs["stride"] == (2, 2)


def test_json_graph_file_is_the_same_graph(tmp_path: Path) -> None:
    document = yaml.safe_load(EXAMPLE_YAML.read_text())
    (tmp_path / "maxpool_add.json").write_text(json.dumps(document, indent=1))
    assert load_model(tmp_path / "maxpool_add.json") == load_model(EXAMPLE_YAML)


def test_graph_file_defaults(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yml"
    path.write_text(
        "inputs: {x: {shape: []}}\nnodes: [{name: y, op: leaky_relu, inputs: [x]}]\noutput: [y]\n"
    )
    graph = load_model(path)
    assert graph.name == "tiny" and graph.outputs == ("y",) and graph.nodes[0].attrs == {}
    assert bind_graph(graph).outputs[0].dtype == "float32" and graph.inputs[0][1].shape == ()


GOOD = {
    "inputs": {"a": {"shape": [1, 4, 8, 8]}, "b": {"shape": [1, 1, 4, 4]}},
    "nodes": [
        {"name": "pool", "op": "max_pool2d", "attrs": {"kernel": 2}, "inputs": ["a"]},
        {"name": "sum", "op": "add", "inputs": ["pool", "b"]},
    ],
    "output": "sum",
}


def changed(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the value at `path` ("nodes.0.op", "inputs.a"; a None value deletes) replaced."""
    document = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    here: Any = document
    for part in parents:
        here = here[int(part)] if isinstance(here, list) else here[part]
    key: Any = int(last) if isinstance(here, list) else last
    if value is None:
        del here[key]
    else:
        here[key] = value
    return document


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (["a"], "the file: expected a mapping with keys name, inputs, nodes, output, got a list"),
        (changed("outputs", "sum"), "the file: unknown key 'outputs' (allowed: name, inputs, nodes, output)"),
        (changed("name", 3), "name 3: expected a non-empty string"),
        (changed("inputs", None), "the file: missing 'inputs'"),
        (changed("inputs", {}), "inputs: expected a mapping of input names"),
        (
            changed("inputs.a", [1, 4, 8, 8]),
            "input 'a': expected a mapping with keys shape, dtype, got a list",
        ),
        (changed("inputs.a.shape", None), "input 'a': missing 'shape'"),
        (
            changed("inputs.a.shape", [1, 0, 8]),
            "input 'a': shape [1, 0, 8]: expected a list of positive ints",
        ),
        (changed("inputs.a.shape", "1x4"), "input 'a': shape '1x4': expected a list of positive ints"),
        (changed("inputs.a.shape", [2.5]), "input 'a': shape [2.5]: expected a list of positive ints"),
        (changed("inputs.a.shape", [True]), "input 'a': shape [True]: expected a list of positive ints"),
        (changed("inputs.a.shape", [100000, 100000, 100]), "input 'a' has shape [100000, 100000, 100]"),
        (changed("inputs.a.dtype", "bfloat16"), "input 'a': dtype 'bfloat16': expected one of float32"),
        (changed("inputs.a.layout", "NCHW"), "input 'a': unknown key 'layout' (allowed: shape, dtype)"),
        (changed("nodes", []), "nodes: expected a non-empty list of nodes"),
        (changed("nodes.1", "add"), "nodes[1]: expected a mapping with keys name, op, attrs, inputs"),
        (changed("nodes.1.name", None), "nodes[1]: name None: expected a non-empty string"),
        (changed("nodes.1.atrs", {}), "node 'sum': unknown key 'atrs' (allowed: name, op, attrs, inputs)"),
        (changed("nodes.1.op", None), "node 'sum': missing 'op' (the name of a registered op)"),
        (changed("nodes.1.op", ["add"]), "node 'sum': op ['add']: expected the name of a registered op"),
        (changed("nodes.1.op", "addd"), "node 'sum': unknown op 'addd': did you mean 'add'? known: "),
        (changed("nodes.1.inputs", None), "node 'sum': missing 'inputs' (a list of tensor names"),
        (changed("nodes.1.inputs", "pool"), "node 'sum': inputs 'pool': expected a list of tensor names"),
        (changed("nodes.1.inputs", ["pool", 2]), "node 'sum': inputs ['pool', 2]: expected a list"),
        (changed("nodes.0.attrs", [2]), "node 'pool': attrs [2]: expected a mapping of attribute names"),
        (changed("output", None), "the file: missing 'output' (the tensor it returns, or a list of them)"),
        (changed("output", []), "output []: expected the tensor the graph returns, or a list of them"),
        (changed("output", 7), "output 7: expected the names of the tensors the graph returns"),
        (
            changed("output", ["sum", 7]),
            "output ['sum', 7]: expected the names of the tensors the graph returns",
        ),
    ],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_graph_file_structure_errors_are_one_line(
    tmp_path: Path, document: Any, expected: str, suffix: str
) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_text(yaml.safe_dump(document) if suffix == ".yaml" else json.dumps(document))
    message = error(path)
    assert message.startswith(f"model {path}: ") and expected in message, message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (changed("nodes.0.inputs", ["sum"]), "node 'pool' (max_pool2d) is on a cycle: pool -> sum -> pool"),
        (changed("nodes.1.inputs", ["pool", "c"]), "node 'sum' (add) reads 'c', which is no graph input"),
        (changed("inputs.b.shape", [1, 3, 4, 4]), "node 'sum' (add): "),
        (changed("nodes.0.attrs", {"kernel": "big"}), "node 'pool' (max_pool2d): attribute kernel='big'"),
        (changed("nodes.0.attrs", {"kernal": 2}), "node 'pool' (max_pool2d): op max_pool2d has no attribute"),
        (changed("nodes.1.inputs", ["pool"]), "node 'sum' (add): op add takes 2 inputs (a, b), got 1"),
        (changed("output", "c"), "output 'c' is no input and no node's output"),
    ],
)
def test_graph_errors_from_files_name_the_node(tmp_path: Path, change: dict[str, Any], expected: str) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(change))
    message = error(path)
    assert expected in message, message


def test_broadcast_mismatch_names_the_node(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(changed("inputs.b.shape", [1, 3, 4, 4])))
    assert "node 'sum' (add)" in error(path) and "[1, 3, 4, 4]" in error(path)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "inputs: {a: [1, 2}\n", ":1: not valid YAML: "),
        ("bad.yaml", "inputs:\n  a: {shape: [1]}\n nodes: []\n", ":3: not valid YAML: "),
        ("bad.json", '{\n  "inputs": {\n    "a": {"shape": [1,]}\n', ":3: not valid JSON: "),
        ("bad.yaml", "!!python/object/apply:os.system ['true']\n", ":1: not valid YAML: "),
        ("bad.yaml", "inputs: \x07\n", ": not valid YAML: unacceptable character #x0007"),
    ],
)
def test_syntax_errors_name_the_file_and_line(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    message = error(path)
    assert message.startswith(f"model {path}") and expected in message, message


def test_non_utf8_graph_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(b'{"name": "\xff"}')
    assert "not UTF-8 text" in error(path)


def test_unknown_suffix_missing_and_unreadable_files(tmp_path: Path) -> None:
    assert error(tmp_path / "model.pb").endswith(
        "unknown model file type '.pb' (known: .onnx, .yaml, .yml, .json)"
    )
    assert "unknown model file type '(no suffix)'" in error(tmp_path / "model")
    assert (
        error(tmp_path / "absent.yaml")
        == f"model {tmp_path / 'absent.yaml'}: cannot read it: No such file or directory"
    )
    (tmp_path / "folder.onnx").mkdir()
    assert error(tmp_path / "folder.onnx").endswith("cannot read it: Is a directory")


# ONNX import


def onnx_file(
    tmp_path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[Any]]],
    output: tuple[str, int, list[int | str]],
    **graph: Any,
) -> Path:
    """A model of `nodes` (opset 17 and com.example 1) saved in `tmp_path`."""
    proto = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        graph.pop("outputs", [helper.make_tensor_value_info(*output)]),
        **graph,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(proto, opset_imports=opsets), path)
    return path


def one_node(
    tmp_path: Path,
    op_type: str,
    shape: list[int],
    out: list[int | str],
    dtype: int = TensorProto.FLOAT,
    **attrs: Any,
) -> Path:
    """A one-node model reading `x`, writing `y`."""
    out_type = TensorProto.INT64 if op_type == "ArgMax" else dtype
    inputs = [("x", dtype, shape)] + ([("b", dtype, attrs.pop("b"))] if op_type == "Add" else [])
    node = helper.make_node(op_type, [i[0] for i in inputs], ["y"], "n", **attrs)
    return onnx_file(tmp_path, [node], inputs, ("y", out_type, out))


def test_example_onnx_model_maps_every_node(example_ops: None) -> None:
    graph = load_model(EXAMPLE_ONNX)
    assert graph.name == "pool_add_leaky_htanh" and graph.outputs == ("out",)
    assert [(name, t.shape, t.dtype) for name, t in graph.inputs] == [
        ("a", (1, 8, 32, 32), "float32"),
        ("b", (1, 1, 16, 16), "float32"),
    ]
    pool, add, leaky, htanh = graph.nodes
    assert (pool.op.name, pool.source, pool.inputs, pool.output) == ("max_pool2d", "MaxPool", ("a",), "pool")
    assert pool.attrs == {
        "kernel": (3, 3),
        "stride": (2, 2),
        "padding": (1, 1),
        "ceil_mode": 0,
        "dilation": (1, 1),
    }
    assert (add.op.name, add.source, add.inputs, add.attrs) == ("add", "Add", ("pool", "b"), {})
    assert (leaky.op.name, leaky.source) == ("leaky_relu", "LeakyRelu")
    assert leaky.attrs["alpha"] == pytest.approx(0.1)
    assert (htanh.op.name, htanh.source, htanh.output) == ("hard_tanh", "com.example::HardTanh", "out")
    assert htanh.attrs == {"min_val": pytest.approx(-0.1), "max_val": 1.0}
    assert htanh.label() == "node 'htanh' (com.example::HardTanh -> hard_tanh)"
    assert bind_graph(graph).outputs[0].shape == (1, 8, 16, 16)


def test_onnx_defaults_are_onnx_ones(tmp_path: Path) -> None:
    """MaxPool strides default to 1 (ours to the kernel), ArgMax keeps dims on axis 0."""
    pool = load_model(one_node(tmp_path, "MaxPool", [1, 1, 6, 6], [1, 1, 4, 4], kernel_shape=[3, 3]))
    assert pool.nodes[0].attrs == {
        "kernel": (3, 3), "stride": (1, 1), "padding": (0, 0), "ceil_mode": 0, "dilation": (1, 1)
    }  # fmt: skip
    argmax = load_model(one_node(tmp_path, "ArgMax", [3, 5], [1, 5]))
    assert argmax.nodes[0].attrs == {"axis": 0, "keepdims": 1, "select_last": 0, "out_dtype": "int64"}
    assert bind_graph(argmax).outputs[0].shape == (1, 5)
    leaky = load_model(one_node(tmp_path, "LeakyRelu", [4], [4]))
    assert leaky.nodes[0].attrs == {"alpha": 0.01}
    valid = load_model(
        one_node(
            tmp_path,
            "MaxPool",
            [1, 1, 6, 6],
            [1, 1, 3, 3],
            kernel_shape=[2, 2],
            strides=[2, 2],
            auto_pad="VALID",
        )
    )
    assert valid.nodes[0].attrs["padding"] == (0, 0)


@pytest.mark.parametrize(
    ("attrs", "padding", "padding_end"),
    [
        ({"kernel_shape": [3, 3], "pads": [2, 0, 1, 1]}, (2, 0), (1, 1)),  # asymmetric, as given
        ({"auto_pad": "SAME_UPPER"}, (0, 0), (1, 1)),  # 5 at stride 1, kernel 2: one more after
        ({"auto_pad": "SAME_LOWER"}, (1, 1), (0, 0)),  # ... or before
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2], "kernel_shape": [3, 3]}, (1, 1), None),  # even
    ],
)
def test_onnx_pads_and_same_padding_become_the_pools_borders(tmp_path, attrs, padding, padding_end) -> None:
    """SAME_* pads by the input's size (from ONNX's shape inference): explicit before the op sees
    it; either way the pool is onnxruntime's."""
    attrs = {"kernel_shape": [2, 2], **attrs}
    path = one_node(tmp_path, "MaxPool", [1, 1, 5, 5], [1, 1, 5, 5], **attrs)
    model = onnx.load(path)
    model.graph.output[0].type.tensor_type.ClearField("shape")  # as shape inference finds it
    inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
    model.graph.output[0].CopyFrom(inferred)
    onnx.save(model, path)
    graph = load_model(path)
    assert (
        graph.nodes[0].attrs["padding"] == padding and graph.nodes[0].attrs.get("padding_end") == padding_end
    )
    bound = bind_graph(graph)
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    np.testing.assert_array_equal(bound.references(x)[0], onnxruntime_reference(path, bound, [x])[0])


def test_op_for_onnx_default_domain_has_two_names() -> None:
    assert op_for_onnx("", "MaxPool") is op_for_onnx("ai.onnx", "MaxPool") is not None
    assert op_for_onnx("", "Relu") is None and op_for_onnx("com.example", "MaxPool") is None
    assert OnnxOp("Custom", domain="my.ops").attrs({"k": [1, 2]}) == {"k": [1, 2]}, "passes through"


@pytest.mark.parametrize(
    ("op_type", "attrs", "expected"),
    [
        (
            "MaxPool",
            {"kernel_shape": [3, 3, 3, 3]},
            "ONNX attribute kernel_shape=[3, 3, 3, 3] is not supported: 1, 2 or 3 values",
        ),
        (
            "MaxPool",
            {"auto_pad": "VALID", "pads": [1, 1, 1, 1]},
            "ONNX attribute pads=[1, 1, 1, 1] is not supported: pads together with auto_pad=VALID",
        ),
        (
            "MaxPool",
            {"kernel_shape": [3], "strides": [1, 1]},
            "ONNX attribute strides=[1, 1] is not supported: 1 value for the 1-D kernel_shape",
        ),
        ("MaxPool", {"strides": [1, 1, 1]}, "strides=[1, 1, 1] is not supported: 2 values for the 2-D"),
    ],
)
def test_unsupported_onnx_attributes_are_refused(
    tmp_path: Path, op_type: str, attrs: dict[str, Any], expected: str
) -> None:
    shape = [1, 1, 5, 5] if attrs.get("kernel_shape") != [3] else [1, 1, 5]
    if op_type == "MaxPool":
        attrs = {"kernel_shape": [3, 3], **attrs}
    message = error(one_node(tmp_path, op_type, shape, [1], **attrs))
    assert f"node 'n' ({op_type} -> " in message and expected in message, message


def test_custom_domain_attributes_are_checked_by_the_mapping(tmp_path: Path, example_ops: None) -> None:
    """The checker knows no com.example schema: the mapping refuses unknown attributes itself, and
    the op's `infer` what only it knows (its bounds in order)."""
    node = helper.make_node("HardTanh", ["x"], ["y"], "ht", domain="com.example", gamma=1.0)
    message = error(
        onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert message.endswith(
        "node 'ht' (com.example::HardTanh -> hard_tanh): ONNX attribute gamma=1.0 is not supported:"
        " the attributes supported are min_val, max_val"
    )
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [1], [1.0])
    node = helper.make_node("HardTanh", ["x"], ["y"], "ht", domain="com.example", min_val=tensor)
    message = error(
        onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert "ONNX attribute min_val is a TENSOR: only ints, floats, strings and lists of them" in message
    node = helper.make_node("HardTanh", ["x"], ["y"], "ht", domain="com.example", min_val="0.3")
    message = error(
        onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert message.endswith(
        "node 'ht' (com.example::HardTanh -> hard_tanh): ONNX attribute min_val='0.3' is a string:"
        " expected float"
    )
    node = helper.make_node("HardTanh", ["x", ""], ["y"], "ht", domain="com.example")
    message = error(
        onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert "input 1 is omitted (an empty optional input): op hard_tanh takes no optional inputs" in message
    nodes = [
        helper.make_node("HardTanh", ["x"], ["", "z"], "ht", domain="com.example"),
        helper.make_node("Add", ["z", "z"], ["y"], "sum"),
    ]
    message = error(
        onnx_file(tmp_path, nodes, [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert message.endswith("its first output is omitted: op hard_tanh computes that one")
    node = helper.make_node("HardTanh", ["x"], ["y"], "ht", domain="com.example", min_val=1.0, max_val=1.0)
    message = error(
        onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    )
    assert message.endswith("attributes min_val=1.0 and max_val=1.0: expected min_val below max_val")


@pytest.mark.parametrize(
    ("op_type", "domain", "declaration"),
    [("Relu", "", 'OnnxOp("Relu")'), ("Swish", "com.example", 'OnnxOp("Swish", domain="com.example")')],
)
def test_unknown_onnx_op_says_how_to_add_it(
    tmp_path: Path, op_type: str, domain: str, declaration: str
) -> None:
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain)
    path = onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", TensorProto.FLOAT, [4]))
    label = f"{domain}::{op_type}" if domain else op_type
    assert error(path) == (
        f"model {path}: node '{op_type}_0' ({label}): no registered op implements it; add an op file"
        f" declaring onnx = ({declaration},) and pass --ops-path (see docs/adding-ops.md; `deploy ops"
        f" --model {path}` reports the whole model)"
    )


def test_the_report_is_safe_on_hostile_models(tmp_path: Path) -> None:
    """A FIFO is refused, not read forever; names that are not UTF-8 are refused in one line;
    control characters are escaped, NaN is JSON text, and a huge value is cut short."""
    os.mkfifo(tmp_path / "fifo.onnx")
    fifo = invoke("ops", "--model", str(tmp_path / "fifo.onnx"))
    assert fifo.exit_code == 2 and "not a regular file" in fifo.output
    node = helper.make_node("Fo\x1b[31mo", ["x"], ["y"], "na\x1b]0;me", domain="com.x", alpha=float("nan"),
                            ints=list(range(1000)), text="z" * 1000)  # fmt: skip
    path = onnx_file(tmp_path, [node], [FLOAT4], ("y", TensorProto.FLOAT, [4]))
    table = invoke("ops", "--model", str(path))
    assert table.exit_code == 1 and "\x1b" not in table.output and "\\x1b" in table.output
    report = json.loads(invoke("ops", "--model", str(path), "--json").stdout)
    attributes = report["missing"][0]["attributes"]
    assert attributes["alpha"] == ["nan"] and attributes["ints"][0][-1] == "... (1000 values)"
    assert len(attributes["text"][0]) < 100
    broken = path.read_bytes().replace(b"com.x", b"com.\xff")
    (tmp_path / "broken.onnx").write_bytes(broken)
    for command in (("ops", "--model"), ("build", "--target", "x86", "--model")):
        result = invoke(*command, str(tmp_path / "broken.onnx"))
        assert result.exit_code == 2 and "name b'com.\\xff' is not UTF-8 text" in result.output, result.output


def test_the_report_lists_everything_a_model_needs_at_once(tmp_path: Path) -> None:
    """Three op types missing, one node refused, one fine: the report says all of it, and build
    refuses in one line naming the count and pointing at it."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], "conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"], "sig"),
        helper.make_node("Mul", ["c", "s"], ["m"], "swish"),
        helper.make_node("MaxPool", ["m"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2], dilations=[1]),
        helper.make_node("LeakyRelu", ["p"], ["q"], "act"),
        helper.make_node("Conv", ["q", "w"], ["y"], "conv2", kernel_shape=[1, 1]),
    ]
    weights = [helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 1, 1], [0.5] * 16)]
    path = onnx_file(
        tmp_path, nodes, [("x", TensorProto.FLOAT, [1, 4, 8, 8])], ("y", TensorProto.FLOAT, [1, 4, 4, 4]),
        initializer=weights,
    )  # fmt: skip
    result = invoke("ops", "--model", str(path), "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [(n["name"], n["op"], n["status"]) for n in report["nodes"]] == [
        ("conv", None, "missing"), ("sig", None, "missing"), ("swish", None, "missing"),
        ("pool", "max_pool2d", "refused"), ("act", "leaky_relu", "ok"), ("conv2", None, "missing"),
    ]  # fmt: skip
    assert report["nodes"][3]["problem"].startswith("ONNX attribute dilations=[1] is not supported")
    assert report["missing"][0] == {
        "domain": "",
        "op_type": "Conv",
        "declaration": 'onnx = (OnnxOp("Conv"),)',
        "nodes": ["conv", "conv2"],
        "attributes": {"kernel_shape": [[3, 3], [1, 1]], "pads": [[1, 1, 1, 1]]},
    }
    assert [m["op_type"] for m in report["missing"]] == ["Conv", "Sigmoid", "Mul"]
    message = (
        f"model {path}: 4 nodes need ONNX ops no registered op implements (3 op types: Conv, Sigmoid, Mul):"
        f" `deploy ops --model {path}` lists each with what to add (see docs/adding-ops.md)"
    )
    assert report["builds"] is False and report["problem"] == message.removeprefix(f"model {path}: ")
    built = invoke("build", "--model", str(path), "--target", "x86", "-o", str(tmp_path / "out"))
    assert built.exit_code == 2 and built.output.strip() == f"error: {message}"
    table = invoke("ops", "--model", str(path))
    assert (
        table.exit_code == 1
        and "op types to add" in table.output
        and "the model does not build" in table.output
    )
    fine = invoke("ops", "--model", str(REPO / "examples" / "pool_bias_leaky.onnx"))
    assert fine.exit_code == 0 and fine.output.rstrip().endswith("the model builds as it is")


FLOAT4 = ("x", TensorProto.FLOAT, [4])


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            {"inputs": [("x", TensorProto.BFLOAT16, [4])]},
            "input 'x' has element type BFLOAT16: expected one of float32, float16, float64, int8, uint8,"
            " int32, int64, int16, uint16, uint32, uint64",
        ),
        (
            {"inputs": [("x", TensorProto.FLOAT, [4, "N"])]},
            "input 'x' dim 1 is symbolic ('N'): only the first dim (the batch) may be symbolic",
        ),
        (
            {"inputs": [("x", TensorProto.FLOAT, [4, None])]},
            "input 'x' dim 1 is unknown: expected a positive size",
        ),
        (
            {"inputs": [("x", TensorProto.FLOAT, None)]},
            "not a valid ONNX model: Field 'shape' of 'type' is required but missing.",
        ),
        ({"outputs": ["y", "y"]}, "graph model: output 'y' is given twice: each output once"),
        (
            {"feedback": True},  # y = x + z; z = leaky_relu(y): a cycle
            "not a valid ONNX model: Nodes in a graph must be topologically sorted, however input 'z'"
            " of node: name: n OpType: Add is not output of any previous nodes.",
        ),
    ],
)
def test_unsupported_onnx_graphs_are_one_line(tmp_path: Path, model: dict[str, Any], expected: str) -> None:
    inputs = model.get("inputs", [FLOAT4])
    second = inputs[1][0] if len(inputs) > 1 else ("z" if model.get("feedback") else "x")
    node = helper.make_node("Add", ["x", second], ["y"], "n")
    nodes = [node, helper.make_node("LeakyRelu", ["y"], ["z"], "act")] if model.get("feedback") else [node]
    extra: dict[str, Any] = {}
    if "initializer" in model:
        extra["initializer"] = [
            helper.make_tensor(n, TensorProto.FLOAT, [4], [1.0] * 4) for n in model["initializer"]
        ]
    if "outputs" in model:
        extra["outputs"] = [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in model["outputs"]
        ]
    path = onnx_file(tmp_path, nodes, inputs, ("y", TensorProto.FLOAT, [4]), **extra)
    message = error(path)
    assert message == f"model {path}: {expected}", message


def test_a_sequence_input_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("Add", ["x", "x"], ["y"], "n")
    sequence = helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [4])
    path = onnx_file(tmp_path, [node], [], ("y", TensorProto.FLOAT, [4]))
    model = onnx.load(path)
    model.graph.input.append(sequence)
    onnx.save(model, path)
    assert error(path).endswith("input 'x' is a sequence_type: expected a tensor")


def test_a_further_output_is_computed_by_its_own_op_where_one_is_declared(tmp_path: Path) -> None:
    """MaxPool's Indices, read, is a max_pool2d_indices node beside the pool (`OnnxOp.more_outputs`),
    and the pool itself is dropped when nothing reads Y; unread, nothing computes the indices; of a
    1-D pool (reshapes around a 2-D one) they are refused."""
    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], "pool", kernel_shape=[2, 2])
    path = onnx_file(
        tmp_path,
        [node],
        [("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        ("indices", TensorProto.INT64, [1, 1, 3, 3]),
    )
    graph = bind_graph(load_model(path))
    assert [(n.node.name, n.bound.op.name) for n in graph.nodes] == [("pool:1", "max_pool2d_indices")]
    assert graph.dropped == ("pool",)
    x = np.array([[[[1, 5, 5, 2], [0, 3, np.nan, 2], [7, 7, 1, 1], [0, 7, 1, 0]]]], np.float32)
    np.testing.assert_array_equal(graph.references(x)[0], [[[[1, 6, 6], [8, 6, 6], [8, 9, 10]]]])
    unused = helper.make_node("MaxPool", ["x"], ["y", "indices"], "pool", kernel_shape=[2, 2])
    path = onnx_file(
        tmp_path, [unused], [("x", TensorProto.FLOAT, [1, 1, 4, 4])], ("y", TensorProto.FLOAT, [1, 1, 3, 3])
    )
    assert [n.node.op.name for n in bind_graph(load_model(path)).nodes] == ["max_pool2d"]
    flat = helper.make_node("MaxPool", ["x"], ["y", "indices"], "pool", kernel_shape=[2])
    path = onnx_file(
        tmp_path, [flat], [("x", TensorProto.FLOAT, [1, 1, 4])], ("indices", TensorProto.INT64, [1, 1, 3])
    )
    assert error(path).endswith(
        "node 'pool' (MaxPool -> max_pool2d): output 1 ('indices') is read: max_pool2d computes it"
        " only in 2-D"
    )


@pytest.mark.parametrize(
    ("attrs", "shape", "out", "outputs", "ops"),
    [
        ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [2, 3, 9, 11], [2, 3, 5, 6], 2,
         ["max_pool2d", "max_pool2d_indices"]),
        ({"kernel_shape": [2, 3, 3], "strides": [1, 2, 2], "pads": [0, 1, 1, 0, 1, 1], "ceil_mode": 1},
         [2, 3, 5, 9, 11], [2, 3, 4, 5, 6], 1, ["max_pool3d"]),
        ({"kernel_shape": [3], "strides": [2], "dilations": [2]}, [2, 3, 17], [2, 3, 7], 1,
         ["reshape", "max_pool2d", "reshape"]),
    ],
)  # fmt: skip
def test_onnxruntime_runs_a_model_node_that_is_several_of_ours(
    tmp_path: Path, attrs: dict[str, Any], shape: list[int], out: list[int], outputs: int, ops: list[str]
) -> None:
    """The second reference runs the model's nodes, not the graph's: a MaxPool whose Indices are
    read (two nodes of ours), a 3-D one (max_pool3d, one node) and a 1-D one (reshapes around a
    2-D pool) match onnxruntime."""
    names = ["y", "i"][:outputs]
    node = helper.make_node("MaxPool", ["x"], names, "pool", **attrs)
    values = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "y" else TensorProto.INT64, out)
        for n in names
    ]
    path = onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, shape)], ("y", 0, []), outputs=values)
    bound = bind_graph(load_model(path))
    assert [n.bound.op.name for n in bound.nodes] == ops
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32).round(1)  # ties
    found = onnxruntime_reference(path, bound, [x])
    assert found is not None and len(found) == outputs
    for ours, theirs in zip(bound.references(x), found, strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"\x07not protobuf", "not an ONNX model: "), (b"", "not a valid ONNX model: ")],
)
def test_files_that_are_no_onnx_model(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    assert expected in error(path)


def test_bind_errors_in_onnx_models_name_the_node(tmp_path: Path) -> None:
    """Padding as large as the kernel: the op's own message, after the ONNX node."""
    path = one_node(tmp_path, "MaxPool", [1, 1, 5, 5], [1, 1, 5, 5], kernel_shape=[2, 2], pads=[2, 2, 2, 2])
    expected = "node 'n' (MaxPool -> max_pool2d): padding [2, 2]: expected less than the kernel [2, 2]"
    assert expected in error(path)


# Duplicate ONNX declarations

POOL_OP = textwrap.dedent(
    '''
    """A second max pooling that claims ONNX {op_type}."""
    from deploy.ops import register
    from deploy.ops.library.max_pool2d import MaxPool2d
    from deploy.ops.onnx_mapping import OnnxOp

    @register
    class Pool(MaxPool2d):
        """max pooling again."""
        name = "{name}"
        onnx = (OnnxOp("{op_type}", domain="{domain}"),)
    '''
)


def test_an_onnx_op_implemented_twice_names_both_files(tmp_path: Path, own_registry: None) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_pool.py").write_text(POOL_OP.format(name="my_pool", op_type="MaxPool", domain="ai.onnx"))
    with pytest.raises(UsageError) as caught:
        load_ops_path(folder)
    assert str(caught.value) == (
        "ONNX op MaxPool is implemented twice: by op 'max_pool2d' in"
        f" {REPO / 'deploy/ops/library/max_pool2d.py'}"
        f" and by op 'my_pool' in {(folder / 'my_pool.py').resolve()}"
    )
    assert op_for_onnx("", "MaxPool") is registry.get_op("max_pool2d")


def test_two_user_ops_claiming_one_custom_onnx_op(tmp_path: Path, own_registry: None) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.py").write_text(
            POOL_OP.format(name=name, op_type="Pool", domain="my.ops")
        )
    assert load_ops_path(tmp_path / "one") == ["one"]
    with pytest.raises(
        UsageError,
        match=r"ONNX op my\.ops::Pool is implemented twice: by op 'one' in .*one\.py and by op 'two' in"
        r" .*two\.py$",
    ):
        load_ops_path(tmp_path / "two")
    assert load_ops_path(tmp_path / "one") == [], "the same file loading again is no duplicate"


# onnxruntime as a second reference


def random_inputs(graph: Any, seed: int = 0) -> list[np.ndarray]:
    """Finite inputs of the graph's types: normal floats, integers over the type's range."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t in graph.inputs:
        if np.issubdtype(t.dtype, np.integer):
            info = np.iinfo(t.dtype)
            arrays.append(rng.integers(info.min, info.max, t.shape, dtype=t.dtype, endpoint=True))
        else:
            arrays.append((rng.standard_normal(t.shape) * 4).astype(t.dtype))
    return arrays


def assert_references_agree(path: Path, arrays: list[np.ndarray] | None = None) -> np.ndarray:
    bound = bind_graph(load_model(path))
    arrays = random_inputs(bound) if arrays is None else arrays
    (ours,) = bound.references(*arrays)
    found = onnxruntime_reference(path, bound, arrays)
    assert found is not None, "onnxruntime is a test dependency"
    (theirs,) = found
    result = compare(ours, theirs, bound.exact)
    assert result.ok, result.detail or result.max_error
    return theirs


F32, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE


@pytest.mark.parametrize(
    ("op_type", "dtype", "shape", "attrs"),
    [
        ("MaxPool", F32, [2, 3, 9, 11], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("MaxPool", F32, [1, 2, 7, 8], {"kernel_shape": [2, 2]}),
        ("MaxPool", F64, [1, 2, 8, 7], {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 0]}),
        (
            "MaxPool",
            F16,
            [2, 5, 9, 11],
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        ),
        (
            "MaxPool",
            F32,
            [1, 1, 4, 4],
            {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        ),
        (
            "MaxPool",
            F32,
            [1, 1, 5, 5],
            {"kernel_shape": [5, 5], "strides": [3, 3], "pads": [2, 2, 2, 2], "ceil_mode": 1},
        ),
        ("MaxPool", F32, [1, 3, 10, 10], {"kernel_shape": [3, 3], "strides": [3, 3], "auto_pad": "VALID"}),
        (
            "MaxPool",
            TensorProto.INT8,
            [1, 2, 6, 6],
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        ),
        ("MaxPool", TensorProto.UINT8, [1, 2, 6, 6], {"kernel_shape": [2, 2]}),
        ("Add", F32, [2, 3, 4, 5], {"b": [3, 1, 5]}),
        ("Add", F16, [7, 13], {"b": [7, 13]}),
        ("Add", TensorProto.INT32, [1001], {"b": [1]}),
        ("Add", TensorProto.INT8, [3, 4], {"b": [4]}),
        ("LeakyRelu", F32, [3, 17], {}),
        ("LeakyRelu", F32, [3, 17], {"alpha": 0.1}),
        ("LeakyRelu", F64, [3, 17], {"alpha": -1.5}),
        ("HardSigmoid", F32, [3, 17], {}),
        ("HardSigmoid", F32, [3, 17], {"alpha": 1 / 6, "beta": 0.5}),
        ("ArgMax", F32, [4, 7, 5], {}),
        ("ArgMax", F32, [4, 7, 5], {"axis": -1, "keepdims": 0}),
        ("ArgMax", TensorProto.INT8, [4, 50], {"axis": 1}),
    ],
)
def test_onnxruntime_agrees_with_numpy_on_finite_inputs(
    tmp_path: Path, op_type: str, dtype: int, shape: list[int], attrs: dict[str, Any]
) -> None:
    rank = len(shape) - (op_type == "ArgMax" and attrs.get("keepdims") == 0)
    # the checker wants a shape: the rank, dims left open
    out: list[int | str] = [f"d{axis}" for axis in range(rank)]
    assert_references_agree(one_node(tmp_path, op_type, shape, out, dtype, **attrs))


def test_onnxruntime_agrees_on_the_example_model(example_ops: None) -> None:
    out = assert_references_agree(EXAMPLE_ONNX)
    assert out.shape == (1, 8, 16, 16) and ((out > 0) & (out < 1)).any(), "not all clipped"
    assert not agrees_on_nan(EXAMPLE_ONNX), "it has a MaxPool"


def test_onnxruntime_maxpool_and_argmax_differ_from_numpy_on_nan(tmp_path: Path) -> None:
    """Why a graph with MaxPool or ArgMax compares on finite inputs only (the module's docstring)."""
    window = np.array([1, np.nan, 4, 5], np.float32).reshape(1, 1, 2, 2)
    first = np.array([np.nan, 1, 4, 5], np.float32).reshape(1, 1, 2, 2)
    pool = one_node(tmp_path / "pool", "MaxPool", [1, 1, 2, 2], [1, 1, 1, 1], kernel_shape=[2, 2])
    bound = bind_graph(load_model(pool))
    assert np.isnan(bound.references(first)[0]).all() and np.isnan(bound.references(window)[0]).all()
    assert onnxruntime_reference(pool, bound, [first])[0].item() == 5.0, (
        "a NaN first in its window is dropped"
    )
    float64 = one_node(tmp_path / "f64", "MaxPool", [1, 1, 2, 2], [1, 1, 1, 1], F64, kernel_shape=[2, 2])
    bound64 = bind_graph(load_model(float64))
    assert onnxruntime_reference(float64, bound64, [window.astype(np.float64)])[0].item() == 5.0
    argmax = one_node(tmp_path / "argmax", "ArgMax", [4], [1])
    row = np.array([1, np.nan, 3, 2], np.float32)
    bound_argmax = bind_graph(load_model(argmax))
    assert (
        bound_argmax.references(row)[0].item() == 1
        and onnxruntime_reference(argmax, bound_argmax, [row])[0].item() == 2
    )
    assert not agrees_on_nan(pool) and not agrees_on_nan(argmax)
    assert {"Add", "LeakyRelu", "HardSigmoid"} == AGREES_ON_NAN


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [("Add", {"b": [6]}), ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.0}), ("HardSigmoid", {}),
     ("HardSigmoid", {"alpha": 0.0})],
)  # fmt: skip
def test_onnxruntime_agrees_on_nan_where_it_says_so(
    tmp_path: Path, op_type: str, attrs: dict[str, Any]
) -> None:
    special = np.array([np.nan, -np.inf, np.inf, -0.0, -1.5, 2.0], np.float32)
    path = one_node(tmp_path, op_type, [6], [6], **attrs)
    arrays = [special, special[::-1].copy()] if op_type == "Add" else [special]
    assert agrees_on_nan(path)
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN in numpy too, and says so
        assert_references_agree(path, arrays)


def test_a_model_onnx_does_not_define_is_refused_when_read(tmp_path: Path) -> None:
    """Issue #37: ONNX defines MaxPool on floats and 8-bit integers, and 2-D dilations as two
    values; ours pools int32, so deploy built what onnxruntime refuses. The checker's full check
    (type constraints, shape inference) runs after our own checks, which refuse the count."""
    int32 = one_node(tmp_path, "MaxPool", [1, 1, 4, 4], [1, 1, 3, 3], TensorProto.INT32, kernel_shape=[2, 2])
    assert "(op_type:MaxPool, node name: n): X typestr: T, has unsupported type: tensor(int32)" in error(
        int32
    )
    dilations = one_node(tmp_path, "MaxPool", [1, 1, 4, 4], [1, 1, 3, 3], TensorProto.FLOAT,
                         kernel_shape=[2, 2], dilations=[1, 1, 1])  # fmt: skip
    assert "ONNX attribute dilations=[1, 1, 1] is not supported: 2 values for the 2-D" in error(dilations)


def test_a_yaml_merge_key_may_give_a_key_again(tmp_path: Path) -> None:
    """`<<: *anchor` merges a mapping whose keys the mapping may then override: no key given
    twice there, though a key given twice in one mapping is refused."""
    path = tmp_path / "merge.yaml"
    path.write_text(
        "inputs:\n  a: &image {shape: [1, 2, 8, 8], dtype: float16}\n  b: {<<: *image, dtype: float32}\n"
        "nodes: [{name: p, op: max_pool2d, attrs: {kernel: 2}, inputs: [b]}]\noutput: p\n"
    )
    graph = bind_graph(load_model(path))
    assert [str(t) for t in graph.inputs] == ["1x2x8x8:float16", "1x2x8x8:float32"]


@pytest.mark.parametrize(
    "shape,alpha,expected",
    [
        ("[010, 4]", "0.5", "g.yaml:1: number 010: YAML 1.1 reads it as octal;"),
        ("[-01, 4]", "0.5", "g.yaml:1: number -01: YAML 1.1 reads it as octal;"),
        ("[1:30, 4]", "0.5", "g.yaml:1: number 1:30: YAML 1.1 reads it as base 60;"),
        ("[3, 4]", "1:30.5", "g.yaml:2: number 1:30.5: YAML 1.1 reads it as base 60;"),
        ("[!!int '010', 4]", "0.5", "g.yaml:1: number 010: YAML 1.1 reads it as octal;"),
        ("[0x10, 1_0]", "0.5", ((16, 10), 0.5)),
        ("[0b11, 10]", "012.5", ((3, 10), 12.5)),
        ("[0, 4]", "0.5", "shape [0, 4]: expected a list of positive ints"),
        ("[!!int 1e3, 4]", "0.5", "g.yaml:1: 1e3 is not an int"),  # was a raw ValueError, exit 1
        ("[3, 4]", "!!float '010'", ((3, 4), 10.0)),  # a float is never octal
    ],
)
def test_a_yaml_number_is_read_as_it_looks_or_refused(tmp_path: Path, shape, alpha, expected) -> None:
    """YAML 1.1 (PyYAML) reads `010` as 8 and `1:30` as 90: a shape or attribute other than the
    file shows, where YAML 1.2 and JSON read 10 or refuse. Those are refused; hex and `_` stay."""
    path = tmp_path / "g.yaml"
    path.write_text(
        f"inputs: {{a: {{shape: {shape}}}}}\n"
        f"nodes: [{{name: r, op: leaky_relu, attrs: {{alpha: {alpha}}}, inputs: [a]}}]\noutput: r\n"
    )
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=re.escape(expected)):
            load_model(path)
        return
    graph = load_model(path)
    assert (graph.inputs[0][1].shape, graph.nodes[0].attrs["alpha"]) == expected


def test_yaml_aliases_that_expand_to_a_billion_values_are_refused(tmp_path: Path) -> None:
    """Nine levels of nine aliases of the level below in an attribute: 600 bytes that would be
    9**9 values (and an error line of hundreds of MB quoting them) are refused as they are read."""
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "inputs: {x: {shape: [4]}}\n"
        f"nodes: [{{name: n, op: leaky_relu, attrs: {{alpha: {{{', '.join(levels)}}}}}, inputs: [x]}}]\n"
        "output: n\n"
    )
    with pytest.raises(UsageError, match=r"bomb.yaml: its aliases \(\*name\) expand to more than"):
        load_model(path)


@pytest.mark.parametrize(
    "declared,message",
    [
        ((TensorProto.INT8, [7, 7]), "output 'y' is declared int8, but its nodes compute 4:float32"),
        ((TensorProto.BFLOAT16, [4]), "output 'y' is declared BFLOAT16, but its nodes compute 4:float32"),
        ((TensorProto.FLOAT, [5]), "output 'y' is declared 5, but its nodes compute 4:float32"),
        ((TensorProto.FLOAT, [4, 1]), "output 'y' is declared 4x1, but its nodes compute 4:float32"),
        ((TensorProto.FLOAT, []), "output 'y' is declared a scalar, but its nodes compute 4:float32"),
        ((TensorProto.FLOAT, [4]), None),
        ((TensorProto.FLOAT, ["n"]), None),
    ],
)
def test_an_onnx_output_must_be_declared_as_it_is_computed(tmp_path: Path, declared, message) -> None:
    """What the model says it returns is what it returns: an engine reads the output by its
    declaration (onnxruntime warns of a shape that differs; deploy refuses it)."""
    node = helper.make_node("LeakyRelu", ["x"], ["y"], "act")
    path = onnx_file(tmp_path, [node], [("x", TensorProto.FLOAT, [4])], ("y", *declared))
    if message is None:
        assert bind_graph(load_model(path)).outputs[0] == TensorType((4,), "float32")
    else:
        assert error(path) == f"model {path}: {message}"


@pytest.mark.parametrize(
    "version,refused", [(6, True), (7, False), (17, False), (onnx.defs.onnx_opset_version() + 1, True)]
)
def test_an_onnx_model_of_an_opset_the_mappings_do_not_follow_is_refused(
    tmp_path: Path, version: int, refused: bool
) -> None:
    """Before opset 7 an Add of [2,3] and [3] needed broadcast=1, and a newer opset than onnx knows
    may mean other things: such a model is refused, not built with today's meanings."""
    path = one_node(tmp_path, "Add", [2, 3], [2, 3], b=[3])
    model = onnx.load(path)
    model.opset_import[0].version = version
    onnx.save(model, path)
    if not refused:
        assert bind_graph(load_model(path)).outputs[0].shape == (2, 3)
        return
    with pytest.raises(UsageError, match=rf"model .*model.onnx: ONNX opset {version}: expected 7 to \d+"):
        load_model(path)


def test_an_onnx_graph_without_nodes_says_it_has_no_kernel(tmp_path: Path) -> None:
    """A pass-through model (its output is its input) builds; its schedule printed as `( schedule`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([], "empty", [x], [x])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "empty.onnx")
    out = tmp_path / "out"
    built = invoke("build", "--model", str(tmp_path / "empty.onnx"), "--target", "x86", "-o", str(out))
    assert built.exit_code == 0, built.output
    assert "(no kernel schedule, " in built.output
    assert json.loads((out / "manifest.json").read_text())["schedule"] == "no kernel"


def _exported_cases() -> list[Any]:
    """(op, case) for every static case of every op that exports itself to ONNX."""
    return [
        pytest.param(op, case, id=f"{op.name}-{index}")
        for op in registry.all_ops()
        if any(m.node_attrs for m in op.onnx)
        for index, case in enumerate(op.cases)
        if not case.symbolic
    ]


@pytest.mark.parametrize(("op", "case"), _exported_cases())
def test_an_exported_node_reads_back_and_runs_as_numpy_does(op: Any, case: Any) -> None:
    """`node_attrs` (the onnxruntime baseline of `deploy bench`) is the inverse of the import:
    the node's attributes read back to attributes that compute the same; and onnxruntime runs
    the one-node model as our numpy reference does (finite inputs: see onnx_reference.py). A
    case ONNX cannot say (a packed layout, int32 indices) exports nothing."""
    from deploy.bench.onnxruntime_baseline import onnx_node, onnxruntime_call
    from deploy.ops import bind

    types = [TensorType(shape, "float32") for shape in case.shapes]
    bound = bind(op, case.attrs, types)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.shape).astype(t.dtype) for t in types]
    want = op.reference(bound.attrs, *inputs)
    found = onnx_node(bound, [i.name for i in op.inputs], "y")
    node = None if found is None else found[0]
    (mapping,) = op.onnx
    if node is None:
        assert mapping.node_attrs(bound.attrs) is None and onnxruntime_call(bound, inputs) is None
        return
    exported = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    read_back = bind(op, mapping.attrs(exported), types)
    np.testing.assert_array_equal(op.reference(read_back.attrs, *inputs), want)
    np.testing.assert_array_equal(onnxruntime_call(bound, inputs)()[0], want)


def test_a_long_string_aliased_into_a_shape_makes_a_short_message(tmp_path: Path) -> None:
    """Issue #37: a 1.4 KB file whose aliases repeat a long string (under the values cap) made a
    114 MB error line; messages quote values bounded (`deploy.base.errors.shown`)."""
    long = "a" * 1000
    levels = ", ".join(f"&l{i} [{', '.join([f'*l{i - 1}' if i > 1 else '*s'] * 10)}]" for i in range(1, 5))
    path = tmp_path / "alias.yaml"
    path.write_text(
        f"inputs: {{x: {{shape: [&s {long}, {levels}]}}}}\n"
        "nodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    )
    message = error(path)
    assert "input 'x': shape [" in message and len(message) < 600, len(message)
