"""What a build survives: graphs of dead nodes, LLVM aborting in codegen, a full disk, a read-only
cache, and a hung emulated run (issue #49, items 6, 7 and 9)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from deploy.base.errors import DeployError
from deploy.base.forked import FORK_LOCK, ChildDied, in_child
from deploy.compiler.bundle import run_tool
from deploy.compiler.cache import cached_build
from deploy.compiler.export import _no_room
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.shared_object import emitting
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.registry import DeviceLost
from deploy.devices.runner import RunnerSession
from deploy.ops import TensorType, bind, get_op
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


def test_constants_only_dead_nodes_read_are_dropped_and_no_node_left_runs(tmp_path):
    """The graph's outputs are its input and a constant: its one node is dead, and so is the
    constant only it reads; what is left, no node at all, builds and runs on x86."""
    from onnx import TensorProto, helper, numpy_helper

    kept = numpy_helper.from_array(np.full(4, 7, "float32"), "w")
    unread = numpy_helper.from_array(np.ones((64, 4), "float32"), "v")
    node = helper.make_node("Add", ["x", "v"], ["dead"], "dead")
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "w")]
    graph = helper.make_graph([node], "g", value[:1], value, [kept, unread])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    result = invoke(
        "build", "--target", "x86", "--model", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")
    )
    assert result.exit_code == 0, result.output
    built = json.loads((tmp_path / "out/manifest.json").read_text())
    assert ([c["name"] for c in built["constants"]], built["graph"]["kernels"]) == (["w"], [])
    assert "constants: 1 (w), 16 bytes" in result.stdout
    np.save(tmp_path / "x.npy", np.arange(4, dtype="float32"))
    outs = [tmp_path / "y0.npy", tmp_path / "y1.npy"]
    ran = invoke("run", "--target", "x86", "--model", str(tmp_path / "m.onnx"), "-i", str(tmp_path / "x.npy"),
                 "-o", str(outs[0]), "-o", str(outs[1]), "--check")  # fmt: skip
    assert ran.exit_code == 0 and "check passed" in ran.stdout, ran.output
    assert [np.load(p).tolist() for p in outs] == [[0, 1, 2, 3], [7, 7, 7, 7]]


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


def _say_and_exit(line: bytes, code: int) -> None:
    """As LLVM's `report_fatal_error`: a line on stderr, then exit(code) with no exception."""
    os.write(2, line)
    os._exit(code)


def test_a_child_exiting_without_an_exception_is_an_error():
    with pytest.raises(ChildDied, match=r"^exited with status 3: why$"):
        in_child(lambda: _say_and_exit(b"LLVM said\nwhy\n", 3))
    with pytest.raises(DeployError, match=r"^compiling module.so for target x86: LLVM aborted: no isel$"):
        emitting(lambda: _say_and_exit(b"LLVM ERROR: no isel\n", 1), "module.so", get_target("x86"))


def test_a_childs_exception_travels_back_or_the_child_is_an_error():
    class Local(Exception):  # pickle cannot find a class defined in a function
        pass

    class Mute(Local):
        def __str__(self) -> str:
            raise ValueError("no text")

    with pytest.raises(ValueError, match=r"^plain$"):
        in_child(lambda: _raise(ValueError("plain")))
    with pytest.raises(RuntimeError, match=r"^local$"):
        in_child(lambda: _raise(Local("local")))
    with pytest.raises(ChildDied, match=r"^exited with status 1$"):
        in_child(lambda: _raise(Mute()))


def _raise(exc: Exception) -> None:
    raise exc


def test_a_child_past_its_deadline_is_killed():
    start = time.monotonic()
    with pytest.raises(ChildDied, match=r"^ran past 0.2 s and was killed$"):
        in_child(lambda: time.sleep(30), deadline_s=0.2)
    assert time.monotonic() - start < 5


def test_children_of_other_threads_are_not_waited_for():
    """A child another thread forks while this one waits for FORK_LOCK (as a concurrent export's)
    inherits what this one opened meanwhile; this one's result still comes when its child ends."""
    took: list[float] = []

    def export() -> None:
        start = time.monotonic()
        in_child(lambda: None)
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=export)
    with FORK_LOCK:
        thread.start()
        time.sleep(0.2)  # the thread has made its files and waits for the lock
        other = os.fork()
        if other == 0:
            time.sleep(4)
            os._exit(0)
    thread.join()
    os.waitpid(other, 0)
    assert took[0] < 2, took


