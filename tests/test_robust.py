"""What a build survives: graphs of dead nodes, LLVM aborting in codegen, a full disk, a read-only
cache, and a hung emulated run (issue #49, items 6, 7 and 9)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from deploy.compiler.cache import cached_build
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.registry import DeviceLost
from deploy.ops import TensorType, bind, get_op
from deploy.verify.run import for_device
from tests.conftest import invoke, run_deploy
from tests.test_hostile import LLVM_ABORT_OP
from tests.test_runner import needs

DEAD = 2000


def dead_graph(path: Path, dead: int) -> Path:
    """A graph file of `dead` nodes no output reads, and one that is the output."""
    nodes = [f"  - {{name: d{i}, op: leaky_relu, inputs: [x]}}" for i in range(dead)]
    text = "\n".join(
        ["inputs: {x: {shape: [4, 8]}}", "nodes:", *nodes, "  - {name: y, op: leaky_relu, inputs: [x]}"]
    )
    path.write_text(f"{text}\noutput: y\n")
    return path


def test_dead_nodes_are_dropped_with_a_note(tmp_path):
    model = dead_graph(tmp_path / "dead.yaml", DEAD)
    result = invoke(
        "build", "--target", "x86", "--cores", "1", "--model", str(model), "-o", str(tmp_path / "out")
    )
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, result.stderr
    assert (
        f"{DEAD} node(s) compute nothing its outputs read; dropped: 'd0', 'd1', 'd2', 'd3', 'd4' ..."
        in notes[0]
    )
    graph = json.loads((tmp_path / "out/manifest.json").read_text())["graph"]
    assert [n["name"] for n in graph["nodes"]] == ["y"]
    assert [k["nodes"] for k in graph["kernels"]] == [["y"]]


def test_an_onnx_models_dead_nodes_are_dropped_too(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("LeakyRelu", ["x"], [name], name) for name in ("y", "unread")]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", value[:1], value[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    result = invoke(
        "build",
        "--target",
        "x86",
        "--cores",
        "1",
        "--model",
        str(tmp_path / "m.onnx"),
        "-o",
        str(tmp_path / "out"),
    )
    assert result.exit_code == 0, result.output
    assert "1 node(s) compute nothing its outputs read; dropped: 'unread'" in result.stderr
    kernels = json.loads((tmp_path / "out/manifest.json").read_text())["graph"]["kernels"]
    assert [k["nodes"] for k in kernels] == [["y"]]


def test_an_llvm_abort_is_one_line_and_the_cli_survives(tmp_path):
    """LLVM aborts the process it emits code in; the CLI's build emits it in a child, and says so."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops/crc.py").write_text(LLVM_ABORT_OP)
    args = ["--ops-path", str(tmp_path / "ops"), "build", "--target", "x86", "--op", "crc32w", "--shape", "1"]
    result = run_deploy(*args, "--dtype", "int32", "--cores", "1", "-o", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    said = "compiling module.so for target x86: LLVM aborted: Cannot select: intrinsic %llvm.aarch64.crc32w"
    assert result.stderr.splitlines() == [f"error: {said}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.emulator
def test_an_emulated_run_past_its_timeout_is_stopped_whole():
    """Tuning's --timeout bounds each run of the runner under qemu, as an RPC session's: a run of
    a million calls is stopped at 0.5 s, qemu and all, and is a DeviceLost (the candidate fails)."""
    needs("armv7")
    bound = bind(get_op("leaky_relu"), {}, [TensorType((4, 1000), "float32")])
    x = np.ones((4, 1000), "float32")
    with get_device("emulator-armv7").open() as session:
        directory, manifest = cached_build(bound, for_device(get_target("armv7"), session))
        session.timeout_s = 0.5
        start = time.monotonic()
        with pytest.raises(DeviceLost, match=r"ran over the 0.5 s limit \(--timeout\) on emulator-armv7"):
            session.time(directory / manifest.module, [x], [((4, 1000), "float32")], 10**6, 3)
        assert time.monotonic() - start < 10
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(directory).encode() in _read(p)]
    assert left == [], "no process of the run is left"


def _read(path: Path) -> bytes:
    """A /proc file's bytes; empty for a process that ended meanwhile."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a small tmpfs (`mount -o OPTIONS`) at a fresh directory; skipped where this process
    may not mount (not root, no CAP_SYS_ADMIN)."""
    points: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        points.append(point)
        return point

    yield mount
    for point in points:
        subprocess.run(["umount", str(point)], check=True)


@pytest.mark.parametrize("free_kb", [0, 40, 700])
def test_a_full_disk_is_named_as_such(mounted, free_kb):
    """Wherever the disk fills (TVM's link of module.so, a copied header, the runner's link), one
    line says so, not `ld returned 1` or an OSError, and nothing is left there."""
    disk = mounted("size=4m")
    room = os.statvfs(disk)
    (disk / "fill").write_bytes(bytes(room.f_bavail * room.f_frsize - free_kb * 1024))
    out = disk / "out"
    result = invoke(*ADD_BUNDLE, "-o", str(out))
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"error: writing the artifact {out}: No space left on device"]
    assert sorted(p.name for p in disk.iterdir()) == ["fill"]


ADD_BUNDLE = (
    "build",
    "--target",
    "x86",
    "--op",
    "add",
    "--shape",
    "4",
    "--shape",
    "4",
    "--cores",
    "1",
    "--bundle",
)


def test_a_read_only_cache_is_named_as_such(mounted, monkeypatch, tmp_path):
    """The build cache (`run`) and the cache of the runtime's objects (`build --bundle -o`)."""
    cache = mounted("ro,size=1m")
    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(cache))
    np.save(tmp_path / "a.npy", np.ones(4, "float32"))
    a = str(tmp_path / "a.npy")
    run = ("run", "--target", "x86", "--op", "add", "-i", a, "-i", a, "-o", str(tmp_path / "out.npy"))
    for args, place in [(run, "builds"), ((*ADD_BUNDLE, "-o", str(tmp_path / "out")), "objects")]:
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        said = f"the cache {cache}/{place} (from $DEPLOY_CACHE_DIR) is not writable: Read-only file system"
        assert result.stderr.splitlines() == [f"error: {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "mnt0"]
