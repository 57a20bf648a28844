"""Bad output paths and the console script's error lines (the table of bad inputs is test_hostile.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.base.threads import host_cpus
from tests.conftest import DEPLOY, invoke, run_deploy

BUILD = ["build", "--target", "x86"]


def test_output_directory_missing(tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones(4, dtype="float32"))
    out = tmp_path / "no" / "such" / "o.npy"
    result = invoke("run", "--op", "leaky_relu", "--target", "x86", "-i", str(x), "-o", str(out))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def _plain_files(out: Path) -> None:
    (out / "notes.txt").write_text("keep me")


def _empty_manifest_and_sources(out: Path) -> None:
    (out / "manifest.json").write_text("{}")
    (out / "src").mkdir()
    (out / "src" / "main.js").write_text("keep me")


def _artifact_plus_a_file(out: Path) -> None:
    assert invoke(*BUILD, "--op", "leaky_relu", "--shape", "4", "-o", str(out)).exit_code == 0
    (out / "notes.txt").write_text("keep me")


def _artifact_claiming_a_user_file(out: Path) -> None:
    """An artifact whose manifest names a user's file as its module (a manifest is data)."""
    _artifact_plus_a_file(out)
    (out / "notes.txt").unlink()
    (out / "src").mkdir()
    (out / "src" / "main.js").write_text("keep me")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "module": "src/main.js"}))


def _artifact_plus_an_empty_directory(out: Path) -> None:
    assert invoke(*BUILD, "--op", "leaky_relu", "--shape", "4", "-o", str(out)).exit_code == 0
    (out / "photos").mkdir()


@pytest.mark.parametrize(
    "prepare,message",
    [
        (_plain_files, "is not an artifact"),
        (_empty_manifest_and_sources, "is not an artifact"),
        (_artifact_plus_a_file, "holds notes.txt, which no deploy build wrote"),
        (_artifact_claiming_a_user_file, "is not an artifact"),
        (_artifact_plus_an_empty_directory, "holds photos, which no deploy build wrote"),
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
    assert (out / "photos").is_dir() or prepare is not _artifact_plus_an_empty_directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left behind


def test_a_bundle_whose_sha256sums_lists_a_users_file_is_not_replaced(tmp_path):
    """A rebuild removed every file a bundle's SHA256SUMS listed, a user's file added to it too:
    the list is trusted only as the manifest pins it."""
    out = tmp_path / "out"
    build = [*BUILD, "--op", "add", "--shape", "4", "--shape", "4", "--bundle", "-o", str(out)]
    assert invoke(*build).exit_code == 0
    (out / "app.c").write_text("int main(void) { return 0; }\n")
    with (out / "SHA256SUMS").open("a") as sums:
        sums.write(f"{hashlib.sha256((out / 'app.c').read_bytes()).hexdigest()}  app.c\n")
    result = invoke(*build)
    assert result.exit_code == 2 and "its SHA256SUMS is not the one its build wrote" in result.stderr
    assert (out / "app.c").read_text() == "int main(void) { return 0; }\n"


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


def test_a_build_removes_what_killed_builds_left_and_nothing_else(tmp_path):
    """A SIGKILLed export leaves what it set aside beside its artifact: the artifact it was
    writing, and, killed between the two renames of the swap, the earlier artifact with its place
    empty. The next export into that directory removes the first and puts the second back.
    Look-alikes without deploy's mark (a user's, or a link to one) stay."""
    from deploy.compiler.export import _set_aside
    from deploy.compiler.manifest import PARTIAL

    out = tmp_path / "out"
    assert invoke(*BUILD, "--op", "leaky_relu", "--shape", "4", "-o", str(out)).exit_code == 0
    killed_writing = _set_aside(tmp_path, ".other.")
    (killed_writing / "module.so").write_bytes(b"half a mod")
    killed_swapping = _set_aside(tmp_path, ".out.old.")
    out.rename(killed_swapping / "previous")
    swapped_in = _set_aside(tmp_path, ".out.")  # the new artifact, still marked: the swap's second half
    (swapped_in / "manifest.json").write_text("{}")
    users = tmp_path / ".out.0123abcd"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    marked = users / "marked"  # marked, but reached through a link
    marked.mkdir()
    (marked / PARTIAL).write_text("")
    (tmp_path / ".out.old.4567cdef").symlink_to(marked)
    built = invoke(*BUILD, "--op", "add", "--shape", "3", "--shape", "3", "-o", str(tmp_path / "other"))
    assert built.exit_code == 0, built.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".out.0123abcd", ".out.old.4567cdef", "other", "out"]
    assert json.loads((out / "manifest.json").read_text())["inputs"][0]["shape"] == [4]
    assert (users / "notes.txt").read_text() == "keep me" and (marked / PARTIAL).exists()
    assert not (out / PARTIAL).exists() and not (tmp_path / "other" / PARTIAL).exists()
    (out / PARTIAL).write_text("")  # killed after the swap, before the mark went: still deploy's
    again = invoke(*BUILD, "--op", "leaky_relu", "--shape", "5", "-o", str(out))
    assert again.exit_code == 0 and not (out / PARTIAL).exists(), again.stderr


@pytest.mark.parametrize(
    "env",
    [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}],
    ids=["ascii", "C locale"],
)
def test_a_stream_that_cannot_encode_a_character_prints_a_question_mark(env):
    """The `\u2026` in `deploy targets` was `error: UnicodeEncodeError: 'ascii' codec can't encode
    character '\\u2026'` on an ASCII stream (click's own lines pick UTF-8 there; rich's tables
    write to the stream as it is)."""
    listed = run_deploy("targets", env=env)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert "?" in listed.stdout and "\u2026" not in listed.stdout


