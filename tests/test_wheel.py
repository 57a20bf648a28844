"""The project as a user installs it: the wheel built from this checkout, installed into an empty
directory and run from outside the checkout (#50: the wheel held no C sources, so bundles, the
runner and the emulator's server failed once installed; and it installed five top-level packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

OLD_NAMES = ("base", "devices", "ops", "schedules", "toolchain")
"""The top-level packages the wheel installed before it was one package, `deploy`."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built from a copy of it (a build leaves build/ behind)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "deploy", source / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (found,) = dist.glob("*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process running the wheel installed into an empty directory: the
    dependencies are this venv's, deploy is the wheel's, the build cache starts empty (a cached
    build would hide a missing source) but shares the session's TVM runtime wheels (`wheels/`).
    Ahead of it on the path, packages named as deploy's were before #50 (`ops`, `base`, ...) fail
    when imported: another distribution's `ops` no longer matters."""
    shadows = tmp_path_factory.mktemp("shadows")
    for name in OLD_NAMES:
        (shadows / name).mkdir()
        (shadows / name / "__init__.py").write_text(f"raise ImportError('another distribution\\'s {name}')\n")
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    cache = tmp_path_factory.mktemp("wheel-cache")
    shared = Path(os.environ["DEPLOY_CACHE_DIR"]) / "wheels"
    shared.mkdir(parents=True, exist_ok=True)
    (cache / "wheels").symlink_to(shared)
    return {**os.environ, "PYTHONPATH": f"{shadows}{os.pathsep}{site}", "DEPLOY_CACHE_DIR": str(cache)}


def run(env: dict[str, str], cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """`command` with `env`, in `cwd` (outside the checkout)."""
    return subprocess.run(list(command), capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def deploy(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m deploy ARGS`, as `run` runs it."""
    return run(env, cwd, sys.executable, "-m", "deploy", *args)


def test_the_wheel_is_one_package_with_every_file_of_it(wheel: Path) -> None:
    """Only `deploy` at the top, and every file under deploy/ (the C sources and headers the
    bundles, the runner and the emulator's server are compiled from included)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    assert [top for top in tops if not top.endswith(".dist-info")] == ["deploy"]
    ours = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "deploy").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert ours - names == set()
    assert {"deploy/compiler/runtime/runtime.c", "deploy/compiler/runtime/abi.h"} <= names
    assert "deploy/devices/native/rpc_server.cc" in names


def test_the_installed_deploy_is_the_wheels(installed: dict[str, str], tmp_path: Path) -> None:
    shadowed = run(installed, tmp_path, sys.executable, "-c", "import ops")
    assert "another distribution's ops" in shadowed.stderr
    code = "import deploy, deploy.cli.main, deploy.compiler.compile; print(deploy.__file__)"
    found = run(installed, tmp_path, sys.executable, "-c", code)
    assert found.returncode == 0, found.stderr
    site = Path(installed["PYTHONPATH"].split(os.pathsep)[-1])
    assert Path(found.stdout.strip()).is_relative_to(site)
    script = site / "bin" / "deploy"
    version = run(installed, tmp_path, str(script), "--version")
    assert version.returncode == 0 and "0.1.0" in version.stdout, version.stderr


def test_an_arm_bundle_from_the_wheel(installed: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "add"
    built = deploy(installed, tmp_path, "build", "--op", "add", "--target", "arm", "--shape", "4", "--shape",
                   "4", "--bundle", "-o", str(out))  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert {"add.h", "libadd.a", "libadd.so", "deploy-run"} <= {p.name for p in out.iterdir()}


def test_a_user_op_from_the_wheel(installed: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "myops"
    folder.mkdir()
    (folder / "twice.py").write_text(
        textwrap.dedent(
            '''
            """twice: 2 * x, a user op written against the installed package."""
            from tvm import te

            from deploy.ops import Case, Input, Op, register

            @register
            class Twice(Op):
                name = "twice"
                inputs = (Input("x"),)
                dtypes = ("float32",)
                cases = (Case(((3, 5),)),)

                def infer(self, attrs, inputs):
                    return inputs[0]

                def compute(self, attrs, out, x):
                    return te.compute(out.shape, lambda *i: x[i] + x[i], name="out")

                def reference(self, attrs, x):
                    return x + x
            '''
        )
    )
    tested = deploy(
        installed, tmp_path, "--ops-path", str(folder), "test", "--target", "x86", "--op", "twice"
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 cases passed, 0 failed" in tested.stdout


@pytest.mark.emulator
@pytest.mark.skipif(not shutil.which("qemu-aarch64"), reason="needs qemu-user")
def test_the_emulator_server_from_the_wheel(installed: dict[str, str], tmp_path: Path) -> None:
    """Its RPC server is compiled from the wheel's rpc_server.cc, then runs under qemu."""
    try:
        started = deploy(installed, tmp_path, "device", "emulator", "start")
        assert started.returncode == 0, started.stderr
        assert "emulator running" in started.stdout
    finally:
        stopped = deploy(installed, tmp_path, "device", "emulator", "stop")
    assert stopped.returncode == 0, stopped.stderr
