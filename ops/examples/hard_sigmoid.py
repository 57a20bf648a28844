"""hard_sigmoid: clip(alpha * x + beta, 0, 1), as in ONNX HardSigmoid.

A complete custom op in one file, the way a user adds one: `deploy --ops-path ops/examples ops`
lists it, `deploy --ops-path ops/examples test --target x86 --op hard_sigmoid` verifies it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from ops import Case, Input, Op, TensorType, register
from ops.attrs import Attr, Float
from ops.onnx_mapping import OnnxOp, same_names
from ops.spec import FLOAT_DTYPES


@register
class HardSigmoid(Op):
    """clip(alpha * x + beta, 0, 1): a cheap sigmoid (MobileNetV3's h-sigmoid uses 1/6, 0.5)."""

    name = "hard_sigmoid"
    inputs = (Input("x"),)
    attrs = (
        Attr("alpha", Float(lo=-100.0, hi=100.0), 0.2, "slope"),
        Attr("beta", Float(lo=-100.0, hi=100.0), 0.5, "offset"),
    )
    dtypes = FLOAT_DTYPES
    onnx = (OnnxOp("HardSigmoid", domain="com.example", attrs=same_names(alpha=0.2, beta=0.5)),)
    cases = (
        Case(((2, 16, 28, 28),)),
        Case(((7, 13),), {"alpha": 1 / 6, "beta": 0.5}),
        Case(((1001,),), {"alpha": -0.5, "beta": 0.25}),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        dtype = str(x.dtype)
        alpha, beta = tirx.const(attrs["alpha"], dtype), tirx.const(attrs["beta"], dtype)
        zero, one = tirx.const(0, dtype), tirx.const(1, dtype)

        def body(*i: Any) -> Any:
            # compares, not min/max: TVM's float min and max drop NaN, numpy's clip keeps it
            value = x[i] * alpha + beta
            return tirx.Select(value < zero, zero, tirx.Select(value > one, one, value))

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        alpha, beta = x.dtype.type(attrs["alpha"]), x.dtype.type(attrs["beta"])
        return np.clip(x * alpha + beta, 0, 1).astype(x.dtype)
