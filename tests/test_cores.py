"""Builds split parallel work for the device's cores, not the build host's (issue #13, defect 3):
asked from the device (its runtime's thread count) or given with --cores, and recorded in the
manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploy.compiler.manifest import Manifest
from tests.conftest import invoke

ARGMAX = ["build", "--op", "argmax", "-a", "axis=1", "--shape", "1x64x2048"]


def build(tmp_path: Path, name: str, *args: str) -> Manifest:
    result = invoke(*ARGMAX, "-o", str(tmp_path / name), *args)
    assert result.exit_code == 0, result.output
    return Manifest.read(tmp_path / name)


def test_explicit_cores_are_recorded_and_change_the_module(tmp_path: Path):
    eight = build(tmp_path, "eight", "--target", "x86", "--cores", "8")
    two = build(tmp_path, "two", "--target", "x86", "--cores", "2")
    assert (eight.cores, two.cores) == (8, 2)
    assert eight.sha256 != two.sha256, "the parallel split follows the core count"
    assert json.loads((tmp_path / "eight" / "manifest.json").read_text())["cores"] == 8


def test_without_cores_the_device_is_asked(tmp_path: Path):
    import tvm

    local = build(tmp_path, "local", "--target", "x86")
    assert local.cores == int(tvm.get_global_func("runtime.NumThreads")())


def test_bad_cores_is_one_line(tmp_path: Path):
    result = invoke(*ARGMAX, "--target", "x86", "--cores", "0", "-o", str(tmp_path / "x"))
    assert result.exit_code == 2 and "--cores 0: expected a thread count" in result.output
    assert not (tmp_path / "x").exists()


def test_opencl_builds_record_no_cores(tmp_path: Path):
    assert build(tmp_path, "cl", "--target", "opencl").cores is None


@pytest.mark.emulator
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user")
def test_arm_build_asks_the_emulator_and_test_runs_split_for_its_cores(tmp_path: Path):
    import os

    arm = build(tmp_path, "arm", "--target", "arm")
    assert arm.cores == int(os.environ["TVM_NUM_THREADS"]), "the emulator's server runs that many threads"
    board = build(tmp_path, "board", "--target", "arm", "--cores", "8")
    assert board.cores == 8 and board.sha256 != arm.sha256
    ran = invoke("test", "--target", "arm", "--op", "argmax", "--dtype", "float32", "--cores", "8")
    assert ran.exit_code == 0 and "0 failed" in ran.output
