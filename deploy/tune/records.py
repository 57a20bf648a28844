"""The tuning records directory that `deploy tune --db DIR` writes and `--tuned DIR` reads.

    DIR/<target>/<op>-<key>/           one tuning task: an op with its attributes and input types
        task.json                      what was tuned (op, attrs, inputs, target, device)
        database_workload.json         MetaSchedule's JSON database (JSON lines, appended per trial
        database_tuning_record.json    batch, so an interrupted run keeps what it measured)
        accepted.json                  the verdict: the record that matched numpy and beat the hand
                                       schedule on the device (pinned by its sha256), or that the
                                       hand schedule stays
        tune.lock                      held by the `deploy tune` tuning the task (`tuning`)
    DIR/<target>/graph-<name>-<key>/layout.json    a model's layout verdict (`tune/layouts.py`)

One database per target and task: MetaSchedule's lookup does not check the target. It holds one
workload per structure the op's computation may take (`tune/metaschedule.py` compute_variants).

Records are data read from disk, not code: a record whose trace names a code import
(`pragma_import_llvm`, `pragma_import_c`: the compiler links the annotation's text into the module)
or uses a primitive TVM does not check makes its database unreadable (`TaskRecords.load`), and a
`--tuned` build applies only the record whose sha256 the verdict pins.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError, reason
from deploy.base.files import load_json, read_regular, write_json_atomically
from deploy.base.locks import locked
from deploy.base.stopping import raise_if_stopped
from deploy.ops.spec import BoundOp

TASK = "task.json"
ACCEPTED = "accepted.json"
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
DATABASE = (WORKLOADS, RECORDS)
"""MetaSchedule's JSON database of a task: the files it appends to."""
LOCK = "tune.lock"
FAILED_SECS = 1e9
"""MetaSchedule stores a failed candidate with run time 1e10 s; anything above this is a failure."""
VERDICT_FORMAT = 2
"""Increased when verdicts gain what builds check (2: the accepted record's sha256), so that a verdict
written before is judged again instead of standing."""


