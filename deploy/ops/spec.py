"""What an op definition is: inputs, attributes, dtypes, inference, TE compute, numpy reference.

An op is a subclass of `Op` registered with `@register` (see `deploy/ops/registry.py`). `bind()` checks
attributes, input count, ranks and dtypes generically, then calls the op's own `infer()`.
"""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from deploy.base.errors import UsageError, clipped
from deploy.ops.attrs import Attr, Float
from deploy.ops.onnx_mapping import OnnxNode, OnnxOp, domain_key
from deploy.ops.tolerance import Rule, Tolerance, op_rule, sum_length

if TYPE_CHECKING:
    from deploy.ops.layouts import Layout, Relayout

COMMON_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int32", "int64")
"""The dtypes an op runs in unless it says otherwise (`Op.dtypes`)."""
MORE_INT_DTYPES = ("int16", "uint16", "uint32", "uint64")
"""Integer dtypes ONNX models use now and then (Add on uint32): an op takes them by naming them."""
ALL_DTYPES = (*COMMON_DTYPES, *MORE_INT_DTYPES)
FLOAT_DTYPES = ("float32", "float16", "float64")
OUTPUT = "out"
"""The name of an op's one output (manifests, C bundles) and of a C bundle's single output."""
MAX_ELEMENTS = 2**31 - 1


SYMBOL = re.compile(r"[A-WYZa-wyz_][A-WYZa-wyz0-9_]*")
SYMBOL_NAMES = "a name like N or batch (letters but x, digits, _; not scalar), as --shape writes one"


def is_symbol_name(name: str) -> bool:
    """Whether `name` may name a symbolic dim: what `--shape` can write (x separates its dims,
    `scalar` is rank 0), so that messages print shapes like `Nx64:float32` unambiguously."""
    return SYMBOL.fullmatch(name) is not None and name.lower() != "scalar"


_SYMBOLS: dict[str, Any] = {}
_SYMBOLS_LOCK = threading.Lock()  # `deploy test` binds cases in worker threads

Dim = Any
"""A dim: an int, or a symbolic batch dim, the tirx.Var `symbol(name)` (given by its name, a str)."""


def symbol(name: str) -> Any:
    """The symbolic dim `name`: one tirx.Var per name in the process, so that every tensor of a
    computation that says N means the same N (one TVM shape variable, checked equal across inputs
    by the runtime). int32, as TVM indexes static shapes: an int64 batch makes every index int64,
    which measured 1.6x slower for argmax on x86; the whole tensor's size is checked against
    MAX_ELEMENTS when a module is called (`sizes_of`)."""
    if not is_symbol_name(name):
        raise UsageError(f"symbolic dim {clipped(name)!r}: expected {SYMBOL_NAMES}")
    with _SYMBOLS_LOCK:
        if name not in _SYMBOLS:
            from tvm import tirx

            _SYMBOLS[name] = tirx.Var(name, "int32")
        return _SYMBOLS[name]


def _dim(value: Any) -> Dim:
    """`value` as a dim: an int (any integer type but bool), a name's `symbol`, or a symbol."""
    if isinstance(value, str):
        return symbol(value)
    if any(value is known for known in _SYMBOLS.values()):
        return value
    if isinstance(value, bool):
        raise UsageError(f"dim {value!r}: expected a size or a batch name")
    try:
        return operator.index(value)
    except TypeError:
        raise UsageError(f"dim {value!r}: expected a size or a batch name") from None


def is_symbolic(dim: Dim) -> bool:
    """Whether `dim` is a symbolic batch (TensorType makes every other dim an int)."""
    return not isinstance(dim, int)


def dim_json(dim: Dim) -> int | str:
    """A dim as JSON and messages write it: its size, or a symbolic dim's name."""
    return dim if isinstance(dim, int) else str(dim.name)


