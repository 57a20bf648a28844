"""Graphs of registered ops: named input tensors, constant tensors (their values given by the
model), nodes (an op, its attributes, the tensors it reads) and output tensors; a model file
or an ONNX model becomes one (`deploy/model`).

`bind_graph` checks a graph the way `bind` checks one op: tensors that exist, no cycle, and each
node bound with its op's own `infer` in data-flow order, so a bad graph fails with the op's own
message, prefixed with the node that has the problem. The reference of a graph is its ops'
numpy references composed in that order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from deploy.base.errors import UsageError
from deploy.ops.spec import BoundOp, Op, TensorType, bind, sizes_of
from deploy.ops.tolerance import Rule, combined


@dataclass(frozen=True)
class Node:
    """One op application: `op` on the tensors named `inputs`, writing the tensor `output`.
    `attrs` are as given (a file's values); `bind` normalizes them. `source` says what the node
    was in its model ("MaxPool" for an ONNX node), for messages."""

    name: str
    op: Op
    attrs: dict[str, Any]
    inputs: tuple[str, ...]
    output: str
    source: str = ""
    layout: str | None = None
    """The layout the layout pass moved the node to (`deploy/ops/relayout.py`; None: as written)."""

    def label(self) -> str:
        """The node as messages name it: `node 'pool' (max_pool2d)`, with the ONNX op type."""
        kind = f"{self.source} -> {self.op.name}" if self.source else self.op.name
        return f"node {self.name!r} ({kind})"


@dataclass(frozen=True)
class Constant:
    """A tensor whose value the model gives (an ONNX initializer or Constant node): read by the
    nodes like an input, baked into the artifact once (`deploy/compiler/constants.py`).
    `data` is the array's bytes, C order, little-endian: hashable, so graphs stay comparable."""

    name: str
    type: TensorType
    data: bytes

    @staticmethod
    def of(name: str, array: np.ndarray) -> Constant:
        little = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")  # 0-d stays 0-d
        return Constant(name, TensorType(array.shape, array.dtype.name), little.tobytes())

    def array(self) -> np.ndarray:
        """The value, read-only (every reference shares it)."""
        shape = tuple(int(d) for d in self.type.shape)
        return np.frombuffer(self.data, np.dtype(self.type.dtype).newbyteorder("<")).reshape(shape)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """As the manifest and the build key list it: the value by its sha256."""
        return {"name": self.name, **self.type.to_json(), "sha256": self.sha256}


@dataclass(frozen=True)
class Graph:
    """A graph as read from a model: `inputs` in the order a caller passes arrays, `constants`
    (the tensors the model gives values), `nodes` in any order, `outputs` the tensors it returns,
    in the order a caller receives them."""

    name: str
    inputs: tuple[tuple[str, TensorType], ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    constants: tuple[Constant, ...] = ()


@dataclass(frozen=True)
class BoundNode:
    """A node with its op bound to the types of the tensors it reads."""

    node: Node
    bound: BoundOp


Apply = Callable[[BoundNode, list[Any]], Any]
"""(a node, the values of the tensors it reads) -> the value of its output."""


@dataclass(frozen=True)
class BoundGraph:
    """A checked graph: nodes in data-flow order, each bound, and every tensor's type."""

    graph: Graph
    nodes: tuple[BoundNode, ...]
    types: dict[str, TensorType]
    dropped: tuple[str, ...] = ()
    """The nodes of the graph as given that no output reads (`bind_graph` leaves them out)."""

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def inputs(self) -> tuple[TensorType, ...]:
        return tuple(t for _, t in self.graph.inputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.graph.inputs)

    @property
    def outputs(self) -> tuple[TensorType, ...]:
        return tuple(self.types[name] for name in self.graph.outputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.graph.outputs

    @property
    def constants(self) -> tuple[Constant, ...]:
        return self.graph.constants

    @property
    def exact(self) -> bool:
        """Bit-exact when every op is (max pooling, argmax): else floats get tolerances."""
        return all(n.bound.op.exact for n in self.nodes)

    def rule(self) -> Rule:
        """How its float outputs are compared: its nodes' rules combined (`tolerance.combined`)."""
        return combined([n.bound.rule() for n in self.nodes])

    def check_inputs(self, given: Sequence[TensorType], sources: Sequence[str]) -> None:
        """Arrays of types `given` (read from `sources`, for messages) fit the graph's inputs:
        as many, each of its shape and dtype; else a one-line UsageError naming the input."""
        names = self.input_names
        if len(given) != len(names):
            raise UsageError(
                f"model {self.name} takes {len(names)} input(s) ({', '.join(names)}), got {len(given)}"
            )
        for name, expected, actual, source in zip(names, self.inputs, given, sources, strict=True):
            if actual.dtype != expected.dtype or not expected.fits(actual.shape):
                raise UsageError(f"input {name} of model {self.name} is {expected}; {source} holds {actual}")
        sizes_of(list(zip(names, self.inputs, strict=True)), [t.shape for t in given])

    def ops(self) -> tuple[Op, ...]:
        """The op definitions the graph's build depends on."""
        return ops_of(self.nodes)

    def key(self) -> dict[str, Any]:
        """What decides the compiled graph: inputs, and each node's op, attributes, inputs."""
        return {
            "graph": self.name,
            "inputs": [{"name": n, **t.to_json()} for n, t in self.graph.inputs],
            "constants": [c.to_json() for c in self.graph.constants],
            "nodes": [
                {"name": n.node.name, **n.bound.key(), "reads": list(n.node.inputs), "writes": n.node.output}
                for n in self.nodes
            ],
            "outputs": list(self.graph.outputs),
        }

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()[:24]

    def references(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The outputs by the ops' numpy references composed in data-flow order."""
        given = {c.name: c.array() for c in self.graph.constants}
        given.update(zip(self.input_names, arrays, strict=True))
        values = flow(self.nodes, given, numpy_reference)
        return [values[name] for name in self.graph.outputs]

    def baselines(self, *arrays: np.ndarray) -> list[np.ndarray] | None:
        """The outputs by the ops' `numpy_baseline`s composed (`deploy bench`'s numpy column);
        None where an op has none."""
        return _baseline_flow(self, arrays)


def _baseline_flow(graph: BoundGraph, arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """The graph's outputs by its ops' `numpy_baseline`s composed; None where one has none."""
    values = {c.name: c.array() for c in graph.graph.constants}
    values.update(zip(graph.input_names, arrays, strict=True))
    for n in graph.nodes:
        found = n.bound.op.numpy_baseline(n.bound.attrs, *[values[name] for name in n.node.inputs])
        if found is None:
            return None
        values[n.node.output] = found
    return [values[name] for name in graph.graph.outputs]


def ops_of(nodes: Sequence[BoundNode]) -> tuple[Op, ...]:
    """The op definitions `nodes` are made of, each once, in order."""
    return tuple(dict.fromkeys(op for n in nodes for op in n.bound.ops()))


def flow(nodes: Sequence[BoundNode], values: dict[str, Any], apply: Apply) -> dict[str, Any]:
    """`values` (tensor name -> value) with every node's output added, in data-flow order: what
    `apply(node, its input values)` returns for it. The one walk over a graph that references,
    computations and fused groups all take."""
    values = dict(values)
    for n in nodes:
        values[n.node.output] = apply(n, [values[name] for name in n.node.inputs])
    return values


def numpy_reference(n: BoundNode, arrays: list[np.ndarray]) -> np.ndarray:
    """A node's output by its op's numpy reference."""
    return n.bound.op.reference(n.bound.attrs, *arrays)


def bind_graph(graph: Graph) -> BoundGraph:
    """Check `graph` and bind every node: tensor names unique, every input a tensor that exists,
    no cycle, each output written by a node, an input or a constant and given once; each node
    bound by its op (its own messages, prefixed with the node). Nodes whose outputs no graph
    output reads are checked, then left out (`BoundGraph.dropped`): each would be a kernel, and
    a file of 10,000 of them did not build in 300 s. So are the constants no node left reads and
    no output is: the artifact would carry them (and an OpenCL one upload them) for nothing."""
    _check_names(graph)
    types: dict[str, TensorType] = {}
    for kind, name, tensor in [
        *(("input", name, t) for name, t in graph.inputs),
        *(("constant", c.name, c.type) for c in graph.constants),
    ]:
        if name in types:
            raise UsageError(f"graph {graph.name}: {kind} {name!r} is declared twice (or as an input)")
        types[name] = tensor
    writers: dict[str, Node] = {}
    names: set[str] = set()
    for node in graph.nodes:
        if node.name in names:
            raise UsageError(f"graph {graph.name}: two nodes are named {node.name!r}")
        names.add(node.name)
        if node.output in types or node.output in writers:
            raise UsageError(
                f"{node.label()} writes {node.output!r}, which is already an input, a constant or"
                " another node's"
            )
        writers[node.output] = node
    for node in graph.nodes:
        for name in node.inputs:
            if name not in types and name not in writers:
                raise UsageError(
                    f"{node.label()} reads {name!r}, which is no graph input and no node's output"
                    f" (inputs: {', '.join(types) or 'none'})"
                )
    if not graph.outputs:
        raise UsageError(f"graph {graph.name} has no output")
    for position, output in enumerate(graph.outputs):
        if output not in types and output not in writers:
            raise UsageError(f"graph {graph.name}: output {output!r} is no input and no node's output")
        if output in graph.outputs[:position]:
            raise UsageError(f"graph {graph.name}: output {output!r} is given twice: each output once")
    order = _data_flow_order(graph, writers)
    bound: list[BoundNode] = []
    for node in order:
        try:
            b = bind(node.op, node.attrs, [types[t] for t in node.inputs])
        except UsageError as exc:
            raise UsageError(f"{node.label()}: {exc}") from None
        types[node.output] = b.output
        bound.append(BoundNode(node, b))
    live = _live(graph.outputs, writers)
    kept = tuple(n for n in bound if n.node.name in live)
    dropped = tuple(n.name for n in graph.nodes if n.name not in live)
    nodes = tuple(n for n in graph.nodes if n.name in live)
    read = {*graph.outputs, *(t for n in nodes for t in n.inputs)}
    constants = tuple(c for c in graph.constants if c.name in read)
    return BoundGraph(replace(graph, nodes=nodes, constants=constants), kept, types, dropped)


def _live(outputs: Sequence[str], writers: dict[str, Node]) -> set[str]:
    """The names of the nodes the tensors `outputs` are computed from."""
    live: set[str] = set()
    pending = [writers[t] for t in outputs if t in writers]
    while pending:
        node = pending.pop()
        if node.name not in live:
            live.add(node.name)
            pending += [writers[t] for t in node.inputs if t in writers]
    return live


def _check_names(graph: Graph) -> None:
    """Every name the graph gives (its own, its inputs', nodes' and tensors') is printable text:
    messages and the build's output show them, and a model file's escape sequences must not
    reach the terminal."""
    named = [
        ("graph", graph.name),
        *(("input", name) for name, _ in graph.inputs),
        *(("constant", c.name) for c in graph.constants),
    ]
    for node in graph.nodes:
        named += [("node", node.name), ("tensor", node.output), *(("tensor", t) for t in node.inputs)]
    for kind, name in [*named, *(("output", name) for name in graph.outputs)]:
        if not isinstance(name, str) or not name or not name.isprintable():
            raise UsageError(f"{kind} name {name!r}: expected printable characters")


def _data_flow_order(graph: Graph, writers: dict[str, Node]) -> list[Node]:
    """Nodes so that each comes after the nodes whose outputs it reads (their order in the graph
    where free); a cycle is a UsageError naming a node on it and the path."""
    done: set[str] = set()
    order: list[Node] = []
    for start in graph.nodes:
        if start.name in done:
            continue
        path: list[Node] = []
        stack: list[tuple[Node, int]] = [(start, 0)]
        on_path: set[str] = set()
        while stack:
            node, index = stack.pop()
            if index == 0:
                path.append(node)
                on_path.add(node.name)
            producers = [writers[t] for t in node.inputs if t in writers]
            if index < len(producers):
                stack.append((node, index + 1))
                producer = producers[index]
                if producer.name in on_path:
                    cycle = [n.name for n in path[[n.name for n in path].index(producer.name) :]]
                    raise UsageError(
                        f"{producer.label()} is on a cycle: {' -> '.join([*cycle, producer.name])}"
                    )
                if producer.name not in done:
                    stack.append((producer, 0))
                continue
            path.pop()
            on_path.discard(node.name)
            if node.name not in done:
                done.add(node.name)
                order.append(node)
    return order
