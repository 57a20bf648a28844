"""The rule a float result is compared by (`deploy/ops/tolerance.py`): derived from the sums a
computation makes or declared by the op, the same for `deploy test`, `tune` and `bench`, and a
failure that names the rule and its bound (issue #51, item 3)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from deploy.base.errors import UsageError
from deploy.compiler.cache import cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.ops import TensorType, bind, get_op, load_ops_path
from deploy.ops.tolerance import DTYPE, Rule, Tolerance, combined, op_rule, summed_per_term
from deploy.verify.compare import bound_for, compare
from deploy.verify.run import against_reference, run_artifact, verify

MATMUL = '''
import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, Tolerance, register


@register
class MatMul(Op):
    """a @ b{what}."""

    name = "{name}"
    inputs = (Input("a", 2, 2), Input("b", 2, 2))
    dtypes = ("float32",)
    cases = (Case(((16, 768), (768, 32))),)
    {tolerance}

    def infer(self, attrs, inputs):
        a, b = inputs
        return TensorType((a.shape[0], b.shape[1]), a.dtype)

    def compute(self, attrs, out, a, b):
        k = te.reduce_axis((0, a.shape[1]), name="k")
        s = te.compute(out.shape, lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="s")
        return te.compute(out.shape, lambda i, j: s[i, j] + tirx.const({off}, "float32"), name="out")

    def reference(self, attrs, a, b):
        return a @ b
'''


def _op_file(folder: Path, name: str, off: float = 0.0, tolerance: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    what = f", off by {off}" if off else ""
    (folder / f"{name}.py").write_text(MATMUL.format(name=name, off=off, tolerance=tolerance, what=what))
    return folder


def _bound(name: str, k: int, n: int = 32, m: int = 16):
    return bind(get_op(name), {}, [TensorType((m, k), "float32"), TensorType((k, n), "float32")])


def _inputs(bound, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype("float32") for t in bound.inputs]


def test_a_sum_gets_the_summation_bound_derived_from_its_computation(tmp_path, own_registry):
    load_ops_path(_op_file(tmp_path / "ops", "dot"))
    rule = _bound("dot", 768).rule()
    assert rule == Rule(False, None, summed_per_term(768), "sum of 768 terms")
    assert summed_per_term(768) == math.ceil(math.log2(768)) + 1 == 11
    assert (
        get_op("add").comparison_rule(bind(get_op("add"), {}, [TensorType((4,), "float32")] * 2)).per_term
        == 0
    )
    assert bind(get_op("argmax"), {}, [TensorType((4, 5), "float32")]).rule().exact


def test_a_dot_of_768_terms_passes_on_x86(tmp_path, own_registry, local_session):
    """A float32 dot of 768 terms in the generic schedule's order differs from numpy's by up to
    ~1e-4 (the old rtol 1e-5 / atol 1e-6 failed it); the summation bound passes it."""
    from deploy.compiler.targets import get_target

    load_ops_path(_op_file(tmp_path / "ops", "dot768"))
    bound = _bound("dot768", 768, 128, 128)
    inputs = _inputs(bound)
    target = get_target("x86")
    comparison, _ = verify(local_session, bound, target, BuildOptions(), inputs)
    assert comparison.ok, comparison.detail
    directory, manifest = cached_build(bound, target, for_device(BuildOptions(), local_session))
    (ours,) = run_artifact(local_session, directory, manifest, inputs)
    assert not compare(bound.reference(*inputs), ours, exact=False, rule=DTYPE).ok, "the dtype's alone fails"
    wide = [a.astype("float64") for a in inputs]
    magnitude = np.abs(wide[0]) @ np.abs(wide[1])
    numpy32 = bound.reference(*inputs)  # numpy's own float32 matmul against float64 passes too
    assert compare((wide[0] @ wide[1]).astype("float32"), numpy32, False, bound.rule(), magnitude).ok


def test_an_off_by_1e3_kernel_still_fails_naming_the_rule(tmp_path, own_registry, local_session):
    from deploy.compiler.targets import get_target

    load_ops_path(_op_file(tmp_path / "ops", "wrong_dot", off=1e-3))
    bound = _bound("wrong_dot", 768)
    comparison, _ = verify(local_session, bound, get_target("x86"), BuildOptions(), _inputs(bound))
    assert not comparison.ok
    assert "> bound" in comparison.detail
    assert "(float32 sum of 768 terms: 11*eps*sum|terms| + 1e-05*|want| + 1e-06)" in comparison.detail


def test_a_declared_tolerance_replaces_the_derived_one(tmp_path, own_registry):
    load_ops_path(_op_file(tmp_path / "ops", "loose", tolerance="tolerance = Tolerance(ulps=4, per_term=2)"))
    bound = _bound("loose", 64)
    rule = bound.rule()
    assert (rule.ulps, rule.per_term, rule.dtype_rtol) == (4, 2.0, False)
    assert "loose's tolerance ulps=4 per_term=2" in bound_for(np.dtype("float32"), rule).text
    inputs = _inputs(bound)
    wrong = bound.reference(*inputs) + np.float32(1.0)
    assert not against_reference(bound, inputs, [wrong]).ok


@pytest.mark.parametrize(
    ("tolerance", "said"),
    [
        ("Tolerance(ulps=-1)", "tolerance ulps=-1: expected a finite number of eps, >= 0"),
        ("Tolerance(per_term=float('nan'))", "tolerance per_term=nan: expected a finite number of eps, >= 0"),
        ("Tolerance(per_term='2')", "tolerance per_term='2': expected a number of eps, >= 0"),
        ("1e-3", "tolerance 0.001: expected Tolerance(ulps=..., per_term=...) from deploy.ops or None"),
    ],
)
def test_a_bad_tolerance_is_refused_when_the_op_registers(tmp_path, own_registry, tolerance, said):
    folder = _op_file(tmp_path / "ops", "bad_tol", tolerance=f"tolerance = {tolerance}")
    with pytest.raises(UsageError) as raised:
        load_ops_path(folder)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("op bad_tol (") and message.endswith(said), message


def test_rules_combine_to_the_loosest_and_exact_stays_exact():
    declared = op_rule("a", False, Tolerance(ulps=200), 0)
    summed = op_rule("b", False, None, 256)
    both = combined([declared, summed, op_rule("c", True, None, 0)])
    assert (both.ulps, both.per_term, both.dtype_rtol, both.exact) == (200, 9.0, True, False)
    assert combined([op_rule("c", True, None, 0)] * 2).exact
    ints = np.array([1, 2], dtype="int32")
    assert not compare(ints, ints + 1, exact=False, rule=summed, magnitude=np.array([1e9, 1e9])).ok


def test_the_magnitude_scales_the_bound_per_element():
    want = np.array([0.0, 0.0], dtype="float32")
    got = np.array([1e-4, 1e-4], dtype="float32")
    rule = op_rule("dot", False, None, 8)
    comparison = compare(want, got, exact=False, rule=rule, magnitude=np.array([1000.0, 1.0]))
    assert not comparison.ok and "at [1]" in comparison.detail, "only the element of small terms fails"
    nan_magnitude = compare(want, got, exact=False, rule=rule, magnitude=np.array([np.nan, np.nan]))
    assert not nan_magnitude.ok, "a NaN magnitude adds nothing: it never hides an error"


@pytest.mark.emulator
def test_a_dot_of_256_terms_passes_on_arm(tmp_path, own_registry):
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device

    load_ops_path(_op_file(tmp_path / "ops", "dot256"))
    bound = _bound("dot256", 256, 16)
    with get_device("emulator").open() as session:
        comparison, _ = verify(session, bound, get_target("arm"), BuildOptions(), _inputs(bound))
    assert comparison.ok, comparison.detail
