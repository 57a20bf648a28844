"""add: elementwise a + b with numpy broadcasting (rank 0..6, size-1 dims on either side); in a
packed layout an NCHW operand of one channel broadcasts over every channel (deploy/ops/layouts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops.broadcast import broadcast_index, broadcast_shapes
from deploy.ops.layouts import NCHW, Layout, Relayout, layout_attr, layout_of
from deploy.ops.onnx_mapping import OnnxOp, same_names
from deploy.ops.registry import register
from deploy.ops.spec import ALL_DTYPES, Case, Input, Op, TensorType


@register
class Add(Op):
    """Elementwise a + b with numpy broadcasting; integers wrap like numpy."""

    name = "add"
    inputs = (Input("a", broadcasts=True), Input("b", broadcasts=True))
    attrs = (layout_attr(doc="layout of the operands: in a packed one, an NCHW [N, 1, H, W] broadcasts"),)
    dtypes = ALL_DTYPES
    onnx = (  # refuses opset-6 `broadcast`/`axis`; ONNX has no packed layout
        OnnxOp("Add", attrs=same_names(), node_attrs=lambda attrs: {} if layout_of(attrs) is NCHW else None),
    )
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
        Case(((2, 2, 5, 6, 4), (2, 1, 5, 6)), {"layout": "NCHW4c"}),
        Case(((1, 3, 4, 7, 8), (1, 3, 1, 1, 8)), {"layout": "NCHW8c"}),
    )
    bench = Case(((32, 64, 112, 112), (32, 64, 112, 112)))  # 308 MB moved

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        layout = layout_of(attrs)
        shapes = [(name, as_broadcast(layout, name, t.shape)) for name, t in zip("ab", inputs, strict=True)]
        out = broadcast_shapes(shapes)
        if layout.packed:
            layout.check("of add", out, what="the output")
        return TensorType(out, inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, a: te.Tensor, b: te.Tensor) -> te.Tensor:
        """An operand of lower rank than a packed output is NCHW with one channel: it is indexed
        by the output's first four indices (its C, of size 1, at 0)."""

        packed = layout_of(attrs).packed

        def operand(x: te.Tensor, i: tuple[Any, ...]) -> Any:
            return x[broadcast_index(x.shape, i[:4] if packed and len(x.shape) == 4 else i)]

        return te.compute(out.shape, lambda *i: operand(a, i) + operand(b, i), name="out")

    def reference(self, attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
        layout = layout_of(attrs)
        a, b = (x.reshape(as_broadcast(layout, "x", x.shape)) for x in (a, b))
        return np.add(a, b, dtype=a.dtype)

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """Image operands (rank 4) of which one at least has more than one channel: those move
        to `layout`; in a packed one, an operand of one channel stays NCHW, which broadcasts
        over every lane (`as_broadcast`)."""
        if layout_of(attrs) is not NCHW or any(len(t.shape) != 4 for t in inputs):
            return None
        many = [t.shape[1] != 1 for t in inputs]
        if not any(many):
            return None
        operands = tuple(layout if m or not layout.packed else NCHW for m in many)
        return Relayout({**attrs, "layout": layout.name}, operands, layout)


def as_broadcast(layout: Layout, name: str, shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """The shape an operand broadcasts as in `layout`: as given, except that a packed layout
    reads an NCHW operand of one channel, [N, 1, H, W], as [N, 1, H, W, 1]; in a packed layout
    any other operand must be packed (rank 5)."""
    if not layout.packed or len(shape) == 5:
        return shape
    if len(shape) == 4 and shape[1] == 1:
        return (*shape, 1)
    raise UsageError(
        f"input {name} has shape {list(shape)}: in {layout.name} an operand is packed (rank 5) or"
        " NCHW with one channel [N, 1, H, W]; pack it with layout_transform"
    )
