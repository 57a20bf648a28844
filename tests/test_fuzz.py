"""Hypothesis fuzzing of every op: random attributes and shapes, compiled x86 vs numpy reference.

Shapes come from each input's declared rank range; inputs that broadcast are derived from the
output shape (dims kept or set to 1, leading dims dropped), so broadcasting is exercised both ways.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from deploy.base.errors import UsageError
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.ops import TensorType, all_ops, bind
from deploy.ops.layouts import LAYOUTS
from deploy.verify.compare import CHUNK, compare, random_input
from deploy.verify.run import verify

MAX_DIM = 9


def draw_attrs(data: st.DataObject, op: Any) -> dict[str, Any]:
    attrs = {}
    for attr in op.attrs:
        if data.draw(st.booleans(), label=f"{attr.name} default?"):
            continue
        options = attr.kind.strategy(st)
        if attr.optional:
            options = st.none() | options
        attrs[attr.name] = data.draw(options, label=attr.name)
    return attrs


def draw_shape(data: st.DataObject, spec: Any, attrs: dict[str, Any]) -> tuple[int, ...]:
    """Up to rank 4 (or the input's least rank: max_pool3d's 5); a tensor in a packed layout (an
    op's `layout` or `src` attribute) is four dims and the pack width."""
    packs = [LAYOUTS[attrs[k]].pack for k in ("layout", "src") if k in attrs and LAYOUTS[attrs[k]].packed]
    if packs and spec.max_rank >= 5:
        return (*data.draw(st.lists(st.integers(1, MAX_DIM), min_size=4, max_size=4)), packs[0])
    most = min(spec.max_rank, max(spec.min_rank, 4))
    rank = data.draw(st.integers(spec.min_rank, most), label=f"rank {spec.name}")
    return tuple(data.draw(st.lists(st.integers(1, MAX_DIM), min_size=rank, max_size=rank)))


def derive_broadcast(data: st.DataObject, spec: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    keep = data.draw(st.integers(max(spec.min_rank, 0), len(shape)), label=f"rank {spec.name}")
    tail = shape[len(shape) - keep :]
    return tuple(d if data.draw(st.booleans()) else 1 for d in tail)


def draw_shapes(data: st.DataObject, op: Any, attrs: dict[str, Any], dtype: str) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...] | None] = [
        None if spec.broadcasts else draw_shape(data, spec, attrs) for spec in op.inputs
    ]
    if all(s is None for s in shapes):
        out_shape = draw_shape(data, op.inputs[0], attrs)
    else:
        ones = [s if s is not None else () for s in shapes]
        out_shape = bind(op, attrs, [TensorType(s, dtype) for s in ones]).output.shape
    return [
        s if s is not None else derive_broadcast(data, spec, out_shape)
        for spec, s in zip(op.inputs, shapes, strict=True)
    ]


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_op_against_reference(op, data, local_session):
    dtype = data.draw(st.sampled_from(op.dtypes), label="dtype")
    attrs = draw_attrs(data, op)
    try:
        shapes = draw_shapes(data, op, attrs, dtype)
        bound = bind(op, attrs, [TensorType(s, dtype) for s in shapes])
    except UsageError:
        reject()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    ties = data.draw(st.booleans(), label="ties")
    specials = data.draw(st.booleans(), label="specials")
    inputs = [random_input(t, rng, ties=ties, specials=specials) for t in bound.inputs]
    comparison, _ = verify(local_session, bound, get_target("x86"), BuildOptions(), inputs)
    assert comparison.ok, f"{bound.key()}: {comparison.detail} (max error {comparison.max_error})"


