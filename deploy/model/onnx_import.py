"""ONNX models -> Graph: each node becomes the registered op declaring its (domain, op_type) in
`Op.onnx`, its attributes converted by that declaration (`deploy/ops/onnx_mapping.py`); initializers and
`Constant` nodes become the graph's constants (`deploy.ops.graph.Constant`), their data read here, an
external file's only from the model's own directory.

What the graphs cannot hold yet is refused in one line, never approximated: symbolic dims other
than the batch (`input_dim`), a node's second output that something reads (an op computes one),
and ONNX ops no registered op implements.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, helper

from deploy.base.errors import UsageError, clipped, printable, reason
from deploy.ops.graph import Constant, Graph, Node, bind_graph
from deploy.ops.onnx_mapping import OnnxOp, domain_key, onnx_label
from deploy.ops.registry import get_op, op_for_onnx
from deploy.ops.spec import ALL_DTYPES, SYMBOL_NAMES, Op, TensorType, check_size, is_symbol_name

DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
}
"""ONNX element types -> our dtype names (deploy.ops.spec.ALL_DTYPES)."""

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
    """The Graph of the ONNX model in `data` (the bytes of `path`): `graph_of` its `decode_onnx`."""
    return graph_of(path, decode_onnx(path, data))


def decode_onnx(path: Path, data: bytes) -> onnx.ModelProto:
    """The ONNX model in `data` (the bytes of `path`), its names UTF-8 text (`check_text`)."""
    try:
        model = onnx.load_model_from_string(data)
    except DecodeError as exc:
        raise UsageError(f"model {path}: not an ONNX model: {reason(exc)}") from None
    try:
        check_text(model.graph)
    except UsageError as exc:
        raise UsageError(f"model {path}: {exc}") from None
    return model


def graph_of(path: Path, model: onnx.ModelProto) -> Graph:
    """The Graph of `model` (read from `path`), checked by onnx's checker with its shape
    inference: a model onnxruntime would refuse is not built."""
    external = [t for t in _tensors(model.graph) if t.data_location == TensorProto.EXTERNAL]
    try:  # ours first: onnx's checker would say "not regular file" of a missing or outside one
        for tensor in external:
            _external_file(tensor, path.parent)
    except UsageError as exc:
        raise UsageError(f"model {path}: {exc}") from None
    try:  # given the path, the checker finds external data beside the model, not in the working directory
        onnx.checker.check_model(str(path) if external else model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise _invalid(path, exc) from None
    check_opset(path, model)
    try:
        graph = graph_from_onnx(model.graph, path, inferred_shapes(model))
        bound = bind_graph(graph)
        for value, computed in zip(model.graph.output, bound.outputs, strict=True):
            check_declared_output(value, computed)
    except UsageError as exc:
        raise UsageError(f"model {path}: {exc}") from None
    try:  # what the checker's full check adds, after ours, whose messages say more where both refuse:
        # ONNX's type constraints and shape inference (MaxPool on int32, 3 dilations on a 2-D
        # pool, a value_info its node contradicts)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise _invalid(path, exc) from None
    return graph


def check_text(graph: onnx.GraphProto) -> None:
    """Every name the graph gives (nodes' names, op types, domains and tensors; inputs',
    outputs' and initializers') is UTF-8 text, as ONNX requires: protobuf hands other bytes over
    as bytes, which no message or op lookup could use."""
    named = [
        *(("node", n.name) for n in graph.node),
        *(("op type", n.op_type) for n in graph.node),
        *(("domain", n.domain) for n in graph.node),
        *(("tensor", t) for n in graph.node for t in (*n.input, *n.output)),
        *(("tensor", v.name) for v in (*graph.input, *graph.output)),
        *(("tensor", t.name) for t in graph.initializer),
    ]
    for kind, value in named:
        if not isinstance(value, str):
            raise UsageError(
                f"a {kind} name {printable(clipped(repr(value)))} is not UTF-8 text, as ONNX requires"
            )


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


def graph_from_onnx(graph: onnx.GraphProto, path: Path, shapes: Shapes) -> Graph:
    """`graph` (of the model at `path`) as a Graph named as the file (ONNX graph names are mostly
    `main_graph`); an initializer's external data is read from the model's directory; `shapes`:
    the tensors' shapes as far as known (`inferred_shapes`). Nodes no registered op implements
    are refused all at once, pointing at the report that lists them."""
    directory = path.parent
    for sparse in graph.sparse_initializer:
        raise UsageError(
            f"initializer {printable(clipped(sparse.values.name))!r} is sparse: expected a dense tensor"
        )
    constants = [Constant.of(t.name, initializer(t, directory)) for t in graph.initializer]
    constants += [constant_node(node, directory) for node in graph.node if is_constant(node)]
    given = {c.name for c in constants}
    read = node_reads(graph)
    nodes = [(index, node) for index, node in enumerate(graph.node) if not is_constant(node)]
    ops = {index: op_for_onnx(node.domain, node.op_type) for index, node in nodes}
    missing = [(index, node) for index, node in nodes if ops[index] is None]
    if missing:
        raise _unimplemented(missing, path)
    return Graph(
        path.stem,
        # an initializer listed as an input too (older exporters) is its default value: a constant here
        tuple((v.name, input_type(v)) for v in graph.input if v.name not in given),
        tuple(
            converted
            for index, node in nodes
            if (op := ops[index]) is not None
            for converted in convert_node(index, node, op, read, shapes)
        ),
        tuple(v.name for v in graph.output),
        tuple(constants),
    )


Dims = tuple[int | None, ...]
"""A tensor's dims as ONNX's shape inference knows them (None: unknown, a symbolic batch)."""
Shapes = dict[str, Dims]


def inferred_shapes(model: onnx.ModelProto) -> Shapes:
    """Every tensor's dims that ONNX's shape inference finds (none where it fails: the checks
    after say why)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):
        inferred = model
    graph = inferred.graph
    shapes: Shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if value.type.WhichOneof("value") == "tensor_type" and tensor.HasField("shape"):
            shapes[value.name] = tuple(
                d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim
            )
    return shapes