STOPPED_MID_PASS = """
import os, signal, sys
import deploy.compiler.tir_passes as tir_passes
from deploy.cli.main import main

rewrite = tir_passes._stride2_to_shuffle
sent = []

def stopped_here(load, *args):  # TVM calls it from a TIR pass of ours: the signal comes in there
    if not sent:  # once: the pass goes on after the stop, on a thread the command abandons
        sent.append(os.kill(os.getpid(), int(sys.argv[1])))
    return rewrite(load, *args)

tir_passes._stride2_to_shuffle = stopped_here
main(sys.argv[2:])
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize(
    "command",
    [
        ["build", "--op", "max_pool2d", "-a", "kernel=2", "--shape", "1x1x8x8", "--target", "x86"],
        ["test", "--op", "max_pool2d", "--target", "x86"],  # whose cases catch every failure
    ],
    ids=["build", "test"],
)
def test_a_signal_inside_a_tvm_pass_stops_the_command_as_that_signal(sig, command, tmp_path):
    """TVM's FFI hands an exception raised in a Python callback it calls back as a RuntimeError:
    Ctrl-C or SIGTERM mid-compile ended a build as `error: RuntimeError: SIGTERM`, exit 1, and
    failed one case of `deploy test`, which went on with the next."""
    run = [sys.executable, "-c", STOPPED_MID_PASS, str(int(sig)), *command]
    done = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert (done.returncode, done.stderr.strip()) == (128 + sig, f"error: stopped by {sig.name}")
    assert list(tmp_path.iterdir()) == [], "nothing is written"


ANNOUNCED_COMPILE = """
import sys
import deploy.compiler.shared_object as shared_object
from deploy.cli.main import main

compile_cpu = shared_object.compile_cpu

def announced(*args):
    print("compiling", file=sys.stderr, flush=True)
    return compile_cpu(*args)

