"""hard_sigmoid: clip(alpha * x + beta, 0, 1), ONNX HardSigmoid (floats)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.ops.attrs import Attr, Float
from deploy.ops.layouts import Layout, Relayout
from deploy.ops.nan import times_zero
from deploy.ops.onnx_mapping import OnnxOp, same_names
from deploy.ops.registry import register
from deploy.ops.spec import FLOAT_DTYPES, Case, Input, Op, TensorType


@register
class HardSigmoid(Op):
    """clip(alpha * x + beta, 0, 1): a cheap sigmoid (MobileNetV3's h-sigmoid uses 1/6, 0.5)."""

    name = "hard_sigmoid"
    inputs = (Input("x"),)
    attrs = (Attr("alpha", Float(), 0.2, "slope"), Attr("beta", Float(), 0.5, "offset"))
    dtypes = FLOAT_DTYPES
    onnx = (
        OnnxOp(
            "HardSigmoid",
            attrs=same_names(alpha=0.2, beta=0.5),
            node_attrs=lambda attrs: {"alpha": attrs["alpha"], "beta": attrs["beta"]},
        ),
    )
    cases = (
        Case(((2, 16, 28, 28),)),
        Case(((1001,),), {"alpha": 0.0, "beta": 0.25}),  # NaN and infinities times 0 are NaN
    )
    """Two cases, for the test matrices' time on the emulators: an image that clips at both ends,
    and the one other path (alpha = 0) on a row with a vector's tail."""
    bench = Case(((32, 64, 112, 112),), {"alpha": 1 / 6, "beta": 0.5})  # 206 MB moved; PyTorch's h-sigmoid

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """Clipped with compares, not min/max: TVM's float min and max drop NaN, numpy's clip
        keeps it. alpha = 0 multiplies through `times_zero`: TVM would fold `x * 0.0` to 0.0 and
        give beta for NaN and infinities, where numpy (and onnxruntime) give NaN."""
        alpha, dtype = attrs["alpha"], str(x.dtype)
        beta, zero, one = tirx.const(attrs["beta"], dtype), tirx.const(0, dtype), tirx.const(1, dtype)

        def body(*i: Any) -> Any:
            scaled = times_zero(x[i], dtype, alpha) if alpha == 0 else x[i] * tirx.const(alpha, dtype)
            value = scaled + beta
            return tirx.Select(value < zero, zero, tirx.Select(value > one, one, value))

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        alpha, beta = x.dtype.type(attrs["alpha"]), x.dtype.type(attrs["beta"])
        return np.clip(x * alpha + beta, 0, 1).astype(x.dtype)

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Elementwise: an image (rank 4) computes the same in any layout."""
        return Relayout(attrs, (layout,), layout) if len(inputs[0].shape) == 4 else None
