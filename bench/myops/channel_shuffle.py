"""channel_shuffle: ShuffleNet's shuffle of NCHW channels in `groups`, as a user adds it: a copy
whose channels move, no schedule of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register
from deploy.ops.attrs import Attr, Int


@register
class ChannelShuffle(Op):
    """Output channel j * groups + i is input channel i * (C / groups) + j."""

    name = "channel_shuffle"
    inputs = (Input("x", min_rank=4, max_rank=4),)
    attrs = (Attr("groups", Int(1, 1024), 2, "groups the channels are split into"),)
    cases = (Case(((1, 116, 28, 28),), {"groups": 2}), Case(((2, 12, 5, 7),), {"groups": 3}))

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        channels = inputs[0].shape[1]
        if channels % attrs["groups"]:
            raise UsageError(f"groups={attrs['groups']}: expected a divisor of the {channels} channels")
        return inputs[0]

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        groups = attrs["groups"]
        per_group = out.shape[1] // groups
        return te.compute(
            out.shape,
            lambda n, c, h, w: x[n, c % groups * per_group + c // groups, h, w],
            name="channel_shuffle",
        )

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        groups = attrs["groups"]
        return x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)
