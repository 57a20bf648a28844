"""scale_bias: x * scale + bias per channel (a folded batch norm), as a user adds it: an
elementwise op whose operands broadcast, no schedule of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class ScaleBias(Op):
    """x[n, c, h, w] * scale[c] + bias[c]."""

    name = "scale_bias"
    inputs = (Input("x", min_rank=4, max_rank=4), Input("scale", 1, 1), Input("bias", 1, 1))
    dtypes = FLOAT_DTYPES
    cases = (Case(((1, 116, 28, 28), (116,), (116,))), Case(((2, 3, 5, 7), (3,), (3,))))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, scale, bias = inputs
        if scale.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
            raise UsageError(f"scale {scale}, bias {bias}: expected [{x.shape[1]}] each, x's channels")
        return x

    def compute(
        self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, scale: te.Tensor, bias: te.Tensor
    ) -> te.Tensor:
        return te.compute(out.shape, lambda n, c, h, w: x[n, c, h, w] * scale[c] + bias[c], name="scale_bias")

    def reference(
        self, attrs: dict[str, Any], x: np.ndarray, scale: np.ndarray, bias: np.ndarray
    ) -> np.ndarray:
        return x * scale[:, None, None] + bias[:, None, None]
