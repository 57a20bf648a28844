"""The runner protocol (#38): armv7 and riscv64, which have no TVM runtime, run their C bundles
through `deploy-run` under qemu-user, for `deploy run`, `test` and `bench` alike; the runner times
as TVM's time evaluator does. Their op x dtype x case matrix is in tests/test_bundle.py, their
edge cases in tests/test_ops_matrix.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from deploy.base.errors import DeployError
from deploy.compiler.cache import cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.platforms import get_platform
from deploy.devices.runner import RunnerEmulator
from deploy.ops import TensorType, bind, get_op
from deploy.verify.run import run_artifact
from tests.conftest import run_deploy

pytestmark = pytest.mark.emulator


def needs(target: str) -> None:
    platform = get_platform(get_target(target).arch)
    for tool, package in ((platform.qemu, platform.qemu_package), (platform.gxx, platform.gxx_package)):
        if tool is None or shutil.which(tool) is None:
            pytest.skip(f"needs {tool} ({package})")


@pytest.mark.parametrize("target", ["armv7", "riscv64"])
def test_deploy_run_checks_float16_through_the_runner(target: str, tmp_path: Path) -> None:
    """float16 add with infinities and NaN, exact: on riscv64 the conversions are deploy's own
    (TVM's helpers returned 0 for every element)."""
    needs(target)
    a = np.array([1.5, -2.25, 65504, np.inf, np.nan, -0.0, 6e-8, 3], dtype="float16")
    b = np.array([0.25, 2.25, 65504, -1, 1, 0.0, 6e-8, -np.inf], dtype="float16")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "out.npy"
    done = run_deploy("run", "--op", "add", "--target", target, "-i", str(tmp_path / "a.npy"),
                      "-i", str(tmp_path / "b.npy"), "-o", str(out), "--check")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"on emulator-{target}" in done.stdout and "check passed: max error 0" in done.stdout
    np.testing.assert_array_equal(np.load(out), a + b)


def test_a_session_times_through_the_runner() -> None:
    """`Session.time` on the runner: `repeat` runs, each of at least MIN_REPEAT_MS of calls."""
    needs("armv7")
    target = get_target("armv7")
    bound = bind(get_op("leaky_relu"), {}, [TensorType((4, 1000), "float32")])
    x = np.random.default_rng(0).standard_normal((4, 1000)).astype("float32")
    with get_device("emulator-armv7").open() as session:
        assert session.bundles and (session.cores() or 0) >= 1
        directory, manifest = cached_build(bound, target, for_device(BuildOptions(), session))
        assert manifest.bundle is not None, "a build for a runner device carries its bundle"
        expected = bound.op.reference(bound.attrs, x)
        np.testing.assert_array_equal(run_artifact(session, directory, manifest, [x])[0], expected)
        outputs: list[tuple[tuple[int, ...], str]] = [((4, 1000), "float32")]
        times = session.time(directory / manifest.module, [x], outputs, number=1, repeat=3)
    assert len(times) == 3 and all(0 < t < 1 for t in times), times


def test_a_build_without_its_bundle_is_refused_by_name(tmp_path: Path) -> None:
    needs("armv7")
    from deploy.compiler.compile import compile_op
    from deploy.compiler.export import export

    bound = bind(get_op("add"), {}, [TensorType((3,), "float32")] * 2)
    manifest = export(compile_op(bound, get_target("armv7"), BuildOptions()), tmp_path / "art")
    with get_device("emulator-armv7").open() as session, pytest.raises(DeployError, match="has no C bundle"):
        session.run(tmp_path / "art" / manifest.module, [np.zeros(3, "float32")] * 2, [((3,), "float32")])


@pytest.mark.parametrize(
    "args,said",
    [
        (["--time", "0,3,20"], "--time NUMBER 0: expected a whole number from 1 to"),
        (["--time", "5,3"], "--time 5,3: expected NUMBER,REPEAT,MIN_REPEAT_MS"),
        (["--time", "5,x,20"], "--time REPEAT x: expected a whole number from 1 to 1000"),
        (["--threads", "0"], "--threads 0: expected a whole number from 1 to 1024"),
    ],
)
def test_the_runners_timing_options_are_checked(args: list[str], said: str, tmp_path: Path) -> None:
    needs("riscv64")
    bound = bind(get_op("add"), {}, [TensorType((3,), "float32")] * 2)
    with get_device("emulator-riscv64").open() as session:
        directory, _ = cached_build(bound, get_target("riscv64"), for_device(BuildOptions(), session))
    np.save(tmp_path / "a.npy", np.zeros(3, "float32"))
    runner = [*get_platform("riscv64").emulator_command(), str(directory / "deploy-run"), str(directory)]
    zeros = str(tmp_path / "a.npy")
    command = [*runner, "-i", zeros, "-i", zeros, "-o", str(tmp_path / "o.npy"), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().startswith(f"deploy-run: {said}"), done.stderr
    assert not (tmp_path / "o.npy").exists()


def test_an_emulator_without_its_qemu_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    device = get_device("emulator-riscv64")
    assert isinstance(device, RunnerEmulator)
    monkeypatch.setattr(device, "platform", dataclasses.replace(device.platform, qemu="qemu-missing-here"))
    said = "qemu-missing-here not found: install the Debian package qemu-user"
    with pytest.raises(DeployError, match=said), device.open():
        pass


@pytest.mark.slow
def test_tune_measures_candidates_through_the_runner(tmp_path: Path) -> None:
    """MetaSchedule's candidates built as bundles and timed by their runner on the emulator, the
    verdict judged side by side with the hand schedule there."""
    needs("riscv64")
    db = str(tmp_path / "db")
    done = run_deploy(
        "tune", "--op", "leaky_relu", "--target", "riscv64", "--shape", "4x256", "--trials", "3", "--db", db
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(3 new, 3 valid)" in " ".join(done.stdout.split()), done.stdout
    assert "on emulator-riscv64" in done.stdout
