"""Tuning records are data read from disk: what `--tuned` builds check before building from them,
and what `deploy tune` refuses to tune from.

Records are planted here as `deploy tune` writes them (a MetaSchedule database and a verdict
pinning the accepted record), then tampered with; no search runs, except in the test of two
concurrent `deploy tune` runs of one task.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from tests.conftest import DEPLOY, invoke, run_deploy

ADD = ["--op", "add", "--shape", "4x4", "--shape", "4x4"]
MARKER = b"deploy-injected"
INJECTED_LLVM = (
    '@deploy_injected = global [16 x i8] c"deploy-injected\\00"\n'
    '@llvm.used = appending global [1 x ptr] [ptr @deploy_injected], section "llvm.metadata"\n'
)


def bound_add(shape: tuple[int, ...] = (4, 4)) -> Any:
    from deploy.ops import TensorType, bind, get_op

    return bind(get_op("add"), {}, [TensorType(shape, "float32")] * 2)


def plant(root: Path, schedule: Callable[[Any], None], bound: Any = None, **verdict: Any) -> tuple[Path, Any]:
    """A task of `add` for x86 under `root` holding one record (its computation scheduled by
    `schedule`), accepted as `deploy tune` accepts one (pinned by its sha256), with the `verdict`
    fields written over the verdict; returns (task directory, record)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from deploy.compiler.compile import prim_module
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import get_target
    from deploy.tune import records as db

    bound = bound or bound_add()
    target = get_target("x86")
    mod = prim_module(bound, target, BuildOptions())
    task = db.task_dir(root, bound, target.name)
    task.mkdir(parents=True)
    db.write_json(task / db.TASK, {**bound.key(), "target": target.name, "device": "local"})
    sch = tvm.s_tir.Schedule(mod)
    schedule(sch)
    database = ms.database.JSONDatabase(work_dir=str(task))
    record = ms.database.TuningRecord(
        sch.trace, database.commit_workload(mod), [1e-6], target.tvm_target(num_cores=1),
        ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
    )  # fmt: skip
    database.commit_tuning_record(record)
    accepted = {"record": db.record_id(record), "sha256": db.record_sha256(record), "compute": {}, "ms": 1.0,
                "spread_ms": 0.0, "hand_ms": 2.0, "hand_spread_ms": 0.0, "max_error": 0.0}  # fmt: skip
    db.write_verdict(task, accepted | verdict, 1, "local")
    return task, record


def parallel(sch: Any) -> None:
    sch.parallel(sch.get_loops(sch.get_sblock("out"))[0])


def transposed_copy(sch: Any) -> None:
    """A copy of a read with its axes swapped: a `transform_layout` step (an IndexMap in the
    trace, which TVM's own `as_json` of a record cannot convert)."""
    copy = sch.cache_read(sch.get_sblock("out"), 0, "global")
    sch.transform_layout(copy, ("write", 0), lambda i, j: (j, i))


def import_llvm(sch: Any) -> None:
    sch.annotate(sch.get_loops(sch.get_sblock("out"))[0], "pragma_import_llvm", INJECTED_LLVM)


def import_c(sch: Any) -> None:
    sch.annotate(sch.get_sblock("out"), "pragma_import_c", "int deploy_injected;")


def hide_a_read(sch: Any) -> None:
    sch.unsafe_hide_buffer_access(sch.get_sblock("out"), "read", [0])


def build(root: Path, out: Path, target: str = "x86") -> Result:
    return invoke("build", *ADD, "--target", target, "--tuned", str(root), "-o", str(out))


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def assert_hand_with_one_warning(built: Result, root: Path, out: Path, *reason: str) -> None:
    """The build succeeded with the hand schedule, saying in one warning line which records it
    did not use and why."""
    from deploy.compiler.options import REFUSED

    assert built.exit_code == 0, built.output
    (line,) = built.stderr.splitlines()
    assert line.startswith(f"warning: --tuned {root}: ") and line.endswith("building the hand schedule")
    assert all(part in line for part in reason), line
    assert manifest(out)["schedule"] != "tuned" and manifest(out)["tuning"] == REFUSED
    assert f"tuned in {root}: {REFUSED}" in built.stdout


def test_a_pinned_record_is_built(tmp_path: Path) -> None:
    """The control for the tests below: an untampered record is what the build runs."""
    from deploy.tune.records import record_id

    root, out = tmp_path / "db", tmp_path / "out"
    _, record = plant(root, parallel)
    built = build(root, out)
    assert built.exit_code == 0 and not built.stderr, built.output
    assert manifest(out)["schedule"] == "tuned" and manifest(out)["tuning_record"] == record_id(record)


