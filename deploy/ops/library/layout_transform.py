"""layout_transform: a 4-D image tensor from one layout to another (NCHW, NHWC, NCHW4c, NCHW8c;
see deploy/ops/layouts.py): channels packed (the padding lanes written as 0) or unpacked (the padding
dropped, `channels` saying how many are real)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.ops.layouts import channels_attr, layout_attr, layout_of, real_channels, static_shape
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, Op, TensorType


@register
class LayoutTransform(Op):
    """A tensor from layout `src` to layout `dst` (channels packed by 4 or 8, or unpacked)."""

    name = "layout_transform"
    inputs = (Input("x", min_rank=4, max_rank=5),)
    attrs = (
        layout_attr("src", "layout of the input"),
        layout_attr("dst", "layout of the output"),
        channels_attr(),
    )
    exact = True
    fuses = False
    """A kernel of its own: fused, its neighbour's loops would run one layout and read or write the
    other, under the generic schedule (docs/layouts.md)."""
    cases = (
        Case(((2, 7, 5, 6),), {"src": "NCHW", "dst": "NCHW4c"}),
        Case(((2, 2, 5, 6, 8),), {"src": "NCHW8c", "dst": "NCHW", "channels": 13}),
        Case(((1, 4, 5, 3),), {"src": "NHWC", "dst": "NCHW8c"}),
        Case(((1, 2, 4, 5, 4),), {"src": "NCHW4c", "dst": "NCHW8c", "channels": 6}),
        Case(((3, 4, 5, 6),), {"src": "NCHW", "dst": "NHWC"}),
        Case(((1, 3, 2, 37),), {"src": "NCHW", "dst": "NHWC"}),  # 3 channels, W past whole vectors
        Case(((1, 2, 37, 3),), {"src": "NHWC", "dst": "NCHW"}),  # and back
        Case((("N", 5, 7, 3),), {"src": "NCHW", "dst": "NCHW4c"}),
    )
    bench = Case(((32, 64, 112, 112),), {"src": "NCHW", "dst": "NCHW8c"})  # 206 MB moved

    def _channels(self, attrs: dict[str, Any], shape: tuple[Any, ...]) -> int:
        return real_channels(layout_of(attrs, "src"), shape, attrs["channels"], "input x")

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        src, dst = layout_of(attrs, "src"), layout_of(attrs, "dst")
        x = inputs[0]
        src.check("x", x.shape)
        n, _, h, w = (x.shape[axis] for axis in src.axes)
        return TensorType(dst.shape((n, self._channels(attrs, x.shape), h, w)), x.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """Each output element reads its logical (n, c, h, w) from the input; a padding lane past
        the last channel reads the last channel (no condition on the load) and is written 0."""
        src, dst = layout_of(attrs, "src"), layout_of(attrs, "dst")
        channels = self._channels(attrs, static_shape(x))
        padded = dst.packed and channels % dst.pack != 0

        def body(*index: Any) -> Any:
            n, c, h, w = dst.logical(index)
            if not padded:
                return x[src.index(n, c, h, w)]
            return zero_from(x[src.index(n, tirx.min(c, channels - 1), h, w)], c, channels)

        return te.compute(out.shape, body, name="out")

    def layout_label(self, attrs: dict[str, Any]) -> str | None:
        return f"{attrs['src']} -> {attrs['dst']}"

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        src, dst = layout_of(attrs, "src"), layout_of(attrs, "dst")
        return dst.from_nchw(src.to_nchw(x, self._channels(attrs, x.shape)))


def zero_from(value: Any, c: Any, channels: int) -> Any:
    """TE expression: `value` for channel c < `channels`, else 0, by a bit mask (the sign of
    c - channels, shifted down: -1 below, else 0) in the signed integer of `value`'s width. A
    plain definition with no select: a vector select of 64- or 16-bit values on an index-wide
    condition is mistyped in OpenCL C, and a bit AND vectorizes everywhere."""
    dtype = str(value.dtype)
    itype = f"int{np.dtype(dtype).itemsize * 8}"
    mask = tirx.Cast(itype, tirx.shift_right(c - channels, tirx.const(31, "int32")))
    bits = value if dtype == itype else tirx.reinterpret(itype, value)
    kept = tirx.bitwise_and(bits, mask)
    return kept if dtype == itype else tirx.reinterpret(dtype, kept)
