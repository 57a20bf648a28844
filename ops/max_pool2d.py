"""max_pool2d: 2-D max pooling (kernel, stride, padding, ceil_mode) in any layout (NCHW, NHWC,
NCHW4c, NCHW8c: see ops/layouts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from ops.layouts import NCHW, Layout, Relayout, layout_of
from ops.onnx_mapping import OnnxOp, check_names, pads, pair, require
from ops.pooling import Pool2d, pool_attrs, pooled_type
from ops.registry import register
from ops.spec import Case, Input, Op, TensorType


def from_onnx_maxpool(attrs: dict[str, Any]) -> dict[str, Any]:
    """ONNX MaxPool -> max_pool2d: 2-D kernel_shape, strides (ONNX default 1, not the kernel),
    pads (`padding_end` where they differ after the axis), ceil_mode, dilations; no Indices
    layout to choose (storage_order)."""
    check_names(
        attrs, ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode", "dilations", "storage_order")
    )
    require(attrs, "storage_order", 0, "only 0 (row-major Indices)")
    before, after = pads(attrs)
    return {
        "kernel": pair(attrs, "kernel_shape", []),
        "stride": pair(attrs, "strides", [1, 1]),
        "padding": before,
        **({"padding_end": after} if after != before else {}),
        "ceil_mode": attrs.get("ceil_mode", 0),
        "dilation": pair(attrs, "dilations", [1, 1]),
    }


def to_onnx_maxpool(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """max_pool2d -> ONNX MaxPool (NCHW only): the stride spelled out (ONNX's default is 1)."""
    if layout_of(attrs) is not NCHW:
        return None
    (kh, kw), (ph, pw) = attrs["kernel"], attrs["padding"]
    return {
        "kernel_shape": [kh, kw],
        "strides": list(attrs["stride"] or (kh, kw)),
        "pads": [ph, pw, *(attrs.get("padding_end") or (ph, pw))],
        "ceil_mode": int(attrs["ceil_mode"]),
        "dilations": list(attrs["dilation"]),
    }


@register
class MaxPool2d(Op):
    """2-D max pooling (NCHW, or `layout`); padding is -inf (floats) or the type minimum (integers)."""

    name = "max_pool2d"
    inputs = (Input("x", min_rank=4, max_rank=5),)  # 5: a packed layout
    attrs = pool_attrs(kernel=2, stride=None, padding=0)
    exact = True
    onnx = (OnnxOp("MaxPool", attrs=from_onnx_maxpool, node_attrs=to_onnx_maxpool),)
    cases = (
        Case(((2, 16, 112, 112),), {"kernel": 3, "stride": 2, "padding": 1}),
        Case(((1, 3, 17, 23),), {"kernel": 2}),
        Case(((2, 5, 9, 11),), {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
        Case(((1, 2, 8, 7),), {"kernel": "3,2", "stride": "1,2", "padding": "1,0"}),
        Case(((1, 1, 5, 5),), {"kernel": 5, "stride": 3, "padding": 2, "ceil_mode": True}),
        Case(((1, 3, 8, 9),), {"kernel": 3, "stride": 2, "padding": 2, "padding_end": "0,1"}),
        Case(((1, 3, 10, 11),), {"kernel": "2,3", "stride": 1, "padding": 1, "dilation": "3,2"}),
        Case((("N", 5, 17, 19),), {"kernel": 3, "stride": 2, "padding": 1}),
        Case(((1, 2, 9, 9, 4),), {"kernel": 3, "stride": 2, "padding": 1, "layout": "NCHW4c"}),
        Case(
            ((2, 2, 11, 10, 8),),
            {"kernel": 3, "stride": 2, "padding": 1, "layout": "NCHW8c", "ceil_mode": True},
        ),
        Case(((2, 9, 11, 7),), {"kernel": "3,2", "stride": "2,1", "padding": "1,0", "layout": "NHWC"}),
    )
    bench = Case(((32, 64, 112, 112),), {"kernel": 3, "stride": 2, "padding": 1})  # 128 MB moved

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return pooled_type("x", inputs[0], Pool2d.from_attrs(attrs))

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        pool = Pool2d.from_attrs(attrs)
        return te.compute(out.shape, pool.windows(x), name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return Pool2d.from_attrs(attrs).reference(x)

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Pooling is what a layout is chosen for: it moves to any layout, unless its input has
        one channel (nothing to pack)."""
        if layout_of(attrs) is not NCHW or inputs[0].shape[1] == 1:
            return None
        return Relayout({**attrs, "layout": layout.name}, (layout,), layout, starts=True)
