"""Our declarative graph file, YAML or JSON with one structure:

    name: maxpool_add            # optional, default: the file's stem
    inputs:                      # in the order a caller passes arrays
      a: {shape: [32, 64, 112, 112], dtype: float32}
      b: {shape: [32, 1, 56, 56]}                    # dtype optional, default float32
                                 # a first dim like N: a symbolic batch, any size at run time
    nodes:
      - name: pool               # the node's output tensor is named like the node
        op: max_pool2d
        attrs: {kernel: 3, stride: 2, padding: 1}   # optional, as `-a` gives them
        inputs: [a]
      - {name: sum, op: add, inputs: [pool, b]}
    output: sum                  # or a list of tensors: [sum, pool], returned in that order

Structure only is checked here, each problem one line naming the node (by name, or as
`nodes[2]` where it has none); tensors, cycles and the ops' own checks are `deploy.ops.graph.bind_graph`'s.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from deploy.base.errors import UsageError, clipped, printable, reason, shown
from deploy.ops.graph import Graph, Node
from deploy.ops.registry import get_op
from deploy.ops.spec import ALL_DTYPES, SYMBOL_NAMES, TensorType, check_size, is_symbol_name

TOP_KEYS = ("name", "inputs", "nodes", "output")
INPUT_KEYS = ("shape", "dtype")
NODE_KEYS = ("name", "op", "attrs", "inputs")
DEFAULT_DTYPE = "float32"


class _TooLarge(Exception):
    """A graph file that is valid YAML, but too large with its aliases written out."""


class _NotAsWritten(Exception):
    """A YAML number its reader would take as another value than the one it shows."""


MAX_YAML_VALUES = 1_000_000
"""The most values a graph file may hold with its aliases written out: a few aliases of aliases
(`*a` repeating `&a [*b, *b, ...]`) would otherwise make a 600-byte file a billion values."""


class _KeysOnce(yaml.SafeLoader):
    """`yaml.safe_load`'s loader (plain data, no Python objects) refusing a mapping that gives a
    key twice, which YAML would read as the last: a model other than the one the file shows; and
    a document whose aliases expand past MAX_YAML_VALUES."""

    def compose_document(self) -> Any:
        document = super().compose_document()
        sizes: dict[int, int] = {}

        def expanded(node: yaml.Node) -> int:  # each node counted once: linear in the file
            if id(node) not in sizes:
                sizes[id(node)] = 1  # a cycle (an alias inside its own anchor) counts once
                children = node.value if isinstance(node, yaml.CollectionNode) else []
                items = (
                    [part for pair in children for part in pair]
                    if isinstance(node, yaml.MappingNode)
                    else children
                )
                sizes[id(node)] = 1 + sum(expanded(child) for child in items)
            return sizes[id(node)]

        if document is not None and expanded(document) > MAX_YAML_VALUES:
            raise _TooLarge(f"its aliases (*name) expand to more than {MAX_YAML_VALUES} values")
        return document


def _merged_once(loader: _KeysOnce, merged: yaml.Node) -> None:
    """`<<: [*a, *b]`: a key that two merged maps both give is refused. YAML takes the first
    map's value, PyYAML the last's: the file would say one graph and build another."""
    if not isinstance(merged, yaml.SequenceNode):
        return
    given: set[Any] = set()
    for part in merged.value:
        pairs = part.value if isinstance(part, yaml.MappingNode) else []
        constructed = [loader.construct_object(k, deep=True) for k, _ in pairs]
        keys = {k for k in constructed if isinstance(k, Hashable)}  # others: construct_yaml_map refuses them
        if twice := sorted(map(str, keys & given)):
            raise yaml.MarkedYAMLError(
                problem=f"key {twice[0]!r} given by two maps it merges (<<)", problem_mark=part.start_mark
            )
        given |= keys


def _mapping_once(loader: _KeysOnce, node: yaml.MappingNode) -> Any:
    seen: set[Any] = set()
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be given again
            _merged_once(loader, value_node)
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):  # construct_yaml_map refuses it, in its words
            continue
        if key in seen:
            raise yaml.MarkedYAMLError(problem=f"key {key!r} given twice", problem_mark=key_node.start_mark)
        seen.add(key)
    yield from loader.construct_yaml_map(node)


_KeysOnce.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)

_OCTAL = re.compile(r"[-+]?0[0-7_]+")
"""An int YAML 1.1 (PyYAML) reads as octal: `010` is 8 there, 10 in YAML 1.2 and JSON."""
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")
"""A number YAML 1.1 reads in base 60: `1:30` is 90."""


def _number_as_written(loader: _KeysOnce, node: yaml.ScalarNode) -> Any:
    """An int or float scalar as it looks, else `_NotAsWritten` naming it: a shape or attribute
    is never silently another value than the file shows."""
    text = str(loader.construct_scalar(node))
    is_int = node.tag.endswith(":int")
    line = node.start_mark.line + 1
    reading = (
        "base 60" if _BASE_60.fullmatch(text) else "octal" if is_int and _OCTAL.fullmatch(text) else None
    )
    if reading is not None:
        raise _NotAsWritten(
            f"{line}: number {text}: YAML 1.1 reads it as {reading}; write it in decimal without"
            " leading zeros (or quote it for a string)"
        )
    if is_int and len(text.lstrip("+-")) > sys.get_int_max_str_digits():
        raise _NotAsWritten(
            f"{line}: an int of {len(text.lstrip('+-'))} digits ({clipped(text)}): at most"
            f" {sys.get_int_max_str_digits()} are read"
        )
    try:
        return loader.construct_yaml_int(node) if is_int else loader.construct_yaml_float(node)
    except ValueError:  # an explicit tag on another text: `!!int 1e3`
        what = "an int" if is_int else "a float"
        raise _NotAsWritten(f"{line}: {printable(clipped(text))} is not {what}") from None


_KeysOnce.add_constructor("tag:yaml.org,2002:int", _number_as_written)
_KeysOnce.add_constructor("tag:yaml.org,2002:float", _number_as_written)


def _pairs_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when it gives a key twice (see `_KeysOnce`)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key!r} given twice")
        found[key] = value
    return found


def read_yaml(path: Path, data: bytes) -> Graph:
    """A graph file in YAML (plain data, no Python objects, each key once)."""
    try:
        document = yaml.load(_text(path, data), Loader=_KeysOnce)
    except _TooLarge as exc:
        raise UsageError(f"model {path}: {exc}") from None
    except _NotAsWritten as exc:
        raise UsageError(f"model {path}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UsageError(
            f"model {where}: not valid YAML: {printable(str(exc.problem or exc.context))}"
        ) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"model {path}: not valid YAML: {reason(exc)}") from None
    except RecursionError:
        raise UsageError(f"model {path}: not valid YAML: nested too deeply") from None
    return _graph(path, document)


def read_json(path: Path, data: bytes) -> Graph:
    """A graph file in JSON."""
    try:
        document = json.loads(_text(path, data), object_pairs_hook=_pairs_once)
    except json.JSONDecodeError as exc:
        raise UsageError(f"model {path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise UsageError(f"model {path}: not valid JSON: {reason(exc)}") from None
    except RecursionError:
        raise UsageError(f"model {path}: not valid JSON: nested too deeply") from None
    return _graph(path, document)


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"model {path}: not UTF-8 text (byte {exc.start})") from None


def _graph(path: Path, document: Any) -> Graph:
    try:
        return graph_from_document(document, default_name=path.stem)
    except UsageError as exc:
        raise UsageError(f"model {path}: {exc}") from None


def graph_from_document(document: Any, default_name: str) -> Graph:
    """The Graph a parsed file describes; every structural problem a one-line UsageError."""
    top = _mapping("the file", document, TOP_KEYS, "a mapping")
    name = top.get("name", default_name)
    if not isinstance(name, str) or not name or not name.isprintable():
        raise UsageError(f"name {shown(name)}: expected a non-empty string of printable characters")
    inputs = _inputs(_required("the file", top, "inputs", "a mapping of input names to {shape, dtype}"))
    nodes = _nodes(_required("the file", top, "nodes", "a list of nodes"))
    outputs = _outputs(_required("the file", top, "output", "the tensor it returns, or a list of them"))
    return Graph(name, inputs, nodes, outputs)


def _mapping(where: str, value: Any, keys: tuple[str, ...], expected: str) -> dict[str, Any]:
    """`value` as a mapping whose keys are all among `keys` (required ones are checked by the caller)."""
    if not isinstance(value, dict):
        raise UsageError(f"{where}: expected {expected} with keys {', '.join(keys)}, got {_kind(value)}")
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise UsageError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f" (allowed: {', '.join(keys)})"
        )
    return value


def _kind(value: Any) -> str:
    """How a message names a parsed value's type: `a list`, `a string 'x'`, `nothing`."""
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"a string {shown(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {shown(value)}"


