"""The numpy references against naive loop twins, and numpy edge semantics through the compiler:
NaN and ties in argmax, padding that never wins a max, integer wrap-around in add."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ops import TensorType, bind, get_op
from ops.pooling import Pool2d
from toolchain.targets import get_target
from toolchain.verify import verify


def naive_max_pool(x: np.ndarray, pool: Pool2d) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = pool.out_size(0, h), pool.out_size(1, w)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    for i, j, y, z in itertools.product(range(n), range(c), range(oh), range(ow)):
        taps = [
            x[i, j, yy, zz]
            for yy in range(
                y * pool.stride[0] - pool.padding[0], y * pool.stride[0] - pool.padding[0] + pool.kernel[0]
            )
            for zz in range(
                z * pool.stride[1] - pool.padding[1], z * pool.stride[1] - pool.padding[1] + pool.kernel[1]
            )
            if 0 <= yy < h and 0 <= zz < w
        ]
        out[i, j, y, z] = max(taps)
    return out


POOLS = [
    Pool2d((3, 3), (2, 2), (1, 1), False),
    Pool2d((3, 3), (2, 2), (1, 1), True),
    Pool2d((2, 3), (1, 2), (1, 0), True),
    Pool2d((4, 4), (3, 3), (2, 2), True),
    Pool2d((1, 1), (2, 2), (0, 0), False),
]


@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("size", [(5, 5), (7, 10), (8, 9)])
def test_pool_reference_matches_naive_loops(pool, size):
    x = np.random.default_rng(0).standard_normal((1, 2, *size)).astype("float32") - 10
    np.testing.assert_array_equal(pool.reference(x), naive_max_pool(x, pool))


def test_pool_output_size_follows_pytorch():
    assert Pool2d((3, 3), (2, 2), (1, 1), False).out_size(0, 112) == 56
    assert Pool2d((3, 3), (2, 2), (0, 0), True).out_size(0, 6) == 3
    assert Pool2d((2, 2), (2, 2), (1, 1), True).out_size(0, 5) == 3  # a 4th window would start in padding
    assert Pool2d((3, 3), (3, 3), (1, 1), True).out_size(0, 5) == 2


def compiled(op_name: str, attrs: dict, *arrays: np.ndarray, local_session) -> tuple:
    op = get_op(op_name)
    bound = bind(op, attrs, [TensorType(a.shape, str(a.dtype)) for a in arrays])
    return verify(local_session, bound, get_target("x86"), list(arrays))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_nan_and_ties_like_numpy(dtype, axis, local_session):
    x = np.array(
        [[1, 3, 3, np.nan], [np.nan, 2, np.nan, 2], [-np.inf, -np.inf, -np.inf, -np.inf]], dtype=dtype
    )
    comparison, _ = compiled("argmax", {"axis": axis}, x, local_session=local_session)
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64"])
def test_argmax_all_minimum_picks_first(dtype, local_session):
    x = np.full((3, 5), np.iinfo(dtype).min, dtype=dtype)
    comparison, _ = compiled("argmax", {"axis": 1}, x, local_session=local_session)
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "int32"])
def test_max_pool_padding_never_wins(dtype, local_session):
    low = np.iinfo(dtype).min if dtype != "float32" else -1e30
    x = np.full((1, 1, 5, 5), low, dtype=dtype)
    comparison, _ = compiled(
        "max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, x, local_session=local_session
    )
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_integer_add_wraps_like_numpy(dtype, local_session):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, 0], dtype=dtype)
    b = np.array([1, -1 if info.min < 0 else info.max, info.max, info.min], dtype=dtype)
    comparison, _ = compiled("add", {}, a, b, local_session=local_session)
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", ["max_pool2d", "maxpool_add"])
def test_max_pool_propagates_nan_like_numpy(op_name, dtype, local_session):
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(dtype)
    x[0, 0, 0, 0] = x[0, 1, 3, 4] = x[0, 1, 5, 5] = np.nan
    inputs = [x] if op_name == "max_pool2d" else [x, np.ones((1, 1, 1), dtype=dtype)]
    comparison, _ = compiled(
        op_name, {"kernel": 3, "stride": 2, "padding": 1}, *inputs, local_session=local_session
    )
    assert comparison.ok, comparison.detail


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint8", "int64"])
@pytest.mark.parametrize("extent", [32, 40, 50, 1000])
def test_wide_argmax_rows_like_numpy(dtype, extent, local_session):
    """Rows wide enough for the CPU's max-then-find form: lanes dividing the row or not, the max
    tied across lanes, NaN anywhere (first wins), rows all NaN or all minimum."""
    rng = np.random.default_rng(extent)
    floating = np.issubdtype(np.dtype(dtype), np.floating)
    x = rng.integers(0, 5, size=(8, extent)).astype(dtype)  # many ties of the max
    low = -np.inf if floating else np.iinfo(dtype).min
    x[1] = low
    if floating:
        x[2, [extent - 1, 7]] = np.nan
        x[3] = np.nan
        x[4, 17] = np.nan
        x[5, :] = -np.inf
        x[5, extent - 1] = np.inf
    for attrs in ({"axis": -1}, {"axis": 1, "keepdims": True, "out_dtype": "int32"}):
        comparison, _ = compiled("argmax", attrs, x, local_session=local_session)
        assert comparison.ok, f"{attrs}: {comparison.detail}"
