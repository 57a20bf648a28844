"""reshape: the same elements, in row-major order, under another shape, given as ONNX Reshape's
`shape` input is (0 keeps the input's dim at that position, -1 once takes what is left). Graphs get
it where an ONNX node runs as other ops (1-D and 3-D pooling as 2-D pools: `max_pool2d.py`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops.attrs import Attr, Ints
from deploy.ops.layouts import static_shape
from deploy.ops.registry import register
from deploy.ops.spec import MAX_ELEMENTS, Case, Dim, Input, Op, TensorType, is_symbolic


def reshaped(shape: tuple[Dim, ...], given: tuple[int, ...]) -> tuple[Dim, ...]:
    """The dims `given` means for an input of `shape`; a symbolic dim of the input must be kept
    by a 0 at its position (its size is known only when a module runs)."""
    where = f"shape {list(given)}"
    if given.count(-1) > 1:
        raise UsageError(f"{where}: expected at most one -1 (the dim that takes what is left)")
    for position, dim in enumerate(shape):
        if is_symbolic(dim) and (position >= len(given) or given[position] != 0):
            raise UsageError(f"{where}: expected 0 at position {position}, keeping the symbolic dim {dim}")
    dims = []
    for position, size in enumerate(given):
        if size == 0 and position >= len(shape):
            raise UsageError(f"{where}: 0 at position {position} keeps no dim of the input {_shown(shape)}")
        dims.append(shape[position] if size == 0 else size)
    elements = math.prod(d for d in shape if not is_symbolic(d))
    known = math.prod(d for d in dims if not is_symbolic(d) and d != -1)
    if -1 in dims:
        if known == 0 or elements % known:
            raise UsageError(f"{where}: no size for -1 holds the {elements} elements of {_shown(shape)}")
        dims[dims.index(-1)] = elements // known
    elif known != elements:
        raise UsageError(f"{where}: expected {elements} elements, as the input {_shown(shape)}, not {known}")
    return tuple(dims)


def _shown(shape: tuple[Dim, ...]) -> str:
    return str([d if isinstance(d, int) else str(d) for d in shape])


@register
class Reshape(Op):
    """The input's elements in row-major order, under the shape `shape` says."""

    name = "reshape"
    inputs = (Input("x"),)
    view = True
    attrs = (
        Attr(
            "shape",
            Ints(-1, MAX_ELEMENTS, most=6),
            (-1,),
            "dims: 0 keeps the input's at that position, -1 (once) takes what is left",
        ),
    )
    exact = True
    cases = (
        Case(((2, 3, 5, 7),), {"shape": "0,-1,7"}),
        Case((("N", 6, 35),), {"shape": "0,2,3,1,35"}),
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return TensorType(reshaped(inputs[0].shape, attrs["shape"]), inputs[0].dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """Each output element's row-major position, taken apart by the input's dims (the first
        dim by division alone, so a symbolic batch first in both is never divided by)."""
        dims = static_shape(x)

        def body(*i: Any) -> Any:
            flat = 0
            for index, size in zip(i, out.shape, strict=True):
                flat = flat * size + index
            index = []
            for size in reversed(dims[1:]):
                index.append(tirx.floormod(flat, size))
                flat = tirx.floordiv(flat, size)
            return x[(flat, *reversed(index))] if dims else x[()]

        return te.compute(out.shape, body, name="out")

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x.reshape(reshaped(x.shape, attrs["shape"]))
