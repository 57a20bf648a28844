"""hard_swish: x * relu6(x + 3) / 6 (MobileNetV3), as a user adds it: no schedule of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class HardSwish(Op):
    """x * relu6(x + 3) / 6, elementwise."""

    name = "hard_swish"
    inputs = (Input("x"),)
    dtypes = FLOAT_DTYPES
    cases = (Case(((1, 116, 28, 28),)), Case(((7, 13),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        def body(*i: Any) -> Any:
            v = x[i]
            zero, three, six = (tirx.const(c, v.dtype) for c in (0, 3, 6))
            return v * te.min(te.max(v + three, zero), six) / six

        return te.compute(out.shape, body, name="hard_swish")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x * np.clip(x + 3, 0, 6) / 6
