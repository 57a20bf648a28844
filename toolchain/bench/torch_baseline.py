"""PyTorch (CPU) versions of the shipped ops, timed beside ours by `deploy bench` when torch is
installed (`pip install torch`); ops without one show no PyTorch column."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from base.threads import runtime_threads
from ops.graph import BoundGraph, BoundNode, flow
from toolchain.verify.measure import host_ms


def _max_pool(attrs: dict[str, Any], x: Any) -> Any:
    import torch.nn.functional as F

    return F.max_pool2d(
        x,
        kernel_size=attrs["kernel"],
        stride=attrs["stride"] or attrs["kernel"],
        padding=attrs["padding"],
        ceil_mode=attrs["ceil_mode"],
    )


def _leaky_relu(attrs: dict[str, Any], x: Any) -> Any:
    import torch.nn.functional as F

    return F.leaky_relu(x, attrs["alpha"])


BASELINES: dict[str, Callable[..., Any]] = {
    "add": lambda attrs, a, b: a + b,
    "leaky_relu": _leaky_relu,
    "max_pool2d": _max_pool,
    "argmax": lambda attrs, x: x.argmax(dim=attrs["axis"], keepdim=attrs["keepdims"]),
}


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def torch_ms(op: str, attrs: dict[str, Any], inputs: list[np.ndarray], repeat: int) -> float | None:
    """Median ms of the op in PyTorch on this host's CPU with as many threads as TVM uses; None
    without torch, without a baseline for the op, or for a dtype torch lacks."""
    fn = BASELINES.get(op)
    if fn is None:
        return None
    return _timed(lambda *tensors: fn(attrs, *tensors), inputs, repeat)


def torch_graph_ms(graph: BoundGraph, inputs: list[np.ndarray], repeat: int) -> float | None:
    """Median ms of the graph in PyTorch, its ops' baselines composed in data-flow order (eager:
    one kernel per op); None when an op has none (or as `torch_ms`)."""
    if any(n.bound.op.name not in BASELINES for n in graph.nodes):
        return None

    def run(*tensors: Any) -> Any:
        values = flow(graph.nodes, dict(zip(graph.input_names, tensors, strict=True)), _baseline)
        return values[graph.graph.output]

    return _timed(run, inputs, repeat)


def _baseline(n: BoundNode, tensors: list[Any]) -> Any:
    return BASELINES[n.bound.op.name](n.bound.attrs, *tensors)


def _timed(fn: Callable[..., Any], inputs: list[np.ndarray], repeat: int) -> float | None:
    """Median ms of `fn(*inputs as torch tensors)`; None without torch or for a dtype it lacks."""
    if torch_version() is None:
        return None
    import torch

    torch.set_num_threads(int(runtime_threads()))
    try:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
        with torch.no_grad():
            return host_ms(lambda: fn(*tensors), repeat)
    except (TypeError, RuntimeError):
        return None
