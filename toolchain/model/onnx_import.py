"""ONNX models -> Graph: each node becomes the registered op declaring its (domain, op_type) in
`Op.onnx`, its attributes converted by that declaration (`ops/onnx_mapping.py`).

What the graphs cannot hold yet is refused in one line, never approximated: constant tensors
(initializers), symbolic dims (`input_dim`), a node's second output that something reads, several
graph outputs, and ONNX ops no registered op implements.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, helper

from base.errors import UsageError, clipped, printable, reason
from ops.graph import Graph, Node, bind_graph
from ops.onnx_mapping import OnnxOp, domain_key, onnx_label
from ops.registry import op_for_onnx
from ops.spec import ALL_DTYPES, SYMBOL_NAMES, Op, TensorType, check_size, is_symbol_name

DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
}
"""ONNX element types -> our dtype names (ops.spec.ALL_DTYPES)."""

ATTRIBUTE_TYPES = (
    AttributeProto.INT,
    AttributeProto.FLOAT,
    AttributeProto.STRING,
    AttributeProto.INTS,
    AttributeProto.FLOATS,
    AttributeProto.STRINGS,
)
"""Attribute types a conversion may receive: tensors and subgraphs have no op attribute to become."""


def read_onnx(path: Path, data: bytes) -> Graph:
    """The Graph of the ONNX model in `data` (the bytes of `path`), checked by onnx's checker with
    its shape inference: a model onnxruntime would refuse is not built."""
    try:
        model = onnx.load_model_from_string(data)
    except DecodeError as exc:
        raise UsageError(f"model {path}: not an ONNX model: {reason(exc)}") from None
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise _invalid(path, exc) from None
    check_opset(path, model)
    try:
        graph = graph_from_onnx(model.graph, default_name=path.stem)
        check_declared_output(model.graph.output[0], bind_graph(graph).output)
    except UsageError as exc:
        raise UsageError(f"model {path}: {exc}") from None
    try:  # what the checker's full check adds, after ours, whose messages say more where both refuse:
        # ONNX's type constraints and shape inference (MaxPool on int32, 3 dilations on a 2-D
        # pool, a value_info its node contradicts)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise _invalid(path, exc) from None
    return graph


def _invalid(path: Path, exc: Exception) -> UsageError:
    """What onnx's checker or shape inference found, as one line."""
    said = " ".join(str(exc).split())  # the checker spreads one finding over lines (the node)
    return UsageError(f"model {path}: not a valid ONNX model: {printable(said[:300])}")


MIN_OPSET = 7
"""The oldest ONNX opset whose semantics the op mappings follow (numpy broadcasting in Add, as
onnxruntime supports): an older model's nodes could mean something else."""


def check_opset(path: Path, model: onnx.ModelProto) -> None:
    """The model imports ONNX's own operator set at a version the mappings follow: from MIN_OPSET
    to the newest the installed onnx knows (a newer one may have changed what a node means)."""
    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and not MIN_OPSET <= entry.version <= newest:
            raise UsageError(
                f"model {path}: ONNX opset {entry.version}: expected {MIN_OPSET} to {newest} (convert it with"
                " onnx.version_converter)"
            )


def check_declared_output(value: onnx.ValueInfoProto, computed: TensorType) -> None:
    """The graph's output as its nodes compute it matches what the model declares, where it
    declares it (element type; rank and each fixed dim): a model whose declared output is not
    what runs is refused, not run (onnx's checker does not look)."""
    where = f"output {value.name!r}"
    tensor = value.type.tensor_type
    declared = DTYPES.get(tensor.elem_type)
    if tensor.elem_type != TensorProto.UNDEFINED and declared != computed.dtype:
        name = TensorProto.DataType.Name(tensor.elem_type) if declared is None else declared
        raise UsageError(f"{where} is declared {name}, but its nodes compute {computed}")
    if not tensor.HasField("shape"):
        return
    dims = tensor.shape.dim
    fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    if len(dims) != len(computed.shape) or any(
        want is not None and want != got for want, got in zip(fixed, computed.shape, strict=True)
    ):
        shown = "x".join(str(d) if d is not None else "?" for d in fixed) or "a scalar"
        raise UsageError(f"{where} is declared {shown}, but its nodes compute {computed}")


def graph_from_onnx(graph: onnx.GraphProto, default_name: str) -> Graph:
    """`graph` as a Graph named `default_name` (ONNX graph names are mostly `main_graph`)."""
    constants = [t.name for t in graph.initializer] + [t.values.name for t in graph.sparse_initializer]
    for value in graph.input:
        if value.name in constants:
            raise UsageError(
                f"input {value.name!r} is an initializer: constant tensors are not supported yet"
            )
    if constants:
        raise UsageError(f"initializer {constants[0]!r}: constant tensors are not supported yet")
    if len(graph.output) != 1:
        names = ", ".join(repr(v.name) for v in graph.output)
        raise UsageError(
            f"the graph has {len(graph.output)} outputs ({names}): a graph has exactly one output"
        )
    read = {t for node in graph.node for t in node.input} | {graph.output[0].name}
    return Graph(
        default_name,
        tuple((v.name, input_type(v)) for v in graph.input),
        tuple(_node(index, node, read) for index, node in enumerate(graph.node)),
        graph.output[0].name,
    )


