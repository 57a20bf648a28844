"""`deploy bench`: the roofline (measured once, then cached), baselines, --json and --plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import run_deploy


def test_bench_reports_the_roofline_and_baselines(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    first = run_deploy("bench", "--target", "x86", "--op", "add", "--op", "argmax", "--repeat", "1",
                       "--json", "--plot", str(plot))  # fmt: skip
    assert first.returncode == 0, first.stderr
    rows = json.loads(first.stdout)
    assert [r["op"] for r in rows] == ["add", "argmax"]
    for row in rows:
        assert row["roofline_gb_per_s"] > 0 and row["gb_per_s"] > 0
        assert row["x_roofline"] == row["median_ms"] / row["roofline_ms"]
        assert row["numpy_ms"] > 0 and "torch_ms" in row and "speedup_vs_torch" in row
    assert plot.read_bytes()[:4] == b"\x89PNG"
    cache = json.loads((Path(os.environ["DEPLOY_CACHE_DIR"]) / "roofline.json").read_text())
    assert cache["x86@local"]["gb_per_s"] == rows[0]["roofline_gb_per_s"]

    again = run_deploy("bench", "--target", "x86", "--op", "leaky_relu", "--repeat", "1", "--json")
    assert json.loads(again.stdout)[0]["roofline_gb_per_s"] == rows[0]["roofline_gb_per_s"], "cached"
    table = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "1")
    assert "copy roofline" in table.stdout and "x roofline" in table.stdout


def test_bad_bench_input_is_one_line(tmp_path: Path) -> None:
    zero = run_deploy("bench", "--target", "x86", "--op", "add", "--repeat", "0")
    assert zero.returncode == 2 and zero.stderr.strip() == "error: --repeat 0: expected at least 1"
    none = run_deploy("bench", "--target", "x86", "--op", "leaky_relu", "--dtype", "int8")
    assert none.returncode == 2 and "no op in the selection supports dtype int8" in none.stderr