def test_a_pinned_record_that_transforms_a_layout_is_built(tmp_path: Path) -> None:
    """A record whose trace holds an IndexMap (the dot rule's transposed weight) is pinned by its
    sha256 when tuned and found by it when read back from the records file."""
    from deploy.tune.records import record_id

    root, out = tmp_path / "db", tmp_path / "out"
    _, record = plant(root, transposed_copy)
    built = build(root, out)
    assert built.exit_code == 0 and not built.stderr, built.output
    assert manifest(out)["schedule"] == "tuned" and manifest(out)["tuning_record"] == record_id(record)


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        (import_llvm, 'annotates "pragma_import_llvm", which imports code'),
        (import_c, 'annotates "pragma_import_c", which imports code'),
        (hide_a_read, "uses UnsafeHideBufferAccess, which TVM does not check"),
    ],
)
def test_a_record_that_imports_code_or_skips_checks_is_never_built(
    tmp_path: Path, schedule: Callable[[Any], None], reason: str
) -> None:
    """Pinned, even: whoever can write accepted.json can pin any record. An import annotation
    would link its text into the module (here a marker string, found in module.so before the
    check)."""
    root, out = tmp_path / "db", tmp_path / "out"
    task, _ = plant(root, schedule)
    built = build(root, out)
    assert_hand_with_one_warning(built, root, out, str(task), f"record 1 {reason}")
    assert MARKER not in (out / manifest(out)["module"]).read_bytes()


def test_tune_refuses_a_database_holding_a_record_that_imports_code(tmp_path: Path) -> None:
    """MetaSchedule starts its search from the database's records: it would build the trace."""
    root = tmp_path / "db"
    task, _ = plant(root, import_llvm)
    tuned = invoke("tune", *ADD, "--target", "x86", "--trials", "2", "--db", str(root))
    assert tuned.exit_code == 2, tuned.output
    assert tuned.output.strip().splitlines() == [
        f'error: cannot read the tuning database in {task}: record 1 annotates "pragma_import_llvm",'
        " which imports code"
    ]


def test_the_record_built_is_the_one_pinned(tmp_path: Path) -> None:
    """A verdict naming a record by id but pinning another, or pinning none (written before
    records were pinned), builds the hand schedule."""
    root, out = tmp_path / "db", tmp_path / "out"
    task, _ = plant(root, parallel, sha256="0" * 64)
    assert_hand_with_one_warning(build(root, out), root, out, f"{task / 'accepted.json'} pins record")
    verdict = json.loads((task / "accepted.json").read_text())
    del verdict["sha256"]
    (task / "accepted.json").write_text(json.dumps(verdict))
    assert_hand_with_one_warning(build(root, out), root, out, "pins no record by sha256")


@pytest.mark.parametrize(
    ("name", "edit", "reason"),
    [
        ("accepted.json", lambda _: "[1, 2]", "is not a verdict of deploy tune"),
        ("accepted.json", lambda _: '{"record": 5}', "is not a verdict of deploy tune"),
        ("accepted.json", lambda _: "{not json", "cannot read"),
        (
            "database_tuning_record.json",
            lambda text: "[0, {corrupt\n" + text,
            "cannot read the tuning database",
        ),
        (
            "accepted.json",
            lambda text: json.dumps(json.loads(text) | {"compute": {"gone": True}}),
            'names the structure {"gone": true}, which the x86 strategy does not build add as',
        ),
    ],
    ids=["verdict-a-list", "record-a-number", "verdict-not-json", "corrupt-database-line", "stale-structure"],
)
def test_unreadable_or_stale_records_build_the_hand_schedule_with_a_warning(
    tmp_path: Path, name: str, edit: Callable[[str], str], reason: str
) -> None:
    root, out = tmp_path / "db", tmp_path / "out"
    task, _ = plant(root, parallel)
    (task / name).write_text(edit((task / name).read_text()))
    assert_hand_with_one_warning(build(root, out), root, out, reason)


def test_a_cached_hand_build_is_not_reused_once_the_records_are_repaired(tmp_path: Path) -> None:
    """deploy run caches builds: one that fell back to the hand schedule over a corrupt database
    line is keyed by the database too, so the repaired records build the tuned schedule."""
    import numpy as np

    root = tmp_path / "db"
    task, _ = plant(root, parallel)
    records = task / "database_tuning_record.json"
    intact = records.read_text()
    np.save(tmp_path / "x.npy", np.ones((4, 4), "float32"))
    run = ["run", *ADD[:2], "--target", "x86", "--tuned", str(root), "-i", str(tmp_path / "x.npy"),
           "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy")]  # fmt: skip
    records.write_text("[0, {corrupt\n" + intact)
    refused = invoke(*run)
    assert refused.exit_code == 0 and "warning: --tuned" in refused.stderr, refused.output
    assert "(hand, the accepted record failed its checks)" in refused.stdout
    records.write_text(intact)
    repaired = invoke(*run)
    assert repaired.exit_code == 0 and not repaired.stderr, repaired.output
    assert "(tuned" in repaired.stdout, repaired.stdout


