"""max_pool2d_indices: where each max of `max_pool2d` (NCHW) is, as a flat index into the input:
ONNX MaxPool's second output `Indices` (storage_order 0), which a model reading it gets from this
op beside max_pool2d (`OnnxOp.more_outputs`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops.attrs import Attr, Bool
from deploy.ops.library.pooling import indices_pool, max_pool2d_indices_compute, pool_attrs, pooled_type
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, Op, TensorType


@register
class MaxPool2dIndices(Op):
    """Per window of 2-D max pooling, ((n * C + c) * H + h) * W + w of its max: the first in
    row-major order on ties, the first NaN where one is (the max is then NaN)."""

    name = "max_pool2d_indices"
    inputs = (Input("x", min_rank=4, max_rank=4),)
    attrs = (
        *(a for a in pool_attrs(kernel=2, stride=None, padding=0) if a.name != "layout"),
        Attr("column_major", Bool(), False, "number each plane column by column (ONNX storage_order=1)"),
    )
    exact = True
    cases = (
        Case(((2, 3, 9, 11),), {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
        Case(((1, 2, 10, 11),), {"kernel": "2,3", "stride": 1, "padding": "1,0", "dilation": "3,2"}),
        Case((("N", 3, 8, 9),), {"kernel": 2, "column_major": True}),
        Case(((1, 2, 9, 10),), {"kernel": "4,3", "stride": 2, "padding": "2,1"}),  # staged (12 taps)
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return TensorType(pooled_type("x", inputs[0], indices_pool(attrs)).shape, "int64")

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return max_pool2d_indices_compute(attrs, out, x)

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return indices_pool(attrs).reference_indices(x, attrs["column_major"])
