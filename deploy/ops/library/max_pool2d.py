"""max_pool2d: 2-D max pooling (kernel, stride, padding, ceil_mode) in any layout (NCHW, NHWC,
NCHW4c, NCHW8c: see deploy/ops/layouts.py). ONNX MaxPool imports as it, or by its kernel's rank
as max_pool3d or a 2-D pool between reshapes (`maxpool_by_rank`)."""

from __future__ import annotations

from typing import Any

from deploy.ops.layouts import NCHW, Layout, Relayout, layout_of
from deploy.ops.library.pooling import MaxPooling, pool_attrs
from deploy.ops.onnx_mapping import OnnxOp, OnnxOutput, check_names, pads, per_axis, unsupported
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, TensorType


def from_onnx_maxpool(attrs: dict[str, Any], axes: str = "HW") -> dict[str, Any]:
    """ONNX MaxPool -> max_pool2d (`axes` HW) or max_pool3d (DHW): kernel_shape, strides (ONNX
    default 1, not the kernel), pads (`padding_end` where they differ after the axis),
    ceil_mode, dilations, a value per axis each (storage_order concerns the Indices only)."""
    check_names(
        attrs, ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode", "dilations", "storage_order")
    )
    before, after = pads(attrs, axes)
    ones = [1] * len(axes)
    return {
        "kernel": per_axis(attrs, "kernel_shape", [], axes),
        "stride": per_axis(attrs, "strides", ones, axes),
        "padding": before,
        **({"padding_end": after} if after != before else {}),
        "ceil_mode": attrs.get("ceil_mode", 0),
        "dilation": per_axis(attrs, "dilations", ones, axes),
    }


def maxpool_by_rank(
    attrs: dict[str, Any], shape: tuple[int | None, ...] | None
) -> list[tuple[str, dict[str, Any]]] | None:
    """ONNX MaxPool by its kernel's rank (None: 2-D, max_pool2d alone). 3-D [N, C, D, H, W] is
    max_pool3d, one pass. 1-D [N, C, L] pools [N, C, 1, L] with a 1 x k window between
    reshapes."""
    del shape  # each rank's ops take any input max_pool2d's or max_pool3d's spec does
    kernel = attrs.get("kernel_shape")
    if not isinstance(kernel, list) or len(kernel) not in (1, 2, 3):
        raise unsupported("kernel_shape", kernel, "1, 2 or 3 values (1-D, 2-D or 3-D pooling)")
    rank = len(kernel)
    lists = {"strides": [1] * rank, "dilations": [1] * rank, "pads": [0] * 2 * rank}
    for name, default in lists.items():
        value = attrs.get(name, default)
        if not isinstance(value, list) or len(value) != len(default):
            count = "1 value" if len(default) == 1 else f"{len(default)} values"
            raise unsupported(name, value, f"{count} for the {rank}-D kernel_shape")
        lists[name] = value
    if rank == 2:
        return None
    if rank == 3:
        return [("max_pool3d", from_onnx_maxpool(attrs, "DHW"))]
    (stride,), (dilation,), (begin, end) = lists.values()
    as_2d = {
        **attrs,
        "kernel_shape": [1, kernel[0]],
        "strides": [1, stride],
        "dilations": [1, dilation],
        "pads": [0, begin, 0, end],
    }
    return [
        ("reshape", {"shape": [0, 0, 1, -1]}),
        ("max_pool2d", from_onnx_maxpool(as_2d)),
        ("reshape", {"shape": [0, 0, -1]}),
    ]


def indices_from_onnx(attrs: dict[str, Any]) -> dict[str, Any]:
    """ONNX MaxPool -> max_pool2d_indices, its Indices: max_pool2d's attributes, and storage_order
    (0: each plane numbered row by row, 1: column by column)."""
    order = attrs.get("storage_order", 0)
    if order not in (0, 1):
        raise unsupported("storage_order", order, "0 (row major) or 1 (column major)")
    return {**from_onnx_maxpool(attrs), "column_major": order == 1}


def to_onnx_maxpool(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """max_pool2d (NCHW only) or max_pool3d -> ONNX MaxPool: the stride spelled out (ONNX's
    default is 1)."""
    if "layout" in attrs and layout_of(attrs) is not NCHW:
        return None
    kernel, padding = attrs["kernel"], attrs["padding"]
    return {
        "kernel_shape": list(kernel),
        "strides": list(attrs["stride"] or kernel),
        "pads": [*padding, *(attrs.get("padding_end") or padding)],
        "ceil_mode": int(attrs["ceil_mode"]),
        "dilations": list(attrs["dilation"]),
    }


@register
class MaxPool2d(MaxPooling):
    """2-D max pooling (NCHW, or `layout`); padding is -inf (floats) or the type minimum (integers)."""

    name = "max_pool2d"
    inputs = (Input("x", min_rank=4, max_rank=5),)  # 5: a packed layout
    attrs = pool_attrs(kernel=2, stride=None, padding=0)
    onnx = (
        OnnxOp(
            "MaxPool",
            attrs=from_onnx_maxpool,
            node_attrs=to_onnx_maxpool,
            chain=maxpool_by_rank,
            more_outputs=(OnnxOutput("max_pool2d_indices", indices_from_onnx),),
        ),
    )
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
        Case(((2, 9, 11, 23),), {"kernel": "3,2", "stride": "2,1", "padding": "1,0", "layout": "NHWC"}),
    )
    bench = Case(((32, 64, 112, 112),), {"kernel": 3, "stride": 2, "padding": 1})  # 128 MB moved

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Pooling is what a layout is chosen for: it moves to any layout, unless its input has
        one channel (nothing to pack)."""
        if layout_of(attrs) is not NCHW or inputs[0].shape[1] == 1:
            return None
        return Relayout({**attrs, "layout": layout.name}, (layout,), layout, starts=True)
