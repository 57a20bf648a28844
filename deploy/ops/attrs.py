"""Typed op attributes: parsing from `-a key=value`, validation and fuzzing domains.

Each kind turns a CLI string or a Python value into one normalized value, or raises a
UsageError naming the attribute, the bad value and what was expected.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from deploy.base.errors import UsageError, shown

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# ASCII only: float() and int() alone also take `1_000` and fullwidth or other Unicode digits.
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I)


def _bad(name: str, value: Any, expected: str) -> UsageError:
    return UsageError(f"attribute {name}={shown(value)}: expected {expected}")


def _parts(value: Any) -> list[Any]:
    """The items of a list attribute: `3,2` split at commas, a list or tuple as it is, one value alone."""
    if isinstance(value, str):
        return [p.strip() for p in value.split(",")]
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


@dataclass(frozen=True)
class Float:
    """A finite float in [lo, hi]."""

    lo: float = -math.inf
    hi: float = math.inf
    takes_text: ClassVar[bool] = False
    """Whether its values are text (else a typed source, such as ONNX, giving a string is wrong)."""

    def type_name(self) -> str:
        return "float"

    def normalize(self, name: str, value: Any) -> float:
        if isinstance(value, str) and not _FLOAT.fullmatch(value.strip()):
            raise _bad(name, value, "a float")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):  # an int past float's range
            raise _bad(name, value, f"a finite float in [{self.lo}, {self.hi}]") from None
        if isinstance(value, bool) or not math.isfinite(number) or not self.lo <= number <= self.hi:
            raise _bad(name, value, f"a finite float in [{self.lo}, {self.hi}]")
        return number

    def check_dtype(self, name: str, value: float, dtype: str) -> None:
        """A float dtype must hold the value: TVM refuses a constant beyond its range."""
        if not np.issubdtype(dtype, np.floating):
            return
        largest = float(np.finfo(dtype).max)
        if abs(value) > largest:
            raise _bad(name, value, f"a float within the range of {dtype} (|x| <= {largest:g})")

    def strategy(self, st: Any) -> Any:
        return st.floats(max(self.lo, -4.0), min(self.hi, 4.0), allow_nan=False)


@dataclass(frozen=True)
class Int:
    """An integer in [lo, hi]; `fuzz_hi` bounds the values a fuzzer tries."""

    lo: int
    hi: int
    fuzz_hi: int | None = None
    takes_text: ClassVar[bool] = False

    def type_name(self) -> str:
        return "int"

    def normalize(self, name: str, value: Any) -> int:
        expected = f"an integer in [{self.lo}, {self.hi}]"
        if isinstance(value, bool):
            raise _bad(name, value, expected)
        if isinstance(value, str) and not _INT.fullmatch(value.strip()):
            raise _bad(name, value, expected)
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):  # inf, nan, text past int()'s 4300 digits
            raise _bad(name, value, expected) from None
        if isinstance(value, float) and value != number:
            raise _bad(name, value, expected)
        if not self.lo <= number <= self.hi:
            raise _bad(name, value, expected)
        return number

    def strategy(self, st: Any) -> Any:
        return st.integers(self.lo, self.fuzz_hi if self.fuzz_hi is not None else self.hi)


@dataclass(frozen=True)
class IntPerAxis:
    """One integer in [lo, hi] per axis of `axes` (a pooling window's H and W, or D, H and W),
    written `3` (every axis) or `3,2`; normalized to a tuple in the order of `axes`."""

    lo: int
    hi: int = 2**31 - 1
    fuzz_hi: int = 4
    axes: str = "HW"
    takes_text: ClassVar[bool] = False

    def type_name(self) -> str:
        return ",".join("int" for _ in self.axes)

    def normalize(self, name: str, value: Any) -> tuple[int, ...]:
        several = "a pair" if len(self.axes) == 2 else f"{len(self.axes)} values"
        expected = f"an integer in [{self.lo}, {self.hi}] or {several} '{','.join(self.axes)}' of them"
        parts = _parts(value)
        if len(parts) == 1:
            parts = parts * len(self.axes)
        if len(parts) != len(self.axes):
            raise _bad(name, value, expected)
        scalar = Int(self.lo, self.hi)
        try:
            return tuple(scalar.normalize(name, p) for p in parts)
        except UsageError:
            raise _bad(name, value, expected) from None

    def strategy(self, st: Any) -> Any:
        one = st.integers(self.lo, self.fuzz_hi)
        return st.tuples(*(one for _ in self.axes))


@dataclass(frozen=True)
class Ints:
    """Up to `most` integers in [lo, hi], written `1,-1,0`; normalized to a tuple."""

    lo: int
    hi: int
    most: int = 8
    takes_text: ClassVar[bool] = False

    def type_name(self) -> str:
        return "int,int,..."

    def normalize(self, name: str, value: Any) -> tuple[int, ...]:
        expected = f"1 to {self.most} integers in [{self.lo}, {self.hi}], as '1,-1,0'"
        parts = _parts(value)
        if not 1 <= len(parts) <= self.most:
            raise _bad(name, value, expected)
        scalar = Int(self.lo, self.hi)
        try:
            return tuple(scalar.normalize(name, p) for p in parts)
        except UsageError:
            raise _bad(name, value, expected) from None

    def strategy(self, st: Any) -> Any:
        return st.lists(st.integers(self.lo, 4), min_size=1, max_size=4).map(tuple)


@dataclass(frozen=True)
class Bool:
    """true/false (also 1/0, yes/no, on/off)."""

    takes_text: ClassVar[bool] = False

    def type_name(self) -> str:
        return "bool"

    def normalize(self, name: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise _bad(name, value, "true or false")

    def strategy(self, st: Any) -> Any:
        return st.booleans()


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of strings."""

    values: tuple[str, ...]
    takes_text: ClassVar[bool] = True

    def type_name(self) -> str:
        return "|".join(self.values)

    def normalize(self, name: str, value: Any) -> str:
        text = str(value)
        if text not in self.values:
            raise _bad(name, value, "one of " + ", ".join(self.values))
        return text

    def strategy(self, st: Any) -> Any:
        return st.sampled_from(self.values)


AttrKind = Float | Int | IntPerAxis | Ints | Bool | Choice


@dataclass(frozen=True)
class Attr:
    """An op attribute: name, kind, default (None: derived by the op), one-line doc."""

    name: str
    kind: AttrKind
    default: Any
    doc: str = ""
    optional: bool = False

    def normalize(self, value: Any) -> Any:
        if value is None and self.optional:
            return None
        return self.kind.normalize(self.name, value)