@pytest.mark.parametrize("size", [0, -5, "abc", 3, 1e8, 64.0, True, None])
def test_an_accepted_work_group_size_is_one_tuning_tries(tmp_path: Path, size: Any) -> None:
    from deploy.compiler.targets import get_target
    from deploy.tune import records as db

    root, out = tmp_path / "db", tmp_path / "out"
    task = db.task_dir(root, bound_add(), "opencl")
    task.mkdir(parents=True)
    verdict = {"record": f"work_group={size}", "work_group": size, "ms": 1.0, "hand_ms": 2.0}
    db.write_verdict(task, verdict, 1, "opencl")
    assert_hand_with_one_warning(
        build(root, out, "opencl"), root, out, str(task), "is not a size deploy tune tries"
    )
    (kernel,) = json.loads((out / "launch.json").read_text())["kernels"]
    assert kernel["local"][0] == get_target("opencl").work_group


def test_an_accepted_work_group_size_is_built(tmp_path: Path) -> None:
    from deploy.tune import records as db

    root, out = tmp_path / "db", tmp_path / "out"
    task = db.task_dir(root, bound_add(), "opencl")
    task.mkdir(parents=True)
    db.write_verdict(
        task, {"record": "work_group=32", "work_group": 32, "ms": 1.0, "hand_ms": 2.0}, 1, "opencl"
    )
    built = build(root, out, "opencl")
    assert built.exit_code == 0 and not built.stderr, built.output
    (kernel,) = json.loads((out / "launch.json").read_text())["kernels"]
    assert kernel["local"][0] == 32 and manifest(out)["tuning_record"] == "work_group=32"
    db.write_verdict(
        task, {"record": "work_group=32", "work_group": 128, "ms": 1.0, "hand_ms": 2.0}, 1, "opencl"
    )
    assert_hand_with_one_warning(
        build(root, out, "opencl"), root, out, 'record "work_group=32" is not size 128'
    )


@pytest.mark.parametrize(
    "trials",
    [
        '{"trials": [{"work_group": 0, "ms": 1}]}',
        '{"trials": [{"work_group": 64, "ms": "1"}]}',
        '{"trials": [{"work_group": 64}]}',
        '{"trials": 3}',
        "[]",
    ],
)
def test_work_group_measurements_are_checked_when_read(tmp_path: Path, trials: str) -> None:
    from deploy.base.errors import UsageError
    from deploy.tune.work_group import measurements

    (tmp_path / "work_groups.json").write_text(trials)
    with pytest.raises(UsageError, match=r"cannot read .*work_groups\.json"):
        measurements(tmp_path)


def test_report_measures_each_task_with_its_own_module(tmp_path: Path) -> None:
    """Two tasks for one target whose builds share schedule names (both hand `cpu/generic`, both
    tuned from the same trace): each is checked against numpy with its own shapes, so a module
    of one run for the other would fail the report."""
    root = tmp_path / "db"
    plant(root, parallel)
    plant(root, parallel, bound_add((8, 3)))
    victim = tmp_path / "victim.txt"
    victim.write_text("not deploy's")
    (root / "x86" / "report.png").symlink_to(victim)  # the plot replaces the link, not what it names
    (root / "x86" / "add-copied").mkdir()  # a task directory without its task, named in a warning
    (root / "x86" / "add-copied" / "notes.txt").write_text("copied by hand")
    (root / "x86" / "graph-m-0123456789ab").mkdir()  # a layout verdict: no task, nothing to say
    (root / "x86" / "graph-m-0123456789ab" / "layout.json").write_text('{"layout": null}')
    (root / "x86" / "graph-m-ba9876543210").mkdir()  # a verdict deleted to measure again
    report = invoke("tune", "--report", "--target", "x86", "--db", str(root))
    assert report.exit_code == 0, report.output
    assert "task add-copied is not in the report: cannot read" in report.output
    assert "graph-m" not in report.output
    rows = json.loads((root / "x86" / "report.json").read_text())["rows"]
    assert sorted(row["label"] for row in rows) == ["add 4x4 4x4", "add 8x3 8x3"]
    assert all(row["verdict"] == "tuned" and row["tuned_ms"] > 0 for row in rows)
    assert victim.read_text() == "not deploy's"
    png = root / "x86" / "report.png"
    assert not png.is_symlink() and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_two_concurrent_tunes_of_one_task_measure_its_trials_once(tmp_path: Path) -> None:
    """The second run waits for the first (it says so), then finds the trials done and the
    verdict standing: the records are not measured twice or appended to twice."""
    db = tmp_path / "db"
    command = [DEPLOY, "tune", "--op", "argmax", "--shape", "64x1000", "--target", "x86", "--trials", "3",
               "--db", str(db)]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(db.glob("x86/*/task.json")):  # the first holds the task's lock from here on
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        second = run_deploy(*command[1:])
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    (task,) = (db / "x86").iterdir()
    assert f"waiting: another deploy tune is tuning this task in {task}" in second.stderr
    assert "3 records in" in out and "continuing: 3 records already in" in second.stdout
    assert len((task / "database_tuning_record.json").read_text().splitlines()) == 3
    assert json.loads((task / "accepted.json").read_text())["records"] == 3
