"""Comparing a device's output with the numpy reference, and the inputs verification uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ops.spec import TensorType

TOLERANCES = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-13)}
"""(rtol, atol) by dtype for results that are not bit-exact."""


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_error: float
    detail: str = ""


def compare(expected: np.ndarray, actual: np.ndarray, exact: bool) -> Comparison:
    """Exact equality for exact ops and integers; dtype tolerances for floats. NaN matches NaN."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Comparison(
            False,
            float("inf"),
            f"got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}",
        )
    if actual.size == 0:
        return Comparison(True, 0.0)
    wide_expected, wide_actual = expected.astype(np.float64), actual.astype(np.float64)
    nan_expected, nan_actual = np.isnan(wide_expected), np.isnan(wide_actual)
    if not np.array_equal(nan_expected, nan_actual):
        return Comparison(False, float("inf"), "NaN in different places")
    finite = ~nan_expected
    with np.errstate(invalid="ignore"):  # inf - inf; equal entries are zeroed next
        diff = np.abs(wide_expected[finite] - wide_actual[finite])
    diff[wide_expected[finite] == wide_actual[finite]] = 0.0
    max_error = float(diff.max()) if diff.size else 0.0
    if exact or expected.dtype.kind in "iub":
        same = np.array_equal(expected[finite], actual[finite])
        return Comparison(same, max_error, "" if same else "not bit-exact")
    rtol, atol = TOLERANCES[str(expected.dtype)]
    close = bool(np.all(diff <= atol + rtol * np.abs(wide_expected[finite])))
    return Comparison(close, max_error, "" if close else f"beyond rtol={rtol} atol={atol}")


def random_input(tensor: TensorType, rng: np.random.Generator, ties: bool = False) -> np.ndarray:
    """Random data over the dtype's whole range for integers, N(0, 1) for floats.

    With `ties`, floats are rounded to quarters so maxima repeat (first-index rules get tested).
    """
    if tensor.dtype.startswith("float"):
        data = rng.standard_normal(tensor.shape)
        if ties:
            data = np.round(data * 4) / 4
        return np.asarray(data, dtype=tensor.dtype)
    info = np.iinfo(tensor.dtype)
    return np.asarray(rng.integers(info.min, info.max, size=tensor.shape, dtype=tensor.dtype, endpoint=True))
