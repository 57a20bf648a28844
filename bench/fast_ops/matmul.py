"""matmul a[M, K] @ b[K, N], as a user writes it: one sum over k; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class Matmul(Op):
    """out[m, n] = sum_k a[m, k] * b[k, n]."""

    name = "matmul"
    inputs = (Input("a", 2, 2), Input("b", 2, 2))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (Case(((128, 768), (768, 768))), Case(((5, 7), (7, 3))), Case(((33, 64), (64, 40))))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        a, b = inputs
        if a.shape[1] != b.shape[0]:
            raise UsageError(f"a {a}, b {b}: expected b's rows to be a's {a.shape[1]} columns")
        return TensorType((a.shape[0], b.shape[1]), a.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, a: te.Tensor, b: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, a.shape[1]), name="k")
        return te.compute(out.shape, lambda m, n: te.sum(a[m, k] * b[k, n], axis=k), name="matmul")

    def reference(self, attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)