def explicit_pads(attrs: dict[str, Any], shape: Dims | None) -> dict[str, Any]:
    """A pooling or convolution node's `auto_pad` SAME_UPPER or SAME_LOWER as the explicit `pads`
    it means on an input of `shape` [N, C, spatial...]: per axis an output of ceil(size / stride),
    the padding that takes split in two, the odd one after (UPPER) or before (LOWER). Left as
    given where the spatial size is unknown or pads are given too (the op's mapping refuses it)."""
    auto_pad = attrs.get("auto_pad")
    kernel = attrs.get("kernel_shape")
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER") or "pads" in attrs or not isinstance(kernel, list):
        return attrs
    spatial = shape[2:] if shape is not None else ()
    sizes = [size for size in spatial if size is not None]
    if len(sizes) != len(kernel) or len(sizes) != len(spatial):
        return attrs
    strides = attrs.get("strides", [1] * len(kernel))
    dilations = attrs.get("dilations", [1] * len(kernel))
    if any(not isinstance(v, int) or v < 1 for v in [*kernel, *strides, *dilations]):
        return attrs  # a size below 1: the op's mapping or ONNX's checks refuse it
    before, after = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=False):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        before.append(first)
        after.append(total - first)
    return {**{n: v for n, v in attrs.items() if n != "auto_pad"}, "pads": before + after}


def node_reads(graph: onnx.GraphProto) -> set[str]:
    """Every tensor a node or the graph's output reads (a node's further output in it needs an op
    computing it: `OnnxOp.more_outputs`)."""
    return {t for node in graph.node for t in node.input} | {v.name for v in graph.output}


def is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and domain_key(node.domain) == ""


def initializer(tensor: onnx.TensorProto, directory: Path) -> np.ndarray:
    """The value of initializer `tensor`: its dtype one of ours, its data all there (inline, or
    in an external file inside `directory`)."""
    where = f"initializer {printable(clipped(tensor.name))!r}"
    dtype = DTYPES.get(tensor.data_type)
    if dtype is None:
        name = (
            TensorProto.DataType.Name(tensor.data_type)
            if tensor.data_type in _TYPE_NAMES
            else tensor.data_type
        )
        raise UsageError(f"{where} has element type {name}: expected one of {', '.join(ALL_DTYPES)}")
    shape = tuple(tensor.dims)
    check_size(where, TensorType(tuple(d if d > 0 else 1 for d in shape), dtype))
    if tensor.data_location == TensorProto.EXTERNAL:
        return _external(tensor, shape, dtype, directory, where)
    try:
        array = onnx.numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as exc:  # data shorter or longer than its dims
        raise UsageError(
            f"{where}: its data does not hold {_shown(shape)} {dtype} values ({reason(exc)})"
        ) from None
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise UsageError(f"{where}: its data does not hold {_shown(shape)} {dtype} values")
    return array


