"""Which nodes of a graph become one kernel: TVM Relax's own fusion decides.

Each node's plain computation becomes a PrimFunc in a Relax module whose `main` calls them in
data-flow order; `AnnotateTIROpPattern` classifies each (elementwise, broadcast, injective,
reduction, ...) and `FuseOps` groups them as TVM fuses any model (injective chains into one
kernel, injective producers into a reduction, never two reductions); an op that says it does not
fuse (`Op.fuses`: a layout conversion) stays a kernel of its own. The groups are read back
from the fused module; each becomes a `Kernel`: a single node's op, or a `FusedOp` whose anchor
is the node of the highest pattern (the last of them: its loops are the group's output's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy.ops.fused import FusedOp, outside_reads
from deploy.ops.graph import BoundGraph, BoundNode
from deploy.ops.spec import BoundOp, is_symbolic, symbols_of
from deploy.schedules.structure import loads


@dataclass(frozen=True)
class Kernel:
    """One kernel of a compiled graph: `bound` (a node's op or a fused group) reading the graph's
    tensors `reads` in order and writing `writes`; `nodes` names the graph nodes it computes."""

    bound: BoundOp
    reads: tuple[str, ...]
    writes: str
    nodes: tuple[str, ...]
    layouts: tuple[str, ...] = ()
    """The layouts its nodes compute in, each once (`Op.layout_label`: "NCHW8c", or "NCHW ->
    NCHW8c" for a conversion); empty when none of them names one."""

    @property
    def name(self) -> str:
        return self.bound.op.name


OPAQUE = 8
"""TVM's op pattern that FuseOps fuses with nothing (`kOpaque`)."""
REDUCTION = 3
"""TVM's op pattern of a reduction (`kCommReduce`); those above it are not inlined either."""

Call = tuple[str, Any, tuple[str, ...], str]
"""A PrimFunc `main` calls: (its name, the PrimFunc, the graph tensors it reads, the one it writes)."""


def relax_main(graph: BoundGraph, calls: list[Call]) -> Any:
    """A Relax module whose `main(graph inputs..., constants...)` calls each PrimFunc in order
    (`call_tir`: the VM allocates the tensors between them) and returns the graph's outputs."""
    import tvm
    from tvm import relax, tirx

    batch = {name: tirx.Var(name, "int64") for name in symbols_of(graph.inputs)}

    def tensor_type(name: str) -> Any:
        """Relax shapes are int64: a symbolic batch is an int64 Var of its own here (the kernels
        take the int32 one of `deploy.ops.spec.symbol`, bound from the same array's shape)."""
        t = graph.types[name]
        return relax.TensorType([batch[str(d.name)] if is_symbolic(d) else d for d in t.shape], t.dtype)

    builder = relax.BlockBuilder()
    given = [*graph.input_names, *(c.name for c in graph.graph.constants)]  # constants: as inputs here
    params = [relax.Var(f"input{i}", tensor_type(name)) for i, name in enumerate(given)]
    values: dict[str, Any] = dict(zip(given, params, strict=True))
    with builder.function("main", params):
        with builder.dataflow():
            for name, func, reads, writes in calls:
                gvar = builder.add_func(func, name)
                call = relax.call_tir(gvar, [values[t] for t in reads], tensor_type(writes))
                values[writes] = builder.emit(call)
            outputs = [values[name] for name in graph.graph.outputs]
            output = builder.emit_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
        builder.emit_func_output(output)
    return tvm.IRModule(builder.get().functions)


MAX_COPIES = 32
"""The most copies of one node's computation a fused kernel may hold. Inlining writes a node's
expression into every read of its output, so a chain of ops that each read their input k times
holds k**(n-1) copies of its first node (leaky_relu reads it 3 times: 8 of them took over 100 s
to compile; three max_pool2d of kernel 2, whose 4 taps are each read twice for the NaN test, hold
64 copies and took 12.5 s). A group past the limit is cut into kernels of their own
(`_chunks`)."""
MAX_NESTING = 3
"""The most levels a node's inlined expression may be multiplied through (a level: its consumers
hold more copies of it than of themselves, by reading it more than once, or through two paths
that join): TVM's simplifier slows with these levels faster than with the copies (on x86 with 2
cores, max_pool2d of kernel 1, read twice for its NaN test: five, 4 levels and 16 copies,
compiled in 5 s; six, 5 levels and 32 copies, in 52 s; ten did not finish in 13 minutes). At 3,
ten build in 2.7 s and two hundred in 24 s; a leaky_relu chain reaches both limits at its fifth
node."""


def _relax_of(graph: BoundGraph) -> tuple[Any, list[dict[str, int]], list[dict[str, int]]]:
    """`relax_main` over PrimFunc `n<index>` per node (its op's own computation), its functions
    classified and grouped by FuseOps; a node whose op does not fuse (`Op.fuses`) is classified
    opaque, which FuseOps leaves alone. With it, per node, how many times its computation reads
    each tensor it reads (what inlining copies), and at how many distinct points (indices) per
    output element: 1 for an elementwise or broadcast read, the taps of a window."""
    from tvm import relax, te

    calls: list[Call] = []
    reads: list[dict[str, int]] = []
    points: list[dict[str, int]] = []
    for index, n in enumerate(graph.nodes):
        placeholders = [
            te.placeholder(graph.types[t].shape, graph.types[t].dtype, name=f"x{i}")
            for i, t in enumerate(n.node.inputs)
        ]
        out = n.bound.computed(n.bound.op.compute(n.bound.attrs, n.bound.output, *placeholders))
        name = f"n{index}"  # its own symbol, or BlockBuilder merges equal PrimFuncs of two nodes
        func = te.create_prim_func([*placeholders, out]).with_attr("global_symbol", name)
        calls.append((name, func, n.node.inputs, n.node.output))
        loads = _loads(func)
        count: dict[str, int] = {}
        distinct: dict[str, int] = {}
        for i, tensor in enumerate(n.node.inputs):
            mine = [at for buffer, at in loads if buffer == f"x{i}"]
            count[tensor] = count.get(tensor, 0) + len(mine)
            distinct[tensor] = max(distinct.get(tensor, 0), len(set(mine)))
        reads.append(count)
        points.append(distinct)
    annotated = relax.transform.AnnotateTIROpPattern()(relax_main(graph, calls))
    for index, n in enumerate(graph.nodes):
        if not n.bound.op.fuses:
            gvar = annotated.get_global_var(f"n{index}")
            annotated[gvar] = annotated[gvar].with_attr("op_pattern", OPAQUE)
    return relax.transform.FuseOps()(annotated), reads, points


def _loads(func: Any) -> list[tuple[str, int]]:
    """Each load in `func`'s body: its buffer's name and the structural hash of its indices (equal
    for two loads of one element: the loop variables are the same objects)."""
    import tvm_ffi

    return [(load.source.name, tvm_ffi.structural_hash(load.indices)) for load in loads(func.body)]


def _chunks(
    graph: BoundGraph,
    group: list[int],
    reads: list[dict[str, int]],
    points: list[dict[str, int]],
    patterns: dict[int, int],
    readers_of: dict[str, list[int]],
) -> list[list[int]]:
    """`group` (node indices in data-flow order) cut into runs each of which inlines no node more
    than MAX_COPIES times nor through more than MAX_NESTING levels that multiply it, and no
    windowed node (one reading an input at several points: pooling's taps) where the run's last
    node evaluates it at several points (the product of the points each reader on the way reads
    it at: a pool -> add -> pool inlined recomputes the first pool's 9 taps at each of the
    second's 9, each tap tested for NaN, 324 loads that took 11 s to build for OpenCL), so the
    second windowed op reads a buffer the first wrote: from the last node back, a node joins the
    run after it while its output is read only inside that run (by any node of the graph) and it
    stays within these limits, else a new run ends with it. A reduction is not inlined
    (`inline_into_last`): what it reads is copied as often as it reads it, however often the
    reduction's own output is read, through no further level. The count is of each op's own
    computation; a family's variant may read its input as often or less."""
    runs: list[list[int]] = []
    copies: dict[int, int] = {}
    nesting: dict[int, int] = {}
    spread: dict[int, int] = {}
    for index in reversed(group):
        output = graph.nodes[index].node.output
        run = runs[-1] if runs else []
        readers = readers_of.get(output, [])
        kept = {i for i in readers if patterns.get(i, OPAQUE) >= REDUCTION}
        inlined = [i for i in readers if i in run]
        count = sum(reads[i][output] * (1 if i in kept else copies[i]) for i in inlined)
        most = max((1 if i in kept else copies[i] for i in inlined), default=1)
        nested = max((0 if i in kept else nesting[i] for i in inlined), default=0) + (count > most)
        at = max((points[i][output] * (1 if i in kept else spread[i]) for i in inlined), default=1)
        windowed = max(points[index].values(), default=1) > 1
        inside = output not in graph.graph.outputs and bool(readers) and all(i in run for i in readers)
        if inside and count <= MAX_COPIES and nested <= MAX_NESTING and not (windowed and at > 1):
            run.insert(0, index)
            copies[index], nesting[index], spread[index] = count, nested, at
        else:
            runs.append([index])
            copies[index], nesting[index], spread[index] = 1, 0, 1
    return [run for run in reversed(runs)]


def _groups(fused: Any) -> list[list[int]]:
    """Node indices per kernel, in the order `main` calls them: a `call_tir` of node PrimFunc
    `n<index>`, or a call of a function FuseOps made, whose body calls several."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")

    def nodes_called(func: Any) -> list[list[int]]:
        found = []
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not isinstance(call, relax.Call):
                    continue
                if call.op.same_as(call_tir):
                    found.append([int(call.args[0].name_hint[1:])])
                elif isinstance(call.op, relax.GlobalVar):
                    found.append([i for group in nodes_called(fused[call.op]) for i in group])
        return found

    return nodes_called(fused["main"])


def _patterns(fused: Any) -> dict[int, int]:
    """Node index -> TVM's op pattern of its PrimFunc (0 elementwise ... 3 reduction, 8 opaque)."""
    from tvm import tirx

    return {
        int(gvar.name_hint[1:]): int(func.attrs["op_pattern"])
        for gvar, func in fused.functions.items()
        if isinstance(func, tirx.PrimFunc) and func.attrs and "op_pattern" in func.attrs
    }


def kernels(graph: BoundGraph) -> list[Kernel]:
    """The graph's kernels in the order they run. A group whose inner tensors are read outside
    it (by another kernel or as a graph output) is split into one kernel per node; one that
    would inline a node too many times, into runs (`_chunks`). A graph of one node is one kernel,
    without the analysis (its PrimFunc of the op's own computation took 2.5 s of a 3-D pool's
    7 s `deploy test --model`)."""
    if len(graph.nodes) == 1:
        return [_node_kernel(graph.nodes[0])]
    fused, reads, points = _relax_of(graph)
    patterns = _patterns(fused)
    readers_of = _readers(graph)
    outputs = set(graph.graph.outputs)
    result: list[Kernel] = []
    for group in [
        run for found in _groups(fused) for run in _chunks(graph, found, reads, points, patterns, readers_of)
    ]:
        nodes = [graph.nodes[i] for i in group]
        members = set(group)
        inner = [n.node.output for n in nodes[:-1]]
        read_outside = any(t in outputs or not members.issuperset(readers_of.get(t, [])) for t in inner)
        if len(nodes) > 1 and not read_outside:
            anchor = max(  # the node of the highest pattern; of those, a view (a reshape) last
                range(len(nodes)),
                key=lambda i: (patterns.get(group[i], OPAQUE), not nodes[i].bound.op.view, i),
            )
            result.append(_fused_kernel(graph, nodes, anchor))
        else:
            result += [_node_kernel(n) for n in nodes]
    return result


def _node_kernel(n: BoundNode) -> Kernel:
    """A kernel of node `n` alone."""
    return Kernel(n.bound, n.node.inputs, n.node.output, (n.node.name,), _layouts([n]))


def _readers(graph: BoundGraph) -> dict[str, list[int]]:
    """Tensor name -> the indices of the nodes that read it, each once, in order: looked up per
    node, not searched for (a search per node made fusing a 10,000-node chain quadratic)."""
    readers: dict[str, list[int]] = {}
    for index, n in enumerate(graph.nodes):
        for tensor in dict.fromkeys(n.node.inputs):
            readers.setdefault(tensor, []).append(index)
    return readers


def _layouts(nodes: list[BoundNode]) -> tuple[str, ...]:
    """The layouts `nodes` compute in (`Kernel.layouts`)."""
    labels = (n.node.layout or n.bound.op.layout_label(n.bound.attrs) for n in nodes)
    return tuple(dict.fromkeys(label for label in labels if label is not None))


def _fused_kernel(graph: BoundGraph, nodes: list[BoundNode], anchor: int) -> Kernel:
    reads = outside_reads([n.node for n in nodes])
    op = FusedOp(nodes, reads, anchor)
    names = tuple(n.node.name for n in nodes)
    return Kernel(op.bind(graph.types), tuple(reads), nodes[-1].node.output, names, _layouts(nodes))
