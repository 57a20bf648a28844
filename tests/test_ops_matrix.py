"""Every op x dtype x case on each x86 target, built and run locally, compared with numpy."""

from __future__ import annotations

import pytest

from ops import all_ops
from toolchain.targets import get_target
from toolchain.verify import plan, verify_case

CASES = plan(all_ops())
TARGETS = ["x86", "x86-avx512"]


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("planned", CASES, ids=[f"{c.op.name}-{c.dtype}-{c.index}" for c in CASES])
def test_op_matches_reference(planned, target_name, local_session):
    target = get_target(target_name)
    missing = target.missing_cpu_flags()
    if missing:
        pytest.skip(f"host CPU lacks {', '.join(missing)}")
    result = verify_case(local_session, planned, target)
    assert result.ok, f"{result.case}: {result.detail} (max error {result.max_error})"
    assert result.schedule != "-"