def _inputs(value: Any) -> tuple[tuple[str, TensorType], ...]:
    if not isinstance(value, dict) or not value:
        raise UsageError(
            "inputs: expected a mapping of input names to {shape, dtype}, in the order a caller"
            f" passes arrays, got {_kind(value)}"
        )
    return tuple(_input(name, spec) for name, spec in value.items())


def _input(name: Any, spec: Any) -> tuple[str, TensorType]:
    if not isinstance(name, str) or not name:
        raise UsageError(f"inputs: input name {shown(name)}: expected a non-empty string")
    where = f"input {shown(name)}"
    fields = _mapping(where, spec, INPUT_KEYS, "a mapping")
    shape = _required(where, fields, "shape", "a list of positive ints")
    if not isinstance(shape, list) or any(not _dim(d, first=axis == 0) for axis, d in enumerate(shape)):
        raise UsageError(
            f"{where}: shape {shown(shape)}: expected a list of positive ints ([] for a scalar),"
            f" the first of them may be a symbolic batch: {SYMBOL_NAMES}"
        )
    dtype = fields.get("dtype", DEFAULT_DTYPE)
    if dtype not in ALL_DTYPES:
        raise UsageError(f"{where}: dtype {shown(dtype)}: expected one of {', '.join(ALL_DTYPES)}")
    result = TensorType(tuple(shape), dtype)
    check_size(where, result)
    return name, result