shared_object.compile_cpu = announced
main(sys.argv[1:])
"""


def _chain_model(path: Path, nodes: int) -> None:
    """An ONNX chain of `nodes` alternating Add and LeakyRelu on [1, 8, 16, 16]."""
    import onnx
    from onnx import TensorProto, helper

    made, last = [], "a"
    attrs: dict[str, Any]
    for i in range(nodes):
        ins, kind, attrs = ([last, "b"], "Add", {}) if i % 2 == 0 else ([last], "LeakyRelu", {"alpha": 0.1})
        made.append(helper.make_node(kind, ins, [f"t{i}"], f"n{i}", **attrs))
        last = f"t{i}"
    shaped = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 16, 16]) for n in ("a", "b", last)]
    graph = helper.make_graph(made, "chain", shaped[:2], shaped[2:])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_signal_during_a_long_compile_stops_the_build_at_once(tmp_path):
    """A 600-node graph's TIR pipeline is one call into TVM of about 10 s (a 2,000-node one's 37 s),
    and a signal's handler runs only when Python gets control back: SIGTERM waited for it."""
    import time

    model = tmp_path / "chain.onnx"
    _chain_model(model, 600)
    command = [sys.executable, "-c", ANNOUNCED_COMPILE, "build", "--model", str(model), "--target", "x86"]
    build = subprocess.Popen(
        command, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    assert build.stderr is not None
    assert build.stderr.readline() == "compiling\n"
    time.sleep(0.5)
    sent = time.monotonic()
    build.send_signal(signal.SIGTERM)
    said = build.stderr.read()
    took = time.monotonic() - sent
    assert (build.wait(), said.strip()) == (128 + signal.SIGTERM, "error: stopped by SIGTERM")
    assert took < 3, f"stopped {took:.1f} s after SIGTERM"
    assert list(tmp_path.iterdir()) == [model], "nothing is written"


def test_a_paths_undecodable_bytes_print_as_they_were_read():
    """The C locale reads a path's bytes it cannot decode as surrogates and prints them back as
    those bytes (surrogateescape): `?` would name another file."""
    from deploy.cli.main import UNENCODABLE

    assert "f\udce9 \u2026".encode("ascii", UNENCODABLE) == b"f\xe9 ?"


def test_console_script_prints_no_traceback():
    proc = run_deploy("build", "--op", "add", "--target", "x86", "--shape", "3x4", "--shape", "5")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]


def test_debug_shows_the_traceback():
    proc = run_deploy("--debug", "build", "--op", "nope", "--target", "x86", "--shape", "3")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize("value", ["100000", "abc", "0", "-1"])
def test_tvm_num_threads_is_checked_before_any_work(value):
    """100000 aborted a `deploy run` (`terminate called without an active exception`, exit 134),
    500 kept a finished one alive for minutes; TVM ignored the others without a word."""

    done = run_deploy("targets", env={"TVM_NUM_THREADS": value})
    cpus = host_cpus()
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"error: TVM_NUM_THREADS='{value}': expected a thread count from 1 to {cpus} (this host's CPUs)",
    )
    assert run_deploy("targets", env={"TVM_NUM_THREADS": ""}).returncode == 0, "empty is unset"


@pytest.mark.parametrize(
    "variable,make,said",
    [
        ("DEPLOY_CACHE_DIR", "file", "is not a directory: expected one"),
        ("DEPLOY_CACHE_DIR", "dangling", "is a dangling symlink: expected a directory"),
        ("XDG_CONFIG_HOME", "file", "is not a directory: expected one"),
        ("DEPLOY_EMULATOR_DIR", "file", "is not a directory: expected one"),
    ],
)
def test_a_cache_or_config_place_that_is_no_directory_is_named(variable, make, said, tmp_path):
    """A file or a dangling link where the cache or config directory goes was `NotADirectoryError`
    or `FileExistsError` (exit 1) from the first mkdir, mid-command."""
    place = tmp_path / "place"
    if make == "file":
        place.write_text("mine")
    else:
        place.symlink_to(tmp_path / "gone")
    done = run_deploy("targets", env={variable: str(place)})
    assert (done.returncode, done.stderr.strip()) == (2, f"error: {place} (from ${variable}) {said}")
    assert place.is_symlink() or place.read_text() == "mine"


