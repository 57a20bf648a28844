"""dense: a Linear layer's product x[M, K] @ w[N, K]^T, the weight as PyTorch keeps it (ONNX's
Gemm with transB; TOPI's `dense`), as a user writes it: one sum over k; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class Dense(Op):
    """out[m, n] = sum_k x[m, k] * w[n, k]."""

    name = "dense"
    inputs = (Input("x", 2, 2), Input("w", 2, 2))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (
        Case(((128, 768), (768, 768))),
        Case(((1, 768), (3072, 768))),
        Case(((4, 64), (24, 64))),
        Case(((5, 7), (3, 7))),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, w = inputs
        if x.shape[1] != w.shape[1]:
            raise UsageError(f"x {x}, w {w}: expected w's columns to be x's {x.shape[1]} columns")
        return TensorType((x.shape[0], w.shape[0]), x.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, w: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, x.shape[1]), name="k")
        return te.compute(out.shape, lambda m, n: te.sum(x[m, k] * w[n, k], axis=k), name="dense")

    def reference(self, attrs: dict[str, Any], x: np.ndarray, w: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (x.astype(np.float64) @ w.astype(np.float64).T).astype(x.dtype)
