"""Comparing a device's output with the numpy reference, and the inputs verification uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deploy.ops.spec import TensorType
from deploy.ops.tolerance import DTYPE, Rule

TOLERANCES = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-13)}
"""(rtol, atol) by dtype for results that are not bit-exact: what every float comparison allows."""


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_error: float
    detail: str = ""


CHUNK = 1 << 18
"""Elements compared at a time: the float64 copies a comparison makes stay a few MB, however
large the output."""


@dataclass(frozen=True)
class Bound:
    """The bound on |got - want| of one float dtype under a rule: atol + rtol * |want| +
    term * magnitude (`deploy/ops/tolerance.py`)."""

    rtol: float
    atol: float
    term: float
    text: str
    """The bound as a formula, with where its rule comes from."""

    def of(self, expected: np.ndarray, magnitude: np.ndarray | None) -> np.ndarray:
        """The bound per element (float64), `magnitude` the reference on |inputs| (None, or NaN
        where NaN inputs make it so: no per-term part)."""
        bound = self.atol + self.rtol * np.abs(expected)
        if magnitude is not None and self.term:
            bound = bound + np.nan_to_num(self.term * np.abs(magnitude), nan=0.0, posinf=np.inf)
        return bound


def bound_for(dtype: np.dtype, rule: Rule) -> Bound:
    """The bound `rule` sets for results of the float `dtype`."""
    eps = float(np.finfo(dtype).eps)
    rtol, atol = TOLERANCES[str(dtype)]
    relative = max(rtol if rule.dtype_rtol else 0.0, (rule.ulps or 0.0) * eps)
    parts = [f"{rule.per_term:g}*eps*sum|terms|"] if rule.per_term else []
    parts += [f"{relative:g}*|want|", f"{atol:g}"]
    why = f"{dtype} {rule.why}" if rule.why else str(dtype)
    return Bound(relative, atol, rule.per_term * eps, f"{why}: {' + '.join(parts)}")


def compare(
    expected: np.ndarray,
    actual: np.ndarray,
    exact: bool,
    rule: Rule = DTYPE,
    magnitude: np.ndarray | None = None,
) -> Comparison:
    """Exact equality for exact ops and integers; for floats the bound `rule` sets
    (`bound_for`; `magnitude`: the reference on |inputs|, where the rule has a per-term part),
    but for infinities, which must match exactly (a relative tolerance of an infinity is
    infinite). NaN matches NaN."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Comparison(
            False,
            float("inf"),
            f"got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}",
        )
    if actual.size == 0:
        return Comparison(True, 0.0)
    exact = exact or rule.exact or expected.dtype.kind in "iub"
    bound = None if exact else bound_for(expected.dtype, rule)
    flat_expected, flat_actual = expected.reshape(-1), actual.reshape(-1)
    flat_magnitude = None
    if magnitude is not None and np.shape(magnitude) == expected.shape:
        flat_magnitude = np.asarray(magnitude).reshape(-1)
    max_error, shown = 0.0, None  # (what, flat index, excess) of the element the detail names
    for start in range(0, flat_expected.size, CHUNK):
        part = slice(start, start + CHUNK)
        error, what, index, excess = _compare_chunk(
            flat_expected[part],
            flat_actual[part],
            bound,
            None if flat_magnitude is None else flat_magnitude[part],
        )
        max_error = max(max_error, error)
        if what and (shown is None or excess > shown[2]):  # a broken rule (inf) outranks a tolerance
            shown = (what, start + index, excess)
        if what.startswith("NaN"):  # no error can be measured
            break
    if shown is None:
        return Comparison(True, max_error)
    what, at, _ = shown
    where = list(map(int, np.unravel_index(at, expected.shape)))
    detail = f"{what}: at {where} got {flat_actual[at].item()!r}, want {flat_expected[at].item()!r}"
    return Comparison(False, max_error, detail)


def compare_all(
    expected: list[np.ndarray],
    actual: list[np.ndarray],
    exact: bool,
    names: list[str],
    rule: Rule = DTYPE,
    magnitudes: list[np.ndarray] | None = None,
) -> Comparison:
    """Each output of `actual` against `expected` (`compare`, under `rule` with each output's
    magnitude): the first that differs, named where there are several, else all fine with the
    largest error."""
    if len(actual) != len(expected):
        return Comparison(False, float("inf"), f"got {len(actual)} outputs, expected {len(expected)}")
    each = magnitudes if magnitudes is not None else [None] * len(expected)
    found = [
        compare(np.asarray(e), a, exact, rule, m) for e, a, m in zip(expected, actual, each, strict=True)
    ]
    worst = max(c.max_error for c in found)
    for name, comparison in zip(names, found, strict=True):
        if not comparison.ok:
            detail = f"output {name!r}: {comparison.detail}" if len(found) > 1 else comparison.detail
            return Comparison(False, worst, detail)
    return Comparison(True, worst)


