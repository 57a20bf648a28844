"""`deploy tune`: MetaSchedule on the real devices, records that survive interrupts, `--tuned` builds.

Tuning runs are tiny (a few trials) and marked slow; every one is a real search measured on the
device (x86: this host's worker processes; arm: the qemu-aarch64 emulator).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.base.threads import host_cpus
from deploy.base.tvm_workers import worker_env
from deploy.compiler.options import BuildOptions
from tests.conftest import DEPLOY, invoke, run_deploy
from tests.test_arm import needs_cross, needs_qemu
from tests.test_opencl import DEVICES as OPENCL_DEVICES

MAX_POOL_OP = ["--op", "max_pool2d", "-a", "kernel=3", "-a", "stride=2", "-a", "padding=1"]
MAX_POOL = [*MAX_POOL_OP, "--shape", "1x16x28x28"]


def test_tvms_workers_import_it_without_torch_and_keep_their_own_sitecustomize(tmp_path: Path) -> None:
    """The processes MetaSchedule and the tracker start (`worker_env`: a sitecustomize importing
    deploy) import TVM without torch, 4 s sooner each; a sitecustomize the Python had still runs,
    and torch still imports for anyone else."""
    pytest.importorskip("torch", reason="torch is what TVM would import (pip install torch==2.13.0)")
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITE_RAN'] = '1'\n")
    env = worker_env({**os.environ, "PYTHONPATH": f"{own}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    script = (
        "import os, sys, tvm\n"
        "print('torch' in sys.modules, os.environ.get('OWN_SITE_RAN'))\n"
        "import torch\n"
        "print(torch.zeros(2).sum().item())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "1", "0.0"]


def task_dir(db: Path, target: str) -> Path:
    (found,) = [p for p in (db / target).iterdir() if p.is_dir()]
    return found


def records(task: Path) -> list[str]:
    path = task / "database_tuning_record.json"
    return path.read_text().splitlines() if path.exists() else []


def manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def assert_built_as_judged(out: Path, verdict: dict) -> None:
    """A `--tuned` build runs the accepted record, or says tuning kept the hand schedule."""
    if verdict["record"]:
        assert manifest(out)["schedule"] == "tuned" and manifest(out)["tuning_record"] == verdict["record"]
        assert verdict["hand_ms"] - verdict["ms"] > max(verdict["spread_ms"], verdict["hand_spread_ms"])
    else:
        assert manifest(out)["schedule"] != "tuned"
        assert manifest(out)["tuning"] == "hand, tuning found nothing faster"


@pytest.mark.slow
def test_tune_x86_locally_then_build_run_and_report_from_the_records(tmp_path: Path) -> None:
    db = tmp_path / "db"
    scratch = tmp_path / "tmp"  # the tune's temporary files: every candidate's left one here
    scratch.mkdir()
    tuned = run_deploy("tune", *MAX_POOL, "--target", "x86", "--trials", "6", "--db", str(db),
                       env={"TMPDIR": str(scratch)})  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("deploy-tune-")], "candidates left"
    task = task_dir(db, "x86")
    verdict = json.loads((task / "accepted.json").read_text())
    assert verdict["device"] == "local" and verdict["hand_ms"] > 0 and verdict["records"] == 6
    assert not verdict["record"] or verdict["sha256"][:12] == verdict["record"]  # pinned
    assert ("accepted record" if verdict["record"] else "kept the hand schedule") in tuned.stdout
    assert "; best while searching " in tuned.stdout  # two times of one run are told apart (#36)
    assert len(records(task)) == 6
    assert json.loads((task / "task.json").read_text())["op"] == "max_pool2d"
    assert {json.loads(line)[0] for line in records(task)} == {0, 1}  # both structures measured

    out = tmp_path / "art"
    built = run_deploy("build", *MAX_POOL, "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert_built_as_judged(out, verdict)

    other = tmp_path / "other"
    fallback = run_deploy("build", *MAX_POOL_OP, "--shape", "1x16x30x30", "--target", "x86",
                          "--tuned", str(db), "-o", str(other))  # fmt: skip
    assert fallback.returncode == 0, fallback.stderr
    assert "were not tuned in" in fallback.stdout
    assert manifest(other)["schedule"] == "cpu/max_pool2d" and manifest(other)["tuning"] is None

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 16, 28, 28)).astype("float32"))
    ran = run_deploy("run", *MAX_POOL_OP, "--target", "x86", "--tuned", str(db),
                     "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "c.npy"), "--check")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ("(tuned)" if verdict["record"] else "(hand, tuning found nothing faster)") in ran.stdout
    assert "check passed" in ran.stdout

    report = run_deploy("tune", "--report", "--target", "x86", "--db", str(db))
    assert report.returncode == 0, report.stderr
    assert (db / "x86" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (row,) = json.loads((db / "x86" / "report.json").read_text())["rows"]
    assert row["tuned_record"] == verdict["record"]
    assert row["default_ms"] > 0 and row["hand_ms"] > 0 and row["tuned_ms"] > 0
    assert row["verdict"] == ("tuned" if verdict["record"] else "hand kept")
    assert_a_column_stage_record_builds_as_recorded(tmp_path, db, task, verdict)


def assert_a_column_stage_record_builds_as_recorded(
    tmp_path: Path, db: Path, task: Path, verdict: dict
) -> None:
    """A verdict naming a record of the column-stage structure (planted: which structure wins
    depends on the host) builds it: the record applies only to that structure's computation, so
    `"schedule": "tuned"` shows the structure in accepted.json's "compute" was built."""
    from deploy.compiler.targets import get_target
    from deploy.ops import TensorType, bind, get_op
    from deploy.tune import records as db_records
    from deploy.tune.metaschedule import compute_variants

    pool = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), pool, [TensorType((1, 16, 28, 28), "float32")])
    staged, _ = compute_variants(bound, get_target("x86"), BuildOptions())  # the hand structure, first
    assert staged.picks == {"max columns first": True}
    record = db_records.TaskRecords.load(task, staged.mod).valid()[0]
    pin = db_records.record_sha256(record)
    planted = verdict | {"record": db_records.record_id(record), "sha256": pin, "compute": staged.picks}
    (task / "accepted.json").write_text(json.dumps(planted))
    out = tmp_path / "staged"
    built = run_deploy("build", *MAX_POOL, "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert manifest(out)["schedule"] == "tuned" and manifest(out)["tuning_record"] == planted["record"]
    ran = run_deploy("run", *MAX_POOL_OP, "--target", "x86", "--tuned", str(db),
                     "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "d.npy"), "--check")  # fmt: skip
    assert ran.returncode == 0 and "check passed" in ran.stdout, ran.stderr
    without = planted | {"compute": {}}  # the same record against the plain computation: no match
    (task / "accepted.json").write_text(json.dumps(without))
    fallback = run_deploy("build", *MAX_POOL, "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert fallback.returncode == 0, fallback.stderr
    assert manifest(out)["schedule"] == "cpu/max_pool2d"
    assert "warning: " in fallback.stderr and "which the x86 strategy does not build" in fallback.stderr


@pytest.mark.slow
def test_a_record_slower_than_the_hand_schedule_is_never_accepted(tmp_path: Path) -> None:
    """A record that the search ranks first but that really runs slower (here the function with
    its loops reversed, so that the innermost steps across batch items 784 KiB apart: about 12x
    the hand schedule's time here; planted with a search time of 1 ns) loses to the hand schedule
    when both are timed in one session: the hand schedule stays. The search's own record (the
    hand schedule with a unit split) compiles to the hand's module byte for byte and is not
    timed: beside the hand, two builds of one code differ by noise alone, and once it came out
    ahead by more than the spread and was accepted."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from deploy.cli.options import resolve_build
    from deploy.compiler.compile import prim_module
    from deploy.ops import TensorType, bind, get_op

    db = tmp_path / "db"
    shape = "8x64x56x56"
    args = ["--op", "add", "--shape", shape, "--shape", shape, "--target", "x86", "--db", str(db)]
    first = run_deploy("tune", *args, "--trials", "1")  # the hand schedule itself, measured
    assert first.returncode == 0, first.stderr
    assert first.stdout.index("default build (cpu/") < first.stdout.index("1 records in")  # checked first
    task = task_dir(db, "x86")
    target, options = resolve_build("x86", cores=host_cpus())
    mod = prim_module(bind(get_op("add"), {}, [TensorType((8, 64, 56, 56), "float32")] * 2), target, options)
    database = ms.database.JSONDatabase(work_dir=str(task))
    reversed_loops = tvm.s_tir.Schedule(mod)
    reversed_loops.reorder(*reversed(reversed_loops.get_loops(reversed_loops.get_sblock("out"))))
    unscheduled = ms.database.TuningRecord(
        reversed_loops.trace, database.commit_workload(mod), [1e-9],
        target.tvm_target(num_cores=host_cpus()), ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
    )  # fmt: skip
    database.commit_tuning_record(unscheduled)

    judged = run_deploy("tune", *args, "--trials", "2")  # no new search: judges the two records
    assert judged.returncode == 0, judged.stderr
    assert "kept the hand schedule" in judged.stdout
    assert "default " in judged.stdout and " ms / best found " in judged.stdout
    verdict = json.loads((task / "accepted.json").read_text())
    assert verdict["record"] is None and verdict["records"] == 2
    assert len(verdict["same_as_hand"]) == 1  # the search's own record, the hand's module
    assert "1 of the fastest records compile to the hand schedule's own module" in judged.stdout
    assert verdict["best_tuned_ms"] > verdict["hand_ms"]  # the planted record, the only one timed

    out = tmp_path / "art"
    built = run_deploy("build", *args[:6], "--target", "x86", "--tuned", str(db), "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert "hand, tuning found nothing faster" in built.stdout
    assert_built_as_judged(out, verdict)


def _wait_for_records(proc: subprocess.Popen[str], db: Path, timeout_s: float = 300) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        tasks = list((db / "x86").glob("*/database_tuning_record.json")) if (db / "x86").exists() else []
        if tasks and tasks[0].read_text().count("\n"):
            return tasks[0].read_text().count("\n")
        time.sleep(0.5)
    raise AssertionError("no record written in time")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])  # SIGTERM stops as SIGINT: test_errors.py
def test_an_interrupted_tune_keeps_its_records_and_continues(tmp_path: Path, how: str) -> None:
    db = tmp_path / "db"
    scratch = tmp_path / "tmp"  # its candidates' directory: a SIGKILL leaves it, here not in /tmp
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    command = [DEPLOY, "tune", "--op", "argmax", "--shape", "64x1000", "--target", "x86", "--trials", "40",
               "--db", str(db)]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)  # fmt: skip
    try:
        _wait_for_records(proc, db)
        if how == "ctrl-c":  # the batch under way finishes and is recorded
            sig = signal.SIGINT
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 128 + sig, err
            assert "run the same command to continue" in err
            assert not list(scratch.glob("deploy-tune-*")), "a stopped tune left its candidates"
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            # a write cut in half by the kill: the next run drops the partial line, keeps the rest
            with (task_dir(db, "x86") / "database_tuning_record.json").open("a") as stream:
                stream.write('[0, [["half a rec')
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    task = task_dir(db, "x86")
    kept = len([line for line in records(task) if line.endswith("]")])
    assert kept >= 1

    again = run_deploy(*command[1:-4], "--trials", str(kept + 4), "--db", str(db), env=env)
    assert again.returncode == 0, again.stderr
    assert f"continuing: {kept} records already in" in again.stdout
    after = records(task)
    assert kept < len(after) <= kept + 4, "the second run adds records instead of starting over"
    assert all(line.endswith("]") for line in after)
    assert (task / "accepted.json").exists()


@pytest.mark.slow
@pytest.mark.emulator
@needs_cross
@needs_qemu
def test_tune_add_for_arm_on_the_emulator_then_test_uses_the_records(tmp_path: Path) -> None:
    db = tmp_path / "db"
    shapes = ["--shape", "7x13", "--shape", "7x13"]  # the shapes of one of add's own test cases
    tuned = run_deploy("tune", "--op", "add", *shapes, "--target", "arm", "--trials", "3", "--db", str(db))
    assert tuned.returncode == 0, tuned.stderr
    assert "on emulator" in tuned.stdout
    task = task_dir(db, "arm")
    assert len(records(task)) == 3
    verdict = json.loads((task / "accepted.json").read_text())
    assert verdict["device"] == "emulator"

    out = tmp_path / "art"
    built = run_deploy("build", "--op", "add", *shapes, "--target", "arm", "--tuned", str(db), "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert_built_as_judged(out, verdict)

    tested = run_deploy(
        "test",
        "--target",
        "arm",
        "--op",
        "add",
        "--dtype",
        "float32",
        "--tuned",
        str(db),
        env={"COLUMNS": "250"},
    )  # fmt: skip  (80 would wrap the schedule cell of a hand verdict)
    assert tested.returncode == 0, tested.stdout
    used = "tuned" if verdict["record"] else "(hand, tuning found nothing faster)"
    assert used in tested.stdout, "the case with the tuned shapes followed the verdict"


@pytest.mark.slow
@pytest.mark.emulator
@needs_cross
@needs_qemu
def test_a_candidate_that_crashes_or_hangs_the_device_fails_alone(tmp_path: Path) -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.script import tirx as T

    from deploy.compiler.compile import prim_module
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.ops import TensorType, bind, get_op
    from deploy.tune.runner import Signature, export_candidate, session_runner

    @T.prim_func
    def hangs(a: T.Buffer((7, 13), "float32"), b: T.Buffer((7, 13), "float32"),
              c: T.Buffer((7, 13), "float32")):  # fmt: skip
        i = T.alloc_buffer((1,), "int32", scope="local")
        i[0] = 0
        while i[0] >= 0:
            i[0] = (i[0] + 1) % 7

    @T.prim_func
    def crashes(a: T.Buffer((7, 13), "float32"), b: T.Buffer((7, 13), "float32"),
                c: T.Buffer((7, 13), "float32")):  # fmt: skip
        wild = T.decl_buffer((1,), "float32", data=T.reinterpret("handle", T.uint64(8)))
        c[0, 0] = wild[0]

    target = get_target("arm")
    bound = bind(get_op("add"), {}, [TensorType((7, 13), "float32")] * 2)
    candidates = [crashes, hangs, prim_module(bound, target, BuildOptions())["main"]]
    built = [tvm.compile(tvm.IRModule({"main": f}), target=target.tvm_target()) for f in candidates]
    paths = [
        export_candidate(target, BuildOptions(), Signature.of(bound), str(tmp_path), module)
        for module in built
    ]
    with get_device("emulator").rpc_endpoint() as endpoint:
        measuring = session_runner(endpoint, bound, timeout_s=5.0)
        inputs = [ms.runner.RunnerInput(p, "cpu", []) for p in paths]
        results = [f.result() for f in measuring.runner.run(inputs)]
    assert measuring.lost() is None, "a candidate that fails does not lose the device"
    crashed, hung, good = results
    assert "crashed the device's session" in crashed.error_msg and not crashed.run_secs
    assert "ran over the 5 s limit" in hung.error_msg and not hung.run_secs
    assert good.error_msg is None and len(good.run_secs) == 3


@pytest.mark.skipif(not OPENCL_DEVICES, reason="needs pyopencl and an OpenCL platform (pocl-opencl-icd)")
def test_tune_opencl_work_group_then_build_and_continue(tmp_path: Path) -> None:
    db = tmp_path / "db"
    args = [*MAX_POOL, "--target", "opencl", "--db", str(db)]
    first = run_deploy("tune", *args, "--trials", "2")
    assert first.returncode == 0, first.stderr
    task = task_dir(db, "opencl")
    tried = json.loads((task / "work_groups.json").read_text())["trials"]
    assert [t["work_group"] for t in tried] == [64, 128]
    again = run_deploy("tune", *args, "--trials", "3")
    assert "continuing: 2 records already in" in again.stdout
    tried = json.loads((task / "work_groups.json").read_text())["trials"]
    assert [t["work_group"] for t in tried] == [64, 128, 32], "only the missing size ran"
    verdict = json.loads((task / "accepted.json").read_text())
    fastest = min(tried, key=lambda t: t["ms"])["work_group"]
    if verdict["record"]:  # another size beat the default beyond the spread
        assert verdict["work_group"] == fastest != 64 and verdict["record"] == f"work_group={fastest}"

    out = tmp_path / "art"
    built = run_deploy("build", *MAX_POOL, "--target", "opencl", "--tuned", str(db), "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert_built_as_judged(out, verdict)
    (kernel,) = json.loads((out / "launch.json").read_text())["kernels"]
    assert kernel["local"][0] == (verdict["work_group"] if verdict["record"] else 64)

    report = run_deploy("tune", "--report", "--target", "opencl", "--db", str(db))
    assert report.returncode == 0, report.stderr
    (row,) = json.loads((db / "opencl" / "report.json").read_text())["rows"]
    assert row["default_ms"] is None and row["hand_ms"] > 0 and row["tuned_ms"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "x86"], "--op or --model is required"),
        (["--target", "x86", "--op", "add"], "--shape is required"),
        (["--target", "x86", "--op", "add", "--shape", "4", "--shape", "4", "--trials", "0"], "--trials 0"),
        (["--target", "x86", "--report", "--db", "/nonexistent/db"], "nothing tuned for target x86"),
        (["--target", "arm", "--op", "add", "--shape", "4", "--shape", "4", "--device", "local"], "x86_64"),
    ],
)
def test_bad_tune_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = invoke("tune", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_tuned_needs_an_existing_directory() -> None:
    shapes = ["--shape", "4", "--shape", "4"]
    result = invoke("build", "--op", "add", "--target", "x86", *shapes, "--tuned", "/nope")
    assert result.exit_code == 2 and "--tuned /nope: no such directory" in result.output


def test_a_half_written_last_line_is_dropped_and_complete_ones_stay(tmp_path: Path) -> None:
    from deploy.tune.records import drop_partial_lines

    (tmp_path / "database_tuning_record.json").write_text('[0, "a"]\n[0, "b"]\n[0, "c')
    (tmp_path / "database_workload.json").write_text('["w"]\n')
    assert drop_partial_lines(tmp_path) == 1
    assert (tmp_path / "database_tuning_record.json").read_text() == '[0, "a"]\n[0, "b"]\n'
    assert (tmp_path / "database_workload.json").read_text() == '["w"]\n'


def test_a_task_file_that_is_a_link_a_fifo_or_a_directory_is_refused_untouched(tmp_path: Path) -> None:
    """MetaSchedule appends to the database files: a link would have it write to (and deploy cut
    the last line off) a user's file, a FIFO or /dev/zero would block or fill memory."""
    db = tmp_path / "db"
    tune = ["tune", "--op", "leaky_relu", "--shape", "4x64", "--target", "x86", "--db", str(db)]
    assert invoke(*tune, "--trials", "1").exit_code == 0
    path = task_dir(db, "x86") / "database_tuning_record.json"
    precious = tmp_path / "precious.txt"
    precious.write_text("keep 1\nkeep 2 (no newline)")
    path.unlink()
    path.symlink_to(precious)
    result = invoke(*tune, "--trials", "2")
    assert result.exit_code == 2, result.output
    expected = f"error: {path} is a symbolic link; deploy tune writes its database files itself"
    assert result.output.strip() == expected
    assert precious.read_text() == "keep 1\nkeep 2 (no newline)"
    path.unlink()
    os.mkfifo(path)
    result = invoke(*tune, "--trials", "2")
    assert result.exit_code == 2 and f"{path} is not a regular file" in result.output, result.output
    path.unlink()
    verdict = path.with_name("accepted.json")
    verdict.unlink(missing_ok=True)
    verdict.mkdir()  # failed the run at its end, every trial done, with an IsADirectoryError line
    result = invoke(*tune, "--trials", "2")
    assert result.exit_code == 2 and f"{verdict} is not a regular file" in result.output, result.output


@pytest.mark.parametrize(
    "run_secs, mean",
    [
        ([1e-3, 3e-3], 2e-3),
        ([-1.0, -1.0, -1.0], math.inf),
        ([0.0], math.inf),
        ([math.nan, 1e-3], math.inf),
        ([], math.inf),
    ],
)
def test_a_record_with_an_impossible_time_counts_as_failed(run_secs, mean) -> None:
    """A hand-edited record of -1 s made tune print `best -1000 ms` and rank it first."""
    from types import SimpleNamespace

    from deploy.tune.records import mean_secs

    assert mean_secs(SimpleNamespace(run_secs=run_secs)) == pytest.approx(mean)


def test_every_structure_enumerates_each_combination_once_defaults_first() -> None:
    """Picks made only under another pick (here "b", only when a == 2) are enumerated only there."""
    from deploy.schedules.registry import Picked, every_structure

    def run(picks: dict) -> tuple[Picked, tuple]:
        choices = Picked(picks)
        a = choices.pick("a", (1, 2, 3), 1)
        b = choices.pick("b", ("x", "y"), "x") if a == 2 else None
        return choices, (a, b, choices.pick("c", (True, False), True))

    results = [result for _, result in every_structure(run)]
    assert results[0] == (1, None, True)
    expected = {
        (a, b, c) for a in (1, 2, 3) for b in (("x", "y") if a == 2 else (None,)) for c in (True, False)
    }
    assert len(results) == len(expected) and set(results) == expected
    assert len(every_structure(run, most=3)) == 3


INTRINSICS_PROBE = """
import sys
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from deploy.tune.metaschedule import cpu_intrinsics_only

cpu_intrinsics_only()
k = te.reduce_axis((0, 64), "k")
a, b = te.placeholder((64, 64), "uint8", name="a"), te.placeholder((64, 64), "int8", name="b")
c = te.compute((64, 64), lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k))
target = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
context = ms.TuneContext(te.create_prim_func([a, b, c]), target=target, space_generator="post-order-apply")
print(all("dot_16x4_vnni" in str(space.trace) for space in context.generate_design_space()))
print(sorted(name for name in sys.modules if name.startswith("tvm.s_tir.tensor_intrin.")))
"""


def test_tuning_registers_the_cpu_intrinsics_and_skips_the_gpu_ones() -> None:
    """MetaSchedule's VNNI rule still finds its intrinsic (an int8 product is tensorized with
    it), and a RISC-V TuneContext finds RVV's registration, while the CUDA, ROCm and Hexagon
    intrinsics that cost every `deploy tune` 15-20 s of TVMScript parsing are never imported, not
    even by the TuneContext."""
    probe = subprocess.run([sys.executable, "-c", INTRINSICS_PROBE], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    tensorized, modules = probe.stdout.splitlines()
    assert tensorized == "True"
    loaded = [
        f"tvm.s_tir.tensor_intrin.{name}" for name in ("arm_cpu", "dot_product_common", "riscv_cpu", "x86")
    ]
    assert modules == str(loaded)


def test_without_a_verified_hand_the_fastest_verified_record_is_accepted(monkeypatch) -> None:
    """Issue #51: a hand schedule whose check failed (before the search) loses to any record that
    passed its own: the best verified record is kept and reported, never lost."""
    from deploy.tune import tuner
    from deploy.verify.measure import Measured

    times = {"slow": Measured(0.0, (3.0, 3.0, 3.0)), "fast": Measured(0.0, (2.0, 2.0, 2.0))}
    monkeypatch.setattr(
        tuner, "time_interleaved", lambda session, checked, rounds: [times[c] for c in checked]
    )
    nowhere: Any = None  # judge times through the patched time_interleaved, on no session
    by_name: dict[str, Any] = {"slow": "slow", "fast": "fast"}  # stand-ins for Checked builds
    verdict = tuner.judge(nowhere, None, by_name)
    assert verdict["record"] == "fast" and verdict["ms"] == 2.0 and verdict["hand_ms"] is None
    with_hand = tuner.judge(nowhere, by_name["slow"], {"fast": by_name["fast"]})
    assert with_hand["record"] == "fast" and with_hand["hand_ms"] == 3.0


def test_the_contenders_of_a_task_are_checked_against_one_draw_of_numpys_answers(
    tmp_path: Path, local_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging a search's finds checks each against numpy on the same seeded input sets: the
    reference runs as often for three contenders as for one build's check (once an input set,
    not once a contender); answers drawn for another item are refused."""
    from deploy.compiler.compile import compile_op
    from deploy.compiler.export import export
    from deploy.compiler.manifest import Manifest
    from deploy.compiler.targets import get_target
    from deploy.ops import TensorType, bind, get_op
    from deploy.ops.spec import BoundOp
    from deploy.tune import tuner
    from deploy.tune.tuner import judge_built
    from deploy.verify.measure import Answers, check_artifact

    bound = bind(get_op("add"), {}, [TensorType((7, 13), "float32")] * 2)
    compiled = compile_op(bound, get_target("x86"), BuildOptions())
    export(compiled, tmp_path / "one")
    calls: list[int] = []
    reference = BoundOp.references

    def counted(self: BoundOp, *arrays: np.ndarray) -> list[np.ndarray]:
        calls.append(1)
        return reference(self, *arrays)

    monkeypatch.setattr(BoundOp, "references", counted)
    assert check_artifact(local_session, bound, tmp_path / "one", Manifest.read(tmp_path / "one")) == 0
    once, calls[:] = len(calls), []
    monkeypatch.setattr(tuner, "ACCEPT_ROUNDS", 1)  # the verdict's timing is not what this checks
    verdict = judge_built(local_session, None, dict.fromkeys("abc", lambda: compiled), tmp_path)
    assert verdict["record"] in ("a", "b", "c") and not verdict["rejected"]
    assert len(calls) == once
    other = bind(get_op("add"), {}, [TensorType((7, 14), "float32")] * 2)
    said = r"answers for add \(7x13:float32, 7x13:float32\) asked of add \(7x14:float32"
    with pytest.raises(ValueError, match=said):
        Answers(bound).of(other)


def test_the_output_says_how_far_the_default_was_from_the_best() -> None:
    from deploy.cli.tune import default_over_best

    accepted = {"record": "r", "ms": 1.25, "hand_ms": 12.5}
    assert default_over_best(accepted) == "default 12.5 ms / best found 1.25 ms = 10.00x"
    kept = {"record": None, "best_tuned_ms": 13.0, "hand_ms": 12.5}
    assert default_over_best(kept) == "default 12.5 ms / best found 12.5 ms = 1.00x"
    assert default_over_best({"record": "r", "ms": 1.0, "hand_ms": None}) is None


WRONG_OP = '''
import numpy as np
from tvm import te, tirx

from deploy.ops import Case, Input, Op, register


@register
class OffByOne(Op):
    """x + 1, whose reference says x."""

    name = "off_by_one"
    inputs = (Input("x"),)
    dtypes = ("float32",)
    cases = (Case(((64, 64),)),)

    def infer(self, attrs, inputs):
        return inputs[0]

    def compute(self, attrs, out, x):
        return te.compute(out.shape, lambda *i: x[i] + tirx.const(1, "float32"), name="out")

    def reference(self, attrs, x):
        return x
'''


@pytest.mark.slow
def test_the_default_build_is_checked_before_the_search(tmp_path: Path) -> None:
    """Issue #51: the default build's check runs first (seconds) and its failure is said before
    any trial; with no verified record found, the tune ends as a failed check (exit 1)."""
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "off_by_one.py").write_text(WRONG_OP)
    db = tmp_path / "db"
    tuned = run_deploy("--ops-path", str(ops), "tune", "--op", "off_by_one", "--shape", "64x64",
                       "--target", "x86", "--trials", "2", "--db", str(db))  # fmt: skip
    assert tuned.returncode == 1, tuned.stderr
    assert "warning: the default build fails its check (" in tuned.stderr
    assert "|got-want| 1 > bound" in tuned.stderr
    assert "error: no record passed its check either" in tuned.stderr
    assert len(records(task_dir(db, "x86"))) == 2, "the search ran after the failed check"
