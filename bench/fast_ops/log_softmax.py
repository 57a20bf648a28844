"""log_softmax over the last axis, as a user writes it: x - max - log(sum(exp(x - max))); no
schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class LogSoftmax(Op):
    """x - max(x) - log(sum(exp(x - max(x)))) along the last axis."""

    name = "log_softmax"
    inputs = (Input("x", min_rank=1),)
    dtypes = FLOAT_DTYPES
    cases = (Case(((1, 12, 128, 128),)), Case(((3, 5, 7),)), Case(((2, 1000),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        *outer, n = x.shape
        k = te.reduce_axis((0, n), name="k")
        high = te.compute(outer, lambda *i: te.max(x[(*i, k)], axis=k), name="high")
        j = te.reduce_axis((0, n), name="j")
        total = te.compute(outer, lambda *i: te.sum(te.exp(x[(*i, j)] - high[i]), axis=j), name="total")
        return te.compute(x.shape, lambda *i: x[i] - high[i[:-1]] - te.log(total[i[:-1]]), name="log_softmax")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            shifted = x - x.max(axis=-1, keepdims=True)
            return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(x.dtype)