def task_dir(root: Path, bound: BoundOp, target_name: str) -> Path:
    """Where the records of `bound` on `target_name` live under `root`."""
    key = hashlib.sha256(json.dumps(bound.key(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(root) / target_name / f"{bound.op.name}-{key}"


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Replace `path` atomically (a reader never sees half a file)."""
    write_json_atomically(path, body)


@contextmanager
def tuning(directory: Path, waiting: Callable[[Path], None]) -> Iterator[None]:
    """Hold the task's lock while tuning it: a second `deploy tune` of the same task calls
    `waiting(directory)` and waits for the first, then continues from its records instead of
    measuring the same trials again and appending them to the same files."""
    with locked(directory / LOCK, waiting=lambda: waiting(directory)):
        yield


def shown(value: Any) -> str:
    """A value read from a records file, as a short line for a message (it may be anything)."""
    return textwrap.shorten(json.dumps(value, default=str), 60, placeholder="...")


def record_json(record: Any) -> Any:
    """A MetaSchedule tuning record as plain JSON values: what TVM's `as_json` gives, but an
    object of the trace that it has no conversion for (a `transform_layout` step's IndexMap: it
    raised TypeError for every record of a dot product whose weight is copied transposed) as
    TVM's own JSON text of it, the way the records file holds it."""
    from tvm.s_tir.meta_schedule import _ffi_api

    return _plain(_ffi_api.TuningRecordAsJSON(record))


def _plain(value: Any) -> Any:
    import tvm
    from tvm.tirx import FloatImm, IntImm
    from tvm_ffi import Array, Map

    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, IntImm | FloatImm):
        return value.value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Array):
        return [_plain(item) for item in value]
    if isinstance(value, Map):
        return {_plain(key): _plain(item) for key, item in value.items()}
    return str(tvm.ir.save_json(value))


def record_sha256(record: Any) -> str:
    """sha256 of a MetaSchedule tuning record's JSON form (`record_json`): what a verdict pins."""
    return hashlib.sha256(json.dumps(record_json(record), sort_keys=True).encode()).hexdigest()


def record_id(record: Any) -> str:
    """A short stable id of a MetaSchedule tuning record: the start of its sha256."""
    return record_sha256(record)[:12]


def refused_step(trace: Any) -> str | None:
    """Why `trace` must not be built, or None: a step names a code import (an annotation key such
    as `pragma_import_llvm`, whose text the compiler links into the module) or is a primitive
    that TVM does not check (`unsafe_set_dtype`, `unsafe_hide_buffer_access`)."""
    for inst in trace.insts:
        if inst.kind.name.startswith("Unsafe"):
            return f"uses {inst.kind.name}, which TVM does not check"
        imported = next((str(a) for a in inst.attrs if isinstance(a, str) and "import" in a.lower()), None)
        if imported is not None:
            return f"annotates {shown(imported)}, which imports code"
    return None


def mean_secs(record: Any) -> float:
    """Mean measured seconds of a record; FAILED_SECS or more for a failed candidate, and for one
    with a time no run can take (0, negative or NaN: a hand-edited file, shown as `best -1000 ms`)."""
    runs = [float(t) for t in record.run_secs] if record.run_secs else []
    if not runs or not all(t > 0 for t in runs):
        return float("inf")
    return sum(runs) / len(runs)


@dataclass(frozen=True)
class TaskRecords:
    """The MetaSchedule records of one task directory, in the order they were measured."""

    directory: Path
    records: list[Any]
    """TuningRecords whose workload is this task's module, oldest first."""

    @classmethod
    def load(cls, directory: Path, *mods: Any) -> TaskRecords:
        """Records of any of `mods` (IRModules) in `directory`, in the order they were measured;
        none when the directory has no database. A UsageError when a line does not parse or a
        record of ours has a step that must not be built (`refused_step`)."""
        if not (directory / RECORDS).exists():
            return cls(directory, [])
        import tvm_ffi
        from tvm.s_tir import meta_schedule as ms

        # Read line by line: JSONDatabase.get_all_tuning_records returns them fastest first.
        try:
            workloads = [
                ms.database.Workload.from_json(json.loads(line)) for line in _lines(directory / WORKLOADS)
            ]
            ours = [any(tvm_ffi.structural_equal(w.mod, mod) for mod in mods) for w in workloads]
            records = []
            for number, line in enumerate(_lines(directory / RECORDS), 1):
                index, body = json.loads(line)
                if not ours[index]:
                    continue
                record = ms.database.TuningRecord.from_json(body, workloads[index])
                refused = refused_step(record.trace)
                if refused is not None:
                    raise UsageError(f"record {number} {refused}")
                records.append(record)
        except Exception as exc:
            raise UsageError(f"cannot read the tuning database in {directory}: {reason(exc)}") from None
        return cls(directory, records)

    def valid(self) -> list[Any]:
        """Records that ran, fastest first."""
        return sorted((r for r in self.records if mean_secs(r) < FAILED_SECS), key=mean_secs)

    def pinned(self, sha256: str) -> Any | None:
        """The record whose `record_sha256` is `sha256`, if any."""
        return next((r for r in self.records if record_sha256(r) == sha256), None)


def read_json(path: Path) -> Any:
    """The JSON value the file `path` holds; a UsageError naming it when it cannot be read or
    parsed (records are data read from disk)."""
    try:
        return load_json(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {reason(exc)}") from None


def verdict(directory: Path) -> dict[str, Any] | None:
    """The task's verdict, if tuned: {"record": ID, "sha256", "ms", "hand_ms", ...} for an
    accepted record, {"record": None, "kept": "hand", "hand_ms", ...} when the hand schedule
    stays. A UsageError when accepted.json is not a verdict."""
    path = directory / ACCEPTED
    if not path.exists():
        return None
    body = read_json(path)
    if not isinstance(body, dict) or not isinstance(body.get("record", 0), str | None):
        raise UsageError(f"{path} is not a verdict of deploy tune (an object naming a record or null)")
    return body


def standing_verdict(directory: Path, records: int, device: str) -> dict[str, Any] | None:
    """The task's verdict if it still holds: written in this format, judging as many records, on
    the same device. None when the task must be judged (again), also when its verdict cannot be
    read: judging writes a new one."""
    try:
        body = verdict(directory)
    except UsageError:
        return None
    judged = (body.get("format"), body.get("records"), body.get("device")) if body is not None else None
    return body if judged == (VERDICT_FORMAT, records, device) else None


def write_verdict(directory: Path, verdict: dict[str, Any], records: int, device: str) -> dict[str, Any]:
    """Write the task's verdict, noting what it judged (for `standing_verdict`); the verdict written."""
    written = verdict | {"device": device, "records": records, "format": VERDICT_FORMAT}
    write_json(directory / ACCEPTED, written)
    return written


def records_digest(directory: Path) -> str:
    """sha256 of the task's database files as they are now: whether the accepted record can be
    built depends on all of them (a corrupt line anywhere refuses the records)."""
    digest = hashlib.sha256()
    for name in DATABASE:
        path = directory / name
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()[:16]


def accepted(directory: Path) -> dict[str, Any] | None:
    """The accepted record's entry ({"record", "ms", "max_error", "device", ...}), if any."""
    body = verdict(directory)
    return body if body is not None and body.get("record") else None


def _lines(path: Path) -> list[str]:
    """The complete non-empty lines of a JSON-lines file (none when it is missing): a last line
    without its newline is still being written, or was cut by a kill, and is left out."""
    if not path.exists():
        return []
    text = read_regular(path).decode()
    return [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def apply_record(mod: Any, record: Any) -> Any:
    """`mod` scheduled by the record's trace (postprocessors included), as an IRModule."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def tuned_module(directory: Path, entry: dict[str, Any], mod: Any) -> Any:
    """`mod` scheduled by the record that the accepted verdict `entry` of the task `directory`
    pins. A UsageError says why not: the database cannot be read, the record is not there for
    this module (tuned for another computation, or changed since), or it no longer applies."""
    pinned = entry.get("sha256")
    if not isinstance(pinned, str):
        raise UsageError(f"{directory / ACCEPTED} pins no record by sha256 (an older deploy tune wrote it)")
    found = TaskRecords.load(directory, mod).pinned(pinned)
    if found is None or record_id(found) != entry["record"]:
        raise UsageError(
            f"{directory / ACCEPTED} pins record {shown(entry['record'])}, which is not in the database"
            " for this computation (stale, or changed since it was accepted)"
        )
    try:
        return apply_record(mod, found)
    except Exception as exc:  # TVM's error for a trace that does not apply
        raise_if_stopped()
        raise UsageError(f"{directory / ACCEPTED}: its record does not apply: {reason(exc)}") from None


def check_task_files(directory: Path) -> None:
    """A UsageError, before a tuning reads or writes anything, where one of a task's files is no
    regular file (a directory there failed the run at its end, when the verdict was written), or
    a database file is a link: MetaSchedule appends to them, and would write through a link to a
    user's file; the half-written-line repair would cut it."""
    for name in (*DATABASE, TASK, ACCEPTED):
        path = directory / name
        if path.is_symlink() and name in DATABASE:
            raise UsageError(f"{path} is a symbolic link; deploy tune writes its database files itself")
        if path.exists() and not path.is_file():
            raise UsageError(f"{path} is not a regular file; deploy tune writes it itself")


def drop_partial_lines(directory: Path) -> int:
    """Cut a half-written last line off the database files (a run killed mid-write); return how
    many files were cut. Every complete line, so every finished record, stays."""
    cut = 0
    for name in DATABASE:
        path = directory / name
        if not path.exists():
            continue
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as stream:
                stream.truncate(data.rfind(b"\n") + 1)
            cut += 1
    return cut