def test_compare_is_exact_for_integers_and_tolerant_for_floats():
    a = np.array([1, 2, 3], dtype="int32")
    assert compare(a, a.copy(), exact=False).ok
    assert not compare(a, a + np.array([0, 0, 1], dtype="int32"), exact=False).ok
    f = np.array([1.0, np.nan, np.inf], dtype="float32")
    assert compare(f, f.copy(), exact=True).ok
    assert compare(f, f * np.float32(1 + 1e-7), exact=False).ok
    assert not compare(f, f * np.float32(1 + 1e-7), exact=True).ok
    assert not compare(f, np.array([1.0, 0.0, np.inf], dtype="float32"), exact=False).ok
    assert not compare(f, f.astype("float64"), exact=False).ok


@pytest.mark.parametrize(
    "expected,actual", [(np.inf, -1.0), (np.inf, -np.inf), (-np.inf, 3.0), (5.0, np.inf)]
)
def test_an_infinity_matches_only_itself_within_a_tolerance(expected, actual):
    """The tolerance of an expected infinity, atol + rtol * inf, would pass any value there; the
    detail names the infinities, not a tolerance."""
    f = np.array([1.0, expected], dtype="float32")
    comparison = compare(f, np.array([1.0, actual], dtype="float32"), exact=False)
    assert not comparison.ok and comparison.detail.startswith("infinities differ in place or sign: at [")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64"])
def test_random_input_plants_specials_at_seeded_positions(dtype):
    tensor = TensorType((32, 1000), dtype)
    plain = random_input(tensor, np.random.default_rng(5))
    planted = random_input(tensor, np.random.default_rng(5), specials=True)
    again = random_input(tensor, np.random.default_rng(5), specials=True)
    assert np.array_equal(planted, again, equal_nan=dtype.startswith("float"))
    copies = np.count_nonzero(planted == plain.max())
    assert copies >= 32000 // 64, "repeated maxima"
    if dtype.startswith("float"):
        assert np.isnan(planted).sum() == np.isposinf(planted).sum() == np.isneginf(planted).sum() == 16
        rows_with_nan = np.isnan(planted).any(axis=1).sum()
        assert 0 < rows_with_nan < 32, "some argmax rows see NaN, others only ties"
    assert np.count_nonzero(planted != plain) < 32000 // 20


def test_specials_in_the_smallest_tensors():
    scalar = random_input(TensorType((), "float32"), np.random.default_rng(0), specials=True)
    assert scalar.shape == () and np.isnan(scalar)
    few = random_input(TensorType((3,), "float64"), np.random.default_rng(0), specials=True)
    assert np.isnan(few).sum() == 1 and np.isinf(few).sum() == 2


BEYOND = "|got-want| 0.5 > bound 4.1e-05 (float32: 1e-05*|want| + 1e-06): at [1, 1] got 4.5, want 4.0"


@pytest.mark.parametrize(
    ("actual", "exact", "detail"),
    [
        ([[1.0, 2.0], [3.0, 4.5]], False, BEYOND),
        ([[1.0, 2.0], [3.25, 4.5]], False, BEYOND),
        ([[1.0, 2.5], [3.0, 4.5]], True, "not bit-exact: at [0, 1] got 2.5, want 2.0"),
        ([[1.0, 2.0], [np.nan, 4.0]], False, "NaN in different places: at [1, 0] got nan, want 3.0"),
    ],
)
def test_a_failure_names_the_element_and_both_values(actual, exact, detail):
    """Issue #36: the worst element beyond the tolerance (the first that differs otherwise) with
    its index in the output's shape, what the device gave and what numpy did."""
    want = np.array([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    assert compare(want, np.array(actual, dtype="float32"), exact=exact).detail == detail


def test_the_worst_element_is_named_across_chunks():
    """The worst element past the tolerance is found over the whole output, not in the first
    chunk compared (`CHUNK` elements at a time)."""
    want = np.ones(2 * CHUNK, dtype="float32")
    got = want.copy()
    got[5], got[CHUNK + 7] = 1.5, 3.0
    assert compare(want, got, exact=False).detail.endswith(f"at [{CHUNK + 7}] got 3.0, want 1.0")
