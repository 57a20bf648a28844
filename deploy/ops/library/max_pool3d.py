"""max_pool3d: 3-D max pooling of NCDHW (kernel, stride, padding, ceil_mode, dilation, a value per
D, H and W), in one pass over the input: ONNX MaxPool with a 3-D kernel_shape imports as it
(`max_pool2d.py`'s `maxpool_by_rank`). The windows are `Pool`'s, as max_pool2d's."""

from __future__ import annotations

from typing import Any

from deploy.ops.library.max_pool2d import to_onnx_maxpool
from deploy.ops.library.pooling import MaxPooling, pool_attrs
from deploy.ops.onnx_mapping import OnnxNode
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, TensorType


@register
class MaxPool3d(MaxPooling):
    """3-D max pooling of NCDHW; padding is -inf (floats) or the type minimum (integers), a NaN in
    a window makes its max NaN."""

    name = "max_pool3d"
    inputs = (Input("x", min_rank=5, max_rank=5),)
    attrs = pool_attrs(kernel=2, stride=None, padding=0, axes="DHW")
    cases = (
        Case(((2, 3, 7, 12, 19),), {"kernel": 3, "stride": 2, "padding": 1}),
        Case(
            ((1, 2, 5, 6, 9),), {"kernel": "2,3,2", "stride": "1,2,2", "padding": "1,1,0", "ceil_mode": True}
        ),
        Case(((1, 2, 6, 7, 8),), {"kernel": 2, "stride": 1, "padding": "0,1,1", "padding_end": "1,0,1"}),
        Case(((1, 1, 7, 6, 9),), {"kernel": "2,2,3", "stride": 1, "padding": 1, "dilation": "3,2,2"}),
        Case((("N", 2, 4, 9, 10),), {"kernel": 3, "stride": 2, "padding": 1}),
    )
    bench = Case(((8, 32, 16, 56, 56),), {"kernel": 3, "stride": 2, "padding": 1})  # 51 MB read

    def onnx_baseline(self, attrs: dict[str, Any], inputs: list[TensorType]) -> OnnxNode | None:
        """ONNX MaxPool, which imports as this op through max_pool2d's mapping (one op per ONNX
        op type)."""
        return OnnxNode("MaxPool", to_onnx_maxpool(attrs) or {})
