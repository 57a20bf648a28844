"""ONNX's own backend node tests (`onnx.backend.test.case.node`, from the installed onnx package,
no copies) for every op type deploy maps: each one-node model built and run on x86 against the
outputs ONNX expects, a sample of them on the other kinds of target. A case deploy cannot build
yet is listed in NOT_YET with the words of its one-line refusal: never a wrong answer, and the
list shrinks as capabilities land (#39)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from deploy.base.errors import UsageError
from deploy.compiler.cache import cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import get_target
from deploy.model import load_model
from deploy.ops.graph import bind_graph
from deploy.ops.onnx_mapping import domain_key
from deploy.ops.registry import all_ops
from deploy.verify.run import run_artifact
from tests.test_ops_matrix import sessions  # noqa: F401  (the module's target sessions)

with warnings.catch_warnings():  # the generators of other op types divide by zero on purpose
    warnings.simplefilter("ignore")
    from onnx.backend.test.case.node import collect_testcases

    ALL_CASES = collect_testcases(None)

MAPPED = {o.op_type for op in all_ops() for o in op.onnx if not domain_key(o.domain)}
"""The standard-domain op types the built-in ops implement."""
CASES = {
    case.name: case
    for case in ALL_CASES
    if all(node.op_type in MAPPED and not domain_key(node.domain) for node in case.model.graph.node)
}

NOT_YET: dict[str, str] = {}
"""Cases refused for now, and what their refusal says."""

SAMPLE = (
    "test_add_bcast",
    "test_argmax_keepdims_random",
    "test_leakyrelu",
    "test_maxpool_2d_ceil",
    "test_maxpool_with_argmax_2d_precomputed_strides",
    "test_maxpool_3d_dilations",
    "test_maxpool_2d_dilations",  # 1x1x4x4: wrong on arm while the dilated taps divided a descending index
)
"""The cases run on the other kinds of target too."""


def run_case(case: Any, on: Any, tmp_path: Path) -> None:
    """Build `case`'s model for `on`'s target, run it on each of its data sets and compare with
    ONNX's expected outputs: exact for exact graphs, else as ONNX's runner does (rtol 1e-3,
    atol 1e-7)."""
    path = tmp_path / f"{case.name}.onnx"
    onnx.save(case.model, path)
    graph = bind_graph(load_model(path))
    directory, manifest = cached_build(graph, on.target, for_device(BuildOptions(), on.session))
    for inputs, outputs in case.data_sets:
        results = run_artifact(on.session, directory, manifest, [np.asarray(i) for i in inputs])
        assert len(results) == len(outputs)
        for actual, expected in zip(results, outputs, strict=True):
            assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
            if graph.exact:
                np.testing.assert_array_equal(actual, expected)
            else:
                np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-7)


def test_the_cases_cover_every_mapped_op_type() -> None:
    assert {node.op_type for case in CASES.values() for node in case.model.graph.node} == MAPPED
    assert set(NOT_YET) <= set(CASES) and len(CASES) >= 46


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case_on_x86(name: str, tmp_path: Path, sessions) -> None:  # noqa: F811
    on = sessions.on(get_target("x86"))
    if name not in NOT_YET:
        run_case(CASES[name], on, tmp_path)
        return
    with pytest.raises(UsageError) as refused:
        run_case(CASES[name], on, tmp_path)
    assert NOT_YET[name] in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("target", "name"),
    [pytest.param("arm", name, marks=pytest.mark.emulator) for name in SAMPLE]
    + [("opencl", name) for name in SAMPLE],
)
def test_onnx_node_cases_on_other_targets(target: str, name: str, tmp_path: Path, sessions) -> None:  # noqa: F811
    run_case(CASES[name], sessions.on(get_target(target)), tmp_path)