_TYPE_NAMES = set(TensorProto.DataType.values())


def _shown(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "a scalar's"


def _tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """The tensors a graph gives values: its initializers and its Constant nodes' tensors."""
    values = [a.t for node in graph.node if is_constant(node) for a in node.attribute if a.name == "value"]
    return [*graph.initializer, *values]


def _external(
    tensor: onnx.TensorProto, shape: tuple[int, ...], dtype: str, directory: Path, where: str
) -> np.ndarray:
    """An initializer stored outside the model (`data_location=EXTERNAL`): read where
    `_external_file` says."""
    file, offset, need = _external_file(tensor, directory)
    try:
        with file.open("rb") as f:
            f.seek(offset)
            data = f.read(need)
    except OSError as exc:
        raise UsageError(
            f"{where}: cannot read its external data file {file}: {exc.strerror or exc}"
        ) from None
    if len(data) != need:
        raise UsageError(
            f"{where}: its external data file {file} holds {len(data)} bytes at offset {offset},"
            f" expected {need}"
        )
    return np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).reshape(shape)


def _external_file(tensor: onnx.TensorProto, directory: Path) -> tuple[Path, int, int]:
    """Where an external tensor's data is: (its `location`, a regular file inside `directory`;
    the `offset` in it, within the file; its bytes, which `length` must match where given)."""
    where = f"initializer {printable(clipped(tensor.name))!r}"
    dtype = DTYPES.get(tensor.data_type, "uint8")  # an unknown dtype is refused when it is read
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    shown = printable(clipped(location))
    base = directory.resolve()
    outside = UsageError(
        f"{where}: its external data {shown!r} is not a file inside the model's directory {base}"
    )
    if not location or "\0" in location or Path(location).is_absolute():
        raise outside
    try:
        file = (base / location).resolve()
        inside, regular = base in file.parents, file.is_file()
        size = file.stat().st_size if regular else 0
    except (OSError, ValueError):  # a name too long for the file system
        raise outside from None
    if not inside:
        raise outside
    if not regular:
        what = "is not a regular file" if file.exists() else "is missing"
        raise UsageError(f"{where}: its external data file {printable(str(file))} {what}")
    if any(d < 0 for d in tensor.dims):
        raise UsageError(f"{where} has dims {list(tensor.dims)}: expected sizes of 0 or more")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        raise UsageError(f"{where}: its external data's offset or length is not a number") from None
    need = int(np.prod(tuple(tensor.dims), dtype=np.int64)) * np.dtype(dtype).itemsize
    if not 0 <= offset <= size or (length is not None and length != need):
        raise UsageError(
            f"{where}: its external data (offset {clipped(str(offset))}, length {clipped(str(length))})"
            f" is not {need} bytes inside its file of {size}"
        )
    return file, offset, need


CONSTANT_VALUES = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}
"""A Constant node's attributes that give a value other than as a tensor, and their dtypes."""


def constant_node(node: onnx.NodeProto, directory: Path) -> Constant:
    """The constant an ONNX `Constant` node outputs: its one value attribute (a dense tensor, a
    float or int, or a list of them); sparse and string values are refused. A tensor's external
    data is read from `directory`, as an initializer's."""
    where = f"Constant node {printable(clipped(node.name or node.output[0]))!r}"
    if len(node.attribute) != 1:
        names = ", ".join(printable(a.name) for a in node.attribute) or "none"
        raise UsageError(f"{where} has attributes {names}: expected exactly one value")
    attribute = node.attribute[0]
    if attribute.name == "value":
        return Constant.of(node.output[0], initializer(attribute.t, directory))
    if attribute.name in CONSTANT_VALUES:
        value = helper.get_attribute_value(attribute)
        return Constant.of(node.output[0], np.array(value, dtype=CONSTANT_VALUES[attribute.name]))
    raise UsageError(
        f"{where} has a {printable(attribute.name)} value: expected a dense tensor, a float or an int"
        " (or a list of them)"
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
    batch such as `N`: one module for every batch, `deploy.ops.spec.symbol`)."""
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


def node_name(index: int, node: onnx.NodeProto) -> str:
    """A node's name, or `OpType_index` for an unnamed one."""
    return node.name or f"{node.op_type}_{index}"


