"""The deploy-cpu lowering: stride-2 vector loads become contiguous loads and a shuffle, and the
x86 max pooling kernels it produces are vector code."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ops import TensorType, bind, get_op
from toolchain.build.compile import compile_op
from toolchain.build.export import export
from toolchain.build.targets import get_target


def _load(extent: object, base: object, stride: int = 2):
    from tvm import tirx

    buffer = tirx.decl_buffer((extent,), "float32", name="a")
    return tirx.BufferLoad(buffer, [tirx.Ramp(base, stride, 8)])


@pytest.mark.parametrize(("offset", "first"), [(0, 0), (1, 1), (5, 1)])
def test_a_stride2_load_becomes_two_aligned_loads_and_a_shuffle(offset: int, first: int) -> None:
    import tvm.sym.analyzer
    from tvm import tirx

    from toolchain.build.shared_object import _stride2_to_shuffle

    i = tirx.Var("i", "int32")
    rewritten = _stride2_to_shuffle(_load(64, i * 16 + offset), tvm.sym.analyzer.Analyzer())
    assert isinstance(rewritten, tirx.Shuffle)
    n = tirx.Var("N", "int32")  # a symbolic batch of even planes: the length is even too
    rewritten = _stride2_to_shuffle(_load(n * 64, i * 16 + offset), tvm.sym.analyzer.Analyzer())
    assert isinstance(rewritten, tirx.Shuffle)
    assert [int(k) for k in rewritten.indices] == [first + 2 * lane for lane in range(8)]
    low, high = rewritten.vectors
    assert str(low.indices[0].stride) == "1" and str(high.indices[0].stride) == "1"


@pytest.mark.parametrize(
    "load",
    [
        lambda tirx: _load(63, tirx.Var("i", "int32") * 16),  # odd length: a pair could cross the end
        lambda tirx: _load(tirx.Var("N", "int32") * 63, tirx.Var("i", "int32") * 16),  # N odd planes
        lambda tirx: _load(64, tirx.Var("i", "int32") * 3),  # parity unknown
        lambda tirx: _load(64, tirx.Var("i", "int32") * 16, stride=3),
    ],
)
def test_loads_it_cannot_prove_safe_are_left_alone(load) -> None:
    import tvm.sym.analyzer
    from tvm import tirx

    from toolchain.build.shared_object import _stride2_to_shuffle

    original = load(tirx)
    assert _stride2_to_shuffle(original, tvm.sym.analyzer.Analyzer()).same_as(original)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils (objdump)")
@pytest.mark.parametrize("batch", [2, "N"])
def test_x86_max_pooling_is_vector_code(tmp_path: Path, batch: int | str) -> None:
    attrs = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), attrs, [TensorType((batch, 8, 32, 32), "float32")])
    manifest = export(compile_op(bound, get_target("x86")), tmp_path / "art")
    text = subprocess.run(["objdump", "-d", str(tmp_path / "art" / manifest.module)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert "vmaxps" in text, "the max is computed 8 lanes at a time"
    assert "vshufps" in text or "vpermps" in text, "stride-2 taps are deinterleaved with shuffles"
