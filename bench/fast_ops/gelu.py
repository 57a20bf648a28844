"""GELU with erf, as a user writes it: 0.5 x (1 + erf(x / sqrt 2)); no schedule code."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class Gelu(Op):
    """x * (1 + erf(x / sqrt(2))) / 2, elementwise."""

    name = "gelu"
    inputs = (Input("x"),)
    dtypes = FLOAT_DTYPES
    cases = (Case(((1, 128, 3072),)), Case(((3, 5, 7),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        half, root = tirx.const(0.5, x.dtype), tirx.const(1 / math.sqrt(2), x.dtype)
        return te.compute(
            x.shape, lambda *i: half * x[i] * (tirx.const(1, x.dtype) + te.erf(x[i] * root)), name="gelu"
        )

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        from scipy.special import erf

        with np.errstate(invalid="ignore"):
            wide = x.astype(np.float64)
            return (0.5 * wide * (1 + erf(wide / math.sqrt(2)))).astype(x.dtype)
