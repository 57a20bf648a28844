"""A fused group of graph nodes as one op: its inputs are the tensors the group reads from outside,
its output the last node's, its computation the nodes' computations composed in one TE graph.

Grouping is decided by the build (`deploy/compiler/fusion.py`); schedules find the group's anchor
(`anchor`: the node whose schedule the fused kernel gets, after the others are inlined into it)
and each node's output by its block name (`block_name`), which the composition sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm import te

from deploy.base.ctext import c_identifier, c_word
from deploy.base.errors import UsageError, reason
from deploy.ops.graph import Apply, BoundNode, Node, flow, numpy_reference, ops_of
from deploy.ops.registry import get_op
from deploy.ops.spec import ALL_DTYPES, BoundOp, Input, Op, TensorType, bind
from deploy.ops.tolerance import Rule, combined


def named(tensor: te.Tensor, name: str) -> te.Tensor:
    """`tensor` computed by an operation called `name` (its block's name in the PrimFunc): the
    same computation, so that a schedule can find the node's output among same-named blocks
    (every op calls its output `out`)."""
    op = tensor.op
    if not isinstance(op, te.ComputeOp):
        return tensor
    renamed = te.ComputeOp(name, op.tag, op.attrs, op.axis, op.reduce_axis, op.body)
    return renamed.output(tensor.value_index)


def outside_reads(nodes: Sequence[Node]) -> list[str]:
    """The tensors `nodes` read that none of them writes, each once, in the order first read: a
    fused group's inputs."""
    written = {n.output for n in nodes}
    return list(dict.fromkeys(t for n in nodes for t in n.inputs if t not in written))


def _key_node(item: Any) -> bool:
    """Whether `item` is one node as a group's key lists it (`FusedOp.bind`): data read back from
    a task file, so checked before it is used."""
    return (
        isinstance(item, dict)
        and isinstance(item.get("op"), str)
        and isinstance(item.get("attrs"), dict)
        and isinstance(item.get("writes"), str)
        and isinstance(item.get("reads"), list)
        and all(isinstance(t, str) for t in item["reads"])
    )


class FusedOp(Op):
    """Nodes of one fused group in data-flow order, reading `reads` from outside the group."""

    attrs = ()
    dtypes = ALL_DTYPES
    cases = ()

    def __init__(self, nodes: Sequence[BoundNode], reads: Sequence[str], anchor: int) -> None:
        self.nodes = tuple(nodes)
        self.reads = tuple(reads)
        self.anchor = anchor
        self.name = "fused_" + "_".join(n.bound.op.name for n in self.nodes)
        taken: set[str] = set()  # TIR and OpenCL C name them: identifiers deploy makes, each once
        self.inputs = tuple(Input(c_identifier(name, taken)) for name in self.reads)
        self.exact = all(n.bound.op.exact for n in self.nodes)

    def parts(self) -> tuple[Op, ...]:
        return ops_of(self.nodes)

    def comparison_rule(self, bound: BoundOp) -> Rule:
        """Its nodes' rules combined (`tolerance.combined`), as the graph's."""
        return combined([n.bound.rule() for n in self.nodes])

    def block_name(self, index: int) -> str:
        """The block that computes node `index`'s output in the fused PrimFunc, named after the
        tensor it writes (which the group's key holds, unlike node names: a tuned trace found by
        the key finds its blocks)."""
        return f"node{index}_{c_word(self.nodes[index].node.output)}"

    def bind(self, types: dict[str, TensorType]) -> BoundOp:
        """The group as a bound op: the input types read from `types` (every tensor's type); its
        attributes name each node's op, attributes and wiring, so that the bound op's key (build
        cache, tuning records) tells groups apart."""
        nodes = [{**n.bound.key(), "reads": list(n.node.inputs), "writes": n.node.output} for n in self.nodes]
        inputs = tuple(types[name] for name in self.reads)
        return BoundOp(self, {"nodes": nodes, "anchor": self.anchor}, inputs, self.nodes[-1].bound.output)

    @classmethod
    def bind_key(cls, attrs: Any, inputs: Sequence[TensorType]) -> BoundOp:
        """The group bound again from its key's attributes and input types (`bind`; a tuning
        task's task.json): each node by its op, attributes and wiring, named after the tensor
        it writes. A UsageError when they do not describe a group."""
        try:
            if not isinstance(attrs, dict) or not isinstance(attrs.get("nodes"), list):
                raise ValueError("expected a mapping with a list of nodes")
            for index, n in enumerate(attrs["nodes"]):
                if not _key_node(n):
                    raise ValueError(f"node {index}: expected a mapping of op, attrs, reads and writes")
            nodes = [
                Node(n["writes"], get_op(n["op"]), n["attrs"], tuple(n["reads"]), n["writes"])
                for n in attrs["nodes"]
            ]
            reads = outside_reads(nodes)
            if len(reads) != len(inputs):
                raise ValueError(f"its nodes read {len(reads)} tensor(s) from outside, given {len(inputs)}")
            types = dict(zip(reads, inputs, strict=True))
            bound = []
            for index, n in enumerate(nodes):
                late = [t for t in n.inputs if t not in types]
                if late:
                    raise ValueError(f"node {index} reads {late[0]!r} before a node writes it")
                b = bind(n.op, n.attrs, [types[t] for t in n.inputs])
                types[n.output] = b.output
                bound.append(BoundNode(n, b))
            anchor = attrs.get("anchor")
            if type(anchor) is not int or not 0 <= anchor < len(bound):
                raise ValueError(f"anchor {anchor!r} is no node's index")
            return cls(bound, reads, anchor).bind(types)
        except ValueError as exc:
            raise UsageError(f"not the attributes of a fused group and its inputs ({reason(exc)})") from None

    def compose(self, compute: Apply, *tensors: Any) -> Any:
        """The group's output te.Tensor from its input te.Tensors, each node computed by `compute`
        and its output block named `block_name`."""
        blocks = {n.node.name: self.block_name(index) for index, n in enumerate(self.nodes)}

        def node(n: BoundNode, inputs: list[Any]) -> Any:
            return named(n.bound.computed(compute(n, inputs)), blocks[n.node.name])

        return self._last(flow(self.nodes, dict(zip(self.reads, tensors, strict=True)), node))

    def _last(self, values: dict[str, Any]) -> Any:
        return values[self.nodes[-1].node.output]

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return self.nodes[-1].bound.output

    def compute(self, attrs: dict[str, Any], out: TensorType, *tensors: Any) -> Any:
        return self.compose(lambda n, xs: n.bound.op.compute(n.bound.attrs, n.bound.output, *xs), *tensors)

    def reference(self, attrs: dict[str, Any], *arrays: np.ndarray) -> np.ndarray:
        return self._last(flow(self.nodes, dict(zip(self.reads, arrays, strict=True)), numpy_reference))
