"""What an ONNX model needs (`deploy ops --model m.onnx`): every node with the op that implements
it, or what stops it, all at once; for each op type no registered op implements, what an op file
must declare and the attributes the model uses with their values (so the op's attributes can be
written for them). Build, run and test refuse such a model in one line pointing here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import onnx

from deploy.base.errors import UsageError, clipped, printable
from deploy.model import ONNX, model_bytes
from deploy.model.onnx_import import (
    attribute_value,
    convert_node,
    declaration,
    decode_onnx,
    graph_of,
    inferred_shapes,
    is_constant,
    node_name,
    node_reads,
)
from deploy.ops.graph import Node
from deploy.ops.onnx_mapping import domain_key, onnx_label
from deploy.ops.registry import op_for_onnx

MAX_VALUES = 8
"""The most distinct values of one attribute a missing op's entry lists (then "... N more")."""


def model_report(path: Path) -> dict[str, Any]:
    """The report of the ONNX model at `path`, JSON-ready:

    - `nodes`: each node's name, its ONNX op (`onnx`), the op that implements it (`op`) and its
      `status`: "ok", "constant" (a Constant node: a constant of the graph), "missing" (no
      registered op implements its op type) or "refused" (an op does, but not as this node uses
      it: `problem` says why, in the build's words);
    - `missing`: per op type no registered op implements: domain, op type, its nodes, the
      `declaration` an op file makes, and `attributes`: each attribute the model gives it, with
      the distinct values;
    - `builds`: whether the model builds as it is, and `problem`: the first thing that stops it.
    """
    if path.suffix.lower() != ".onnx":
        raise UsageError(f"model {path}: the report reads ONNX models (.onnx); a graph file names our ops")
    model = decode_onnx(path, model_bytes(path, ONNX))
    read, shapes = node_reads(model.graph), inferred_shapes(model)
    nodes: list[dict[str, Any]] = []
    missing: dict[tuple[str, str], dict[str, Any]] = {}
    for index, node in enumerate(model.graph.node):
        label = printable(onnx_label(node.domain, node.op_type))
        entry: dict[str, Any] = {"name": printable(node_name(index, node)), "onnx": label, "op": None}
        op = op_for_onnx(node.domain, node.op_type)
        if is_constant(node):
            entry["status"] = "constant"
        elif op is None:
            entry["status"] = "missing"
            key = (domain_key(node.domain), node.op_type)
            found = missing.setdefault(key, _missing_entry(node))
            found["nodes"].append(entry["name"])
            _add_attributes(found["attributes"], node)
        else:
            entry["op"] = op.name
            try:
                converted = convert_node(index, node, op, read, shapes)
                entry["op"] = " + ".join(dict.fromkeys(n.op.name for n in converted))
                entry["status"] = "ok"
            except UsageError as exc:  # its row names the node: the message without its label
                label = Node(node_name(index, node), op, {}, (), "", label).label()
                entry["status"], entry["problem"] = "refused", str(exc).removeprefix(f"{label}: ")
        nodes.append(entry)
    problem = None
    try:
        graph_of(path, model)
    except UsageError as exc:
        problem = str(exc).removeprefix(f"model {path}: ")
    for entry in missing.values():
        entry["attributes"] = {
            name: values[:MAX_VALUES]
            + ([f"... {len(values) - MAX_VALUES} more"] if len(values) > MAX_VALUES else [])
            for name, values in sorted(entry["attributes"].items())
        }
    return {
        "model": str(path),
        "nodes": nodes,
        "missing": list(missing.values()),
        "builds": problem is None,
        "problem": problem,
    }


def _missing_entry(node: onnx.NodeProto) -> dict[str, Any]:
    return {
        "domain": printable(domain_key(node.domain)),
        "op_type": printable(node.op_type),
        "declaration": declaration(node),
        "nodes": [],
        "attributes": {},
    }


MOST_LISTED = 16
"""The most items of one list value a report shows (then how many there are)."""


def _add_attributes(attributes: dict[str, list[Any]], node: onnx.NodeProto) -> None:
    """Each attribute `node` gives, its value added to those seen (each once, in order); a
    value no op attribute could take (a tensor, a graph) is shown by its kind."""
    for attribute in node.attribute:
        try:
            value = attribute_value(attribute)
        except UsageError:
            value = f"<{onnx.AttributeProto.AttributeType.Name(attribute.type)}>"
        shown = _shown(value)
        seen = attributes.setdefault(printable(clipped(attribute.name)), [])
        if shown not in seen:
            seen.append(shown)


def _shown(value: Any) -> Any:
    """An attribute value as the report shows it, JSON of any parser: text escaped and clipped,
    NaN and infinities as text, a long list cut to its first MOST_LISTED items."""
    if isinstance(value, list):
        items = [_shown(v) for v in value[:MOST_LISTED]]
        return items if len(value) <= MOST_LISTED else [*items, f"... ({len(value)} values)"]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return printable(clipped(value)) if isinstance(value, str) else value
