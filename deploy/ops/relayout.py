"""The graph pass that moves an NCHW graph's spatial nodes into a target's layout (deploy/ops/layouts.py)
and converts tensors only where it must.

Each spatial node (pooling: `Relayout.starts`) moves to the layout the target runs graphs in
(`--layout`); a node that can run in a layout (`Op.relayout`) joins it when one of its inputs arrives in
it, so a chain of such nodes stays in the layout with no conversion between them. A
`layout_transform` is inserted only where a node reads a tensor in another layout than it needs:
the graph's inputs entering the first moved node, a node that cannot move reading a moved
tensor, and the graph's outputs, which leave in NCHW under their own names, as the model
declares them. One conversion of a tensor serves all its readers. The rewritten graph takes and returns the
same arrays as the original, and its reference computes the same values bit for bit (padding
lanes are never read into a real channel).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deploy.ops.graph import BoundGraph, Node, bind_graph
from deploy.ops.layouts import NCHW, Layout
from deploy.ops.library.layout_transform import LayoutTransform
from deploy.ops.registry import get_op


def relayout(graph: BoundGraph, layout: Layout) -> BoundGraph:
    """`graph` with its spatial nodes in `layout` and the conversions that needs; `graph` itself
    when nothing moves (NCHW, or no node can)."""
    moved: dict[str, Layout] = {}  # tensor -> its layout, for each the pass put in another than NCHW
    stored: dict[str, str] = {}  # a graph output, moved: the name it is written under until converted
    nodes: list[Node] = []
    taken = {n.node.name for n in graph.nodes} | set(graph.types)
    conversions: dict[tuple[str, str], str] = {}

    def read(tensor: str, need: Layout) -> str:
        """The tensor holding `tensor` in layout `need`: itself, or a conversion (made once)."""
        have = moved.get(tensor, NCHW)
        if have is need:
            return stored.get(tensor, tensor)
        key = (tensor, need.name)
        if key not in conversions:
            name = _fresh(f"{tensor}_{need.name}", taken)
            attrs: dict[str, Any] = {"src": have.name, "dst": need.name}
            if have.packed:
                attrs["channels"] = graph.types[tensor].shape[1]
            # a graph output, converted back, keeps its name: the model's interface is unchanged
            written = tensor if need is NCHW and tensor in graph.graph.outputs else name
            source = stored.get(tensor, tensor)
            nodes.append(Node(name, get_op(LayoutTransform.name), attrs, (source,), written))
            conversions[key] = written
        return conversions[key]

    if layout is NCHW:
        return graph
    for n in graph.nodes:
        arrived = any(t in moved for t in n.node.inputs)
        found = n.bound.op.relayout(n.bound.attrs, list(n.bound.inputs), layout)
        if found is None or not (found.starts or arrived):
            nodes.append(replace(n.node, inputs=tuple(read(t, NCHW) for t in n.node.inputs)))
            continue
        reads = tuple(read(t, need) for t, need in zip(n.node.inputs, found.inputs, strict=True))
        written = n.node.output
        if found.output is not NCHW:
            moved[written] = found.output
            if written in graph.graph.outputs:
                stored[written] = _fresh(f"{written}_{found.output.name}", taken)
                written = stored[written]
        nodes.append(replace(n.node, attrs=found.attrs, inputs=reads, output=written, layout=layout.name))
    if not moved:
        return graph
    for output in graph.graph.outputs:  # the outputs leave in NCHW: their conversions back, if they moved
        read(output, NCHW)
    return bind_graph(replace(graph.graph, nodes=tuple(nodes)))


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, ...: the first not in `taken`, which it is added to."""
    fresh, count = name, 1
    while fresh in taken:
        count += 1
        fresh = f"{name}_{count}"
    taken.add(fresh)
    return fresh
