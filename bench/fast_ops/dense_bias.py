"""dense_bias: a Linear layer with its bias, x[M, K] @ w[N, K]^T + b[N] (ONNX's Gemm with transB and
C; PyTorch's nn.Linear), as a user writes it: the sum, then the bias added to it in a second
computation; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class DenseBias(Op):
    """out[m, n] = sum_k x[m, k] * w[n, k] + b[n]."""

    name = "dense_bias"
    inputs = (Input("x", 2, 2), Input("w", 2, 2), Input("b", 1, 1))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (
        Case(((128, 768), (768, 768), (768,))),
        Case(((1, 768), (3072, 768), (3072,))),
        Case(((5, 7), (3, 7), (3,))),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, w, b = inputs
        if x.shape[1] != w.shape[1] or b.shape[0] != w.shape[0]:
            raise UsageError(f"x {x}, w {w}, b {b}: expected w [N, {x.shape[1]}] and b [N]")
        return TensorType((x.shape[0], w.shape[0]), x.dtype)

    def compute(
        self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, w: te.Tensor, b: te.Tensor
    ) -> te.Tensor:
        k = te.reduce_axis((0, x.shape[1]), name="k")
        product = te.compute(out.shape, lambda m, n: te.sum(x[m, k] * w[n, k], axis=k), name="product")
        return te.compute(out.shape, lambda m, n: product[m, n] + b[n], name="dense_bias")

    def reference(self, attrs: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (x.astype(np.float64) @ w.astype(np.float64).T + b).astype(x.dtype)
