"""What an op definition is: inputs, attributes, dtypes, inference, TE compute, numpy reference.

An op is a subclass of `Op` registered with `@register` (see `ops/registry.py`). `bind()` checks
attributes, input count, ranks and dtypes generically, then calls the op's own `infer()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from base.errors import UsageError
from ops.attrs import Attr, Float
from ops.onnx_mapping import OnnxOp

ALL_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int32", "int64")
FLOAT_DTYPES = ("float32", "float16", "float64")
MAX_ELEMENTS = 2**31 - 1


@dataclass(frozen=True)
class TensorType:
    """Shape (tuple of dims, row-major) and dtype name of one tensor."""

    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    def __str__(self) -> str:
        return "x".join(map(str, self.shape)) + ":" + self.dtype if self.shape else f"():{self.dtype}"


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

    shapes: tuple[tuple[int, ...], ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        shapes = " ".join("x".join(map(str, s)) or "()" for s in self.shapes)
        attrs = " ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{shapes} {attrs}".strip()


class Op:
    """Base class of op definitions; subclasses set the class attributes and four methods."""

    name: ClassVar[str]
    inputs: ClassVar[tuple[Input, ...]]
    attrs: ClassVar[tuple[Attr, ...]] = ()
    dtypes: ClassVar[tuple[str, ...]] = ALL_DTYPES
    exact: ClassVar[bool] = False
    """True when the result is bit-exact for every dtype (max, argmax); else floats get tolerances."""
    cases: ClassVar[tuple[Case, ...]] = ()
    """Shapes and attributes that `deploy test` verifies for every dtype."""
    onnx: ClassVar[tuple[OnnxOp, ...]] = ()
    """The ONNX nodes this op implements, each with its attribute conversion (`ops/onnx_mapping.py`)."""

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        """Validate shapes (CheckShape) and return the output type (InferShape/InferType)."""
        raise NotImplementedError

    def compute(self, attrs: dict[str, Any], out: TensorType, *tensors: Any) -> Any:
        """TE computation: te.Tensor inputs -> te.Tensor output of type `out`."""
        raise NotImplementedError

    def reference(self, attrs: dict[str, Any], *arrays: np.ndarray) -> np.ndarray:
        """Numpy reference with the same semantics as `compute`."""
        raise NotImplementedError

    def parts(self) -> tuple[Op, ...]:
        """The ops whose definitions this op's computation is made of: itself (a fused group: its
        nodes' ops), which is what a build depends on."""
        return (self,)

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

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        """The op's numpy reference on `arrays`."""
        return self.op.reference(self.attrs, *arrays)

    def key(self) -> dict[str, Any]:
        return {
            "op": self.op.name,
            "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()},
            "inputs": [t.to_json() for t in self.inputs],
        }


def normalize_attrs(op: Op, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, every value normalized; unknown names are a UsageError."""
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
        if any(d < 1 for d in tensor.shape):
            raise UsageError(
                f"input {spec.name} of {op.name} has shape {list(tensor.shape)}: dims must be >= 1"
            )
        check_size(f"input {spec.name} of {op.name}", tensor.shape)
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
        raise UsageError(f"inputs of {op.name} must share one dtype, got {', '.join(sorted(dtypes))}")
    for attr in op.attrs:
        if isinstance(attr.kind, Float) and values[attr.name] is not None:
            attr.kind.check_dtype(attr.name, values[attr.name], inputs[0].dtype)
    output = op.infer(values, list(inputs))
    check_size(f"the output of {op.name}", output.shape)
    return BoundOp(op, values, tuple(inputs), output)


def check_size(what: str, shape: tuple[int, ...]) -> None:
    """At most MAX_ELEMENTS elements: TVM indexes a tensor with int32 and fails deep in lowering
    beyond it, and the cap keeps a typo like 100000x100000x100 from asking for terabytes."""
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise UsageError(
            f"{what} has shape {list(shape)}: {count:.3g} elements, more than the {MAX_ELEMENTS}"
            " (2**31 - 1) one tensor may hold"
        )
