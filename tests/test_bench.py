"""`deploy bench`: the floor and copy roofline timed beside each op, baselines, --json and --plot."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.base.errors import UsageError
from deploy.bench.torch_baseline import torch_version
from deploy.cli.bench import versus, warn_in_cache
from deploy.devices import get_device
from deploy.ops import TensorType
from tests.conftest import REPO, run_deploy

ADD_WRITTEN = 4 * 32 * 64 * 112 * 112
ADD_BYTES = 3 * ADD_WRITTEN
"""add's bench case in float32: a, b and the output 32x64x112x112 (past the last-level cache)."""
ARGMAX_BYTES = 4 * 256 * 100_000 + 8 * 256
"""argmax's bench case in float32: 256x100000 read, 256 int64 indices written."""


def test_bench_reports_the_floor_beside_each_op(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    done = run_deploy("bench", "--target", "x86", "--op", "add", "--op", "argmax", "--repeat", "3",
                      "--json", "--plot", str(plot), "--no-batch-1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["op"] for r in rows] == ["add", "argmax"]
    for row, moved in zip(rows, (ADD_BYTES, ARGMAX_BYTES), strict=True):
        assert row["read_gb_per_s"] > 0 and row["write_gb_per_s"] > 0 and row["roofline_gb_per_s"] > 0
        assert row["mb_moved"] * 1e6 == pytest.approx(moved)
        assert row["gb_per_s"] == pytest.approx(moved / 1e6 / row["median_ms"])
        assert 0.01 < row["gb_per_s"] < 1000, "a plausible speed (a ms/s slip would be 1000x off)"
        read = moved - (ADD_WRITTEN if row["op"] == "add" else 8 * 256)
        assert row["floor_ms"] == pytest.approx(
            max(read / row["read_gb_per_s"], (moved - read) / row["write_gb_per_s"]) / 1e6
        )
        # medians of per-round ratios: near the ratio of the medians, not equal to it; 3 rounds on a
        # loaded CI machine put them 1.6x apart, so this checks units (a ms/s slip is 1000x), not speed
        for ratio, of_medians in ((row["x_floor"], row["floor_ms"]), (row["x_roofline"], row["roofline_ms"])):
            assert 1 / 4 < ratio / (row["median_ms"] / of_medians) < 4
        assert row["numpy_ms"] > 0 and row["onnxruntime_ms"] > 0 and "torch_ms" in row
        assert row["max_error"] == 0, "checked against numpy on the timed inputs (both exact here)"
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert not (Path(os.environ["DEPLOY_CACHE_DIR"]) / "roofline.json").exists(), "nothing cached to go stale"


def test_each_op_is_timed_at_batch_1_beside_onnxruntime_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #36: a row at batch 1 (in cache, as an edge device calls an op) after each bench
    case, and baselines that do not allocate in the timed call: onnxruntime through IOBinding,
    PyTorch with out= where it has it (its column marks the ones without)."""
    from deploy.ops import get_op
    from deploy.ops.spec import Case
    from tests.conftest import invoke

    monkeypatch.setattr(get_op("add"), "bench", Case(((4, 8, 32), (4, 8, 32))))
    monkeypatch.setattr(get_op("max_pool2d"), "bench", Case(((3, 4, 16, 16),), {"kernel": 3, "stride": 2}))
    monkeypatch.setattr(get_op("argmax"), "bench", Case((("N", 64),), {"axis": -1}))
    done = invoke("bench", "--target", "x86", "--op", "add", "--op", "max_pool2d", "--op", "argmax",
                  "--repeat", "1", "--json")  # fmt: skip
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output)
    assert [(r["op"], r["shapes"], r["batch_1"]) for r in rows] == [
        ("add", "4x8x32 4x8x32", False),
        ("add", "1x8x32 1x8x32 (batch 1)", True),
        ("max_pool2d", "3x4x16x16 kernel=3 stride=2", False),
        ("max_pool2d", "1x4x16x16 kernel=3 stride=2 (batch 1)", True),
        ("argmax", "Nx64 axis=-1 (N=1)", False),  # a symbolic batch is timed at 1 already
        ("argmax", "Nx64 axis=-1 (N=32)", False),
    ]
    for row in rows:
        assert row["onnxruntime_ms"] > 0 and row["speedup_vs_onnxruntime"] == pytest.approx(
            row["onnxruntime_ms"] / row["median_ms"]
        )
        if torch_version() is not None:
            assert row["torch_ms"] > 0 and row["torch_preallocated"] == (row["op"] != "max_pool2d")
    table = invoke("bench", "--target", "x86", "--op", "max_pool2d", "--repeat", "1", "--no-batch-1")
    assert table.exit_code == 0 and "bandwidth beside each op" in table.output and "x floor" in table.output
    assert "(batch 1)" not in table.output and "ort ms" in table.output
    if torch_version() is not None:
        assert re.search(r"\d \*", table.output), "max_pool2d's torch time is marked: it allocates"


def test_ratios_are_per_round_so_drift_cancels() -> None:
    """A round where the device runs at half its bandwidth (a neighbour's job) times the op at half
    speed too: the per-round ratio stays, where a yardstick from another minute would be off 2x."""
    from deploy.bench.roofline import Beside, bandwidth_from

    total = 10**9
    fast = bandwidth_from(total, fill_ms=1.0, folds_ms=(1.0 + 1.0 / 16, 1.5), copy_ms=2.0)
    assert fast.read == pytest.approx(1000.0) and (fast.write, fast.copy) == (1000.0, 1000.0)
    slow = bandwidth_from(total, fill_ms=2.0, folds_ms=(2.0 + 2.0 / 16, 3.0), copy_ms=4.0)
    beside = Beside(runs=(3.0, 6.0, 3.0), bandwidths=(fast, slow, fast))
    assert beside.ms == 3.0
    assert beside.x_floor(3 * total, total) == pytest.approx(1.0), "3 ms against a 3 ms floor, every round"
    assert beside.x_copy(3 * total) == pytest.approx(1.0)
    assert beside.bandwidth.write == 1000.0


@pytest.mark.parametrize(
    ("folds_ms", "read"),
    [
        ((1.0 + 1.0 / 16, 2.0), 1000.0),  # many streams read fastest: the fold of 16, its writes off
        ((2.0, 0.8), 1250.0),  # a few streams read fastest (AMD Zen 3): the fold of 4, as timed
        ((0.9, 0.9), 1000 / (0.9 - 1 / 16)),  # as fast: the fold of 16's writes taken off
        ((0.1, 2.0), 10000.0),  # the fold of 16's writes would be over half its time: kept
        ((0.1, 0.08), 12500.0),  # kept so, and the fold of 4 faster still
    ],
)
def test_read_bandwidth_is_the_faster_folds(folds_ms: tuple[float, float], read: float) -> None:
    """The read bandwidth is the faster of the folds of 16 and 4 rows (`FOLDS`): a floor is a
    rate the device reaches, whichever number of streams it reads fastest from."""
    from deploy.bench.roofline import FOLDS, bandwidth_from

    assert FOLDS == (16, 4)
    assert bandwidth_from(10**9, fill_ms=1.0, folds_ms=folds_ms, copy_ms=2.0).read == pytest.approx(read)


def test_bad_bench_input_is_one_line(tmp_path: Path) -> None:
    zero = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "0")
    assert zero.returncode == 2 and zero.stderr.strip() == "error: --repeat 0: expected 1 to 1000"
    none = run_deploy("bench", "--target", "x86", "--op", "leaky_relu", "--dtype", "int8")
    assert none.returncode == 2 and "no op in the selection supports dtype int8" in none.stderr


def test_min_mb_grows_the_case_and_the_roofline() -> None:
    """A device whose cache holds a case (a GPU's L2, a server's 300 MB L3) times a grown one:
    --min-mb multiplies the leading dims, and the bandwidth kernels stream as many bytes.
    --no-baselines leaves numpy and PyTorch out (seconds a call at GB sizes)."""
    from deploy.bench.roofline import BYTES, roofline_bytes

    grown = run_deploy("bench", "--target", "x86", "--op", "argmax", "--min-mb", "150", "--no-baselines",
                       "--repeat", "1", "--json", "--no-batch-1")  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    (row,) = json.loads(grown.stdout)
    assert row["shapes"] == "512x100000 axis=-1", "256 rows times 2: 205 MB, past 150"
    assert row["mb_moved"] * 1e6 == pytest.approx(2 * ARGMAX_BYTES)
    assert row["yardstick_mb"] * 1e6 == roofline_bytes(False, 150_000_000), "the kernels stream 150 MB"
    assert row["numpy_ms"] is None and row["torch_ms"] is None and row["onnxruntime_ms"] is None
    assert roofline_bytes(False, 150_000_000) >= 150_000_000 > roofline_bytes(False) == BYTES
    assert roofline_bytes(True, 150_000_000) < BYTES, "an emulator streams little whatever is asked"


def test_a_case_grows_along_its_batch() -> None:
    from deploy.ops import get_op
    from deploy.ops.spec import Case

    add = get_op("add")
    case = Case(((32, 64, 8, 8), (1, 64, 8, 8)))
    assert case.batch_inputs(add) == (0,)
    assert case.batched(3, (0,)) == Case(((96, 64, 8, 8), (1, 64, 8, 8))), "a broadcast 1 stays"
    assert Case((("N", 4), ("N", 4))).batch_inputs(add) == (), "a symbolic batch stays"
    lower = Case(((2, 3, 4, 5), (5,)))
    assert lower.batch_inputs(add) == (0,), "a lower-rank operand stays"
    both = Case(((8, 8), (8, 8)))
    assert both.batch_inputs(add) == (0, 1) and both.single((0, 1)) == Case(((1, 8), (1, 8)))


DEPTHWISE = """
from tvm import te

from deploy.base.errors import UsageError
from deploy.ops import Case, Input, Op, TensorType, register


@register
class Depthwise(Op):
    \"\"\"3x3 depthwise convolution, stride 1, no padding.\"\"\"

    name = "dw3x3"
    inputs = (Input("x", 4, 4), Input("w", 4, 4))
    dtypes = ("float32",)
    cases = (Case(((4, 32, 16, 16), (32, 1, 3, 3))),)

    def infer(self, attrs, inputs):
        x, w = inputs
        if list(w.shape) != [x.shape[1], 1, 3, 3]:
            raise UsageError(f"w {w}: expected [{x.shape[1]}, 1, 3, 3]")
        return TensorType((x.shape[0], x.shape[1], x.shape[2] - 2, x.shape[3] - 2), x.dtype)

    def compute(self, attrs, out, x, w):
        i, j = te.reduce_axis((0, 3), "i"), te.reduce_axis((0, 3), "j")
        taps = lambda n, c, h, v: te.sum(x[n, c, h + i, v + j] * w[c, 0, i, j], axis=[i, j])  # noqa: E731
        return te.compute(out.shape, taps, name="out")

    def reference(self, attrs, x, w):
        import numpy as np

        out = np.zeros((x.shape[0], x.shape[1], x.shape[2] - 2, x.shape[3] - 2), x.dtype)
        for i in range(3):
            for j in range(3):
                out += x[:, :, i : i + out.shape[2], j : j + out.shape[3]] * w[None, :, 0, i, j, None, None]
        return out
"""


def test_the_batch_1_row_shrinks_the_data_not_a_weight(tmp_path: Path, own_registry: None) -> None:
    """Issue #51: the batch-1 row shrank every input of the highest rank, a weight [32, 1, 3, 3]
    to [1, 1, 3, 3], and the bench aborted; and --min-mb grew the weight likewise."""
    from deploy.bench.bench import BenchOptions, plan_rows
    from deploy.ops import get_op, load_ops_path

    (tmp_path / "dw.py").write_text(DEPTHWISE)
    load_ops_path(tmp_path)
    op = get_op("dw3x3")
    rows = plan_rows(op, "float32", BenchOptions(min_bytes=400_000), emulated=False)
    assert [(label, single) for _, label, _, single in rows] == [
        ("8x32x16x16 32x1x3x3", False),
        ("1x32x16x16 32x1x3x3 (batch 1)", True),
    ]


def test_a_grown_case_moves_at_least_what_was_asked() -> None:
    """Bytes that do not grow (a broadcast operand) are counted: the case reaches the size; one
    with nothing to grow is refused before any device is touched."""
    from deploy.bench.bench import moved_bytes, sized_case
    from deploy.ops.library.add import Add
    from deploy.ops.spec import Case

    class Broadcast(Add):
        bench = Case(((4, 64, 32, 32), (1, 64, 32, 32)))

    class Unbatched(Add):
        bench = Case(((1, 64, 32, 32), (1, 64, 32, 32)))

    case, bound = sized_case(Broadcast(), "float32", 10**7, emulated=False)
    assert case.shapes[1] == (1, 64, 32, 32) and moved_bytes(bound) >= 10**7
    assert sized_case(Unbatched(), "float32", 1000, emulated=False)[0] == Unbatched.bench, "already past"
    with pytest.raises(UsageError, match=r"--min-mb 10: add's bench case 1x64x32x32 1x64x32x32 has no batch"):
        sized_case(Unbatched(), "float32", 10**7, emulated=False)


def test_a_bench_that_computes_a_wrong_answer_reports_no_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The timed artifact's first call is checked against numpy: a wrong answer is a failed check
    (exit 1), not a time; the other rows are still measured and shown, the wrong one says so."""
    from deploy.ops import get_op
    from deploy.ops.spec import Case
    from tests.conftest import invoke

    add, leaky = get_op("add"), get_op("leaky_relu")
    monkeypatch.setattr(add, "reference", lambda attrs, a, b: a - b)
    monkeypatch.setattr(add, "bench", Case(((2, 8), (2, 8))))
    monkeypatch.setattr(leaky, "bench", Case(((2, 8),), {"alpha": 0.1}))
    plot = tmp_path / "bench.png"
    table = invoke("bench", "--target", "x86", "--op", "add", "--op", "leaky_relu", "--repeat", "1",
                   "--no-baselines", "--no-batch-1", "--plot", str(plot))  # fmt: skip
    assert table.exit_code == 1, table.output
    assert "wrong answer" in table.output and "leaky_relu" in table.output, "the table, then the error"
    last = table.output.strip().splitlines()[-1]
    assert (
        last.startswith("error: 1 of 2 rows gave a wrong answer, no time; first: ")
        and "of add differs" in last
    )
    assert plot.read_bytes()[:4] == b"\x89PNG", "the right rows are plotted"
    done = invoke("bench", "--target", "x86", "--op", "add", "--op", "leaky_relu", "--repeat", "1",
                  "--no-baselines", "--no-batch-1", "--json")  # fmt: skip
    assert done.exit_code == 1
    wrong, right = json.loads(done.output[: done.output.rindex("\n]") + 2])  # the error line follows
    assert "build of add differs from numpy" in wrong["wrong_answer"]
    assert wrong["median_ms"] is None and wrong["x_floor"] is None and wrong["mb_moved"] == 3 * 64 / 1e6
    assert right["wrong_answer"] is None and right["median_ms"] > 0 and right["max_error"] == 0
    assert right.keys() == wrong.keys(), "one schema for every row"

    model = tmp_path / "tiny.yaml"
    model.write_text(
        "inputs: {a: {shape: [2, 8]}, b: {shape: [2, 8]}}\n"
        "nodes: [{name: s, op: add, inputs: [a, b]}]\n"
        "output: s\n"
    )
    graph = invoke("bench", "--target", "x86", "--model", str(model), "--repeat", "1")
    assert graph.exit_code == 1, graph.output
    assert "build of tiny differs from numpy" in graph.output


def test_a_plot_that_cannot_be_written_loses_only_the_plot(tmp_path: Path) -> None:
    """The table is printed before the plot is written: an immutable `--plot` file ended the
    bench with a PermissionError line and no figures at all."""
    import shutil
    import subprocess

    model = tmp_path / "tiny.yaml"
    model.write_text(
        "inputs: {x: {shape: [64, 64]}}\nnodes: [{name: r, op: leaky_relu, inputs: [x]}]\noutput: r\n"
    )
    plot = tmp_path / "ro.png"
    plot.write_bytes(b"the user's")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(plot)]).returncode != 0:
        pytest.skip("needs chattr +i (root, a file system with attributes)")
    try:
        argv = ["bench", "--target", "x86", "--model", str(model), "--repeat", "1", "--plot", str(plot)]
        done = run_deploy(*argv, env={"COLUMNS": "250"})
    finally:
        subprocess.run(["chattr", "-i", str(plot)], check=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "deploy bench --target x86 on local" in done.stdout and "tiny" in done.stdout
    assert done.stderr == f"error: --plot {plot}: cannot write it: Operation not permitted\n"
    assert plot.read_bytes() == b"the user's" and sorted(p.name for p in tmp_path.iterdir()) == [
        "ro.png",
        "tiny.yaml",
    ]


def test_a_plot_that_is_a_link_stays_a_link(tmp_path: Path) -> None:
    """As `run -o`: the file the link names is replaced, the link stays."""
    model = tmp_path / "tiny.yaml"
    model.write_text(
        "inputs: {x: {shape: [64, 64]}}\nnodes: [{name: r, op: leaky_relu, inputs: [x]}]\noutput: r\n"
    )
    real, link = tmp_path / "real.png", tmp_path / "link.png"
    real.write_bytes(b"old")
    link.symlink_to(real)
    done = run_deploy("bench", "--target", "x86", "--model", str(model), "--repeat", "1", "--plot", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and real.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("speedup", "said"), [(2.0, "2.0x faster"), (0.2, "5.0x slower"), (1.0, "1.0x faster"), (None, "-")]
)
def test_ratios_say_faster_or_slower(speedup, said):
    """Issue #36: 'vs numpy 0.2x' was read as faster; it meant five times slower."""
    assert versus(speedup) == said


def test_bench_shows_progress_on_a_terminal_and_warns_of_the_cache(capsys: pytest.CaptureFixture[str]):
    """Issue #36: `deploy bench` printed nothing for 10-14 s on a terminal; now a line on stderr
    names the row being built and timed (nothing where stderr is not a terminal: the other tests
    read it). An op without `bench` is timed on its first case, a few KB that a cache holds: deploy
    says so (not of its batch-1 row, in cache on purpose, and not for ops that declare one)."""
    import pty
    import subprocess
    import threading

    from tests.conftest import DEPLOY

    examples = str(Path(__file__).resolve().parent.parent / "deploy" / "ops" / "examples")
    argv = [DEPLOY, "--ops-path", examples, "bench", "--target", "x86", "--op", "hard_tanh",
            "--repeat", "1", "--no-baselines"]  # fmt: skip
    terminal, stderr = pty.openpty()
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # EIO: the other end closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        ran = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=600,
                             env={**os.environ, "TERM": "xterm", "COLUMNS": "200"})  # fmt: skip
    finally:
        os.close(stderr)
        reader.join(timeout=10)
        os.close(terminal)
    text = shown.decode(errors="replace")
    assert ran.returncode == 0, text
    assert "bench: building, checking and timing hard_tanh 2x16x28x28" in text, text
    warned = [line for line in text.splitlines() if "warning: " in line]
    assert len(warned) == 1 and "hard_tanh declares no bench case" in warned[0], text
    assert "(batch 1)" in ran.stdout and "bench: building" not in ran.stdout
    from deploy.ops import get_op

    warn_in_cache([{"op": "add", "mb_moved": 0.1, "batch_1": False}], {"add": get_op("add")})  # it has one
    assert capsys.readouterr().err == ""


GELU = '''
import math

import numpy as np
from tvm import te

from deploy.ops import Case, Input, Op, register
from deploy.ops.onnx_mapping import OnnxNode


@register
class Gelu(Op):
    """x * (1 + erf(x / sqrt 2)) / 2, a custom op ONNX has as Gelu (opset 20)."""

    name = "my_gelu"
    inputs = (Input("x"),)
    dtypes = ("float32",)
    cases = (Case(((4, 64),)),)

    def infer(self, attrs, inputs):
        return inputs[0]

    def compute(self, attrs, out, x):
        return te.compute(out.shape, lambda *i: x[i] * (1 + te.erf(x[i] * 0.70710678)) * 0.5, name="out")

    def reference(self, attrs, x):
        return (x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))) / 2).astype(x.dtype)

    def numpy_baseline(self, attrs, x):
        return None  # numpy has no erf: np.vectorize is no fair baseline

    def onnx_baseline(self, attrs, inputs):
        return OnnxNode("Gelu", {}, opset=20)
'''


def test_an_op_names_its_own_baselines(tmp_path: Path, own_registry: None) -> None:
    """Issue #51: the onnxruntime column needed an import mapping and had opset 17 (no Gelu) and
    no shapes (no grouped Conv); the numpy column timed a reference written for correctness
    (GELU through np.vectorize printed "16.9x faster than numpy"). An op names its onnxruntime
    node (opset, attributes from the shapes) and its numpy baseline, or n/a."""
    from deploy.ops import get_op, load_ops_path
    from deploy.ops.onnx_mapping import OnnxNode
    from tests.conftest import invoke

    (tmp_path / "gelu.py").write_text(GELU)
    dw = DEPTHWISE
    dw += (  # its onnxruntime node: a Conv whose group is the input's channels
        "\n    def onnx_baseline(self, attrs, inputs):\n"
        "        from deploy.ops.onnx_mapping import OnnxNode\n\n"
        "        return OnnxNode('Conv', {'group': inputs[0].shape[1], 'kernel_shape': [3, 3]})\n"
    )
    (tmp_path / "dw.py").write_text(dw)
    load_ops_path(tmp_path)
    assert get_op("dw3x3").onnx_baseline({}, [TensorType((1, 32, 8, 8), "float32")] * 2) == OnnxNode(
        "Conv", {"group": 32, "kernel_shape": [3, 3]}
    )
    done = invoke("bench", "--target", "x86", "--op", "my_gelu", "--op", "dw3x3", "--repeat", "1",
                  "--json", "--no-batch-1")  # fmt: skip
    assert done.exit_code == 0, done.output
    gelu, dw_row = json.loads(done.stdout)
    assert gelu["onnxruntime_ms"] > 0, "Gelu at opset 20"
    assert gelu["numpy_na"] and gelu["numpy_ms"] is None and gelu["speedup_vs_numpy"] is None
    assert dw_row["onnxruntime_ms"] > 0, "a grouped Conv, its group read from the shapes"
    assert not dw_row["numpy_na"] and dw_row["numpy_ms"] > 0
    table = invoke("bench", "--target", "x86", "--op", "my_gelu", "--repeat", "1", "--no-batch-1")
    assert table.exit_code == 0 and "n/a" in table.output


def bench_harness(monkeypatch: pytest.MonkeyPatch) -> Any:
    """bench/harness.py, as the scripts beside it import it."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("harness")


def test_an_avx2_host_is_refused_for_another_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = bench_harness(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        harness.avx2_host(argparse.ArgumentParser(prog="fast_by_default.py"), "x86-avx512")
    assert stopped.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith("error: --avx2-host with --target x86-avx512: expected --target x86 (AVX2 builds)")


NOT_ON_HOST = get_device("local").missing_cpu_flags(("avx512f", "cpuid_fault"))


@pytest.mark.skipif("avx512f" in NOT_ON_HOST, reason="this host has no AVX-512 to hide")
@pytest.mark.skipif("cpuid_fault" in NOT_ON_HOST, reason="this host offers no CPUID faulting")
def test_an_avx2_host_hides_avx512_from_cpuid_and_keeps_other_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes a bench script starts with --avx2-host see no AVX-512 in CPUID, whatever
    SIGSEGV handler a library sets after (TVM's), and a real fault still ends the process there."""
    monkeypatch.setenv("LD_PRELOAD", "")
    bench_harness(monkeypatch).avx2_host(argparse.ArgumentParser(), "x86")
    probe = (
        "import numpy, tvm\n"
        "print(numpy._core._multiarray_umath.__cpu_features__['AVX512F'])\n"
        "import onnxruntime, ctypes\n"
        "ctypes.string_at(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ))
    assert done.stdout.split() == ["False"]
    assert done.returncode == -signal.SIGSEGV, done.stderr
    assert "Segfault encountered" in done.stderr  # TVM's handler got the real fault


@pytest.mark.parametrize(
    ("bundle", "tvm", "behind"),
    [
        ([1.0, 1.1, 0.9, 1.2, 1.0], [1.0] * 5, False),  # noise around level
        ([1.0, 1.0, 1.0, 3.0, 1.0], [1.0] * 5, False),  # one slow round: a neighbour's job
        ([1.0, 1.0, 1.0, 3.0, 3.0], [1.0] * 5, False),  # two of five
        ([1.0, 3.0, 3.0], [1.0] * 3, True),  # two of three
        ([1.2, 1.3, 1.2, 1.25, 1.0], [1.0] * 5, True),  # behind in three rounds of four
        ([2.4, 2.6, 2.4, 2.5, 2.0], [2.0] * 5, True),  # the same at another speed
        ([1.2, 2.6, 1.2, 2.5, 1.0], [1.0, 2.0, 1.0, 2.0, 1.0], True),  # drift between rounds cancels
        ([1.05, 1.05, 1.05], [1.0] * 3, False),  # at the limit is not beyond it
    ],
)
def test_the_bundle_falls_behind_only_beyond_the_noise(
    monkeypatch: pytest.MonkeyPatch, bundle: list[float], tvm: list[float], behind: bool
) -> None:
    """`bundle_latency.py --fail-above 1.05`'s verdict: the first quartile of the per-round
    ratios above the limit."""
    assert (bench_harness(monkeypatch).round_ratio(bundle, tvm) > 1.05) == behind


BUNDLE_LATENCY = [sys.executable, str(REPO / "bench" / "bundle_latency.py")]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--fail-above", "0"], "--fail-above 0: expected a ratio above 0, such as 1.05"),
        (["--fail-above", "nan"], "--fail-above nan: expected a ratio above 0, such as 1.05"),
        (["--fail-above", "inf"], "--fail-above inf: expected a ratio above 0, such as 1.05"),
        (
            ["--fail-above", "1.05", "--rounds", "2"],
            "--fail-above with --rounds 2: expected 3 rounds at least (one slow round would decide)",
        ),
        (["--only", "conv2d"], "--only conv2d: no workload's label holds it (add 1x64x56x56, "),
    ],
)
def test_bundle_latency_refuses_a_check_it_cannot_make(args: list[str], said: str) -> None:
    """Refused before any build, one line, exit 2: a check that could never fail (inf), one
    slow round deciding (fewer than 3 rounds), or no workload to check."""
    refused = subprocess.run([*BUNDLE_LATENCY, *args], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert f"error: {said}" in refused.stderr.strip().splitlines()[-1]


def test_bundle_latency_fails_naming_each_row_behind() -> None:
    """With a limit no real run meets, the check exits 1 naming the row, after the table (the
    row shows its first quartile and `behind`)."""
    check = ["--only", "argmax", "--threads", "1", "--rounds", "3", "--fail-above", "0.01"]
    done = subprocess.run([*BUNDLE_LATENCY, *check], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert re.search(r"^argmax axis=1 1x1000x7x7 +1 .* \d+\.\d\d behind$", done.stdout, re.MULTILINE), (
        done.stdout
    )
    said = done.stderr.strip()
    assert "\n" not in said
    assert said.startswith("error: the bundle is behind TVM's runtime by more than 0.01"), said
    assert re.search(r"on 1 row: argmax axis=1 1x1000x7x7 at 1 thread \(\d+\.\d\d\)$", said), said