INTERRUPT_AFTER_FORK: list[bool] = []
"""Set: the next fork's parent sends itself SIGINT before `os.fork()` returns (a ^C in the fork)."""


def _interrupt_after_fork() -> None:
    if INTERRUPT_AFTER_FORK:
        os.kill(os.getpid(), signal.SIGINT)


os.register_at_fork(after_in_parent=_interrupt_after_fork)


@pytest.mark.parametrize("other_thread", [False, True], ids=["one thread", "another thread too"])
def test_a_stop_during_the_fork_is_raised_once_the_child_is_known(other_thread: bool):
    """Without the signals held, the ^C's exception would be raised inside the fork (and lost,
    or it would leave the child unknown, so unreaped); it comes once `in_child` can end it. With
    another thread alive the kernel gives the signal to it (the main thread blocks it), and the
    KeyboardInterrupt's handler ran inside the at-fork hook, where it was lost: the main thread's
    Python handlers defer it too."""
    before = {child.pid for child in psutil.Process().children()}  # earlier tests' servers stay
    done = threading.Event()
    waiting = threading.Thread(target=done.wait)
    if other_thread:
        waiting.start()
    INTERRUPT_AFTER_FORK.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            in_child(lambda: time.sleep(30))
    finally:
        INTERRUPT_AFTER_FORK.clear()
        done.set()
    assert {child.pid for child in psutil.Process().children()} <= before


@pytest.mark.parametrize("taken_for", ["a failed case", "a lost device"])
def test_a_stop_swallowed_on_its_way_up_still_ends_the_matrix(monkeypatch, taken_for: str):
    """A Ctrl-C whose KeyboardInterrupt something on its way up swallowed (TVM's FFI hands one
    raised inside a call back as another exception; a catch-all may then take it for a failure
    or for a lost device) still ends `deploy test` before its next case, and before it
    reconnects: a CI run's `deploy test` ran all its cases after a Ctrl-C."""
    import deploy.verify.matrix as matrix
    from deploy.base.stopping import stopping_like_ctrl_c

    planned = matrix.plan([get_op("leaky_relu")], ["float32"])[:3]
    ran: list[object] = []

    def swallowing(session, case, *args):
        ran.append(case)
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            if taken_for == "a lost device":
                raise DeviceLost("taken for a lost device") from None
            return matrix.CaseResult(case.op.name, case.dtype, "swallowed", False, float("inf"), "-", "-")
        raise AssertionError("SIGINT raised no KeyboardInterrupt")

    monkeypatch.setattr(matrix, "verify_case", swallowing)
    with pytest.raises(KeyboardInterrupt), stopping_like_ctrl_c():
        matrix.run_matrix(planned, get_target("x86"), BuildOptions(), get_device("local"))
    assert ran == planned[:1]


def test_a_failed_fork_leaves_no_descriptor(monkeypatch):
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(BlockingIOError):
        in_child(lambda: None)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.emulator
def test_an_emulated_run_past_its_timeout_is_stopped_whole():
    """Tuning's --timeout bounds each run of the runner under qemu, as an RPC session's: a run of
    a million calls is stopped at 0.5 s, qemu and all, and is a DeviceLost (the candidate fails)."""
    needs("armv7")
    bound = bind(get_op("leaky_relu"), {}, [TensorType((4, 1000), "float32")])
    x = np.ones((4, 1000), "float32")
    with get_device("emulator-armv7").open() as session:
        assert isinstance(session, RunnerSession)
        directory, manifest = cached_build(bound, get_target("armv7"), for_device(BuildOptions(), session))
        start = time.monotonic()
        with pytest.raises(DeviceLost, match=r"ran over the 0.5 s limit \(--timeout\) on emulator-armv7"):
            session.time(directory / manifest.module, [x], [((4, 1000), "float32")], 10**6, 3, timeout_s=0.5)
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


ELSEWHERE = " (there, or in $TMPDIR or the cache)"
"""A compiler's or linker's full disk: its line names no file."""


def full(disk: Path, free_kb: int) -> Path:
    """`disk` filled but for `free_kb` KiB."""
    room = os.statvfs(disk)
    (disk / "fill").write_bytes(bytes(room.f_bavail * room.f_frsize - free_kb * 1024))
    return disk


