"""`deploy bench`: the floor and copy roofline (measured once, then cached), baselines, --json and --plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from base.errors import UsageError
from tests.conftest import run_deploy

ADD_WRITTEN = 4 * 32 * 64 * 112 * 112
ADD_BYTES = 3 * ADD_WRITTEN
"""add's bench case in float32: a, b and the output 32x64x112x112 (past the last-level cache)."""
ARGMAX_BYTES = 4 * 256 * 100_000 + 8 * 256
"""argmax's bench case in float32: 256x100000 read, 256 int64 indices written."""


def test_bench_reports_the_roofline_and_baselines(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    first = run_deploy("bench", "--target", "x86", "--op", "add", "--op", "argmax", "--repeat", "1",
                       "--json", "--plot", str(plot))  # fmt: skip
    assert first.returncode == 0, first.stderr
    rows = json.loads(first.stdout)
    assert [r["op"] for r in rows] == ["add", "argmax"]
    measured = rows[0]["roofline_gb_per_s"]
    assert measured > 0 and rows[1]["roofline_gb_per_s"] == measured, "one bandwidth measurement per run"
    for row in rows:
        assert row["read_gb_per_s"] > 0 and row["write_gb_per_s"] > 0
        assert row["x_floor"] == pytest.approx(row["median_ms"] / row["floor_ms"])
    for row, moved in zip(rows, (ADD_BYTES, ARGMAX_BYTES), strict=True):
        assert row["mb_moved"] * 1e6 == pytest.approx(moved)
        assert row["gb_per_s"] == pytest.approx(moved / 1e6 / row["median_ms"])
        assert 0.01 < row["gb_per_s"] < 1000, "a plausible speed (a ms/s slip would be 1000x off)"
        assert row["numpy_ms"] > 0 and "torch_ms" in row and "speedup_vs_torch" in row
    assert plot.read_bytes()[:4] == b"\x89PNG"
    cache_file = Path(os.environ["DEPLOY_CACHE_DIR"]) / "roofline.json"
    cache = json.loads(cache_file.read_text())
    assert cache["x86@local"]["copy_gb_per_s"] == measured

    # no device runs at these speeds here: only the cache says so
    cache["x86@local"].update(read_gb_per_s=4.0, write_gb_per_s=1.0, copy_gb_per_s=2.0)
    cache_file.write_text(json.dumps(cache))
    again = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "1", "--json")
    (row,) = json.loads(again.stdout)
    assert row["roofline_gb_per_s"] == 2.0, "the cached bandwidth is used"
    assert row["roofline_ms"] == pytest.approx(ADD_BYTES / 2e9 * 1e3)
    assert row["floor_ms"] == pytest.approx(((ADD_BYTES - ADD_WRITTEN) / 4e9 + ADD_WRITTEN / 1e9) * 1e3)
    assert row["x_roofline"] == pytest.approx(row["median_ms"] / row["roofline_ms"])

    cache["x86@local"] = {"gb_per_s": 2.0}  # an older deploy's entry: copy only
    cache_file.write_text(json.dumps(cache))
    table = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "1")
    assert "copy roofline" in table.stdout and "x floor" in table.stdout
    assert json.loads(cache_file.read_text())["x86@local"]["read_gb_per_s"] > 0, "measured again"
    table = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "1", "--fresh-roofline")
    fresh = json.loads(cache_file.read_text())["x86@local"]["copy_gb_per_s"]
    assert table.returncode == 0 and fresh > 0 and fresh != 2.0, "--fresh-roofline measures again"


def test_bad_bench_input_is_one_line(tmp_path: Path) -> None:
    zero = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "0")
    assert zero.returncode == 2 and zero.stderr.strip() == "error: --repeat 0: expected at least 1"
    none = run_deploy("bench", "--target", "x86", "--op", "leaky_relu", "--dtype", "int8")
    assert none.returncode == 2 and "no op in the selection supports dtype int8" in none.stderr


