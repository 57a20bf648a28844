"""Which ONNX node an op implements: `Op.onnx = (OnnxOp("MaxPool", attrs=..., node_attrs=...),)`.

The ONNX reader (`deploy/model/onnx_import.py`) finds the op for each node by its (domain,
op_type) through `deploy.ops.registry.op_for_onnx` and converts the node's attributes with `attrs`. A
conversion raises a one-line UsageError naming the ONNX attribute, its value and what is
supported: a model that needs what an op does not do (1-D pooling, storage_order=1) is refused,
never run with other semantics. `node_attrs` converts back, for a one-node model of a bound op
(the onnxruntime baseline of `deploy bench`); tests/test_models.py checks the round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deploy.base.errors import UsageError, printable

DEFAULT_DOMAIN = ""
"""The standard operator set; "ai.onnx" names it too (`domain_key`)."""


def passes_through(attrs: dict[str, Any]) -> dict[str, Any]:
    """The ONNX attributes as the op's own: same names, same values."""
    return dict(attrs)


@dataclass(frozen=True)
class OnnxOutput:
    """A further output of an ONNX node: the op computing it from the node's inputs, and the
    conversion of the node's attributes to that op's."""

    op: str
    attrs: Callable[[dict[str, Any]], dict[str, Any]] = passes_through


@dataclass(frozen=True)
class OnnxOp:
    """An ONNX (domain, op_type) an op implements, and its attribute conversion: ONNX values
    (ints, floats, lists of ints, str) -> the op's attribute dict (defaults as ONNX has them)."""

    op_type: str
    domain: str = DEFAULT_DOMAIN
    attrs: Callable[[dict[str, Any]], dict[str, Any]] = passes_through
    node_attrs: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    """The other way: the op's bound attributes -> the node's ONNX attributes, None where ONNX
    cannot say them (a packed layout, int32 indices); no function: the op is not exported.
    `deploy bench` builds its onnxruntime baseline with it."""
    chain: (
        Callable[[dict[str, Any], tuple[int | None, ...] | None], list[tuple[str, dict[str, Any]]] | None]
        | None
    ) = None
    """For nodes this op alone does not compute (1-D and 3-D MaxPool): (the node's ONNX
    attributes, its first input's dims where known, None for a symbolic one) -> the ops that do,
    as (op name, attributes), each reading the one before (the first the node's input, the last
    writing its output); None where the op alone does."""
    more_outputs: tuple[OnnxOutput, ...] = ()
    """How the node's second, third... outputs are computed (MaxPool's Indices): a model reading
    such an output gets a node of that op beside this one."""

    def key(self) -> tuple[str, str]:
        return domain_key(self.domain), self.op_type


BASELINE_OPSET = 17
"""The opset of a baseline node that does not name one: every shipped op's node means the same
from opset 13 to now."""


@dataclass(frozen=True)
class OnnxNode:
    """A standard-domain ONNX node computing what an op does, for `deploy bench`'s onnxruntime
    column (`Op.onnx_baseline`): its op_type, its ONNX attributes and the opset that defines it
    (Gelu: 20)."""

    op_type: str
    attrs: dict[str, Any]
    opset: int = BASELINE_OPSET


def domain_key(domain: str) -> str:
    """The key of `domain`: "" and "ai.onnx" are the same default domain."""
    return DEFAULT_DOMAIN if domain == "ai.onnx" else domain


def onnx_label(domain: str, op_type: str) -> str:
    """How messages name an ONNX op: `MaxPool`, or `com.example::HardTanh` outside the standard set."""
    key = domain_key(domain)
    return f"{key}::{op_type}" if key else op_type


def unsupported(name: str, value: Any, supported: str) -> UsageError:
    return UsageError(f"ONNX attribute {printable(name)}={value!r} is not supported: {supported}")


def check_names(attrs: dict[str, Any], known: tuple[str, ...]) -> None:
    """Every ONNX attribute one the conversion knows: an unknown one may change the semantics."""
    for name, value in attrs.items():
        if name not in known:
            raise unsupported(name, value, f"the attributes supported are {', '.join(known) or 'none'}")


def same_names(**defaults: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A conversion for ops whose attributes ONNX names alike: ONNX's `defaults` filled in (not
    the op's own, which may differ), any other ONNX attribute refused."""

    def convert(attrs: dict[str, Any]) -> dict[str, Any]:
        check_names(attrs, tuple(defaults))
        return {**defaults, **attrs}

    return convert


def require(attrs: dict[str, Any], name: str, allowed: Any, supported: str) -> None:
    """The ONNX attribute `name`, where given, must equal `allowed`."""
    if name in attrs and attrs[name] != allowed:
        raise unsupported(name, attrs[name], supported)


def per_axis(attrs: dict[str, Any], name: str, default: list[int], axes: str = "HW") -> tuple[int, ...]:
    """A pooling ONNX list attribute (kernel_shape, strides) with a value per axis of `axes`."""
    value = attrs.get(name, default)
    if not isinstance(value, list) or len(value) != len(axes):
        raise unsupported(name, value, f"{len(axes)}-D pooling here ({len(axes)} values, {', '.join(axes)})")
    return tuple(value)


def pads(attrs: dict[str, Any], axes: str = "HW") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ONNX `auto_pad` and `pads` [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over `axes`
    as (before, after), a value per axis each: auto_pad NOTSET (the pads as given) or VALID
    (none). SAME_UPPER and SAME_LOWER pad by the input's size: the importer makes them explicit
    pads first (`onnx_import.explicit_pads`)."""
    rank = len(axes)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    given = attrs.get("pads", [0] * 2 * rank)
    if auto_pad not in ("NOTSET", "VALID"):
        raise unsupported(
            "auto_pad", auto_pad, "NOTSET (explicit pads), VALID (none), or SAME_* on an input of known size"
        )
    if not isinstance(given, list) or len(given) != 2 * rank:
        names = [f"{axis.lower()}_{end}" for end in ("begin", "end") for axis in axes]
        raise unsupported("pads", given, f"{rank}-D pads here [{', '.join(names)}]")
    if auto_pad == "VALID" and any(given):
        raise unsupported("pads", given, "pads together with auto_pad=VALID")
    return tuple(given[:rank]), tuple(given[rank:])
