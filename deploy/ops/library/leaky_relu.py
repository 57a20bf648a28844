"""leaky_relu: x if x > 0 else alpha * x (floats)."""

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
class LeakyRelu(Op):
    """x where x > 0, else alpha * x."""

    name = "leaky_relu"
    inputs = (Input("x"),)
    attrs = (Attr("alpha", Float(), 0.01, "slope for x <= 0"),)
    dtypes = FLOAT_DTYPES
    onnx = (
        OnnxOp("LeakyRelu", attrs=same_names(alpha=0.01), node_attrs=lambda attrs: {"alpha": attrs["alpha"]}),
    )
    cases = (
        Case(((32, 64, 56, 56),)),
        Case(((7, 13),), {"alpha": 0.2}),
        Case(((1001,),), {"alpha": -1.5}),
        Case(((),)),
        Case(((2, 3, 1, 5, 1, 3),), {"alpha": 0.0}),
        Case((("N", 3, 37),), {"alpha": 0.1}),
    )
    bench = Case(((32, 64, 112, 112),))  # 206 MB moved

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """alpha = 0 multiplies through `times_zero`: TVM would fold `x * 0.0` to 0.0 and turn
        NaN and -inf into 0 where numpy gives NaN."""
        alpha, dtype = attrs["alpha"], str(x.dtype)

        def body(*i: Any) -> Any:
            scaled = times_zero(x[i], dtype, alpha) if alpha == 0 else x[i] * tirx.const(alpha, dtype)
            return tirx.Select(x[i] > tirx.const(0, dtype), x[i], scaled)

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        alpha = x.dtype.type(attrs["alpha"])
        return np.where(x > 0, x, x * alpha).astype(x.dtype)

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Elementwise: an image (rank 4) computes the same in any layout."""
        return Relayout(attrs, (layout,), layout) if len(inputs[0].shape) == 4 else None
