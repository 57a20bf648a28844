"""1x1 convolution (NCHW, no padding, stride 1), as a user writes it: a sum over the input
channels at each pixel; no schedule code. It is a matmul w[co, ci] @ x[ci, h*w] per image."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class PointwiseConv(Op):
    """out[n, co, y, x] = sum_ci x[n, ci, y, x] * w[co, ci, 0, 0]."""

    name = "pointwise_conv"
    inputs = (Input("x", 4, 4), Input("w", 4, 4))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (Case(((1, 64, 56, 56), (128, 64, 1, 1))), Case(((2, 3, 5, 7), (5, 3, 1, 1))))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, w = inputs
        n, c, h, wd = x.shape
        if w.shape[1:] != (c, 1, 1):
            raise UsageError(f"w {w}: expected [out channels, {c}, 1, 1]")
        return TensorType((n, w.shape[0], h, wd), x.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, w: te.Tensor) -> te.Tensor:
        ci = te.reduce_axis((0, x.shape[1]), name="ci")
        return te.compute(
            out.shape,
            lambda n, co, y, z: te.sum(x[n, ci, y, z] * w[co, ci, 0, 0], axis=ci),
            name="pointwise_conv",
        )

    def reference(self, attrs: dict[str, Any], x: np.ndarray, w: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            out = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
            return out.astype(x.dtype)
