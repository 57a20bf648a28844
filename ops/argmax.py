"""argmax: index of the maximum along one axis; ties and NaNs pick the first index like numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import te, tirx

from ops.attrs import Attr, Bool, Choice, Int
from ops.errors import UsageError
from ops.nan import NAN_BITS, is_nan_bits
from ops.registry import register
from ops.spec import Case, Input, Op, TensorType

GPU_LANES = 64
"""Work-items that share one argmax on GPU targets."""
CPU_LANES = 16
"""Partials per output on CPU targets (innermost axis): two AVX2 vectors, four NEON ones; half
as many when that divides the axis and this does not (a ragged end re-reads with gathers)."""


def _argmax_reducer(dtype: str, index_dtype: str) -> Any:
    """(index, value) reducer ordering values descending (NaN highest), then indices ascending."""
    floating = dtype.startswith("float")

    def combine(x: tuple[Any, Any], y: tuple[Any, Any]) -> tuple[Any, Any]:
        (i0, v0), (i1, v1) = x, y
        if floating:
            nan0, nan1 = is_nan_bits(v0, dtype), is_nan_bits(v1, dtype)
            better = tirx.Or(v1 > v0, tirx.And(nan1, tirx.Not(nan0)))
            tie = tirx.Or(v1 == v0, tirx.And(nan1, nan0))
        else:
            better, tie = v1 > v0, v1 == v0
        take = tirx.Or(better, tirx.And(tie, i1 < i0))
        return tirx.Select(take, i1, i0), tirx.Select(take, v1, v0)

    def identity(index_type: str, value_type: str) -> tuple[Any, Any]:
        low = tirx.const(float("-inf"), value_type) if floating else tirx.min_value(value_type)
        return tirx.max_value(index_type), low

    return te.comm_reducer(combine, identity, name="argmax")


def _strided_argmax(x: te.Tensor, out: TensorType, axis: int, keepdims: bool, lanes: int) -> te.Tensor:
    """`lanes` strided partial argmaxes per output (lane l takes elements l, l + lanes, ...),
    then their argmax. Past the end a lane re-reads the last element (no condition) under index
    `extent`, which loses every tie with the real one."""
    extent = int(x.shape[axis])
    keep = 1 if keepdims else 0
    reducer = _argmax_reducer(str(x.dtype), out.dtype)
    steps = te.reduce_axis((0, (extent + lanes - 1) // lanes), name="step")

    def partial(*i: Any) -> Any:
        *outer, lane = i
        k = steps * lanes + lane
        index = (*outer[:axis], tirx.min(k, extent - 1), *outer[axis + keep :])
        position = tirx.Select(k < extent, k, extent).astype(out.dtype)
        return reducer((position, x[index]), axis=steps)

    p_index, p_value = te.compute((*out.shape, lanes), partial, name="argmax_partial")
    lane = te.reduce_axis((0, lanes), name="lane")

    def combine(*i: Any) -> Any:
        return reducer((p_index[(*i, lane)], p_value[(*i, lane)]), axis=lane)

    index, _value = te.compute(out.shape, combine, name="argmax")
    return index


def _max_then_find(x: te.Tensor, out: TensorType, lanes: int) -> te.Tensor:
    """Argmax over the innermost axis as numpy does it: the row's maximum (NaN if any), then
    the first index holding it — two passes of plain vector max/compare/min instead of one
    pass of the (value, index) tie logic. Each pass keeps `lanes` strided partials (a vector)
    that a per-row stage combines; past the end a lane re-reads the last element."""
    *rows, extent = (int(d) for d in x.shape)
    dtype = str(x.dtype)
    floating = dtype.startswith("float")
    steps = (extent + lanes - 1) // lanes

    def element(row: tuple[Any, ...], lane: Any, step: Any) -> Any:
        return x[(*row, tirx.min(step * lanes + lane, extent - 1))]

    def magnitude(value: Any) -> Any:
        itype, mask, _inf = NAN_BITS[dtype]
        return tirx.bitwise_and(tirx.reinterpret(itype, value), tirx.const(mask, itype))

    step = te.reduce_axis((0, steps), name="step")
    if floating:  # the max of the values, and of the magnitudes' bits: NaN above +inf
        pair = te.comm_reducer(
            lambda a, b: (te.max(a[0], b[0]), te.max(a[1], b[1])),
            lambda t0, t1: (tirx.const(float("-inf"), t0), tirx.min_value(t1)),
            name="max_and_nan",
        )

        def partial_max(*i: Any) -> Any:
            value = element(tuple(i[:-1]), i[-1], step)
            return pair((value, magnitude(value)), axis=step)

        p_max, p_mag = te.compute((*rows, lanes), partial_max, name="argmax_partial_max")
        lane = te.reduce_axis((0, lanes), name="lane")
        row_max, row_mag = te.compute(
            tuple(rows), lambda *r: pair((p_max[(*r, lane)], p_mag[(*r, lane)]), axis=lane), name="argmax_max"
        )

        def hit(row: tuple[Any, ...], value: Any) -> Any:
            inf = tirx.const(NAN_BITS[dtype][2], NAN_BITS[dtype][0])
            return tirx.Select(row_mag[row] > inf, magnitude(value) > inf, value == row_max[row])
    else:
        p_max = te.compute(
            (*rows, lanes), lambda *i: te.max(element(tuple(i[:-1]), i[-1], step), axis=step),
            name="argmax_partial_max",
        )  # fmt: skip
        lane = te.reduce_axis((0, lanes), name="lane")
        row_max = te.compute(tuple(rows), lambda *r: te.max(p_max[(*r, lane)], axis=lane), name="argmax_max")

        def hit(row: tuple[Any, ...], value: Any) -> Any:
            return value == row_max[row]

    find = te.reduce_axis((0, steps), name="find")

    def partial_first(*i: Any) -> Any:
        row, position = tuple(i[:-1]), find * lanes + i[-1]
        found = hit(row, element(row, i[-1], find))
        return te.min(tirx.Select(found, position, extent), axis=find)

    p_first = te.compute((*rows, lanes), partial_first, name="argmax_partial_first")
    lane2 = te.reduce_axis((0, lanes), name="lane2")
    first = te.compute(tuple(rows), lambda *r: te.min(p_first[(*r, lane2)], axis=lane2), name="argmax_first")
    kept = len(rows)  # keepdims adds a trailing axis of extent 1
    return te.compute(out.shape, lambda *r: first[r[:kept]].astype(out.dtype), name="argmax")


@register
class Argmax(Op):
    """Index of the maximum along `axis` (first on ties; NaN counts as the maximum like numpy)."""

    name = "argmax"
    inputs = (Input("x", min_rank=1),)
    attrs = (
        Attr("axis", Int(-6, 5), -1, "axis to reduce, negative counts from the end"),
        Attr("keepdims", Bool(), False, "keep the reduced axis with size 1"),
        Attr("out_dtype", Choice(("int64", "int32")), "int64", "index dtype"),
    )
    exact = True
    cases = (
        Case(((32, 1000),)),
        Case(((2, 64, 56, 56),), {"axis": 1}),
        Case(((7, 13, 5),), {"axis": 0, "keepdims": True, "out_dtype": "int32"}),
        Case(((1001,),), {"axis": 0}),
        Case(((3, 4, 1, 6, 2, 3),), {"axis": -4, "keepdims": True}),
        Case(((5, 1),), {"axis": 1, "out_dtype": "int32"}),
    )

    def _axis(self, attrs: dict[str, Any], rank: int) -> int:
        axis = attrs["axis"]
        if not -rank <= axis < rank:
            raise UsageError(
                f"attribute axis={axis}: expected an axis in [{-rank}, {rank - 1}] for rank {rank}"
            )
        return axis % rank

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        shape = inputs[0].shape
        axis = self._axis(attrs, len(shape))
        kept = (1,) if attrs["keepdims"] else ()
        return TensorType((*shape[:axis], *kept, *shape[axis + 1 :]), attrs["out_dtype"])

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        """One reduction, or where that vectorizes or spreads the work better: on GPU targets
        GPU_LANES strided partial argmaxes per output (one per work-item of a work-group), then
        their argmax; on CPU targets over the innermost axis, max-then-find (`_max_then_find`)."""
        rank = len(x.shape)
        axis = self._axis(attrs, rank)
        extent = int(x.shape[axis])
        target = tvm.target.Target.current(allow_none=True)
        if target is not None and "gpu" in target.keys and extent >= 2:
            return _strided_argmax(x, out, axis, attrs["keepdims"], min(GPU_LANES, extent))
        if axis == rank - 1 and extent >= 2 * CPU_LANES:
            exact = [lanes for lanes in (CPU_LANES, CPU_LANES // 2) if extent % lanes == 0]
            return _max_then_find(x, out, exact[0] if exact else CPU_LANES)
        reducer = _argmax_reducer(str(x.dtype), out.dtype)
        keep = 1 if attrs["keepdims"] else 0
        k = te.reduce_axis((0, extent), name="k")

        def body(*i: Any) -> Any:
            index = (*i[:axis], k, *i[axis + keep :])
            return reducer((k.var.astype(out.dtype), x[index]), axis=k)

        index, _value = te.compute(out.shape, body, name="argmax")
        return index

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        axis = self._axis(attrs, x.ndim)
        result = np.argmax(x, axis=axis, keepdims=attrs["keepdims"])
        return result.astype(attrs["out_dtype"])
