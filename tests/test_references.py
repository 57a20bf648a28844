"""The numpy references against naive loop twins, and output sizes as PyTorch has them (the edge
semantics through the compiler, NaN, ties, padding and wrap-around, run on every target in
tests/test_ops_matrix.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from tvm import te

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


WIDE = [
    Pool((3, 3), (1, 1), (2, 2), True, dilation=(2, 2)),
    Pool((4, 2), (3, 1), (1, 1), True, padding_end=(3, 0), dilation=(2, 3)),
]
"""Pools whose windows at (3, 4) span past both ends of the input: a dilated tap there reads the
window's first tap inside."""


@pytest.mark.parametrize("columns_first", [False, True])
@pytest.mark.parametrize(
    ("pool", "size"),
    [(p, s) for p in POOLS for s in [(5, 5), (8, 9)]] + [(p, (3, 4)) for p in WIDE],
    ids=str,
)
def test_pool_computation_matches_naive_loops(pool, size, columns_first):
    """The computation's taps (`Pool.windows`: clamped where some window crosses an end, a
    dilated one onto its window's first tap inside), in one pass or a column stage first, run
    plainly on the host."""
    x = np.random.default_rng(1).standard_normal((1, 2, *size)).astype("float32")
    data = te.placeholder(x.shape, "float32", name="x")
    out = te.compute(pool.output_shape("x", x.shape), pool.windows(data, columns_first=columns_first))
    built = tvm.compile(te.create_prim_func([data, out]), target="llvm")
    got = tvm.runtime.tensor(np.zeros([int(n) for n in out.shape], "float32"))
    built["main"](tvm.runtime.tensor(x), got)
    np.testing.assert_array_equal(got.numpy(), naive_max_pool(x, pool))


def test_pool_output_size_follows_pytorch():
    assert Pool((3, 3), (2, 2), (1, 1), False).out_size(0, 112) == 56
    assert Pool((3, 3), (2, 2), (0, 0), True).out_size(0, 6) == 3
    assert Pool((2, 2), (2, 2), (1, 1), True).out_size(0, 5) == 3  # a 4th window would start in padding
    assert Pool((3, 3), (3, 3), (1, 1), True).out_size(0, 5) == 2
