"""hard_tanh: clip(x, min_val, max_val), as PyTorch's nn.Hardtanh.

A complete custom op in one file, the way a user adds one: ONNX has no HardTanh (PyTorch exports
it as Clip), so this one is `com.example::HardTanh`. `deploy --ops-path deploy/ops/examples ops` lists it,
`deploy --ops-path deploy/ops/examples test --target x86 --op hard_tanh` verifies it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Float
from deploy.ops.onnx_mapping import OnnxOp, same_names
from deploy.ops.spec import FLOAT_DTYPES


@register
class HardTanh(Op):
    """clip(x, min_val, max_val): a cheap tanh (PyTorch's nn.Hardtanh; ReLU6 is 0, 6)."""

    name = "hard_tanh"
    inputs = (Input("x"),)
    attrs = (
        Attr("min_val", Float(), -1.0, "lower bound"),
        Attr("max_val", Float(), 1.0, "upper bound, above min_val"),
    )
    dtypes = FLOAT_DTYPES
    exact = True  # compares and selects only: no rounding in any dtype
    onnx = (OnnxOp("HardTanh", domain="com.example", attrs=same_names(min_val=-1.0, max_val=1.0)),)
    cases = (
        Case(((2, 16, 28, 28),)),
        Case(((7, 13),), {"min_val": 0.0, "max_val": 6.0}),
        Case(((1001,),), {"min_val": -0.25, "max_val": 0.5}),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        """Each bound is a float already (its kind checked it); that they are in order only this
        op knows."""
        low, high = attrs["min_val"], attrs["max_val"]
        if low >= high:
            raise UsageError(f"attributes min_val={low} and max_val={high}: expected min_val below max_val")
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        dtype = str(x.dtype)
        low, high = tirx.const(attrs["min_val"], dtype), tirx.const(attrs["max_val"], dtype)

        def body(*i: Any) -> Any:
            # compares, not min/max: TVM's float min and max drop NaN, numpy's clip keeps it
            return tirx.Select(x[i] < low, low, tirx.Select(x[i] > high, high, x[i]))

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        low, high = x.dtype.type(attrs["min_val"]), x.dtype.type(attrs["max_val"])
        return np.clip(x, low, high)
