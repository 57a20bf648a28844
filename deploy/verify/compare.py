"""Comparing a device's output with the numpy reference, and the inputs verification uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deploy.ops.spec import TensorType

TOLERANCES = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-13)}
"""(rtol, atol) by dtype for results that are not bit-exact."""


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_error: float
    detail: str = ""


CHUNK = 1 << 18
"""Elements compared at a time: the float64 copies a comparison makes stay a few MB, however
large the output."""


def compare(expected: np.ndarray, actual: np.ndarray, exact: bool) -> Comparison:
    """Exact equality for exact ops and integers; dtype tolerances for floats, but for infinities,
    which must match exactly (a relative tolerance of an infinity is infinite). NaN matches NaN."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Comparison(
            False,
            float("inf"),
            f"got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}",
        )
    if actual.size == 0:
        return Comparison(True, 0.0)
    exact = exact or expected.dtype.kind in "iub"
    rtol, atol = (0.0, 0.0) if exact else TOLERANCES[str(expected.dtype)]
    flat_expected, flat_actual = expected.reshape(-1), actual.reshape(-1)
    max_error, shown = 0.0, None  # (what, flat index, excess) of the element the detail names
    for start in range(0, flat_expected.size, CHUNK):
        error, what, index, excess = _compare_chunk(
            flat_expected[start : start + CHUNK], flat_actual[start : start + CHUNK], exact, rtol, atol
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
    expected: list[np.ndarray], actual: list[np.ndarray], exact: bool, names: list[str]
) -> Comparison:
    """Each output of `actual` against `expected` (`compare`): the first that differs, named
    where there are several, else all fine with the largest error."""
    if len(actual) != len(expected):
        return Comparison(False, float("inf"), f"got {len(actual)} outputs, expected {len(expected)}")
    found = [compare(np.asarray(e), a, exact) for e, a in zip(expected, actual, strict=True)]
    worst = max(c.max_error for c in found)
    for name, comparison in zip(names, found, strict=True):
        if not comparison.ok:
            detail = f"output {name!r}: {comparison.detail}" if len(found) > 1 else comparison.detail
            return Comparison(False, worst, detail)
    return Comparison(True, worst)


def _compare_chunk(
    expected: np.ndarray, actual: np.ndarray, exact: bool, rtol: float, atol: float
) -> tuple[float, str, int, float]:
    """(max error, what disagrees: "" where nothing does, the flat index in the chunk of the
    element to show, how far past the tolerance it is): the first element that breaks a rule
    (NaN, bit-exactness, infinities; inf past), else the worst beyond the tolerance."""
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
    if exact:
        differs = expected[finite] != actual[finite]
        if differs.any():
            return max_error, "not bit-exact", int(finite[np.argmax(differs)]), float("inf")
        return max_error, "", 0, 0.0
    infinite = np.isinf(wide_expected) | np.isinf(wide_actual)  # where a tolerance would be inf too
    moved = infinite & (wide_expected != wide_actual)
    if moved.any():
        return max_error, "infinities differ in place or sign", int(finite[np.argmax(moved)]), float("inf")
    with np.errstate(invalid="ignore"):
        excess = np.where(infinite, 0.0, diff - (atol + rtol * np.abs(wide_expected)))
    if excess.size and excess.max() > 0:
        worst = int(np.argmax(excess))
        return max_error, f"beyond rtol={rtol} atol={atol}", int(finite[worst]), float(excess[worst])
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
