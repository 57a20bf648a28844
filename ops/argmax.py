"""argmax: index of the maximum along one axis; ties and NaNs pick the first index like numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import te, tirx

from ops.attrs import Attr, Bool, Choice, Int
from ops.errors import UsageError
from ops.nan import is_nan_bits
from ops.registry import register
from ops.spec import Case, Input, Op, TensorType

GPU_LANES = 64
"""Work-items that share one argmax on GPU targets."""
CPU_LANES = 16
"""Partial argmaxes per output on CPU targets (innermost axis): two AVX2 vectors, four NEON ones."""


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
        """One reduction; in two stages where that vectorizes or spreads the work: `lanes`
        strided partial argmaxes per output (lane l takes elements l, l + lanes, ...), then
        their argmax. GPU targets: GPU_LANES, one per work-item of a work-group; CPU targets
        reducing the innermost axis: CPU_LANES, one per vector lane."""
        rank = len(x.shape)
        axis = self._axis(attrs, rank)
        extent = int(x.shape[axis])
        reducer = _argmax_reducer(str(x.dtype), out.dtype)
        keep = 1 if attrs["keepdims"] else 0
        target = tvm.target.Target.current(allow_none=True)
        gpu = target is not None and "gpu" in target.keys
        lanes = min(GPU_LANES, extent) if gpu else (CPU_LANES if axis == rank - 1 else 1)
        if lanes < 2 or (not gpu and extent < 2 * lanes):
            k = te.reduce_axis((0, extent), name="k")

            def body(*i: Any) -> Any:
                index = (*i[:axis], k, *i[axis + keep :])
                return reducer((k.var.astype(out.dtype), x[index]), axis=k)

            index, _value = te.compute(out.shape, body, name="argmax")
            return index

        steps = te.reduce_axis((0, (extent + lanes - 1) // lanes), name="step")

        def partial(*i: Any) -> Any:
            """Past the end a lane re-reads the last element (no condition, so it vectorizes)
            under index `extent`, which loses every tie with the real one."""
            *outer, lane = i
            k = steps * lanes + lane
            index = (*outer[:axis], tirx.min(k, extent - 1), *outer[axis + keep :])
            position = tirx.Select(k < extent, k, extent).astype("int32")
            return partial_reducer((position, x[index]), axis=steps)

        partial_reducer = _argmax_reducer(str(x.dtype), "int32")  # half the vector width of int64
        p_index, p_value = te.compute((*out.shape, lanes), partial, name="argmax_partial")
        lane = te.reduce_axis((0, lanes), name="lane")

        def combine(*i: Any) -> Any:
            return reducer((p_index[(*i, lane)].astype(out.dtype), p_value[(*i, lane)]), axis=lane)

        index, _value = te.compute(out.shape, combine, name="argmax")
        return index

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        axis = self._axis(attrs, x.ndim)
        result = np.argmax(x, axis=axis, keepdims=attrs["keepdims"])
        return result.astype(attrs["out_dtype"])