def test_min_mb_grows_the_case_and_the_roofline(tmp_path: Path) -> None:
    """A device whose cache holds a case (a GPU's L2, a server's 300 MB L3) times a grown one:
    --min-mb multiplies the leading dims, and a roofline measured over fewer bytes is measured
    again over as many. --no-baselines leaves numpy and PyTorch out (seconds a call at GB sizes)."""
    from toolchain.bench.roofline import roofline_bytes

    env = {"DEPLOY_CACHE_DIR": str(tmp_path)}
    cache_file = tmp_path / "roofline.json"
    entry = {"read_gb_per_s": 4.0, "write_gb_per_s": 1.0, "copy_gb_per_s": 2.0, "bytes": 300_000_000}
    cache_file.write_text(json.dumps({"x86@local": entry}))  # only the cache runs at these speeds
    grown = run_deploy("bench", "--target", "x86", "--op", "argmax", "--min-mb", "250", "--no-baselines",
                       "--repeat", "1", "--json", env=env)  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    (row,) = json.loads(grown.stdout)
    assert row["shapes"] == "768x100000 axis=-1", "256 rows times 3: 307 MB, past 250"
    assert row["mb_moved"] * 1e6 == pytest.approx(3 * ARGMAX_BYTES)
    assert row["roofline_gb_per_s"] == 2.0, "an entry over 300 MB serves a 250 MB bench"
    assert row["numpy_ms"] is None and row["torch_ms"] is None and row["speedup_vs_numpy"] is None

    entry["bytes"] = 64 << 20
    cache_file.write_text(json.dumps({"x86@local": entry}))
    table = run_deploy("bench", "--target", "x86", "--op", "argmax", "--min-mb", "70", "--no-baselines",
                       "--repeat", "1", env=env)  # fmt: skip
    assert table.returncode == 0, table.stderr
    measured = json.loads(cache_file.read_text())["x86@local"]
    assert measured["bytes"] == roofline_bytes(False, 70_000_000) >= 70_000_000
    assert measured["copy_gb_per_s"] != 2.0, "measured again over 70 MB"
    assert "256x100000" in table.stdout, "a case past 70 MB stays as it is"


def test_a_case_grows_along_its_batch() -> None:
    from ops.spec import Case

    case = Case(((32, 64, 8, 8), (1, 64, 8, 8), ()), {"axis": 1})
    assert case.batched(3) == Case(((96, 64, 8, 8), (1, 64, 8, 8), ()), {"axis": 1}), "a broadcast 1 stays"
    assert Case((("N", 4),)).batched(3).shapes == (("N", 4),), "a symbolic batch stays"
    assert Case(((2, 3, 4, 5), (5,))).batched(2).shapes == ((4, 3, 4, 5), (5,)), "a lower-rank operand stays"


def test_a_grown_case_moves_at_least_what_was_asked() -> None:
    """Bytes that do not grow (a broadcast operand) are counted: the case reaches the size; one
    with nothing to grow is refused before any device is touched."""
    from ops.add import Add
    from ops.spec import Case
    from toolchain.bench.bench import moved_bytes, sized_case

    class Broadcast(Add):
        bench = Case(((4, 64, 32, 32), (1, 64, 32, 32)))

    class Unbatched(Add):
        bench = Case(((1, 64, 32, 32), (1, 64, 32, 32)))

    case, bound = sized_case(Broadcast(), "float32", 10**7, emulated=False)
    assert case.shapes[1] == (1, 64, 32, 32) and moved_bytes(bound) >= 10**7
    assert sized_case(Unbatched(), "float32", 1000, emulated=False)[0] == Unbatched.bench, "already past"
    with pytest.raises(UsageError, match=r"--min-mb 10: add's bench case 1x64x32x32 1x64x32x32 has no batch"):
        sized_case(Unbatched(), "float32", 10**7, emulated=False)
