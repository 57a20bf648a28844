"""A graph's execution plan on CPUs, in TIR: its kernels as private subroutines, called in order by
one PrimFunc over the graph's tensors, the tensors between them in one arena:

    main(inputs..., outputs..., arena)      arena: uint8[arena bytes at the batch the inputs have]

This is the one way a graph runs on a CPU: through TVM's runtime (`deploy run/test/bench/tune`,
locally and over RPC: the session allocates the arena, `deploy/devices/session.py`) and in a C bundle
(`bundle.py`: the caller's memory or a per-thread cache), so what `deploy test` verifies is what
ships. No VM: the plan is machine code like the kernels.

The graph's constants are one read-only blob linked into the module (`constants.py`): `main` asks
`deploy_constants()` for its address once and passes each kernel its constant's offset in it, so
a constant is stored once and a caller passes nothing for it.

The arena holds every tensor between two kernels at an offset fixed when built (a multiple of
ALIGNMENT bytes, from N at call time for a symbolic batch); a tensor takes the slot of one no
longer read when both have the same size, so a chain of same-sized kernels needs two slots. The
size is computed alike here (`Plan.arena_bytes`), in the TIR (`main` checks its arena's shape
against it) and in C (`deploy/compiler/runtime/bundle.h`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deploy.base.errors import UsageError
from deploy.compiler.fusion import Call
from deploy.compiler.runtime import ALIGNMENT
from deploy.ops.spec import TensorType, symbol, symbols_of

if TYPE_CHECKING:
    from deploy.ops.graph import BoundGraph, Constant

MAIN = "main"
CONSTANTS_SYMBOL = "deploy_constants"
"""The function `main` calls for the address of the graph's constants (`constants.py` defines it,
hidden in a module, local in a bundle)."""


@dataclass(frozen=True)
class Size:
    """A byte count `factor * product(symbols)`: a tensor's, with its symbolic batch dims."""

    factor: int
    symbols: tuple[str, ...] = ()

    @staticmethod
    def of(t: TensorType) -> Size:
        return Size(t.nbytes(), tuple(sorted(t.symbols)))

    def at(self, sizes: dict[str, int]) -> int:
        """The bytes with the symbolic dims at `sizes`."""
        return self.factor * math.prod(sizes[name] for name in self.symbols)

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.factor, "times": list(self.symbols)}