@dataclass(frozen=True)
class TensorType:
    """Shape (tuple of dims, row-major) and dtype name of one tensor. A dim given as a str is a
    symbolic batch dim (`symbol`): the tensor is any size along it, known when a module runs."""

    shape: tuple[Dim, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(_dim(d) for d in self.shape))

    @property
    def symbols(self) -> tuple[str, ...]:
        """The names of the symbolic dims, in order."""
        return tuple(str(d.name) for d in self.shape if is_symbolic(d))

    def dims(self) -> list[int | str]:
        """The shape as JSON writes it: sizes, and a symbolic batch's name."""
        return [dim_json(d) for d in self.shape]

    def elements(self) -> int:
        """Elements of one batch item (every symbolic dim counted as 1): what a schedule sizes its
        work by, and all of it for a static shape."""
        return math.prod(d for d in self.shape if not is_symbolic(d))

    def nbytes(self) -> int:
        """Bytes of one batch item (every symbolic dim counted as 1): all of a static tensor."""
        return self.elements() * np.dtype(self.dtype).itemsize

    def fits(self, shape: tuple[int, ...]) -> bool:
        """An array of `shape` can be this tensor: same rank, same size on every static dim."""
        return len(shape) == len(self.shape) and all(
            is_symbolic(d) or d == s for d, s in zip(self.shape, shape, strict=True)
        )

    def at(self, sizes: dict[str, int]) -> TensorType:
        """This type with each symbolic dim replaced by its size in `sizes`."""
        missing = [name for name in self.symbols if name not in sizes]
        if missing:
            raise UsageError(f"{self}: no size given for the symbolic batch {', '.join(missing)}")
        return TensorType(tuple(sizes[str(d.name)] if is_symbolic(d) else d for d in self.shape), self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.dims(), "dtype": self.dtype}

    def __str__(self) -> str:
        return "x".join(map(str, self.dims())) + ":" + self.dtype if self.shape else f"():{self.dtype}"


def symbols_of(types: Sequence[TensorType]) -> tuple[str, ...]:
    """The symbolic dims of `types`, each once, in order of appearance."""
    return tuple(dict.fromkeys(name for t in types for name in t.symbols))


def batch_sizes(types: Sequence[TensorType], sizes: Sequence[int]) -> list[dict[str, int]]:
    """What to run tensors of `types` at: every symbolic dim at each of `sizes` in turn, or once
    (an empty dict) when all dims are static."""
    symbols = symbols_of(types)
    return [dict.fromkeys(symbols, size) for size in sizes] if symbols else [{}]


def sizes_text(sizes: dict[str, int]) -> str:
    """`N=3` (the symbolic dims' sizes as labels and messages say them; "" for none)."""
    return ", ".join(f"{name}={size}" for name, size in sizes.items())


def require_static(types: Sequence[TensorType], what: str, why: str) -> None:
    """A one-line error when `types` have a symbolic batch: `what` needs static shapes (`why`)."""
    symbols = symbols_of(types)
    if symbols:
        raise UsageError(
            f"{what} needs static shapes: the batch {', '.join(symbols)} is symbolic ({why}); give it"
            " as a number"
        )


