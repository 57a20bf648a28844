"""Mean over the channels of NCHW (axis 1, kept), a reduction along an outer axis, as a user
writes it; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class MeanChannels(Op):
    """out[n, 0, h, w] = mean_c x[n, c, h, w]."""

    name = "mean_channels"
    inputs = (Input("x", 4, 4),)
    dtypes = FLOAT_DTYPES
    cases = (Case(((1, 256, 56, 56),)), Case(((2, 3, 5, 7),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        n, _, h, w = inputs[0].shape
        return TensorType((n, 1, h, w), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        c = te.reduce_axis((0, x.shape[1]), name="c")
        total = te.compute(out.shape, lambda n, _, h, w: te.sum(x[n, c, h, w], axis=c), name="total")
        return te.compute(out.shape, lambda *i: total[i] / x.shape[1], name="mean_channels")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return x.mean(axis=1, keepdims=True, dtype=np.float64).astype(x.dtype)
