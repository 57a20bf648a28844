"""PyTorch (CPU) versions of the shipped ops, timed beside ours by `deploy bench` when torch is
installed (`pip install torch==2.13.0`, a CPU build); ops without one show no PyTorch column.
Where PyTorch has an `out=` form the output is preallocated, as an engine calling it would;
where it has none (max pooling, a graph's eager ops) every call allocates, and the row says so."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from deploy.base.threads import runtime_threads
from deploy.ops.graph import BoundGraph, BoundNode, flow
from deploy.ops.spec import BoundOp
from deploy.verify.measure import host_ms


@dataclass(frozen=True)
class TorchOp:
    """An op in PyTorch: `call(attrs, *tensors)` returns a new tensor; `into(attrs, out,
    *tensors)`, where PyTorch has an `out=` form, writes the same into `out`; `says(attrs)`:
    whether PyTorch can say the op with these attributes (else no baseline)."""

    call: Callable[..., Any]
    into: Callable[..., Any] | None = None
    says: Callable[[dict[str, Any]], bool] = lambda attrs: True


class TorchTime(NamedTuple):
    ms: float
    """Median milliseconds per call."""
    preallocated: bool
    """Whether the output was preallocated (`out=`), or allocated by every call."""


def _leaky_relu(attrs: dict[str, Any], x: Any) -> Any:
    import torch.nn.functional as F

    return F.leaky_relu(x, attrs["alpha"])


def _leaky_relu_into(attrs: dict[str, Any], out: Any, x: Any) -> Any:
    import torch

    return torch.ops.aten.leaky_relu.out(x, attrs["alpha"], out=out)


def _hard_sigmoid(attrs: dict[str, Any], x: Any) -> Any:
    import torch.nn.functional as F

    return F.hardsigmoid(x)


def _hard_sigmoid_into(attrs: dict[str, Any], out: Any, x: Any) -> Any:
    import torch

    return torch.ops.aten.hardsigmoid.out(x, out=out)


def _hard_sigmoid_says(attrs: dict[str, Any]) -> bool:
    """PyTorch's hardsigmoid is MobileNetV3's, alpha 1/6 and beta 0.5 (1/6 as an ONNX model's float32
    attribute says it too)."""
    return math.isclose(attrs["alpha"], 1 / 6, rel_tol=1e-6) and attrs["beta"] == 0.5


def _add_into(attrs: dict[str, Any], out: Any, a: Any, b: Any) -> Any:
    import torch

    return torch.add(a, b, out=out)


def _argmax(attrs: dict[str, Any], x: Any) -> Any:
    return x.argmax(dim=attrs["axis"], keepdim=attrs["keepdims"])


def _argmax_into(attrs: dict[str, Any], out: Any, x: Any) -> Any:
    import torch

    return torch.argmax(x, dim=attrs["axis"], keepdim=attrs["keepdims"], out=out)


def _max_pool(attrs: dict[str, Any], x: Any) -> Any:
    """F.max_pool2d, or F.max_pool3d for a kernel of three (max_pool3d's)."""
    import torch.nn.functional as F

    pool = F.max_pool3d if len(attrs["kernel"]) == 3 else F.max_pool2d
    return pool(
        x,
        kernel_size=attrs["kernel"],
        stride=attrs["stride"] or attrs["kernel"],
        padding=attrs["padding"],
        dilation=attrs["dilation"],
        ceil_mode=attrs["ceil_mode"],
    )


def _pool_says(attrs: dict[str, Any]) -> bool:
    """PyTorch pads both sides alike, by at most half the kernel."""
    symmetric = attrs.get("padding_end") in (None, attrs["padding"])
    return symmetric and all(2 * p <= k for p, k in zip(attrs["padding"], attrs["kernel"], strict=True))


BASELINES: dict[str, TorchOp] = {
    "add": TorchOp(lambda attrs, a, b: a + b, _add_into),
    "leaky_relu": TorchOp(_leaky_relu, _leaky_relu_into),
    "hard_sigmoid": TorchOp(_hard_sigmoid, _hard_sigmoid_into, says=_hard_sigmoid_says),
    "max_pool2d": TorchOp(_max_pool, says=_pool_says),
    "max_pool3d": TorchOp(_max_pool, says=_pool_says),
    "argmax": TorchOp(_argmax, _argmax_into, says=lambda attrs: not attrs["select_last"]),  # first on ties
}


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def torch_ms(item: BoundOp | BoundGraph, inputs: list[np.ndarray], repeat: int) -> TorchTime | None:
    """Median ms of an op in PyTorch on this host's CPU with as many threads as TVM uses, into a
    preallocated output where PyTorch has an `out=` form; of a graph, its ops' baselines composed
    in data-flow order (eager: one kernel per op, each allocating its output). None without
    torch, without a baseline for an op, or for a dtype torch lacks."""
    if isinstance(item, BoundGraph):
        return _graph_ms(item, inputs, repeat)
    baseline = _baseline_for(item)
    if baseline is None:
        return None
    attrs, into = item.attrs, baseline.into
    return _timed(
        lambda *tensors: baseline.call(attrs, *tensors),
        None if into is None else lambda out, *tensors: into(attrs, out, *tensors),
        inputs,
        repeat,
    )


def _baseline_for(bound: BoundOp) -> TorchOp | None:
    """The PyTorch twin of `bound`, if PyTorch has one for its op and can say its attributes."""
    baseline = BASELINES.get(bound.op.name)
    return baseline if baseline is not None and baseline.says(bound.attrs) else None


def _graph_ms(graph: BoundGraph, inputs: list[np.ndarray], repeat: int) -> TorchTime | None:
    if any(_baseline_for(n.bound) is None for n in graph.nodes):
        return None
    if torch_version() is None:
        return None
    import torch

    constants = {c.name: torch.from_numpy(c.array().copy()) for c in graph.graph.constants}

    def run(*tensors: Any) -> Any:
        values = flow(
            graph.nodes, {**constants, **dict(zip(graph.input_names, tensors, strict=True))}, _baseline
        )
        return [values[name] for name in graph.graph.outputs]

    return _timed(run, None, inputs, repeat)


def _baseline(n: BoundNode, tensors: list[Any]) -> Any:
    return BASELINES[n.bound.op.name].call(n.bound.attrs, *tensors)


def _timed(
    call: Callable[..., Any], into: Callable[..., Any] | None, inputs: list[np.ndarray], repeat: int
) -> TorchTime | None:
    """Median ms of `into(out, *tensors)` with `out` allocated once (the shape and dtype of a
    first `call(*tensors)`), or of `call(*tensors)` without `into`; None without torch or for a
    dtype it lacks."""
    if torch_version() is None:
        return None
    import torch

    torch.set_num_threads(int(runtime_threads()))
    try:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
        with torch.no_grad():
            first = call(*tensors)
            if into is None:
                return TorchTime(host_ms(lambda: call(*tensors), repeat), preallocated=False)
            out = torch.empty_like(first)
            return TorchTime(host_ms(lambda: into(out, *tensors), repeat), preallocated=True)
    except (TypeError, RuntimeError, NotImplementedError):
        return None
