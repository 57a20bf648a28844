"""Builds split parallel work for the device's cores, not the build host's (issue #13, defect 3):
asked from the device (its runtime's thread count) or given with --cores, and recorded in the
manifest. Likewise the device's CPU model, whose hand defaults the schedules take where they were
measured to differ (`deploy/schedules/cpu_models.py`): named from /proc/cpuinfo's fields, and
recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploy.compiler.compile import context, hand_schedule
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.local import cpu_id_of
from deploy.ops import TensorType, bind, get_op
from deploy.schedules.cpu.pooling import PLANE_STREAMS, plane_streams
from deploy.schedules.cpu.prefetch import NEAR_PREFETCH_BYTES, PREFETCH_NEAR
from deploy.schedules.cpu_models import identify
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


def cpuinfo(vendor: str, family: int, model: int) -> str:
    """/proc/cpuinfo's text of a 2-CPU x86 machine (the fields deploy reads, as Linux writes them)."""
    fields = f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: fpu avx2\n"
    return "\n".join(f"processor\t: {i}\n{fields}" for i in range(2))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (cpuinfo("AuthenticAMD", 25, 1), "zen3"),  # EPYC 7003 (Milan)
        (cpuinfo("AuthenticAMD", 25, 0x21), "zen3"),  # Ryzen 5000 (Vermeer)
        (cpuinfo("AuthenticAMD", 25, 0x11), None),  # Zen 4 (Genoa): not measured
        (cpuinfo("AuthenticAMD", 26, 2), None),  # Zen 5
        (cpuinfo("GenuineIntel", 6, 207), None),  # Emerald Rapids
        ("processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n", None),
        ("vendor_id\t: AuthenticAMD\ncpu family\t: x\nmodel\t\t: 1\n", None),
        ("", None),
    ],
    ids=["zen3-epyc", "zen3-ryzen", "zen4", "zen5", "intel", "aarch64", "garbled", "empty"],
)
def test_the_cpu_model_is_named_from_cpuinfo(text: str, expected: str | None) -> None:
    assert identify(cpu_id_of(text)) == expected


def test_a_cpu_models_defaults_reach_the_pool_and_the_manifest(tmp_path: Path) -> None:
    """Zen 3's pool reads one plane at a time without near prefetches; no model, the constants'
    defaults (four planes, near prefetches); a local build records the host's model."""
    bound = bind(get_op("max_pool2d"), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]},
                 [TensorType((8, 64, 112, 112), "float32")])  # fmt: skip
    x86 = get_target("x86")
    for model, planes, near in ((None, PLANE_STREAMS, NEAR_PREFETCH_BYTES), ("zen3", 1, 0)):
        options = BuildOptions(cores=2, cpu_model=model)
        assert plane_streams(context(bound, x86, options), 512) == planes
        mod, _ = hand_schedule(bound, x86, options)
        assert f'"{PREFETCH_NEAR}": {near}' in mod.script()
    with get_device("local").open() as session:
        asked = for_device(BuildOptions(), session).cpu_model
    assert build(tmp_path, "local", "--target", "x86").cpu_model == asked
    assert build(tmp_path, "cl", "--target", "opencl").cpu_model is None
