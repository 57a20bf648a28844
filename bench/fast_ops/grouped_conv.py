"""Grouped 2-D convolution (NCHW, a k x k filter over each group's input channels, stride 1, zero
padding), as a user writes it: a padded input, then a sum over the group's channels and the
window; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Int


@register
class GroupedConv(Op):
    """out[n, o, y, x] = sum_{c, i, j} pad(x)[n, g * C + c, y + i, x + j] * w[o, c, i, j], where
    g = o // (O / groups) is o's group and C = w's channels (input channels / groups)."""

    name = "grouped_conv"
    inputs = (Input("x", 4, 4), Input("w", 4, 4))
    attrs = (Attr("groups", Int(1, 4096), 4, "channel groups"), Attr("pad", Int(0, 3), 1, "zeros each side"))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (
        Case(((1, 64, 56, 56), (64, 16, 3, 3))),
        Case(((2, 6, 5, 7), (4, 3, 3, 3)), {"groups": 2}),
        Case(((1, 8, 9, 9), (8, 2, 1, 1))),
        Case(((1, 8, 7, 7), (16, 2, 3, 3))),  # rows of 7: one vector of the row (not whole ones)
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, w = inputs
        n, c, h, wd = x.shape
        groups, p = attrs["groups"], attrs["pad"]
        out_c, group_c, k, k2 = w.shape
        if c % groups or out_c % groups or group_c != c // groups or k != k2:
            raise UsageError(
                f"x {x}, w {w}: expected w [O, {c}/{groups}, k, k] with O a multiple of {groups}"
            )
        oh, ow = h + 2 * p - k + 1, wd + 2 * p - k + 1
        if oh < 1 or ow < 1:
            raise UsageError(f"x {x}: smaller than the {k}x{k} window")
        return TensorType((n, out_c, oh, ow), x.dtype)

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, w: te.Tensor) -> te.Tensor:
        _, _, h, wd = x.shape
        out_c, group_c, k, _ = w.shape
        per_group, p = out_c // attrs["groups"], attrs["pad"]
        zero = tirx.const(0, x.dtype)
        padded = te.compute(
            (x.shape[0], x.shape[1], h + 2 * p, wd + 2 * p),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= p, y < h + p, z >= p, z < wd + p), x[n, c, y - p, z - p], zero
            ),
            name="padded",
        )
        c = te.reduce_axis((0, group_c), name="c")
        i, j = te.reduce_axis((0, k), name="i"), te.reduce_axis((0, k), name="j")
        return te.compute(
            out.shape,
            lambda n, o, y, z: te.sum(
                padded[n, o // per_group * group_c + c, y + i, z + j] * w[o, c, i, j], axis=[c, i, j]
            ),
            name="grouped_conv",
        )

    def reference(self, attrs: dict[str, Any], x: np.ndarray, w: np.ndarray) -> np.ndarray:
        groups, p = attrs["groups"], attrs["pad"]
        out_c, group_c, k, _ = w.shape
        per_group = out_c // groups
        padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))).astype(np.float64)
        oh, ow = padded.shape[2] - k + 1, padded.shape[3] - k + 1
        out = np.zeros((x.shape[0], out_c, oh, ow), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            for g in range(groups):
                taps = padded[:, g * group_c : (g + 1) * group_c]
                weights = w[g * per_group : (g + 1) * per_group].astype(np.float64)
                for i in range(k):
                    for j in range(k):
                        out[:, g * per_group : (g + 1) * per_group] += np.einsum(
                            "nchw,oc->nohw", taps[:, :, i : i + oh, j : j + ow], weights[:, :, i, j]
                        )
        return out.astype(x.dtype)