def sizes_of(named: Sequence[tuple[str, TensorType]], shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    """The size of each symbolic dim, read from the arrays' `shapes` that the inputs `named`
    (name, declared type) are called with; a rank or static dim that differs, or two inputs that
    disagree on a symbolic dim, is a one-line error naming the input."""
    sizes: dict[str, int] = {}
    seen: dict[str, str] = {}
    for (name, declared), shape in zip(named, shapes, strict=True):
        if not declared.fits(shape):
            raise UsageError(f"input {name} has shape {list(shape)}: expected {list(declared.shape)}")
        for dim, size in zip(declared.shape, shape, strict=True):
            if not is_symbolic(dim):
                continue
            symbolic = str(dim.name)
            if size < 1:
                raise UsageError(f"input {name} has {symbolic}={size} (shape {list(shape)}): expected >= 1")
            if symbolic in sizes and sizes[symbolic] != size:
                raise UsageError(
                    f"input {name} has {symbolic}={size} (shape {list(shape)}) but input"
                    f" {seen[symbolic]} has {symbolic}={sizes[symbolic]}: the inputs must agree on {symbolic}"
                )
            sizes.setdefault(symbolic, size)
            seen.setdefault(symbolic, name)
    for name, declared in named:
        check_size(f"input {name} at {sizes_text(sizes)}", declared.at(sizes))
    return sizes


@dataclass(frozen=True)
class Input:
    """A tensor input. `broadcasts`: its shape broadcasts numpy-style against the output."""

    name: str
    min_rank: int = 0
    max_rank: int = 6
    broadcasts: bool = False


@dataclass(frozen=True)
class Case:
    """One verification case: attributes and input shapes (dtype is chosen per run)."""

    shapes: tuple[tuple[int | str, ...], ...]
    """A str dim is a symbolic batch: `deploy test` runs one module at several batch sizes."""
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def symbolic(self) -> bool:
        """Its batch is symbolic."""
        return any(isinstance(d, str) for shape in self.shapes for d in shape)

    def batched(self, factor: int, batch: Collection[int]) -> Case:
        """This case with `factor` times the leading dim of each input of `batch` (its batch
        inputs, `batch_inputs`) whose leading dim is a size other than 1 (a broadcast 1 and a
        symbolic batch stay): the same workload, up to `factor` times the memory."""
        return self._batch(lambda size: size * factor, batch)

    def single(self, batch: Collection[int]) -> Case:
        """This case at batch 1 (the leading dims `batched` grows set to 1): how an edge device
        calls an op, its data in cache."""
        return self._batch(lambda size: 1, batch)

    def _batch(self, size: Callable[[int], int], batch: Collection[int]) -> Case:
        resized = tuple(
            (size(s[0]), *s[1:]) if index in batch and s and isinstance(s[0], int) and s[0] != 1 else s
            for index, s in enumerate(self.shapes)
        )
        return Case(resized, self.attrs)

    def batch_inputs(self, op: Op) -> tuple[int, ...]:
        """The inputs whose leading dim is the batch, read from the op's own shape relations
        (`infer`): those whose leading dim, doubled (together, else each alone), doubles the
        output's leading dim. A weight [32, 1, 3, 3] beside data [8, 32, 112, 112] is not one:
        doubling it is refused or leaves the output as it was."""
        dtype = op.dtypes[0]

        def output_lead(shapes: tuple[tuple[int | str, ...], ...]) -> Any:
            try:
                out = bind(op, self.attrs, [TensorType(s, dtype) for s in shapes]).output
            except UsageError:
                return None
            return out.shape[0] if out.shape else None

        lead = output_lead(self.shapes)
        candidates = [i for i, s in enumerate(self.shapes) if s and isinstance(s[0], int) and s[0] != 1]
        if not isinstance(lead, int) or not candidates:
            return ()

        def doubles(group: list[int]) -> bool:
            return output_lead(self.batched(2, group).shapes) == 2 * lead

        if doubles(candidates):
            return tuple(candidates)
        return tuple(i for i in candidates if doubles([i]))

    def label(self) -> str:
        shapes = " ".join("x".join(map(str, s)) or "()" for s in self.shapes)
        attrs = " ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{shapes} {attrs}".strip()


class Op:
    """Base class of op definitions; subclasses set the class attributes and four methods."""

    name: str
    inputs: tuple[Input, ...]
    attrs: ClassVar[tuple[Attr, ...]] = ()
    dtypes: ClassVar[tuple[str, ...]] = COMMON_DTYPES
    exact: bool = False
    """True when the result is bit-exact for every dtype (max, argmax); else floats get tolerances."""
    tolerance: ClassVar[Tolerance | None] = None
    """How far a float result may be from `reference` beyond the dtype's tolerance
    (`deploy/ops/tolerance.py`); None: derived from the computation (a sum of n terms gets the
    summation bound)."""
    cases: ClassVar[tuple[Case, ...]] = ()
    """Shapes and attributes that `deploy test` verifies for every dtype."""
    bench: ClassVar[Case | None] = None
    """The case `deploy bench` times: one well past the last-level cache, so that its ratio to the
    memory floor measures memory, not cache (None: the first of `cases`)."""
    fuses: ClassVar[bool] = True
    """Whether a graph's fusion may put this op in one kernel with its neighbours (False: it is
    always a kernel of its own)."""
    onnx: ClassVar[tuple[OnnxOp, ...]] = ()
    """The ONNX nodes this op implements, each with its attribute conversion (`onnx_mapping.py`)."""
    view: ClassVar[bool] = False
    """Its output is its input's elements in the same order under another shape (a reshape): a
    fused kernel that ends in views writes its anchor's output in their place, in the anchor's
    loops (`deploy/schedules/fused.py`)."""

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        """Validate shapes (CheckShape) and return the output type (InferShape/InferType)."""
        raise NotImplementedError

    def compute(self, attrs: dict[str, Any], out: TensorType, *tensors: Any) -> Any:
        """TE computation: te.Tensor inputs -> te.Tensor output of type `out`."""
        raise NotImplementedError

    def reference(self, attrs: dict[str, Any], *arrays: Any) -> np.ndarray:
        """Numpy reference with the same semantics as `compute`."""
        raise NotImplementedError

    def numpy_baseline(self, attrs: dict[str, Any], *arrays: np.ndarray) -> np.ndarray | None:
        """numpy's fast way to compute the op: what `deploy bench` times as its numpy column
        (checked against `reference` first). Default: `reference`, fair where it is whole-array
        numpy; override it where the reference is written for correctness (`np.vectorize`,
        Python loops) with a fast one, or return None: the column says n/a."""
        return self.reference(attrs, *arrays)

    def onnx_baseline(self, attrs: dict[str, Any], inputs: list[TensorType]) -> OnnxNode | None:
        """The standard ONNX node that computes the op for these inputs, which `deploy bench`
        times in onnxruntime; None: no onnxruntime column. Default: the first standard-domain
        mapping of `onnx` whose `node_attrs` can say the attributes. Override it for a node the
        op does not import (a custom op that is a standard Gelu, opset 20) or whose attributes
        depend on the shapes (a depthwise Conv's `group`: the input's channels)."""
        for mapping in self.onnx:
            if mapping.node_attrs is None or domain_key(mapping.domain):
                continue
            node_attrs = mapping.node_attrs(attrs)
            if node_attrs is not None:
                return OnnxNode(mapping.op_type, node_attrs)
        return None

    def relayout(self, attrs: dict[str, Any], inputs: list[TensorType], layout: Layout) -> Relayout | None:
        """How this node (NCHW `attrs`, bound to `inputs`) runs in `layout`; None: it runs only as
        it is (the default), and a graph pass converts its inputs back to what it reads."""
        return None

    def layout_label(self, attrs: dict[str, Any]) -> str | None:
        """The layout this node computes in, as a manifest names it: its `layout` attribute
        (None: it has none, and computes in the layout of what it reads)."""
        layout = attrs.get("layout")
        return None if layout is None else str(layout)

    def parts(self) -> tuple[Op, ...]:
        """The ops whose definitions this op's computation is made of: itself (a fused group: its
        nodes' ops), which is what a build depends on."""
        return (self,)

    def comparison_rule(self, bound: BoundOp) -> Rule:
        """How `bound`'s float outputs are compared with the reference (`deploy/ops/tolerance.py`):
        exact, the declared `tolerance`, or derived from the sums its computation makes."""
        if self.exact or self.tolerance is not None:
            return op_rule(self.name, self.exact, self.tolerance, 0)
        from tvm import te

        placeholders = [
            te.placeholder(t.shape, t.dtype, name=spec.name)
            for spec, t in zip(self.inputs, bound.inputs, strict=True)
        ]
        return op_rule(
            self.name, False, None, sum_length(self.compute(bound.attrs, bound.output, *placeholders))
        )

    def bench_case(self) -> Case:
        """The case `deploy bench` times."""
        return self.bench or self.cases[0]

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""


@dataclass(frozen=True)
class BoundOp:
    """An op with validated attributes and input types, and its inferred output type."""

    op: Op
    attrs: dict[str, Any]
    inputs: tuple[TensorType, ...]
    output: TensorType

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def exact(self) -> bool:
        return self.op.exact

    def ops(self) -> tuple[Op, ...]:
        """The op definitions the build of this op depends on."""
        return self.op.parts()

    def rule(self) -> Rule:
        """How its float outputs are compared with the reference (`Op.comparison_rule`)."""
        return self.op.comparison_rule(self)

    @property
    def outputs(self) -> tuple[TensorType, ...]:
        """Its one output, as a graph's outputs are listed."""
        return (self.output,)

    @property
    def output_names(self) -> tuple[str, ...]:
        return (OUTPUT,)

    @property
    def constants(self) -> tuple[()]:
        """An op has none: its tensors are all its caller's (a graph's `constants`)."""
        return ()

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        """The op's numpy reference on `arrays`."""
        return self.op.reference(self.attrs, *arrays)

    def references(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """`reference` as a graph's outputs are listed."""
        return [self.reference(*arrays)]

    def baselines(self, *arrays: np.ndarray) -> list[np.ndarray] | None:
        """The op's `numpy_baseline` on `arrays`, as `references` lists outputs; None: n/a."""
        found = self.op.numpy_baseline(self.attrs, *arrays)
        return None if found is None else [found]

    def computed(self, out: Any) -> Any:
        """`out`, what the op's compute returned, if it is the te.Tensor `infer` said (rank, static
        dims, dtype); a UsageError naming the op when not: its artifact could never be called."""
        from tvm import te, tirx

        if not isinstance(out, te.Tensor):
            raise UsageError(
                f"op {self.op.name}: compute returned {type(out).__name__}: expected a te.Tensor"
            )
        if isinstance(out.op, te.PlaceholderOp):
            raise UsageError(
                f"op {self.op.name}: compute returned its input {out.op.name!r}: expected a te.compute"
            )
        dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in out.shape]
        said = [None if is_symbolic(d) else d for d in self.output.shape]
        if (
            str(out.dtype) != self.output.dtype
            or len(dims) != len(said)
            or any(a is not None and b is not None and a != b for a, b in zip(dims, said, strict=True))
        ):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            raise UsageError(
                f"op {self.op.name}: compute gives {shown}:{out.dtype}, but infer said {self.output}"
            )
        return out

    def key(self) -> dict[str, Any]:
        return {
            "op": self.op.name,
            "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()},
            "inputs": [t.to_json() for t in self.inputs],
        }


def normalize_attrs(op: Op, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, every value normalized; unknown names are a UsageError, and so is
    anything but a mapping (attributes read from a file may be anything)."""
    if not isinstance(given, dict):
        raise UsageError(f"op {op.name}: attributes {given!r}: expected a mapping of names to values")
    known = {a.name: a for a in op.attrs}
    for name in given:
        if name not in known:
            expected = ", ".join(known) if known else "none"
            raise UsageError(f"op {op.name} has no attribute {name!r} (attributes: {expected})")
    return {a.name: a.normalize(given.get(a.name, a.default)) for a in op.attrs}


def bind(op: Op, attrs: dict[str, Any], inputs: list[TensorType]) -> BoundOp:
    """Check attributes, input count, ranks and dtypes, then infer the output type."""
    values = normalize_attrs(op, attrs)
    if len(inputs) != len(op.inputs):
        names = ", ".join(i.name for i in op.inputs)
        raise UsageError(f"op {op.name} takes {len(op.inputs)} inputs ({names}), got {len(inputs)}")
    for spec, tensor in zip(op.inputs, inputs, strict=True):
        if tensor.dtype not in op.dtypes:
            raise UsageError(
                f"op {op.name} does not support dtype {tensor.dtype} for input {spec.name}"
                f" (supported: {', '.join(op.dtypes)})"
            )
        if not spec.min_rank <= len(tensor.shape) <= spec.max_rank:
            raise UsageError(
                f"input {spec.name} of {op.name} has shape {list(tensor.shape)}: expected rank"
                f" {spec.min_rank}..{spec.max_rank}"
            )
        if any(not is_symbolic(d) and d < 1 for d in tensor.shape):
            raise UsageError(
                f"input {spec.name} of {op.name} has shape {list(tensor.shape)}: dims must be >= 1"
            )
        if any(is_symbolic(d) for d in tensor.shape[1:]):
            raise UsageError(
                f"input {spec.name} of {op.name} has shape {list(tensor.shape)}: only the first dim (the"
                " batch) may be symbolic"
            )
        check_size(f"input {spec.name} of {op.name}", tensor)
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
        raise UsageError(f"inputs of {op.name} must share one dtype, got {', '.join(sorted(dtypes))}")
    for attr in op.attrs:
        if isinstance(attr.kind, Float) and values[attr.name] is not None:
            attr.kind.check_dtype(attr.name, values[attr.name], inputs[0].dtype)
    output = op.infer(values, list(inputs))
    if not isinstance(output, TensorType):
        raise UsageError(f"op {op.name}: infer returned {type(output).__name__}: expected a TensorType")
    if output.dtype not in ALL_DTYPES:
        raise UsageError(
            f"op {op.name}: infer gives dtype {output.dtype!r}: expected one of {', '.join(ALL_DTYPES)}"
        )
    if any(not is_symbolic(d) and d < 1 for d in output.shape):
        raise UsageError(f"the output of {op.name} has shape {list(output.shape)}: dims must be >= 1")
    if any(is_symbolic(d) for d in output.shape[1:]):
        raise UsageError(
            f"the output of {op.name} has shape {list(output.shape)}: only the first dim (the batch)"
            " may be symbolic"
        )
    check_size(f"the output of {op.name}", output)
    return BoundOp(op, values, tuple(inputs), output)


def check_size(what: str, tensor: TensorType) -> None:
    """At most MAX_ELEMENTS elements (per batch item: a symbolic dim counts as 1): TVM indexes a
    tensor with int32 and fails deep in lowering beyond it, and the cap keeps a typo like
    100000x100000x100 from asking for terabytes."""
    count = tensor.elements()
    if count > MAX_ELEMENTS:
        per = " per batch item" if tensor.symbols else ""
        shape = ", ".join(clipped(str(d)) for d in tensor.shape)
        many = f"{count:.3g}" if count < 10**300 else f"about 1e{len(str(count)) - 1}"  # float() overflows
        raise UsageError(
            f"{what} has shape [{shape}]: {many} elements{per}, more than the"
            f" {MAX_ELEMENTS} (2**31 - 1) one tensor may hold"
        )