def _dim(value: Any, first: bool) -> bool:
    """A size, or (the first dim) a symbolic batch's name."""
    if isinstance(value, str):
        return first and is_symbol_name(value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _nodes(value: Any) -> tuple[Node, ...]:
    if not isinstance(value, list) or not value:
        raise UsageError(
            f"nodes: expected a non-empty list of nodes ({', '.join(NODE_KEYS)}), got {_kind(value)}"
        )
    return tuple(_node(index, item) for index, item in enumerate(value))


def _node(index: int, item: Any) -> Node:
    name = item.get("name") if isinstance(item, dict) else None
    where = f"node {shown(name)}" if isinstance(name, str) and name else f"nodes[{index}]"
    fields = _mapping(where, item, NODE_KEYS, "a mapping")
    if not isinstance(name, str) or not name:
        raise UsageError(
            f"{where}: name {shown(name)}: expected a non-empty string (it names the node's output)"
        )
    op_name = _required(where, fields, "op", "the name of a registered op")
    if not isinstance(op_name, str):
        raise UsageError(f"{where}: op {shown(op_name)}: expected the name of a registered op")
    try:
        op = get_op(op_name)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    attrs = fields.get("attrs", {})
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise UsageError(f"{where}: attrs {shown(attrs)}: expected a mapping of attribute names to values")
    expected = "a list of tensor names (graph inputs or nodes)"
    inputs = _required(where, fields, "inputs", expected)
    if not isinstance(inputs, list) or not all(isinstance(t, str) and t for t in inputs):
        raise UsageError(f"{where}: inputs {shown(inputs)}: expected {expected}")
    return Node(name, op, attrs, tuple(inputs), output=name)


def _required(where: str, fields: dict[str, Any], key: str, expected: str) -> Any:
    if key not in fields:
        raise UsageError(f"{where}: missing {key!r} ({expected})")
    return fields[key]


def _outputs(value: Any) -> tuple[str, ...]:
    """`output`: a tensor's name, or a non-empty list of them (returned in that order)."""
    names = value if isinstance(value, list) else [value]
    if not names:
        raise UsageError("output []: expected the tensor the graph returns, or a list of them")
    for name in names:
        if not isinstance(name, str) or not name:
            raise UsageError(f"output {shown(value)}: expected the names of the tensors the graph returns")
    return tuple(names)
