"""maxpool_add: dst = add(max_pool2d(a), b) as one fused kernel, b broadcast numpy-style."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from ops.broadcast import broadcast_index, broadcast_shapes
from ops.pooling import Pool2d, pool_attrs, pooled_type
from ops.registry import register
from ops.spec import Case, Input, Op, TensorType


@register
class MaxPoolAdd(Op):
    """max_pool2d(a) + b in one pass: each output reads its window of a and one b value."""

    name = "maxpool_add"
    inputs = (Input("a", min_rank=4, max_rank=4), Input("b", broadcasts=True))
    attrs = pool_attrs(kernel=3, stride=2, padding=1)
    cases = (
        Case(((4, 64, 112, 112), (4, 1, 56, 56))),
        Case(((2, 8, 17, 23), (2, 8, 9, 12))),
        Case(((1, 3, 9, 9), (5,))),
        Case(((2, 1, 10, 10), (2, 4, 5, 5))),
        Case(((1, 2, 7, 8), ()), {"kernel": 2, "stride": 1, "padding": 0, "ceil_mode": True}),
        Case(
            ((1, 2, 11, 11), (1, 2, 1, 1)),
            {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        ),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        a, b = inputs
        pooled = pooled_type("a", a, Pool2d.from_attrs(attrs))
        shape = broadcast_shapes([("max_pool2d(a)", pooled.shape), ("b", b.shape)])
        return TensorType(shape, a.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, a: te.Tensor, b: te.Tensor) -> te.Tensor:
        pool = Pool2d.from_attrs(attrs)
        pooled_shape = pool.output_shape("a", tuple(int(d) for d in a.shape))
        b_shape = tuple(int(d) for d in b.shape)
        window_max = pool.windows(a)

        def body(*i: Any) -> Any:
            n, c, h, w = broadcast_index(pooled_shape, i)
            return window_max(n, c, h, w) + b[broadcast_index(b_shape, i)]

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(Pool2d.from_attrs(attrs).reference(a), b, dtype=a.dtype)
