"""Attention's head split [B, S, H, D] -> [B, H, S, D] (data movement), as a user writes it; no
schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class TransposeHeads(Op):
    """out[b, h, s, d] = x[b, s, h, d]."""

    name = "transpose_heads"
    inputs = (Input("x", 4, 4),)
    dtypes = FLOAT_DTYPES
    exact = True  # moves values only
    cases = (Case(((1, 128, 12, 64),)), Case(((2, 3, 5, 7),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        b, s, h, d = inputs[0].shape
        return TensorType((b, h, s, d), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return te.compute(out.shape, lambda b, h, s, d: x[b, s, h, d], name="transpose_heads")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
