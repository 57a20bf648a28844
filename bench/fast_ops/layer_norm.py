"""layer_norm over the last axis with gamma and beta, as a user writes it: mean, variance, then
the normalized row; no schedule code."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Float


@register
class LayerNorm(Op):
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis (gamma, beta: [n])."""

    name = "layer_norm"
    inputs = (Input("x", min_rank=1), Input("gamma", 1, 1), Input("beta", 1, 1))
    attrs = (Attr("epsilon", Float(0.0), 1e-5, "added to the variance"),)
    dtypes = ("float32", "float64")  # float16 sums round at every term: past its tolerance
    cases = (Case(((1, 128, 768), (768,), (768,))), Case(((3, 5, 7), (7,), (7,))))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        x, gamma, beta = inputs
        n = x.shape[-1]
        if gamma.shape != (n,) or beta.shape != (n,):
            raise UsageError(f"gamma {gamma}, beta {beta}: expected [{n}] each, x's last axis")
        return x

    def compute(
        self, attrs: dict[str, Any], out: TensorType, x: te.Tensor, gamma: te.Tensor, beta: te.Tensor
    ) -> te.Tensor:
        *outer, n = x.shape
        k = te.reduce_axis((0, n), name="k")
        total = te.compute(outer, lambda *i: te.sum(x[(*i, k)], axis=k), name="total")
        mean = te.compute(outer, lambda *i: total[i] / n, name="mean")
        j = te.reduce_axis((0, n), name="j")
        squares = te.compute(
            outer, lambda *i: te.sum((x[(*i, j)] - mean[i]) * (x[(*i, j)] - mean[i]), axis=j), name="squares"
        )
        eps = tirx.const(attrs["epsilon"], x.dtype)
        return te.compute(
            x.shape,
            lambda *i: (
                (x[i] - mean[i[:-1]]) / te.sqrt(squares[i[:-1]] / n + eps) * gamma[i[-1]] + beta[i[-1]]
            ),
            name="layer_norm",
        )

    def reference(
        self, attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray, beta: np.ndarray
    ) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            mean = x.mean(axis=-1, keepdims=True)
            var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
            return ((x - mean) / np.sqrt(var + attrs["epsilon"]) * gamma + beta).astype(x.dtype)
