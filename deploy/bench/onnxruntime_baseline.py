"""onnxruntime (CPU) as a `deploy bench` baseline: the op, or the graph, as an ONNX model built
from its ops' `onnx_baseline` nodes (by default their `node_attrs`, `deploy/ops/onnx_mapping.py`;
an op may name its own node, opset and shape-dependent attributes), run through IOBinding into a preallocated
output with as many threads as TVM uses. This is how an engine calls onnxruntime, and the
runtime our users compare against. Calls go through onnxruntime's Python binding, about 2.5 us
each on this project's 2-core x86 host (an Identity of one element): it counts at in-cache sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deploy.base.threads import runtime_threads
from deploy.ops.graph import BoundGraph, Constant
from deploy.ops.onnx_mapping import BASELINE_OPSET
from deploy.ops.spec import BoundOp
from deploy.verify.measure import host_ms

try:
    import onnxruntime
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    UNSUPPORTED: tuple[type[Exception], ...] = (InvalidGraph, OrtNotImplemented)
    """What onnxruntime raises for a dtype ONNX does not define for an op, or its CPU lacks."""
except ImportError:  # an optional dependency: without it there is no onnxruntime column
    onnxruntime = None

Step = tuple[BoundOp, Sequence[str], str]
"""A node to export: its bound op, the names of the tensors it reads, the name it writes."""


def onnx_node(bound: BoundOp, inputs: Sequence[str], output: str) -> tuple[onnx.NodeProto, int] | None:
    """The ONNX node of a bound op (`Op.onnx_baseline`: its own node, attributes from its
    attributes and input shapes) with the opset defining it, or None where it has none."""
    node = bound.op.onnx_baseline(bound.attrs, list(bound.inputs))
    if node is None:
        return None
    return helper.make_node(node.op_type, list(inputs), [output], **node.attrs), node.opset


def onnx_model(
    steps: Sequence[Step],
    inputs: dict[str, np.ndarray],
    outputs: dict[str, str],
    constants: Sequence[Constant] = (),
) -> onnx.ModelProto | None:
    """A model of `steps` in order, its inputs typed and shaped as `inputs`, `constants` its
    initializers, its outputs of the dtypes `outputs` gives (onnxruntime infers the shapes); None
    when a step has no ONNX node. The opset is the highest any node needs."""
    found = [pair for step in steps if (pair := onnx_node(*step)) is not None]
    if len(found) != len(steps):
        return None
    nodes = [node for node, _ in found]
    opset = max((version for _, version in found), default=BASELINE_OPSET)

    def value_info(name: str, dtype: np.dtype, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)

    graph = helper.make_graph(
        nodes,
        "baseline",
        [value_info(name, a.dtype, a.shape) for name, a in inputs.items()],
        [value_info(name, np.dtype(dtype), None) for name, dtype in outputs.items()],
        [numpy_helper.from_array(c.array(), c.name) for c in constants],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def op_steps(bound: BoundOp) -> tuple[list[Step], list[str], dict[str, str]]:
    """One step for an op: (steps, input names, output name -> dtype)."""
    names = [i.name for i in bound.op.inputs]
    return [(bound, names, "y")], names, {"y": bound.output.dtype}


def graph_steps(graph: BoundGraph) -> tuple[list[Step], list[str], dict[str, str]]:
    """A graph's nodes in data-flow order: (steps, input names, output name -> dtype)."""
    steps: list[Step] = [(n.bound, n.node.inputs, n.node.output) for n in graph.nodes]
    return steps, list(graph.input_names), {name: graph.types[name].dtype for name in graph.graph.outputs}


def onnxruntime_ms(item: BoundOp | BoundGraph, inputs: list[np.ndarray], repeat: int) -> float | None:
    """Median ms per call of `item` in onnxruntime on `inputs` (see the module); None without
    onnxruntime, when an op has no ONNX node, or where onnxruntime has no kernel (MaxPool on
    int32, float16 on its CPU for some ops)."""
    run = onnxruntime_call(item, inputs)
    return None if run is None else host_ms(run, repeat)


def onnxruntime_call(item: BoundOp | BoundGraph, inputs: list[np.ndarray]) -> Any:
    """A function running `item` once in onnxruntime into preallocated outputs (returned by
    each call, a list), or None as `onnxruntime_ms` says."""
    if onnxruntime is None:
        return None
    steps, names, outputs = graph_steps(item) if isinstance(item, BoundGraph) else op_steps(item)
    feeds = dict(zip(names, (np.ascontiguousarray(a) for a in inputs), strict=True))
    model = onnx_model(steps, feeds, outputs, item.constants)
    if model is None:
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(runtime_threads())
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: its warnings would be lines of their own
    try:
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        first = session.run(None, feeds)  # the outputs' shapes and dtypes, and a warm-up
    except UNSUPPORTED:
        return None
    outs = [np.empty_like(array) for array in first]
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    for name, out in zip(outputs, outs, strict=True):
        binding.bind_output(name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

    def call() -> list[np.ndarray]:
        session.run_with_iobinding(binding)
        return outs

    return call
