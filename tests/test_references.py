"""The numpy references against naive loop twins, and output sizes as PyTorch has them (the edge
semantics through the compiler, NaN, ties, padding and wrap-around, run on every target in
tests/test_ops_matrix.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from deploy.ops.library.pooling import Pool


def naive_max_pool(x: np.ndarray, pool: Pool) -> np.ndarray:
    """Every window's taps one by one: `kernel` of them `dilation` apart from the window's start,
    those inside the input."""
    n, c, h, w = x.shape
    oh, ow = pool.out_size(0, h), pool.out_size(1, w)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    (kh, kw), (dh, dw) = pool.kernel, pool.dilation
    for i, j, y, z in itertools.product(range(n), range(c), range(oh), range(ow)):
        top, left = y * pool.stride[0] - pool.padding[0], z * pool.stride[1] - pool.padding[1]
        taps = [
            x[i, j, top + a * dh, left + b * dw]
            for a in range(kh)
            for b in range(kw)
            if 0 <= top + a * dh < h and 0 <= left + b * dw < w
        ]
        out[i, j, y, z] = max(taps)
    return out


POOLS = [
    Pool((3, 3), (2, 2), (1, 1), False),
    Pool((3, 3), (2, 2), (1, 1), True),
    Pool((2, 3), (1, 2), (1, 0), True),
    Pool((4, 4), (3, 3), (2, 2), True),
    Pool((1, 1), (2, 2), (0, 0), False),
    Pool((3, 2), (2, 1), (2, 0), True, padding_end=(0, 1)),
    Pool((2, 3), (1, 2), (1, 1), False, dilation=(3, 2)),
    Pool((3, 3), (2, 2), (2, 1), True, padding_end=(1, 2), dilation=(2, 2)),
]


@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("size", [(5, 5), (7, 10), (8, 9)])
def test_pool_reference_matches_naive_loops(pool, size):
    x = np.random.default_rng(0).standard_normal((1, 2, *size)).astype("float32") - 10
    np.testing.assert_array_equal(pool.reference(x), naive_max_pool(x, pool))


def test_pool_output_size_follows_pytorch():
    assert Pool((3, 3), (2, 2), (1, 1), False).out_size(0, 112) == 56
    assert Pool((3, 3), (2, 2), (0, 0), True).out_size(0, 6) == 3
    assert Pool((2, 2), (2, 2), (1, 1), True).out_size(0, 5) == 3  # a 4th window would start in padding
    assert Pool((3, 3), (3, 3), (1, 1), True).out_size(0, 5) == 2