def declaration(node: onnx.NodeProto) -> str:
    """What an op file declares to implement `node`'s op type: `onnx = (OnnxOp("Relu"),)`."""
    domain = f', domain="{printable(node.domain)}"' if domain_key(node.domain) else ""
    return f'onnx = (OnnxOp("{printable(node.op_type)}"{domain}),)'


def _unimplemented(missing: list[tuple[int, onnx.NodeProto]], path: Path) -> UsageError:
    """The one line refusing a model with `missing` nodes (their op types implemented by no
    registered op): the node and what to declare for one, the count and op types for several;
    both point at the report of the whole model."""
    report = f"deploy ops --model {printable(str(path))}"
    if len(missing) == 1:
        index, node = missing[0]
        return UsageError(
            f"node {node_name(index, node)!r} ({printable(onnx_label(node.domain, node.op_type))}): no"
            f" registered op implements it; add an op file declaring {declaration(node)} and pass"
            f" --ops-path (see docs/adding-ops.md; `{report}` reports the whole model)"
        )
    labels = list(dict.fromkeys(printable(onnx_label(n.domain, n.op_type)) for _, n in missing))
    shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
    return UsageError(
        f"{len(missing)} nodes need ONNX ops no registered op implements ({len(labels)} op types: {shown}):"
        f" `{report}` lists each with what to add (see docs/adding-ops.md)"
    )


def convert_node(index: int, node: onnx.NodeProto, op: Op, read: set[str], shapes: Shapes) -> list[Node]:
    """The Nodes of ONNX `node` (the `index`th), which `op` implements: its own, and one per
    further output that is read, of the op the mapping names for it (`OnnxOp.more_outputs`);
    `read`: `node_reads`; `shapes`: `inferred_shapes` (its first input's for auto_pad)."""
    name = node_name(index, node)
    source = printable(onnx_label(node.domain, node.op_type))  # a label, not a repr: escape it here
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
    mapping = _mapping(op.onnx, node.domain, node.op_type)
    more = []
    for position, tensor in enumerate(outputs[1:], start=1):
        if tensor not in read:
            continue
        computed = 1 + len(mapping.more_outputs)
        if position >= computed:
            raise UsageError(
                f"{shell.label()}: output {position} ({tensor!r}) is read, but op {op.name} computes"
                f" {'only the first output' if computed == 1 else f'only the first {computed} outputs'}"
            )
        more.append((position, tensor, mapping.more_outputs[position - 1]))
    try:
        shape = shapes.get(node.input[0]) if node.input else None
        given = explicit_pads({a.name: attribute_value(a) for a in node.attribute}, shape)
        steps = mapping.chain(given, shape) if mapping.chain else None
        nodes = [replace(shell, attrs=mapping.attrs(given))] if steps is None else _chained(shell, steps)
        for position, tensor, output in more:
            if steps is not None:
                raise UsageError(f"output {position} ({tensor!r}) is read: {op.name} computes it only in 2-D")
            extra = get_op(output.op)
            nodes.append(
                replace(shell, name=f"{name}:{position}", op=extra, attrs=output.attrs(given), output=tensor)
            )
        for converted in nodes:
            _strings_only_where_text(converted.op, converted.attrs)
    except UsageError as exc:
        raise UsageError(f"{shell.label()}: {exc}") from None
    return nodes


def _chained(node: Node, steps: list[tuple[str, dict[str, Any]]]) -> list[Node]:
    """`node` as the chain of ops `steps` (`OnnxOp.chain`): step k is node `name:k` writing
    `output:k`, the last one the node's output."""
    chain: list[Node] = []
    for k, (op_name, attrs) in enumerate(steps):
        reads = node.inputs if k == 0 else (chain[-1].output,)
        writes = node.output if k == len(steps) - 1 else f"{node.output}:{k}"
        chain.append(
            replace(
                node, name=f"{node.name}:{k}", op=get_op(op_name), attrs=attrs, inputs=reads, output=writes
            )
        )
    return chain


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


def attribute_value(attribute: onnx.AttributeProto) -> Any:
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
