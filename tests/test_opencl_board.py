"""`--target opencl` on a board over SSH with no Python: a real sshd on loopback whose "board" is
this x86_64 machine (tests/sshd.py), its OpenCL driver PoCL. Each artifact's OpenCL bundle is
pushed and run by its deploy-run (`deploy/devices/board_opencl.py`); a board without OpenCL, or added
with a device it lacks, is a one-line error naming it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import sshd
from tests.conftest import invoke
from tests.test_opencl_bundle import NEEDS_OPENCL

pytestmark = [
    pytest.mark.skipif(not sshd.available(), reason="needs openssh-server (/usr/sbin/sshd) and ssh-keygen"),
    *NEEDS_OPENCL,
    pytest.mark.skipif(shutil.which("x86_64-linux-gnu-gcc") is None, reason="needs gcc (x86_64)"),
]
POCL_TOOLS = (*sshd.BOARD_TOOLS, "ld")
"""PoCL's CPU device links each kernel it builds with `ld` from the PATH (it aborts without one)."""
GRAPH = """name: pool_add
inputs:
  a: {shape: [1, 4, 8, 8], dtype: float32}
  b: {shape: [1, 1, 4, 4], dtype: float32}
nodes:
  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}
  - {name: sum, op: add, inputs: [pool, b]}
output: sum
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = sshd.start(tmp_path_factory.mktemp("sshd"), POCL_TOOLS)
    yield running
    sshd.stop(running)


@pytest.fixture(autouse=True)
def boards_removed() -> Iterator[None]:
    """The boards a test adds (named ocl...) are removed after it: the session's other tests
    share deploy's config (tests/test_ssh.py adds a board `bare` too)."""
    yield
    for name in ("oclgpu", "oclbare", "oclnodev", "oclcpu"):
        invoke("device", "remove", name)


def add(name: str, server: sshd.Sshd, remote_dir: Path, *extra: str):
    return invoke(
        "device", "add", name, "--host", "127.0.0.1", "--port", str(server.port), "--user", server.user,
        "--key", str(server.key), "--arch", "x86_64", "--remote-dir", str(remote_dir), "--protocol", "runner",
        "--accept-new-host-key", *extra,
    )  # fmt: skip


def test_opencl_on_a_board_through_its_bundles(server, tmp_path):
    """An op's cases (float16 as half storage: PoCL has no cl_khr_fp16) and a graph pass on the
    board's OpenCL device, each through its bundle's deploy-run."""
    remote = tmp_path / "oclgpu"
    added = add("oclgpu", server, remote, "--opencl", "0:0")
    assert added.exit_code == 0 and "(x86_64, runner protocol, OpenCL 0:0)" in added.stdout, added.stderr
    assert " opencl=0:0" in invoke("device", "list").stdout
    checked = invoke("device", "check", "oclgpu")
    assert checked.exit_code == 0 and "oclgpu: OpenCL 0:0 is " in checked.stdout, checked.output
    assert "no cl_khr_fp16: float16 is built as half storage" in checked.stdout
    tested = invoke("test", "--target", "opencl", "--device", "oclgpu", "--op", "hard_sigmoid",
                        "--dtype", "float16")  # fmt: skip
    assert tested.exit_code == 0, tested.stdout[-2000:] + tested.stderr
    assert " passed, 0 failed" in tested.stdout
    graph = tmp_path / "pool_add.yaml"
    graph.write_text(GRAPH)
    tested = invoke("test", "--target", "opencl", "--device", "oclgpu", "--model", str(graph))
    assert tested.exit_code == 0, tested.stdout[-2000:] + tested.stderr
    bundles = list((remote / "bundles").iterdir())
    assert any((b / "deploy-run").is_file() for b in bundles) and any(
        (b / "deploy-cl-probe").is_file() for b in bundles
    )
    assert list((remote / "calls").iterdir()) == [], "each call's inputs and outputs are removed"


def test_a_board_without_opencl_is_one_line_naming_it(server, tmp_path):
    """No OpenCL platform on the board (its ICD loader finds no driver), a device it lacks, a
    board added without one, and a bad --opencl: one line each, naming the board."""
    bare = sshd.start(tmp_path / "sshd", POCL_TOOLS, env={"OCL_ICD_VENDORS": str(tmp_path / "no-vendors")})
    try:
        (tmp_path / "no-vendors").mkdir()
        added = add("oclbare", bare, tmp_path / "oclbare", "--opencl", "0:0")
        assert added.exit_code == 0, added.output
        failed = invoke("test", "--target", "opencl", "--device", "oclbare", "--op", "add")
        assert failed.exit_code == 1, failed.stdout
        assert failed.stderr.startswith("error: oclbare cannot run OpenCL bundles: no OpenCL platform"), (
            failed.stderr
        )
        assert len(failed.stderr.splitlines()) == 1, failed.stderr
    finally:
        sshd.stop(bare)
    added = add("oclnodev", server, tmp_path / "oclnodev", "--opencl", "0:7")
    assert added.exit_code == 0, added.output
    failed = invoke("test", "--target", "opencl", "--device", "oclnodev", "--op", "add", "--dtype", "float32")
    assert failed.exit_code == 2 and len(failed.stderr.splitlines()) == 1, failed.stderr
    assert failed.stderr.startswith("error: oclnodev: no OpenCL device 0:7: platform 0 has 1 device"), (
        failed.stderr
    )
    added = add("oclcpu", server, tmp_path / "oclcpu")
    assert added.exit_code == 0, added.output
    failed = invoke("test", "--target", "opencl", "--device", "oclcpu", "--op", "add")
    assert (failed.exit_code, failed.stderr) == (
        2,
        "error: board oclcpu has no OpenCL device: add it with --opencl P:D (`deploy device add oclcpu ..."
        " --opencl 0:0 --replace`)\n",
    )
    bad = add("oclbad", server, tmp_path / "oclbad", "--opencl", "gpu0")
    assert (bad.exit_code, bad.stderr) == (
        2,
        "error: board opencl 'gpu0': expected PLATFORM:DEVICE, OpenCL's indices (e.g. 0:0)\n",
    )