def test_a_tilde_in_deploys_variables_is_home_and_a_relative_xdg_place_is_ignored(tmp_path):
    """`DEPLOY_CACHE_DIR="~/c"` (quoted, or a Dockerfile's ENV: no shell expanded it) made a
    directory named `~` in the current one; a relative `XDG_CONFIG_HOME` put the boards under
    the current directory, which the XDG Base Directory spec says to ignore."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HOME": str(home), "DEPLOY_CACHE_DIR": "~/c", "XDG_CONFIG_HOME": "rel"}
    status = subprocess.run(
        [DEPLOY, "device", "emulator", "status"], cwd=work, env=env, capture_output=True, text=True
    )
    assert f"({home / 'c' / 'emulator'})" in status.stdout, status.stdout + status.stderr
    added = subprocess.run(
        [DEPLOY, "device", "add", "b1", "--host", "10.0.0.1", "--user", "pi"],
        cwd=work,
        env=env,
        capture_output=True,
    )
    assert added.returncode == 0, added.stderr
    assert (home / ".config" / "deploy" / "devices.json").is_file() and list(work.iterdir()) == []


@pytest.mark.parametrize(
    "env,said",
    [
        ({"PATH": "/nonexistent"}, "no g++, gcc or clang++ on PATH (Debian: g++)"),
        ({"CXX": "/nonexistent/g++"}, "CXX or CC is '/nonexistent/g++', not a program (Debian: g++)"),
        ({"CXX": "FAILING"}, "linking module.so for target x86 failed: /usr/bin/ld: cannot find -lstdc++"),
    ],
)
def test_a_missing_or_failing_host_compiler_is_named(env, said, tmp_path):
    """TVM links x86 modules with $CXX, else the first compiler on PATH: none was `TypeError:
    expected str ... not NoneType`, a missing one a FileNotFoundError, a failing one
    `RuntimeError: Compilation error:` with the compiler's own words cut off (the cause, not the
    driver's closing `collect2: error` line, is named)."""
    failing = tmp_path / "g++"
    failing.write_text(
        '#!/bin/sh\necho "/usr/bin/ld: cannot find -lstdc++" >&2\n'
        'echo "collect2: error: ld returned 1 exit status" >&2\nexit 1\n'
    )
    failing.chmod(0o755)
    env = {k: str(failing) if v == "FAILING" else v for k, v in env.items()}
    out = tmp_path / "o"
    done = run_deploy(*BUILD, "--op", "add", "--shape", "3x5", "--shape", "3x5", "-o", str(out), env=env)
    assert done.returncode == 1 and done.stderr.strip().endswith(said), done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "name,said",
    [
        ("a" * 242, "its name is over 241 bytes (it is written beside itself first, under a longer name)"),
        ("a" * 300, "File name too long"),
        ("loop/x", "symlink"),  # 3.11: "Symlink loop from"; 3.13: "Too many levels of symbolic links"
    ],
)
def test_an_output_name_the_file_system_refuses_is_one_line(name, said, tmp_path):
    """A 250-byte name (valid) failed on its 10-byte-longer staging name with `OSError: [Errno 36]`
    (exit 1), a 241-byte one built once and failed every rebuild; a symlink loop was a RuntimeError."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    done = run_deploy(*BUILD, "--op", "add", "--shape", "4", "--shape", "4", "-o", str(tmp_path / name))
    assert done.returncode == 2 and said.lower() in done.stderr.lower(), done.stderr
    assert len(done.stderr.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def test_an_output_name_of_241_bytes_builds_and_rebuilds(tmp_path):
    out = tmp_path / ("a" * 241)
    for _ in range(2):
        done = run_deploy(*BUILD, "--op", "add", "--shape", "4", "--shape", "4", "-o", str(out))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


ROW_SUM = '''
from tvm import te

from deploy.ops import Case, Input, Op, TensorType, register
from deploy.schedules.registry import register_schedule


@register
class RowSum(Op):
    """The sum of each row."""

    name = "row_sum_bad_schedule"
    inputs = (Input("x", 2, 2),)
    dtypes = ("float32",)
    cases = (Case(((4, 8),)),)

    def infer(self, attrs, inputs):
        return TensorType((inputs[0].shape[0],), inputs[0].dtype)

    def compute(self, attrs, out, x):
        k = te.reduce_axis((0, x.shape[1]), "k")
        return te.compute(out.shape, lambda i: te.sum(x[i, k], axis=k), name="out")

    def reference(self, attrs, x):
        return x.sum(axis=1)


@register_schedule("cpu", "row_sum_bad_schedule")
def parallel_reduction(sch, ctx):
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    sch.parallel(sch.get_loops(block)[-1])  # the reduction loop: TVM refuses
'''


@pytest.mark.parametrize("debug", [False, True])
def test_a_schedule_error_names_the_primitive_and_tvms_reason(tmp_path, debug):
    """Issue #51: `ScheduleError: An error occurred in the schedule primitive 'parallel'` alone,
    even with --debug; TVM's reason comes after the IR it renders."""
    (tmp_path / "row_sum.py").write_text(ROW_SUM)
    flags = ["--debug"] if debug else []
    proc = run_deploy(*flags, "--ops-path", str(tmp_path), "build", "--op", "row_sum_bad_schedule",
                      "--shape", "4x8", "--target", "x86", "-o", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 1
    (line,) = [text for text in proc.stderr.splitlines() if text.startswith("error: ")]
    assert line.startswith("error: ScheduleError: primitive 'parallel': The \"parallel\" cannot be fulfilled")
    assert "is not a data parallel block iter" in line