@pytest.mark.parametrize(("free_kb", "where"), [(0, ELSEWHERE), (40, ""), (700, ELSEWHERE)])
def test_a_full_disk_is_named_as_such(mounted, free_kb, where):
    """Wherever the disk fills (TVM's link of module.so, a copied header, the runner's link), one
    line says so, not `ld returned 1` or an OSError, and nothing is left there. A tool's line
    names no file: the place may be TVM's temporaries or the cache as well."""
    disk = full(mounted("size=4m"), free_kb)
    out = disk / "out"
    result = invoke(*ADD_BUNDLE, "-o", str(out))
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        f"error: writing the artifact {out}: No space left on device{where}"
    ]
    assert sorted(p.name for p in disk.iterdir()) == ["fill"]


def test_a_full_tmpdir_is_not_blamed_on_the_artifact(mounted, tmp_path):
    disk = full(mounted("size=4m"), 0)
    out = tmp_path / "out"
    result = run_deploy(*ADD_BUNDLE, "-o", str(out), env={"TMPDIR": str(disk)})
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"error: writing the artifact {out}: No space left on device{ELSEWHERE}"
    ]
    assert not out.exists()


def test_a_full_quota_and_a_file_elsewhere_are_named(tmp_path):
    """EDQUOT in its own words, from Python or a linker; an OSError's file, unless it is the
    artifact's (a copy's target)."""
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/cache/objects/x.o")
    assert _no_room(quota, (tmp_path,)) == "Disk quota exceeded (writing /cache/objects/x.o)"
    copy = OSError(errno.ENOSPC, "copying", "/usr/include/dlpack.h", None, str(tmp_path / "include/dlpack.h"))
    assert _no_room(copy, (tmp_path,)) == "No space left on device"
    assert _no_room(OSError(errno.EACCES, "denied", str(tmp_path)), (tmp_path,)) is None
    said = ("ld: final link failed: Disk quota exceeded", "collect2: error: ld returned 1")
    ld = f"echo '{said[0]}' >&2; echo '{said[1]}' >&2; exit 1"
    with pytest.raises(
        DeployError, match=r"^gcc failed: ld: final link failed: Disk quota exceeded \| collect2"
    ):
        run_tool(["sh", "-c", ld], "gcc")  # the line that names the cause, not only the driver's
    linked = DeployError(
        "linking module.so for target x86 failed: ld: final link failed: Disk quota exceeded"
    )
    assert _no_room(linked, (tmp_path,)) == f"Disk quota exceeded{ELSEWHERE}"


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


def test_a_killed_childs_temporary_files_are_removed(tmp_path: Path) -> None:
    """A child killed mid-export (a stop, its deadline) had left TVM's temporary `lib0.o` in
    $TMPDIR: the child's temporary files now go in a directory the parent removes."""
    import tempfile

    made = tmp_path / "made.txt"

    def killed_mid_write() -> None:
        work = Path(tempfile.mkdtemp())  # as TVM's export_library makes its own
        (work / "lib0.o").write_bytes(b"")
        made.write_text(str(work))
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(ChildDied, match="killed by SIGKILL"):
        in_child(killed_mid_write)
    left = Path(made.read_text())
    assert left.name.startswith("tmp") and not left.exists() and not left.parent.exists()


ORPHANED = """
import os, sys, threading, time
from pathlib import Path
from deploy.base.forked import end_children, in_child

def child():
    Path(sys.argv[1]).write_text(str(os.getpid()))
    time.sleep(60)

threading.Thread(target=in_child, args=(child,), daemon=True).start()
while not Path(sys.argv[1]).exists():
    time.sleep(0.01)
if sys.argv[2] == "as the CLI ends":
    end_children()
os._exit(0)  # as a command stopped while another thread exports ends (`stopping.beside`)
"""


@pytest.mark.parametrize("ending", ["os._exit alone", "as the CLI ends"])
def test_a_child_ends_with_the_process_that_forked_it(ending: str, tmp_path: Path) -> None:
    """A command stopped while the build-ahead thread exported ended with os._exit, and the
    export's child ran on, holding the build cache's lock: it is now killed with its parent. The
    CLI ends such a process after `end_children`, which also removes the child's scratch
    directory (it stayed in $TMPDIR)."""
    import sys

    pid_file, scratch = tmp_path / "child.pid", tmp_path / "tmp"
    scratch.mkdir()
    command = [sys.executable, "-c", ORPHANED, str(pid_file), ending]
    subprocess.run(command, check=True, timeout=60, env={**os.environ, "TMPDIR": str(scratch)})
    child = int(pid_file.read_text())
    left = [p.name for p in scratch.iterdir()]
    kept = 0 if ending == "as the CLI ends" else 1
    assert len(left) == kept and all(name.startswith("deploy-child-") for name in left), left
    deadline = time.monotonic() + 10
    while True:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)