def aligned_bytes(size: int) -> int:
    """`size` rounded up to a multiple of ALIGNMENT."""
    return -(-size // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Plan:
    """The arena: its slots in order (each starts where the one before ends, rounded up to
    ALIGNMENT), and the slot of each tensor between kernels."""

    slots: tuple[Size, ...]
    places: dict[str, int]

    def to_json(self) -> list[dict[str, Any]]:
        """The arena as the manifest lists it: each slot's size and the tensors it holds."""
        held = {i: [t for t, s in self.places.items() if s == i] for i in range(len(self.slots))}
        return [{**size.to_json(), "tensors": held[i]} for i, size in enumerate(self.slots)]


MAX_BLOB_BYTES = 2**31 - 1
"""The most bytes of constants a graph holds: the plan addresses the blob with int32 offsets, as
TVM indexes a buffer of static size."""


def constant_offsets(constants: Sequence[Constant]) -> list[int]:
    """Each constant's byte offset in the blob: in order, each ALIGNMENT-aligned; a blob past
    MAX_BLOB_BYTES is refused in one line."""
    result, end = [], 0
    for constant in constants:
        result.append(end)
        end += aligned_bytes(constant.type.nbytes())
    if end > MAX_BLOB_BYTES:
        raise UsageError(
            f"the graph's {len(constants)} constants take {end} bytes: expected at most {MAX_BLOB_BYTES}"
            " (2 GiB; the plan addresses them with 32-bit offsets)"
        )
    return result


def arena_bytes(slots: Sequence[Size], sizes: dict[str, int]) -> int:
    """The arena's bytes with the symbolic dims at `sizes`: at least ALIGNMENT (`_arena_expr`)."""
    return max(sum(aligned_bytes(size.at(sizes)) for size in slots), ALIGNMENT)


def plan_arena(graph: BoundGraph, steps: Sequence[tuple[tuple[str, ...], str]]) -> Plan:
    """Slots for the tensors the kernels write (`steps`: the tensors each reads, the one it
    writes, in order) that are not graph outputs, in the order written: a tensor reuses a
    slot of the same size whose tensor no later kernel reads."""
    last_read: dict[str, int] = {}
    for index, (reads, _) in enumerate(steps):
        for tensor in reads:
            last_read[tensor] = index
    slots: list[Size] = []
    places: dict[str, int] = {}
    holder: dict[int, str] = {}
    for index, (_, tensor) in enumerate(steps):
        if tensor in graph.graph.outputs:
            continue
        size = Size.of(graph.types[tensor])
        free = [
            s for s, held in holder.items()
            if slots[s] == size and last_read.get(held, -1) < index
        ]  # fmt: skip
        slot = free[0] if free else len(slots)
        if not free:
            slots.append(size)
        places[tensor] = slot
        holder[slot] = tensor
    return Plan(tuple(slots), places)


def _subroutine(func: Any, symbols: dict[str, Any]) -> Any:
    """A kernel's scheduled PrimFunc as a private subroutine: its buffers' data pointers, then
    the symbolic dims its shapes use, as plain parameters (the kernel's entry checks are the
    caller's: `main` checks the graph's tensors, and the plan lays out the rest). That it runs
    on the CPU is said once its buffers are placed (`tir_passes.subroutines_on_cpu`)."""
    import tvm
    from tvm import tirx

    buffers = list(func.params)
    pointers = [_pointer(f"{b.name}_data", b.dtype) for b in buffers]
    declared = [tirx.DeclBuffer(b, data=p) for b, p in zip(buffers, pointers, strict=True)]
    body = tirx.SeqStmt([*declared, func.body])
    params = [*pointers, *symbols.values()]
    kept = {k: v for k, v in (func.attrs or {}).items() if k != "global_symbol"}
    subroutine = tirx.PrimFunc(params, body, ret_type=tvm.ir.PrimType("int32"))  # TVM's error returns
    return subroutine.with_attrs(kept) if kept else subroutine


def _pointer(name: str, dtype: Any) -> Any:
    """A parameter holding a pointer to `dtype` elements."""
    import tvm
    from tvm import tirx

    return tirx.Var(name, tvm.ir.PointerType(tvm.ir.PrimType(str(dtype))))


def plan_module(graph: BoundGraph, calls: Sequence[Call], alignment: int = ALIGNMENT) -> Any:
    """The IRModule of the graph's plan: `main(inputs..., outputs..., arena)` calling one private
    subroutine per kernel of `calls` (each named as given), in order; its inputs and outputs
    assumed `alignment`-byte aligned (the arena is ALIGNMENT-aligned whatever it is)."""
    import tvm
    from tvm import tirx

    plan = plan_arena(graph, [(reads, writes) for _, _, reads, writes in calls])
    symbols = {name: symbol(name) for name in symbols_of(graph.inputs)}
    mod = tvm.IRModule({name: _subroutine(func, symbols) for name, func, _, _ in calls})

    def buffer(name: str, t: TensorType) -> Any:
        return tirx.decl_buffer(t.shape, t.dtype, name=name, data_alignment=alignment)

    tensors = {name: buffer(f"input{i}", t) for i, (name, t) in enumerate(graph.graph.inputs)}
    several = len(graph.graph.outputs) > 1
    outs = {
        name: buffer(f"out{i}" if several else "out", graph.types[name])
        for i, name in enumerate(graph.graph.outputs)
    }
    offsets, total = _layout(plan, symbols)
    arena = tirx.decl_buffer((total,), "uint8", name="arena")

    constants = graph.graph.constants
    blob, bind_blob = _constants_address("uint8")
    blob_bytes = sum(aligned_bytes(len(c.data)) for c in constants)
    blob_buffer = tirx.decl_buffer((max(blob_bytes, 1),), "uint8", name="constant_blob", data=blob)
    at = dict(zip((c.name for c in constants), constant_offsets(constants), strict=True))

    def pointer(tensor: str) -> Any:
        """Where a kernel finds `tensor`: an input or a constant where it is one (an output that
        is one too is a copy of it, made last), else its output buffer or its arena slot."""
        if tensor in tensors:
            return tensors[tensor].data
        if tensor in at:
            return tirx.address_of(tirx.BufferLoad(blob_buffer, [at[tensor]]))
        if tensor in outs:
            return outs[tensor].data
        return tirx.address_of(tirx.BufferLoad(arena, [offsets[plan.places[tensor]]]))

    steps = []
    for index, (name, _, reads, writes) in enumerate(calls):
        args = [pointer(t) for t in (*reads, writes)] + list(symbols.values())
        call = tvm.ir.Call(mod.get_global_var(name), args, ret_ty="int32")
        steps += _checked(call, f"kernel {index + 1} of {len(calls)} ({name.split('_', 1)[-1]}) failed")
    for name, out in outs.items():
        if name in tensors:  # an output that is an input (an ONNX pass-through): copy it
            steps.append(_copy(tensors[name], out))
        if name in at:  # an output that is a constant: copy it
            value = graph.types[name]
            typed, bind_typed = _constants_address(value.dtype)
            start = at[name] // tvm.DataType(value.dtype).itemsize
            source = tirx.decl_buffer(
                value.shape, value.dtype, data=typed, elem_offset=start, name="constant"
            )
            steps += [bind_typed, tirx.DeclBuffer(source, data=typed), _copy(source, out)]
    body = tirx.SeqStmt(steps) if len(steps) > 1 else steps[0]
    if constants:
        body = tirx.SeqStmt([bind_blob, tirx.DeclBuffer(blob_buffer, data=blob), body])
    mod[MAIN] = tirx.PrimFunc([*tensors.values(), *outs.values(), arena], body).with_attr(
        "global_symbol", MAIN
    )
    return mod


def _checked(call: Any, failure: str) -> list[Any]:
    """`call` (a kernel, int32: 0 or TVM's -1 after a failed parallel task or workspace
    allocation), then `main` stops and returns nonzero with `failure` raised when it failed:
    the plan's caller (`NAME()`, TVM's runtime) sees the error instead of an unwritten output."""
    import tvm
    from tvm import tirx

    status = tirx.Var("status", "int32")
    failed = tirx.AssertStmt(status == 0, tvm.ir.StringImm("RuntimeError"), [tvm.ir.StringImm(failure)])
    return [tirx.Bind(status, call), failed]


def _constants_address(dtype: str) -> tuple[Any, Any]:
    """A pointer to `dtype` holding the address of the graph's constants, and the statement that
    sets it (`deploy_constants()`)."""
    import tvm
    from tvm import tirx

    var = tirx.Var(f"constants_{dtype}", tvm.ir.PointerType(tvm.ir.PrimType(dtype)))
    extern = tvm.ir.Op.get("tirx.call_extern")
    return var, tirx.Bind(var, tvm.ir.Call(extern, [tvm.ir.StringImm(CONSTANTS_SYMBOL)], ret_ty=var.ty))


def _copy(src: Any, dst: Any) -> Any:
    """A flat copy loop from `src` (from its element offset) to `dst` (same shape and dtype)."""
    from tvm import tirx

    total = math.prod(src.shape) if src.shape else 1
    i = tirx.Var("i", "int32")
    flat_src = tirx.decl_buffer(
        (total,), src.dtype, data=src.data, name="src_flat", elem_offset=src.elem_offset
    )
    flat_dst = tirx.decl_buffer((total,), dst.dtype, data=dst.data, name="dst_flat")
    store = tirx.BufferStore(flat_dst, tirx.BufferLoad(flat_src, [i]), [i])
    loop = tirx.For(i, 0, total, tirx.ForKind.SERIAL, store)
    return tirx.SeqStmt(
        [tirx.DeclBuffer(flat_src, data=src.data), tirx.DeclBuffer(flat_dst, data=dst.data), loop]
    )


def _size_expr(size: Size, symbols: dict[str, Any]) -> Any:
    """`size` in bytes as an int64 TIR expression of the symbolic dims."""
    from tvm import tirx

    expr = tirx.const(size.factor, "int64")
    for name in size.symbols:
        expr = expr * tirx.Cast("int64", symbols[name])
    return expr


def _layout(plan: Plan, symbols: dict[str, Any]) -> tuple[list[Any], Any]:
    """Each slot's byte offset, and the arena's size (as `arena_bytes`), as TIR expressions."""
    from tvm import tirx

    offsets, total = [], tirx.const(0, "int64")
    for size in plan.slots:
        offsets.append(total)
        total = total + tirx.floordiv(_size_expr(size, symbols) + (ALIGNMENT - 1), ALIGNMENT) * ALIGNMENT
    return offsets, tirx.max(total, tirx.const(ALIGNMENT, "int64"))
