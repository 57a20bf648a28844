"""A second reference for an ONNX model: onnxruntime's kernels, one node at a time.

`BoundGraph.reference` composes our ops' numpy references; this runs each standard-domain node
as a one-node model in onnxruntime (its types from the bound graph, the model's opsets), so an
ONNX mapping that converts an attribute wrongly (a default, the stride) shows as a difference.
Nodes in other domains (`com.example::HardTanh`) have no onnxruntime kernel: they run our
op's numpy reference.

Where onnxruntime's semantics differ from numpy's (checked in tests/test_models.py):
- MaxPool with NaN: whether a window holding NaN gives NaN depends on where the NaN sits and on
  the dtype (float32 [1, NaN, 4, 5] gives NaN, float64 gives 5; a NaN first in its window is
  dropped); ours is NaN whenever the window holds one, as numpy's max.
- ArgMax with NaN: onnxruntime skips NaN (except at index 0); ours picks the first NaN, as
  numpy's argmax.
- Add, LeakyRelu and HardSigmoid agree with numpy on NaN and +-inf.
So compare on NaN inputs only where `agrees_on_nan`; else on finite inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from deploy.base.errors import UsageError, reason
from deploy.ops.graph import BoundGraph
from deploy.ops.onnx_mapping import domain_key
from deploy.ops.spec import TensorType

try:
    import onnxruntime
except ImportError:  # an optional test dependency: without it there is no second reference
    onnxruntime = None


def installed() -> bool:
    """Whether onnxruntime is installed (the second reference exists)."""
    return onnxruntime is not None


AGREES_ON_NAN = frozenset({"Add", "LeakyRelu", "HardSigmoid"})
"""Standard ONNX op types whose onnxruntime kernels treat NaN as numpy does."""


class OnnxruntimeError(Exception):
    """onnxruntime refused a one-node model or failed running it."""


def agrees_on_nan(model: Path) -> bool:
    """Whether NaN inputs compare: every standard-domain node's op type is in AGREES_ON_NAN
    (custom-domain nodes run our numpy reference)."""
    return all(
        node.op_type in AGREES_ON_NAN for node in onnx.load(model).graph.node if not domain_key(node.domain)
    )


def standard_nodes(model: Path) -> tuple[int, int]:
    """(nodes onnxruntime runs, nodes computed) of `model`: its standard-domain nodes, and all
    but Constant nodes (constants of the graph); custom-domain nodes run our numpy reference."""
    computed = [node for node in onnx.load(model).graph.node if node.op_type != "Constant"]
    return sum(not domain_key(node.domain) for node in computed), len(computed)


def onnxruntime_reference(
    model: Path, graph: BoundGraph, arrays: list[np.ndarray]
) -> list[np.ndarray] | None:
    """The outputs of `model` (read into `graph`) for `arrays`, in the graph's input order, node
    by node of the model (one may be several of the graph's: a chain, a further output), each
    output the graph computes; None when onnxruntime is not installed. A node onnxruntime cannot
    run (MaxPool on int32, which ONNX does not define) is a UsageError naming it."""
    if onnxruntime is None:
        return None
    proto = onnx.load(model)
    ours = {bound.node.output: bound for bound in graph.nodes}
    values = {c.name: c.array() for c in graph.graph.constants}
    values.update(zip(graph.input_names, arrays, strict=True))
    for node in proto.graph.node:
        computed = [t for t in node.output if t in ours]
        if not computed:  # a Constant node: a constant of the graph
            continue
        inputs = [values[t] for t in node.input]
        if domain_key(node.domain):
            bound = ours[computed[0]].bound
            values[computed[0]] = bound.op.reference(bound.attrs, *inputs)
            continue
        try:
            values.update(zip(computed, run_node(proto, node, graph.types, inputs, computed), strict=True))
        except OnnxruntimeError as exc:
            raise UsageError(f"{ours[computed[0]].node.label()}: onnxruntime cannot run it: {exc}") from None
    return [values[name] for name in graph.graph.outputs]


def run_node(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    types: dict[str, TensorType],
    arrays: list[np.ndarray],
    outputs: list[str],
) -> list[np.ndarray]:
    """`node` alone in onnxruntime, as a model with `model`'s opsets: its `outputs` (the others
    omitted, as ONNX writes an optional output nobody reads), each typed as `types` says (one it
    does not name: as onnxruntime infers it)."""
    one = onnx.NodeProto()
    one.CopyFrom(node)
    kept = [t if t in outputs else "" for t in node.output]
    while kept and not kept[-1]:
        kept.pop()
    one.output[:] = kept

    def value_info(name: str) -> onnx.ValueInfoProto:
        if name not in types:
            return onnx.ValueInfoProto(name=name)
        elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(types[name].dtype))
        return helper.make_tensor_value_info(name, elem_type, types[name].dims())

    feeds = dict(zip(node.input, arrays, strict=True))
    graph = helper.make_graph(
        [one], node.name or node.op_type, [value_info(t) for t in feeds], [value_info(t) for t in outputs]
    )
    single = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # errors only: its warnings would be lines of their own on stderr
    try:
        session = onnxruntime.InferenceSession(
            single.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises a class of its own per status code
        raise OnnxruntimeError(reason(exc)) from None
