"""max_pool2d: 2-D max pooling (kernel, stride, padding, ceil_mode) in any layout (NCHW, NHWC,
NCHW4c, NCHW8c: see deploy/ops/layouts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.ops.layouts import NCHW, Layout, Relayout, layout_of
from deploy.ops.library.pooling import Pool2d, max_pool2d_compute, pool_attrs, pooled_type
from deploy.ops.onnx_mapping import OnnxOp, OnnxOutput, check_names, pads, pair, unsupported
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, Op, TensorType


def from_onnx_maxpool(attrs: dict[str, Any]) -> dict[str, Any]:
    """ONNX MaxPool -> max_pool2d: 2-D kernel_shape, strides (ONNX default 1, not the kernel),
    pads (`padding_end` where they differ after the axis), ceil_mode, dilations (storage_order
    concerns the Indices only)."""
    check_names(
        attrs, ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode", "dilations", "storage_order")
    )
    before, after = pads(attrs)
    return {
        "kernel": pair(attrs, "kernel_shape", []),
        "stride": pair(attrs, "strides", [1, 1]),
        "padding": before,
        **({"padding_end": after} if after != before else {}),
        "ceil_mode": attrs.get("ceil_mode", 0),
        "dilation": pair(attrs, "dilations", [1, 1]),
    }


def maxpool_as_2d(
    attrs: dict[str, Any], shape: tuple[int | None, ...] | None
) -> list[tuple[str, dict[str, Any]]] | None:
    """1-D and 3-D ONNX MaxPool as 2-D pools between reshapes (None: a 2-D one, max_pool2d
    alone; any rank: each list as long as the kernel's). 1-D [N, C, L] pools [N, C, 1, L] with a
    1 x k window; 3-D [N, C, D, H, W] pools H and W of [N, C * D, H, W], then D of
    [N, C, D, OH * OW] with a k x 1 window: a max over a box is the max over D of the maxes over
    H and W, and each axis's output size depends on that axis alone. A 3-D pool needs C, D, H
    and W known (a symbolic batch is fine)."""
    kernel = attrs.get("kernel_shape")
    if not isinstance(kernel, list) or len(kernel) not in (1, 2, 3):
        raise unsupported("kernel_shape", kernel, "1, 2 or 3 values (1-D, 2-D or 3-D pooling)")
    rank = len(kernel)
    lists = {
        "kernel_shape": kernel,
        "strides": attrs.get("strides", [1] * rank),
        "dilations": attrs.get("dilations", [1] * rank),
        "pads": attrs.get("pads", [0] * 2 * rank),
    }
    for name, value in lists.items():
        wanted = 2 * rank if name == "pads" else rank
        if not isinstance(value, list) or len(value) != wanted:
            count = "1 value" if wanted == 1 else f"{wanted} values"
            raise unsupported(name, value, f"{count} for the {rank}-D kernel_shape")
    if rank == 2:
        return None
    pads_ = lists["pads"]
    per_axis = [
        {"kernel": k, "stride": s, "dilation": d, "padding": p, "padding_end": e}
        for k, s, d, p, e in zip(
            kernel, lists["strides"], lists["dilations"], pads_[:rank], pads_[rank:], strict=True
        )
    ]
    plain = {n: v for n, v in attrs.items() if n not in lists}

    def pool(h: dict[str, Any] | None, w: dict[str, Any] | None) -> dict[str, Any]:
        """max_pool2d over H with axis `h`'s window and W with `w`'s (None: a window of 1)."""
        one = {"kernel": 1, "stride": 1, "dilation": 1, "padding": 0, "padding_end": 0}
        h, w = h or one, w or one
        return from_onnx_maxpool(
            {
                **plain,
                **{
                    onnx: [h[ours], w[ours]]
                    for onnx, ours in (
                        ("kernel_shape", "kernel"),
                        ("strides", "stride"),
                        ("dilations", "dilation"),
                    )
                },
                "pads": [h["padding"], w["padding"], h["padding_end"], w["padding_end"]],
            }
        )

    if rank == 1:
        return [
            ("reshape", {"shape": [0, 0, 1, -1]}),
            ("max_pool2d", pool(None, per_axis[0])),
            ("reshape", {"shape": [0, 0, -1]}),
        ]
    known = [size for size in shape[1:] if size is not None] if shape is not None and len(shape) == 5 else []
    if len(known) != 4:
        raise unsupported("kernel_shape", kernel, "3-D pooling of an input whose C, D, H and W are known")
    channels, depth, height, width = known
    over_hw = pool(per_axis[1], per_axis[2])
    hw = Pool2d.from_attrs({**over_hw, "layout": "NCHW"})
    oh, ow = hw.out_size(0, height), hw.out_size(1, width)
    return [
        ("reshape", {"shape": [0, channels * depth, height, width]}),
        ("max_pool2d", over_hw),
        ("reshape", {"shape": [0, channels, depth, oh * ow]}),
        ("max_pool2d", pool(per_axis[0], None)),
        ("reshape", {"shape": [0, channels, -1, oh, ow]}),
    ]


def indices_from_onnx(attrs: dict[str, Any]) -> dict[str, Any]:
    """ONNX MaxPool -> max_pool2d_indices, its Indices: max_pool2d's attributes, and storage_order
    (0: each plane numbered row by row, 1: column by column)."""
    order = attrs.get("storage_order", 0)
    if order not in (0, 1):
        raise unsupported("storage_order", order, "0 (row major) or 1 (column major)")
    return {**from_onnx_maxpool(attrs), "column_major": order == 1}


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
    onnx = (
        OnnxOp(
            "MaxPool",
            attrs=from_onnx_maxpool,
            node_attrs=to_onnx_maxpool,
            chain=maxpool_as_2d,
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
        Case(((2, 9, 11, 7),), {"kernel": "3,2", "stride": "2,1", "padding": "1,0", "layout": "NHWC"}),
    )
    bench = Case(((32, 64, 112, 112),), {"kernel": 3, "stride": 2, "padding": 1})  # 128 MB moved

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return pooled_type("x", inputs[0], Pool2d.from_attrs(attrs))

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return max_pool2d_compute(attrs, out, x)

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return Pool2d.from_attrs(attrs).reference(x)

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Pooling is what a layout is chosen for: it moves to any layout, unless its input has
        one channel (nothing to pack)."""
        if layout_of(attrs) is not NCHW or inputs[0].shape[1] == 1:
            return None
        return Relayout({**attrs, "layout": layout.name}, (layout,), layout, starts=True)
