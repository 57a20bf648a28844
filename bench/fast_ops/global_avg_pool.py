"""Global average pooling (NCHW: the mean of each channel's plane, ONNX's GlobalAveragePool, a
classifier's last pooling), as a user writes it: the sum over the plane's rows and columns, then
the division by its size; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register


@register
class GlobalAvgPool(Op):
    """out[n, c, 0, 0] = sum_{i, j} x[n, c, i, j] / (H * W)."""

    name = "global_avg_pool"
    inputs = (Input("x", 4, 4),)
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (
        Case(((1, 2048, 7, 7),)),  # ResNet-50's: rows of 49, not whole vectors
        Case(((2, 256, 14, 14),)),
        Case(((1, 3, 1, 5),)),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        n, c, _, _ = inputs[0].shape
        return TensorType((n, c, 1, 1), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        h, w = x.shape[2], x.shape[3]
        i, j = te.reduce_axis((0, h), name="i"), te.reduce_axis((0, w), name="j")
        sums = te.compute(out.shape, lambda n, c, _y, _z: te.sum(x[n, c, i, j], axis=[i, j]), name="sums")
        size = tirx.const(float(int(h) * int(w)), x.dtype)
        return te.compute(out.shape, lambda *at: sums[at] / size, name="global_avg_pool")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(x.dtype)