def input_type(value: onnx.ValueInfoProto) -> TensorType:
    """The TensorType of a graph input: one of our dtypes, every dim a size (`input_dim`)."""
    where = f"input {value.name!r}"
    if value.type.WhichOneof("value") != "tensor_type":
        raise UsageError(f"{where} is a {value.type.WhichOneof('value')}: expected a tensor")
    tensor = value.type.tensor_type
    if tensor.elem_type not in DTYPES:
        names = {number: name for name, number in TensorProto.DataType.items()}
        name = names.get(tensor.elem_type, tensor.elem_type)
        raise UsageError(f"{where} has element type {name}: expected one of {', '.join(ALL_DTYPES)}")
    # onnx's checker refuses a graph input without a shape: no unknown rank reads as a scalar
    shape = tuple(input_dim(value.name, axis, dim) for axis, dim in enumerate(tensor.shape.dim))
    result = TensorType(shape, DTYPES[tensor.elem_type])
    check_size(where, result)
    return result


def input_dim(name: str, axis: int, dim: onnx.TensorShapeProto.Dimension) -> int | str:
    """Dim `axis` of input `name`: a `dim_value`, or on the first axis a `dim_param` (a symbolic
    batch such as `N`: one module for every batch, `ops.spec.symbol`)."""
    if dim.HasField("dim_param"):
        if axis != 0:
            raise UsageError(
                f"input {name!r} dim {axis} is symbolic ({dim.dim_param!r}): only the first dim (the"
                " batch) may be symbolic"
            )
        if not is_symbol_name(dim.dim_param):
            param = clipped(dim.dim_param)
            raise UsageError(f"input {name!r} dim 0 is symbolic ({param!r}): expected {SYMBOL_NAMES}")
        return dim.dim_param
    if not dim.HasField("dim_value") or dim.dim_value < 1:
        size = dim.dim_value if dim.HasField("dim_value") else "unknown"
        raise UsageError(f"input {name!r} dim {axis} is {size}: expected a positive size")
    return dim.dim_value


def _node(index: int, node: onnx.NodeProto, read: set[str]) -> Node:
    """The Node of ONNX `node` (the `index`th); `read`: every tensor a node or the graph output reads."""
    name = node.name or f"{node.op_type}_{index}"
    source = printable(onnx_label(node.domain, node.op_type))  # a label, not a repr: escape it here
    op = op_for_onnx(node.domain, node.op_type)
    if op is None:
        domain = f', domain="{printable(node.domain)}"' if domain_key(node.domain) else ""
        raise UsageError(
            f"node {name!r} ({source}): no registered op implements it; add an op file declaring"
            f' onnx = (OnnxOp("{printable(node.op_type)}"{domain}),) and pass --ops-path'
            " (see docs/adding-ops.md)"
        )
    outputs = list(node.output)
    shell = Node(name, op, {}, tuple(node.input), outputs[0] if outputs else "", source)
    for position, tensor in enumerate(node.input):
        if not tensor:
            raise UsageError(
                f"{shell.label()}: input {position} is omitted (an empty optional input):"
                f" op {op.name} takes no optional inputs"
            )
    if not shell.output:
        raise UsageError(f"{shell.label()}: its first output is omitted: op {op.name} computes that one")
    for position, tensor in enumerate(outputs[1:], start=1):
        if tensor in read:
            raise UsageError(
                f"{shell.label()}: output {position} ({tensor!r}) is read, but op {op.name}"
                " computes only the first output"
            )
    mapping = _mapping(op.onnx, node.domain, node.op_type)
    try:
        attrs = mapping.attrs({a.name: _attribute(a) for a in node.attribute})
        _strings_only_where_text(op, attrs)
    except UsageError as exc:
        raise UsageError(f"{shell.label()}: {exc}") from None
    return replace(shell, attrs=attrs)


def _mapping(declared: tuple[OnnxOp, ...], domain: str, op_type: str) -> OnnxOp:
    """The declaration among an op's `onnx` that `op_for_onnx` found it by."""
    key = (domain_key(domain), op_type)
    return next(m for m in declared if m.key() == key)


def _strings_only_where_text(op: Op, attrs: dict[str, Any]) -> None:
    """ONNX attributes are typed: a string reaching an attribute whose kind takes no text
    (`takes_text`) is refused, never parsed as the CLI parses `-a` (a STRING "0.3" would pass as
    the float 0.3)."""
    kinds = {attr.name: attr.kind for attr in op.attrs}
    for name, value in attrs.items():
        kind = kinds.get(name)
        values = value if isinstance(value, list | tuple) else [value]
        if kind is not None and not kind.takes_text and any(isinstance(v, str) for v in values):
            raise UsageError(
                f"ONNX attribute {printable(name)}={value!r} is a string: expected {kind.type_name()}"
            )


def _attribute(attribute: onnx.AttributeProto) -> Any:
    """An ONNX attribute as a Python value: int, float, str, or a list of one of them."""
    if attribute.type not in ATTRIBUTE_TYPES:
        kind = AttributeProto.AttributeType.Name(attribute.type)
        raise UsageError(
            f"ONNX attribute {printable(attribute.name)} is a {kind}: only ints, floats, strings and lists of"
            " them are supported"
        )
    if attribute.ref_attr_name:  # onnx's checker lets it pass outside a function; it has no value
        raise UsageError(
            f"ONNX attribute {printable(attribute.name)} refers to a function's attribute"
            f" ({clipped(printable(attribute.ref_attr_name))}): only attributes with values are read"
        )
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value
