"""Every bad input is one line on stderr naming the bad value, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import invoke, run_deploy

BUILD = ["build", "--target", "x86"]
BAD_BUILDS = {
    "unknown op": (["--op", "conv9d", "--shape", "4"], "unknown op 'conv9d'"),
    "unknown target": (["--op", "add", "--shape", "4", "--shape", "4", "--target", "riscv"], "'riscv'"),
    "bad attr value": (["--op", "max_pool2d", "--shape", "1x1x8x8", "-a", "kernel=0"], "kernel='0'"),
    "attr not a float": (["--op", "leaky_relu", "--shape", "4", "-a", "alpha=abc"], "alpha='abc'"),
    "attr not a bool": (
        ["--op", "max_pool2d", "--shape", "1x1x8x8", "-a", "ceil_mode=maybe"],
        "ceil_mode='maybe'",
    ),
    "attr not finite": (["--op", "leaky_relu", "--shape", "4", "-a", "alpha=nan"], "alpha='nan'"),
    "unknown attr": (["--op", "add", "--shape", "4", "--shape", "4", "-a", "axis=1"], "'axis'"),
    "attr without value": (["--op", "leaky_relu", "--shape", "4", "-a", "alpha"], "'alpha'"),
    "bad shape": (["--op", "leaky_relu", "--shape", "3xa"], "'3xa'"),
    "zero dim": (["--op", "leaky_relu", "--shape", "3x0"], "'3x0'"),
    "broadcast mismatch": (["--op", "add", "--shape", "3x4", "--shape", "5"], "[5]"),
    "maxpool_add broadcast": (
        ["--op", "maxpool_add", "--shape", "1x2x8x8", "--shape", "1x2x8x8"],
        "[1, 2, 8, 8]",
    ),
    "unsupported dtype": (["--op", "leaky_relu", "--shape", "4", "--dtype", "int8"], "int8"),
    "unknown dtype": (["--op", "add", "--shape", "4", "--shape", "4", "--dtype", "float128"], "float128"),
    "input count": (["--op", "add", "--shape", "4"], "takes 2 inputs"),
    "rank": (["--op", "max_pool2d", "--shape", "8x8"], "[8, 8]"),
    "kernel larger than input": (["--op", "max_pool2d", "--shape", "1x1x2x2", "-a", "kernel=3"], "kernel"),
    "padding over half kernel": (
        ["--op", "max_pool2d", "--shape", "1x1x8x8", "-a", "kernel=2", "-a", "padding=2"],
        "padding [2, 2]",
    ),
    "axis out of range": (["--op", "argmax", "--shape", "3x4", "-a", "axis=2"], "axis=2"),
    "index dtype": (["--op", "argmax", "--shape", "3x4", "-a", "out_dtype=int16"], "int16"),
}


@pytest.mark.parametrize("args,needle", BAD_BUILDS.values(), ids=BAD_BUILDS.keys())
def test_bad_build_input_is_one_line(args, needle, tmp_path):
    out = tmp_path / "artifact"
    result = invoke(*BUILD, *args, "-o", str(out))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0]
    assert not out.exists(), "a failed build must not leave an artifact"


def test_unreadable_npy(tmp_path):
    text = tmp_path / "a.npy"
    text.write_text("not a numpy file")
    for path in (str(text), str(tmp_path / "missing.npy")):
        result = invoke(
            "run", "--op", "leaky_relu", "--target", "x86", "-i", path, "-o", str(tmp_path / "o.npy")
        )
        assert result.exit_code == 2
        assert result.stderr.startswith("error: cannot read input") and path in result.stderr


def test_output_directory_missing(tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones(4, dtype="float32"))
    out = tmp_path / "no" / "such" / "o.npy"
    result = invoke("run", "--op", "leaky_relu", "--target", "x86", "-i", str(x), "-o", str(out))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_ops_path_not_a_directory(tmp_path):
    result = invoke("--ops-path", str(tmp_path / "nope"), "ops")
    assert result.exit_code == 2 and "is not a directory" in result.stderr


def _plain_files(out: Path) -> None:
    (out / "notes.txt").write_text("keep me")


def _empty_manifest_and_sources(out: Path) -> None:
    (out / "manifest.json").write_text("{}")
    (out / "src").mkdir()
    (out / "src" / "main.js").write_text("keep me")


def _artifact_plus_a_file(out: Path) -> None:
    assert invoke(*BUILD, "--op", "leaky_relu", "--shape", "4", "-o", str(out)).exit_code == 0
    (out / "notes.txt").write_text("keep me")


@pytest.mark.parametrize(
    "prepare,message",
    [
        (_plain_files, "is not an artifact"),
        (_empty_manifest_and_sources, "is not an artifact"),
        (_artifact_plus_a_file, "holds notes.txt, which no deploy build wrote"),
    ],
)
def test_build_replaces_only_an_artifact_directory(tmp_path, prepare, message):
    """Only a directory holding nothing but an earlier artifact's own files is replaced."""
    out = tmp_path / "out"
    out.mkdir()
    prepare(out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = invoke(*BUILD, "--op", "leaky_relu", "--shape", "4", "-o", str(out))
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left behind


def test_build_replaces_an_earlier_artifact_and_refuses_the_current_directory(tmp_path, monkeypatch):
    out = tmp_path / "out"
    for shape in ("4", "5"):
        result = invoke(*BUILD, "--op", "leaky_relu", "--shape", shape, "-o", str(out))
        assert result.exit_code == 0, result.stderr
    assert json.loads((out / "manifest.json").read_text())["inputs"][0]["shape"] == [5]
    monkeypatch.chdir(out)
    result = invoke(*BUILD, "--op", "leaky_relu", "--shape", "6", "-o", ".")
    assert result.exit_code == 2 and "holds the current directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_console_script_prints_no_traceback():
    proc = run_deploy("build", "--op", "add", "--target", "x86", "--shape", "3x4", "--shape", "5")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]


def test_debug_shows_the_traceback():
    proc = run_deploy("--debug", "build", "--op", "nope", "--target", "x86", "--shape", "3")
    assert proc.returncode != 0 and "Traceback" in proc.stderr
