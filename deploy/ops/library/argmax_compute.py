"""argmax's computations: its reducer (ties and NaNs as the op defines them), and the forms
target families compute it in along one axis of NCHW (`along_one_axis`): strided partials
(`strided_argmax`, `vector_strided_argmax`: GPUs), contiguous slices (`sliced_argmax`) and one
vector pass (`max_then_find`: CPUs). The op and its plain definition are `argmax.py`; which form
a family takes is its schedule's business (`deploy/schedules/cpu/argmax.py`, `gpu/argmax.py`)."""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from deploy.ops.layouts import NCHW, layout_of
from deploy.ops.nan import is_nan_bits, lowest, none_nan
from deploy.ops.spec import TensorType


def argmax_reducer(dtype: str, last: bool) -> Any:
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
        return tirx.min_value(index_type) if last else tirx.max_value(index_type), lowest(value_type)

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
        return lowest(value_type), tirx.const(0, index_type)

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
    reducer = argmax_reducer(str(x.dtype), last)
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
    reducer = argmax_reducer(dtype, last)
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
    reducer = argmax_reducer(dtype, last)
    part = te.reduce_axis((0, slices), name="part")

    def combine(*i: Any) -> Any:
        at = (*i[:axis], part, *i[axis + keep :])
        return reducer((p_index[at].astype(out.dtype), p_value[at]), axis=part)

    index, _value = te.compute(out.shape, combine, name="argmax")
    return index


def max_then_find(
    x: te.Tensor, out: TensorType, lanes: int, last: bool = False, segments: int = 1
) -> te.Tensor:
    """Argmax over the innermost axis in one vector pass: `lanes` strided partials per row, each
    keeping its strictly greatest value with that value's position (so its first) and the
    position of its first NaN; a per-row stage then takes the first NaN if any, else the
    greatest value's first position. A lane that never moves off the identity reports (minimum,
    0), which only wins when the whole row is the minimum, where 0 is the answer. Past the end
    a lane re-reads the last element under a position past the end, which loses every tie.

    With `segments` above 1 the row is read as that many streams at once, `lanes` partials each
    (partials [*rows, segments, lanes]): segment s starts at s * span (span: the row's share in
    whole vectors), the last at the row's end minus span, so none reads past the end, and what
    two segments both read counts once, under its own position. One core draws more bandwidth
    from several streams than from one (see `deploy/schedules/cpu/argmax.py`, SCAN_STREAMS).

    Where `last`: each lane keeps a value greater or equal (its last maximum) and its last NaN's
    position, a position past the end is -1, and the row takes the last NaN, else the greatest
    value's last position. A lane's re-read past the end may replace its maximum with the last
    element under -1, which then loses its tie with the lane that holds the last element."""
    *rows, inner = x.shape
    extent = int(inner)
    dtype = str(x.dtype)
    floating = dtype.startswith("float")
    far = tirx.const(-1 if last else extent, "int32")
    steps = -(-extent // (lanes * segments))
    span = steps * lanes

    def keep_greatest(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        take = b[0] >= a[0] if last else b[0] > a[0]
        nan = ((tirx.max if last else tirx.min)(a[2], b[2]),) if floating else ()
        return (tirx.Select(take, b[0], a[0]), tirx.Select(take, b[1], a[1]), *nan)

    def identity(*types: str) -> tuple[Any, ...]:
        return (lowest(types[0]), tirx.const(0, types[1]), *((far,) if floating else ()))

    scan = te.comm_reducer(keep_greatest, identity, name="keep_greatest")
    step = te.reduce_axis((0, steps), name="step")

    def partial(*i: Any) -> Any:
        row, (segment, lane) = (i[:-1], (0, i[-1])) if segments == 1 else (i[:-2], i[-2:])
        start = tirx.min(segment * span, extent - span) if segments > 1 else 0
        position = start + step * lanes + lane
        value = x[(*row, tirx.min(position, extent - 1))]
        if last and segments == 1 and extent % lanes:
            position = tirx.Select(position < extent, position, far)
        nan = (tirx.Select(none_nan([value], dtype), far, position),) if floating else ()
        return scan((value, position, *nan), axis=step)

    def partial_axes(name: str) -> list[Any]:
        """Reduction axes over a row's partials: (lane) or (segment, lane)."""
        lane = te.reduce_axis((0, lanes), name=f"lane{name}")
        return [lane] if segments == 1 else [te.reduce_axis((0, segments), name=f"segment{name}"), lane]

    shape = (*rows, lanes) if segments == 1 else (*rows, segments, lanes)
    partials = te.compute(shape, partial, name="argmax_partial")
    reducer = argmax_reducer(dtype, last)
    axes = partial_axes("")
    p_value, p_index = partials[0], partials[1]
    best, _value = te.compute(
        tuple(rows),
        lambda *r: reducer((p_index[(*r, *axes)], p_value[(*r, *axes)]), axis=axes),
        name="argmax_best",
    )
    kept = len(rows)  # keepdims adds a trailing axis of extent 1
    if not floating:
        return te.compute(out.shape, lambda *r: best[r[:kept]].astype(out.dtype), name="argmax")
    p_nan = partials[2]
    axes2 = partial_axes("2")
    extreme = te.max if last else te.min
    found_nan = te.compute(
        tuple(rows), lambda *r: extreme(p_nan[(*r, *axes2)], axis=axes2), name="argmax_nan"
    )

    def answer(*r: Any) -> Any:
        nan = found_nan[r[:kept]]
        return tirx.Select(nan != far, nan, best[r[:kept]]).astype(out.dtype)

    return te.compute(out.shape, answer, name="argmax")


def along_one_axis(attrs: dict[str, Any]) -> bool:
    """Whether argmax with these attributes reduces one axis of its input (NCHW, any rank): the
    form the targets' variants take; in other layouts it reduces the channels (the op's own)."""
    return layout_of(attrs) is NCHW
