"""argmax: index of the maximum along one axis; ties and NaNs pick the first index like numpy (the
last with `select_last`, as ONNX's select_last_index=1). In NHWC or a packed layout
(deploy/ops/layouts.py) it reduces the channel axis, skipping padding lanes."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

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
from deploy.ops.nan import is_nan_bits
from deploy.ops.onnx_mapping import OnnxOp, check_names
from deploy.ops.registry import register
from deploy.ops.spec import Case, Input, Op, TensorType, is_symbolic


def _lowest(value_type: str) -> Any:
    """The identity value of a max: -inf for floats, the type minimum for integers."""
    return (
        tirx.const(float("-inf"), value_type)
        if value_type.startswith("float")
        else tirx.min_value(value_type)
    )


def _argmax_reducer(dtype: str, last: bool) -> Any:
    """(index, value) reducer ordering values descending (NaN highest), then indices ascending
    (descending when `last`: the last index on ties wins)."""
    floating = dtype.startswith("float")

    def combine(x: tuple[Any, Any], y: tuple[Any, Any]) -> tuple[Any, Any]:
        (i0, v0), (i1, v1) = x, y
        if floating:
            nan0, nan1 = is_nan_bits(v0, dtype), is_nan_bits(v1, dtype)
            better = tirx.Or(v1 > v0, tirx.And(nan1, tirx.Not(nan0)))
            tie = tirx.Or(v1 == v0, tirx.And(nan1, nan0))
        else:
            better, tie = v1 > v0, v1 == v0
        take = tirx.Or(better, tirx.And(tie, i1 > i0 if last else i1 < i0))
        return tirx.Select(take, i1, i0), tirx.Select(take, v1, v0)

    def identity(index_type: str, value_type: str) -> tuple[Any, Any]:  # an index every tie beats
        return tirx.min_value(index_type) if last else tirx.max_value(index_type), _lowest(value_type)

    return te.comm_reducer(combine, identity, name="argmax")


def _keep_greatest(dtype: str, last: bool) -> Any:
    """(value, position) reducer of a scan in order: keeps a value only when strictly greater (or
    the first NaN), no tie test; where `last`, when greater or equal (or any NaN, a number never
    replacing one). Its identity is (minimum, 0)."""
    floating = dtype.startswith("float")

    def keep_greatest(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
        take = b[0] >= a[0] if last else b[0] > a[0]
        if floating:
            nan_b = is_nan_bits(b[0], dtype)
            take = tirx.Or(take, nan_b if last else tirx.And(nan_b, tirx.Not(is_nan_bits(a[0], dtype))))
        return tirx.Select(take, b[0], a[0]), tirx.Select(take, b[1], a[1])

    def identity(value_type: str, index_type: str) -> tuple[Any, Any]:
        return _lowest(value_type), tirx.const(0, index_type)

    return te.comm_reducer(keep_greatest, identity, name="keep_greatest")


def strided_argmax(
    x: te.Tensor, out: TensorType, axis: int, keepdims: bool, lanes: int, last: bool = False
) -> te.Tensor:
    """`lanes` strided partial argmaxes per output (lane l takes elements l, l + lanes, ...),
    then their argmax (the last index on ties where `last`). Past the end a lane re-reads the
    last element (no condition) under index `extent` (-1 where `last`), which loses every tie
    with the real one."""
    extent = int(x.shape[axis])
    keep = 1 if keepdims else 0
    reducer = _argmax_reducer(str(x.dtype), last)
    beyond = -1 if last else extent
    steps = te.reduce_axis((0, (extent + lanes - 1) // lanes), name="step")

    def partial(*i: Any) -> Any:
        *outer, lane = i
        k = steps * lanes + lane
        index = (*outer[:axis], tirx.min(k, extent - 1), *outer[axis + keep :])
        position = tirx.Select(k < extent, k, beyond).astype(out.dtype)
        return reducer((position, x[index]), axis=steps)

    p_index, p_value = te.compute((*out.shape, lanes), partial, name="argmax_partial")
    lane = te.reduce_axis((0, lanes), name="lane")

    def combine(*i: Any) -> Any:
        return reducer((p_index[(*i, lane)], p_value[(*i, lane)]), axis=lane)

    index, _value = te.compute(out.shape, combine, name="argmax")
    return index


def vector_strided_argmax(
    x: te.Tensor, out: TensorType, lanes: int, width: int, last: bool = False
) -> te.Tensor:
    """Argmax over the innermost axis (extent a multiple of `width`) as `lanes` x `width` strided
    partials per row: lane l reads the `width` consecutive elements of vector l, l + lanes, ...
    (one vector load a step), each of its `width` partials keeping its strictly greatest value
    (or first NaN) with an int32 position, then their argmax in `out.dtype`. Positions stay
    int32 so that a vector select's mask (the value compare's: int4 for float4) is as wide as
    the positions it picks between, as OpenCL's `select` requires. A partial that never moves
    off the identity reports (minimum, 0), which only wins when the whole row is the minimum,
    where 0 is the answer. Past the end a lane re-reads the last vector under its own positions,
    after every element it reads in place: no partial then drops the first maximum it holds
    (nothing is greater), and one that takes a re-read maximum takes a real pair. Where `last`:
    a partial keeps a value greater or equal (or any NaN, a number never replacing one): its
    last, which a re-read of the last vector never moves below; the argmax takes the last index.
    (A re-read under a position past the end would need a select on a scalar test, which TVM
    prints as a vector of 0/1 where OpenCL reads the mask's top bit.)"""
    *rows, inner = x.shape
    extent = int(inner)
    vectors = extent // width
    dtype = str(x.dtype)
    scan = _keep_greatest(dtype, last)
    step = te.reduce_axis((0, -(-vectors // lanes)), name="step")

    def partial(*i: Any) -> Any:
        *outer, lane, element = i
        vector = step * lanes + lane
        if vectors % lanes:
            vector = tirx.min(vector, vectors - 1)
        position = vector * width + element
        return scan((x[(*outer, position)], position), axis=step)

    p_value, p_index = te.compute((*rows, lanes, width), partial, name="argmax_partial")
    reducer = _argmax_reducer(dtype, last)
    lane = te.reduce_axis((0, lanes), name="lane")
    element = te.reduce_axis((0, width), name="element")
    kept = len(rows)  # keepdims adds a trailing axis of extent 1

    def combine(*r: Any) -> Any:
        at = (*r[:kept], lane, element)
        return reducer((p_index[at].astype(out.dtype), p_value[at]), axis=[lane, element])

    index, _value = te.compute(out.shape, combine, name="argmax")
    return index


def sliced_argmax(
    x: te.Tensor, out: TensorType, axis: int, keepdims: bool, slices: int, last: bool = False
) -> te.Tensor:
    """Argmax over a non-innermost `axis` in up to `slices` contiguous slices of it, then their
    argmax: a stage `argmax_slice` (x's shape with `axis` -> the slices) scans each slice in
    order, keeping a value only when strictly greater (or the first NaN), with its int32
    position: no tie test, half the index traffic of int64, so 8 lanes a step on AVX2. The slices
    can run on separate threads when the axes around `axis` are too small to split. A slice
    that never moves off the identity reports (minimum, 0), which only wins when every slice
    holds just the minimum, where 0 is the answer. Where `last`, a slice keeps a value when
    greater or equal (or any NaN, a number never replacing one): its last maximum, and the
    slices' argmax takes the last of them."""
    extent = int(x.shape[axis])
    per = -(-extent // slices)
    slices = -(-extent // per)  # every slice holds a real element
    keep = 1 if keepdims else 0
    dtype = str(x.dtype)
    scan = _keep_greatest(dtype, last)
    row = te.reduce_axis((0, per), name="row")

    def partial(*i: Any) -> Any:
        k = i[axis] * per + row
        if extent % per:  # the last slice re-reads the last element, never strictly greater
            k = tirx.min(k, extent - 1)
        return scan((x[(*i[:axis], k, *i[axis + 1 :])], k.astype("int32")), axis=row)

    shape = (*x.shape[:axis], slices, *x.shape[axis + 1 :])
    p_value, p_index = te.compute(shape, partial, name="argmax_slice")
    reducer = _argmax_reducer(dtype, last)
    part = te.reduce_axis((0, slices), name="part")

    def combine(*i: Any) -> Any:
        at = (*i[:axis], part, *i[axis + keep :])
        return reducer((p_index[at].astype(out.dtype), p_value[at]), axis=part)

    index, _value = te.compute(out.shape, combine, name="argmax")
    return index


def max_then_find(x: te.Tensor, out: TensorType, lanes: int, last: bool = False) -> te.Tensor:
    """Argmax over the innermost axis in one vector pass: `lanes` strided partials per row, each
    keeping its strictly greatest value with that value's position (so its first) and the
    position of its first NaN; a per-row stage then takes the first NaN if any, else the
    greatest value's first position. A lane that never moves off the identity reports (minimum,
    0), which only wins when the whole row is the minimum, where 0 is the answer. Past the end
    a lane re-reads the last element under a position past the end, which loses every tie.

    Where `last`: each lane keeps a value greater or equal (its last maximum) and its last NaN's
    position, a position past the end is -1, and the row takes the last NaN, else the greatest
    value's last position. A lane's re-read past the end may replace its maximum with the last
    element under -1, which then loses its tie with the lane that holds the last element."""
    *rows, inner = x.shape
    extent = int(inner)
    dtype = str(x.dtype)
    floating = dtype.startswith("float")
    far = tirx.const(-1 if last else extent, "int32")

    def keep_greatest(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        take = b[0] >= a[0] if last else b[0] > a[0]
        nan = ((tirx.max if last else tirx.min)(a[2], b[2]),) if floating else ()
        return (tirx.Select(take, b[0], a[0]), tirx.Select(take, b[1], a[1]), *nan)

    def identity(*types: str) -> tuple[Any, ...]:
        return (_lowest(types[0]), tirx.const(0, types[1]), *((far,) if floating else ()))

    scan = te.comm_reducer(keep_greatest, identity, name="keep_greatest")
    step = te.reduce_axis((0, (extent + lanes - 1) // lanes), name="step")

    def partial(*i: Any) -> Any:
        position = step * lanes + i[-1]
        value = x[(*i[:-1], tirx.min(position, extent - 1))]
        if last and extent % lanes:
            position = tirx.Select(position < extent, position, far)
        nan = (tirx.Select(is_nan_bits(value, dtype), position, far),) if floating else ()
        return scan((value, position, *nan), axis=step)

    partials = te.compute((*rows, lanes), partial, name="argmax_partial")
    reducer = _argmax_reducer(dtype, last)
    lane = te.reduce_axis((0, lanes), name="lane")
    p_value, p_index = partials[0], partials[1]
    best, _value = te.compute(
        tuple(rows),
        lambda *r: reducer((p_index[(*r, lane)], p_value[(*r, lane)]), axis=lane),
        name="argmax_best",
    )
    kept = len(rows)  # keepdims adds a trailing axis of extent 1
    if not floating:
        return te.compute(out.shape, lambda *r: best[r[:kept]].astype(out.dtype), name="argmax")
    p_nan = partials[2]
    lane2 = te.reduce_axis((0, lanes), name="lane2")
    extreme = te.max if last else te.min
    found_nan = te.compute(tuple(rows), lambda *r: extreme(p_nan[(*r, lane2)], axis=lane2), name="argmax_nan")

    def answer(*r: Any) -> Any:
        nan = found_nan[r[:kept]]
        return tirx.Select(nan != far, nan, best[r[:kept]]).astype(out.dtype)

    return te.compute(out.shape, answer, name="argmax")


def along_one_axis(attrs: dict[str, Any]) -> bool:
    """Whether argmax with these attributes reduces one axis of its input (NCHW, any rank): the
    form the targets' variants take; in other layouts it reduces the channels (the op's own)."""
    return layout_of(attrs) is NCHW


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
        along one axis of NCHW (`strided_argmax`, `sliced_argmax`, `max_then_find`: see
        deploy/schedules/cpu.py and gpu.py; `along_one_axis`)."""
        rank = len(x.shape)
        layout = layout_of(attrs)
        reducer = _argmax_reducer(str(x.dtype), attrs["select_last"])
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
