"""An image's first transpose, NCHW to NHWC of its 3 channels (data movement: output rows of 3
elements, shorter than a vector), as a user writes it; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.spec import FLOAT_DTYPES


@register
class ImageToNhwc(Op):
    """out[n, h, w, c] = x[n, c, h, w]."""

    name = "image_to_nhwc"
    inputs = (Input("x", 4, 4),)
    dtypes = FLOAT_DTYPES
    exact = True  # moves values only
    cases = (Case(((1, 3, 224, 224),)), Case(((2, 3, 5, 37),)))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        n, c, h, w = inputs[0].shape
        return TensorType((n, h, w, c), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return te.compute(out.shape, lambda n, h, w, c: x[n, c, h, w], name="image_to_nhwc")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
