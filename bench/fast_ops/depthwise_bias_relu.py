"""A MobileNet layer: depthwise 2-D convolution (NCHW, a k x k filter per channel, zero padding),
its bias, then a ReLU (ONNX's Conv with a bias, then Relu), as a user writes it: a padded input,
the sum over the window, then the bias and the ReLU in a second computation; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Int


@register
class DepthwiseBiasRelu(Op):
    """out[n, c, y, x] = relu(sum_{i, j} pad(x)[n, c, y * s + i, x * s + j] * w[c, 0, i, j] + b[c]);
    relu keeps NaN (NaN < 0 is false)."""

    name = "depthwise_bias_relu"
    inputs = (Input("x", 4, 4), Input("w", 4, 4), Input("b", 1, 1))
    attrs = (Attr("stride", Int(1, 4), 1, "step of the window"), Attr("pad", Int(0, 3), 1, "zeros each side"))
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (
        Case(((1, 32, 56, 56), (32, 1, 3, 3), (32,))),
        Case(((2, 3, 9, 7), (3, 1, 3, 3), (3,)), {"stride": 2}),
        Case(((1, 8, 14, 14), (8, 1, 3, 3), (8,))),  # rows of 14: whole vectors, then the rest
    )

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, w, b = inputs
        n, c, h, wd = x.shape
        if w.shape[:2] != (c, 1) or w.shape[2] != w.shape[3]:
            raise UsageError(f"w {w}: expected [{c}, 1, k, k]")
        if b.shape != (c,):
            raise UsageError(f"b {b}: expected [{c}]")
        k, s, p = w.shape[2], attrs["stride"], attrs["pad"]
        oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
        if oh < 1 or ow < 1:
            raise UsageError(f"x {x}: smaller than the {k}x{k} window")
        return TensorType((n, c, oh, ow), x.dtype)

    def compute(
        self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, w: te.Tensor, b: te.Tensor
    ) -> te.Tensor:
        _, _, h, wd = x.shape
        k, s, p = w.shape[2], attrs["stride"], attrs["pad"]
        zero = tirx.const(0, x.dtype)
        padded = te.compute(
            (x.shape[0], x.shape[1], h + 2 * p, wd + 2 * p),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= p, y < h + p, z >= p, z < wd + p), x[n, c, y - p, z - p], zero
            ),
            name="padded",
        )
        i, j = te.reduce_axis((0, k), name="i"), te.reduce_axis((0, k), name="j")
        conv = te.compute(
            out.shape,
            lambda n, c, y, z: te.sum(padded[n, c, y * s + i, z * s + j] * w[c, 0, i, j], axis=[i, j]),
            name="conv",
        )
        biased = te.compute(out.shape, lambda n, c, y, z: conv[n, c, y, z] + b[c], name="biased")
        return te.compute(
            out.shape,
            lambda *at: tirx.Select(biased[at] < zero, zero, biased[at]),
            name="depthwise_bias_relu",
        )

    def reference(self, attrs: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        k, s, p = w.shape[2], attrs["stride"], attrs["pad"]
        padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        oh, ow = (padded.shape[2] - k) // s + 1, (padded.shape[3] - k) // s + 1
        out = np.zeros((x.shape[0], x.shape[1], oh, ow), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            for i in range(k):
                for j in range(k):
                    window = padded[:, :, i : i + s * oh : s, j : j + s * ow : s]
                    out += window * w[None, :, 0, i, j, None, None].astype(np.float64)
            biased = out + b[None, :, None, None]
            return np.where(biased < 0, 0, biased).astype(x.dtype)
