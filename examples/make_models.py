"""Writes the example ONNX models next to this script: `python examples/make_models.py`.

pool_add_leaky_htanh.onnx: MaxPool(3x3, stride 2, pads 1) on `a` [1, 8, 32, 32], plus `b`
[1, 1, 16, 16] broadcast over channels, LeakyRelu(0.1), then com.example::HardTanh to [-0.1, 1]
(both ends clip some of the values), a custom domain that only the example op
`deploy/ops/examples/hard_tanh.py` implements (load it with `--ops-path deploy/ops/examples`). Opset 17 and
com.example opset 1; float32 throughout.

pool_add_leaky_htanh_n.onnx: the same with a symbolic batch, `dim_param` N: a [N, 8, 32, 32], b
[N, 1, 16, 16] (one module for every N).

pool_bias_leaky.onnx: as exporters write a model, its learned values inside it: MaxPool(2x2,
stride 2) on `x` [N, 16, 32, 32], plus the initializer `bias` [1, 16, 1, 1] (per channel), plus a
`Constant` node's float 0.5, then LeakyRelu(0.01). Standard ops only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def pool_add_leaky_htanh(batch: int | str = 1) -> onnx.ModelProto:
    """The model with inputs of batch `batch` (a str: a symbolic batch of that name)."""
    nodes = [
        helper.make_node(
            "MaxPool", ["a"], ["pool"], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
        ),
        helper.make_node("Add", ["pool", "b"], ["sum"], "sum"),
        helper.make_node("LeakyRelu", ["sum"], ["leaky"], "leaky", alpha=0.1),
        helper.make_node(
            "HardTanh", ["leaky"], ["out"], "htanh", domain="com.example", min_val=-0.1, max_val=1.0
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_add_leaky_htanh" if batch == 1 else f"pool_add_leaky_htanh_{str(batch).lower()}",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [batch, 8, 32, 32]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [batch, 1, 16, 16]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 8, 16, 16])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="examples/make_models.py")
    onnx.checker.check_model(model)
    return model


def pool_bias_leaky() -> onnx.ModelProto:
    """The model with a learned per-channel bias (an initializer) and a Constant node."""
    bias = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16, 1, 1)
    nodes = [
        helper.make_node("Constant", [], ["half"], "half", value_float=0.5),
        helper.make_node("MaxPool", ["x"], ["pool"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["pool", "bias"], ["biased"], "biased"),
        helper.make_node("Add", ["biased", "half"], ["shifted"], "shifted"),
        helper.make_node("LeakyRelu", ["shifted"], ["y"], "leaky", alpha=0.01),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_bias_leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 16, 16])],
        [numpy_helper.from_array(bias, "bias")],
    )
    opsets = [helper.make_opsetid("", 17)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="examples/make_models.py")
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(pool_add_leaky_htanh(), HERE / "pool_add_leaky_htanh.onnx")
    onnx.save(pool_add_leaky_htanh("N"), HERE / "pool_add_leaky_htanh_n.onnx")
    onnx.save(pool_bias_leaky(), HERE / "pool_bias_leaky.onnx")
