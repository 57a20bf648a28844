"""argmax: index of the maximum along one axis; ties and NaNs pick the first index like numpy (the
last with `select_last`, as ONNX's select_last_index=1). In NHWC or a packed layout
(deploy/ops/layouts.py) it reduces the channel axis, skipping padding lanes."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops.attrs import Attr, Bool, Choice, Int
from deploy.ops.layouts import (
    NCHW,
    Layout,
    Relayout,
    channels_attr,
    layout_attr,
    layout_of,
    real_channels,
    static_shape,
)
from deploy.ops.library.argmax_compute import along_one_axis, argmax_reducer
from deploy.ops.onnx_mapping import OnnxOp, check_names
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, Op, TensorType, is_symbolic


def from_onnx_argmax(attrs: dict[str, Any]) -> dict[str, Any]:
    """ONNX ArgMax -> argmax: axis (default 0), keepdims (default 1), select_last_index (default
    0: the first index on ties), int64 indices."""
    check_names(attrs, ("axis", "keepdims", "select_last_index"))
    return {
        "axis": attrs.get("axis", 0),
        "keepdims": attrs.get("keepdims", 1),
        "select_last": attrs.get("select_last_index", 0),
        "out_dtype": "int64",
    }


def to_onnx_argmax(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """argmax -> ONNX ArgMax: NCHW with int64 indices only (ONNX's are int64)."""
    if not along_one_axis(attrs) or attrs["out_dtype"] != "int64":
        return None
    return {
        "axis": attrs["axis"],
        "keepdims": int(attrs["keepdims"]),
        "select_last_index": int(attrs["select_last"]),
    }


@register
class Argmax(Op):
    """Index of the maximum along `axis` (first on ties, or last with `select_last`; NaN counts as
    the maximum like numpy)."""

    name = "argmax"
    inputs = (Input("x", min_rank=1),)
    attrs = (
        Attr("axis", Int(-6, 5), -1, "axis to reduce, negative counts from the end"),
        Attr("keepdims", Bool(), False, "keep the reduced axis with size 1"),
        Attr("select_last", Bool(), False, "on ties (and among NaNs) the last index, not the first"),
        Attr("out_dtype", Choice(("int64", "int32")), "int64", "index dtype"),
        layout_attr(doc="layout of the input; other than NCHW, axis=1 (NCHW's C) is reduced"),
        channels_attr(),
    )
    exact = True
    onnx = (OnnxOp("ArgMax", attrs=from_onnx_argmax, node_attrs=to_onnx_argmax),)
    cases = (
        Case(((32, 1000),)),
        Case(((2, 64, 56, 56),), {"axis": 1}),
        Case(((7, 13, 5),), {"axis": 0, "keepdims": True, "out_dtype": "int32"}),
        Case(((1001,),), {"axis": 0}),
        Case(((3, 4, 1, 6, 2, 3),), {"axis": -4, "keepdims": True}),
        Case(((5, 1),), {"axis": 1, "out_dtype": "int32"}),
        Case((("N", 3, 40),), {"axis": -1}),
        Case(((2, 2, 5, 6, 4),), {"axis": 1, "layout": "NCHW4c", "channels": 7}),
        Case(((1, 5, 3, 9),), {"axis": 1, "layout": "NHWC", "keepdims": True}),
        Case(((7, 45),), {"select_last": True}),
        Case(((3, 37, 5),), {"axis": 1, "keepdims": True, "select_last": True}),
    )
    bench = Case(((256, 100_000),), {"axis": -1})  # 102 MB read

    def _axis(self, attrs: dict[str, Any], rank: int) -> int:
        axis = attrs["axis"]
        if not -rank <= axis < rank:
            raise UsageError(
                f"attribute axis={axis}: expected an axis in [{-rank}, {rank - 1}] for rank {rank}"
            )
        return axis % rank

    def _channels(self, attrs: dict[str, Any], shape: tuple[Any, ...]) -> int:
        """The channels reduced in a layout other than NCHW; a one-line error for another axis."""
        layout = layout_of(attrs)
        layout.check("x", shape)
        if attrs["axis"] not in (1, -3):
            raise UsageError(
                f"attribute axis={attrs['axis']}: in {layout.name} argmax reduces the channels,"
                " expected axis=1 (NCHW's C)"
            )
        return real_channels(layout, shape, attrs["channels"], "input x")

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        shape = inputs[0].shape
        layout = layout_of(attrs)
        if layout is not NCHW:
            self._channels(attrs, shape)
            n, _, h, w = (shape[axis] for axis in layout.axes)
            return TensorType((n, 1, h, w) if attrs["keepdims"] else (n, h, w), attrs["out_dtype"])
        if attrs["channels"] is not None:
            raise UsageError(
                f"attribute channels={attrs['channels']}: expected it only with a layout other than NCHW"
            )
        axis = self._axis(attrs, len(shape))
        if is_symbolic(shape[axis]):
            raise UsageError(
                f"attribute axis={attrs['axis']} reduces the symbolic batch {shape[axis]}:"
                " expected a static axis"
            )
        kept = (1,) if attrs["keepdims"] else ()
        return TensorType((*shape[:axis], *kept, *shape[axis + 1 :]), attrs["out_dtype"])

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """One reduction along the axis (in NCHW; else over the channels, wherever the layout
        keeps channel k). Targets pair their schedules with forms that vectorize or spread better
        along one axis of NCHW (`argmax_compute.py`; their choice: deploy/schedules/cpu/argmax.py
        and gpu/argmax.py)."""
        rank = len(x.shape)
        layout = layout_of(attrs)
        reducer = argmax_reducer(str(x.dtype), attrs["select_last"])
        keep = 1 if attrs["keepdims"] else 0
        if layout is not NCHW:  # the channels, out (n, [0,] h, w): k's element is wherever c=k is
            k = te.reduce_axis((0, self._channels(attrs, static_shape(x))), name="k")

            def at(*i: Any) -> tuple[Any, ...]:
                return layout.index(i[0], k, i[1 + keep], i[2 + keep])
        else:
            axis = self._axis(attrs, rank)
            k = te.reduce_axis((0, int(x.shape[axis])), name="k")

            def at(*i: Any) -> tuple[Any, ...]:
                return (*i[:axis], k, *i[axis + keep :])

        def body(*i: Any) -> Any:
            return reducer((k.var.astype(out.dtype), x[at(*i)]), axis=k)

        index, _value = te.compute(out.shape, body, name="argmax")
        return index

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        layout = layout_of(attrs)
        if layout is not NCHW:
            x, axis = layout.to_nchw(x, self._channels(attrs, x.shape)), 1
        else:
            axis = self._axis(attrs, x.ndim)
        if attrs["select_last"]:  # the first in the flipped array, counted from the end
            flipped = np.argmax(np.flip(x, axis), axis=axis, keepdims=attrs["keepdims"])
            return (x.shape[axis] - 1 - flipped).astype(attrs["out_dtype"])
        result = np.argmax(x, axis=axis, keepdims=attrs["keepdims"])
        return result.astype(attrs["out_dtype"])

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Argmax over an image's channels reads them in any layout, the padding lanes skipped
        (`channels`); its output has no channels, NCHW's `[N, H, W]` or `[N, 1, H, W]`."""
        if layout_of(attrs) is not NCHW or len(inputs[0].shape) != 4 or attrs["axis"] not in (1, -3):
            return None
        channels = inputs[0].shape[1] if layout.packed else None
        return Relayout({**attrs, "layout": layout.name, "channels": channels}, (layout,), NCHW)
