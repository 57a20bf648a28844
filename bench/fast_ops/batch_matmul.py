"""Batched matmul a[B, M, K] @ b[B, K, N] (attention's scores), as a user writes it; no schedule
code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class BatchMatmul(Op):
    """out[g, m, n] = sum_k a[g, m, k] * b[g, k, n]."""

    name = "batch_matmul"
    inputs = (Input("a", 3, 3), Input("b", 3, 3))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (Case(((12, 128, 64), (12, 64, 128))), Case(((2, 5, 7), (2, 7, 3))))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        a, b = inputs
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise UsageError(f"a {a}, b {b}: expected [B, M, K] and [B, K, N]")
        return TensorType((a.shape[0], a.shape[1], b.shape[2]), a.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, a: te.Tensor, b: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, a.shape[2]), name="k")
        return te.compute(
            out.shape, lambda g, m, n: te.sum(a[g, m, k] * b[g, k, n], axis=k), name="batch_matmul"
        )

    def reference(self, attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)
