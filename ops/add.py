"""add: elementwise a + b with numpy broadcasting (rank 0..6, size-1 dims on either side)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from ops.broadcast import broadcast_index, broadcast_shapes
from ops.onnx_mapping import OnnxOp, same_names
from ops.registry import register
from ops.spec import Case, Input, Op, TensorType


@register
class Add(Op):
    """Elementwise a + b with numpy broadcasting; integers wrap like numpy."""

    name = "add"
    inputs = (Input("a", broadcasts=True), Input("b", broadcasts=True))
    onnx = (OnnxOp("Add", attrs=same_names()),)  # refuses opset-6 `broadcast`/`axis`
    cases = (
        Case(((32, 64, 56, 56), (32, 1, 56, 56))),
        Case(((7, 13), (7, 13))),
        Case(((3, 1, 5), (1, 4, 1))),
        Case(((2, 3, 4, 5), (5,))),
        Case(((), (17,))),
        Case(((1, 2, 1, 3, 1, 2), (2, 1, 3, 1, 5, 1))),
        Case(((1001,), (1,))),
        Case((("N", 8, 9, 10), ("N", 1, 9, 10))),
        Case((("N", 3, 5), (1, 3, 5))),
    )
    bench = Case(((32, 64, 112, 112), (32, 64, 112, 112)))  # 308 MB moved

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        a, b = inputs
        return TensorType(broadcast_shapes([("a", a.shape), ("b", b.shape)]), a.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, a: te.Tensor, b: te.Tensor) -> te.Tensor:
        return te.compute(
            out.shape,
            lambda *i: a[broadcast_index(a.shape, i)] + b[broadcast_index(b.shape, i)],
            name="out",
        )

    def reference(self, attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=a.dtype)
