"""A 2-D transpose (data movement: the read's innermost index is the output's outer
variable), as a user writes it; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class Transpose2d(Op):
    """out[j, i] = x[i, j]."""

    name = "transpose2d"
    inputs = (Input("x", 2, 2),)
    dtypes = FLOAT_DTYPES
    exact = True  # moves values only
    cases = (Case(((1024, 1024),)), Case(((5, 7),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        rows, cols = inputs[0].shape
        return TensorType((cols, rows), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return te.compute(out.shape, lambda j, i: x[i, j], name="transpose2d")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.T)