def _compare_chunk(
    expected: np.ndarray, actual: np.ndarray, bound: Bound | None, magnitude: np.ndarray | None
) -> tuple[float, str, int, float]:
    """(max error, what disagrees: "" where nothing does, the flat index in the chunk of the
    element to show, how far past the bound it is): the first element that breaks a rule
    (NaN, bit-exactness where `bound` is None, infinities; inf past), else the worst beyond the
    bound."""
    wide_expected, wide_actual = expected.astype(np.float64), actual.astype(np.float64)
    nan_expected = np.isnan(wide_expected)
    nan_moved = nan_expected != np.isnan(wide_actual)
    if nan_moved.any():
        return float("inf"), "NaN in different places", int(np.argmax(nan_moved)), float("inf")
    finite = np.flatnonzero(~nan_expected)
    wide_expected, wide_actual = wide_expected[finite], wide_actual[finite]
    with np.errstate(invalid="ignore"):  # inf - inf; equal entries are zeroed next
        diff = np.abs(wide_expected - wide_actual)
    diff[wide_expected == wide_actual] = 0.0
    max_error = float(diff.max()) if diff.size else 0.0
    if bound is None:
        differs = expected[finite] != actual[finite]
        if differs.any():
            return max_error, "not bit-exact", int(finite[np.argmax(differs)]), float("inf")
        return max_error, "", 0, 0.0
    infinite = np.isinf(wide_expected) | np.isinf(wide_actual)  # where a tolerance would be inf too
    moved = infinite & (wide_expected != wide_actual)
    if moved.any():
        return max_error, "infinities differ in place or sign", int(finite[np.argmax(moved)]), float("inf")
    wide_magnitude = None if magnitude is None else magnitude.astype(np.float64)[finite]
    allowed = bound.of(wide_expected, wide_magnitude)
    with np.errstate(invalid="ignore"):
        excess = np.where(infinite, 0.0, diff - allowed)
    if excess.size and excess.max() > 0:
        worst = int(np.argmax(excess))
        what = f"|got-want| {diff[worst]:.3g} > bound {allowed[worst]:.3g} ({bound.text})"
        return max_error, what, int(finite[worst]), float(excess[worst])
    return max_error, "", 0, 0.0


SPECIAL_EVERY = 2000
"""With `specials`, one element in this many becomes NaN, one +inf and one -inf (floats, at least
one of each where the tensor has room): a row of 1000 holds some in about 40% of rows."""
TIE_EVERY = 64
"""With `specials`, one element in this many becomes a copy of the tensor's maximum."""


@dataclass(frozen=True)
class InputSet:
    """A kind of seeded random input an artifact is checked on (`random_input`)."""

    label: str
    ties: bool = False
    specials: bool = False


INPUT_SETS = (InputSet("random"), InputSet("ties", ties=True), InputSet("NaN, inf, ties", specials=True))
"""What `check_artifact` (tuning, layout choice) and `deploy test --model` run an artifact on:
plain random inputs, inputs full of ties, and inputs with NaN, infinities and repeated maxima
planted. The op matrix draws its own per case (`matrix.verify_case`)."""


def random_input(
    tensor: TensorType, rng: np.random.Generator, ties: bool = False, specials: bool = False
) -> np.ndarray:
    """Random data over the dtype's whole range for integers, N(0, 1) for floats.

    With `ties`, floats are rounded to quarters so maxima repeat (first-index rules get tested).
    With `specials`, seeded positions hold NaN, +inf and -inf (floats; NaN first where the tensor
    is too small for all) and copies of the maximum, so NaN propagation, infinities and
    tie-breaking get tested.
    """
    if tensor.dtype.startswith("float"):
        data = rng.standard_normal(tensor.shape)
        if ties:
            data = np.round(data * 4) / 4
        data = np.asarray(data, dtype=tensor.dtype)
    else:
        info = np.iinfo(tensor.dtype)
        data = rng.integers(info.min, info.max, size=tensor.shape, dtype=tensor.dtype, endpoint=True)
        data = np.asarray(data)
    if specials and data.size:
        plant_specials(data, rng)
    return data


def plant_specials(data: np.ndarray, rng: np.random.Generator) -> None:
    """Overwrite seeded positions of `data` in place: NaN, +inf, -inf (floats), then copies of
    the largest value."""
    flat = data.reshape(-1)
    values: list[float | int] = []
    if data.dtype.kind == "f":
        count = max(1, flat.size // SPECIAL_EVERY)
        for value in (np.nan, np.inf, -np.inf):
            values += [value] * count
    values += [flat.max()] * max(1, flat.size // TIE_EVERY)
    positions = rng.choice(flat.size, size=min(len(values), flat.size), replace=False)
    flat[positions] = np.asarray(values[: len(positions)], dtype=data.dtype)
