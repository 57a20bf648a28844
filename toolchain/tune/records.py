"""The tuning records directory that `deploy tune --db DIR` writes and `--tuned DIR` reads.

    DIR/<target>/<op>-<key>/           one tuning task: an op with its attributes and input types
        task.json                      what was tuned (op, attrs, inputs, target, device)
        database_workload.json         MetaSchedule's JSON database (JSON lines, appended per trial
        database_tuning_record.json    batch, so an interrupted run keeps what it measured)
        accepted.json                  the verdict: the record that matched numpy and beat the hand
                                       schedule on the device, or that the hand schedule stays

One database per target and task: MetaSchedule's lookup does not check the target. It holds one
workload per structure the op's computation may take (`tune/metaschedule.py` compute_variants).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import UsageError, first_line
from ops.spec import BoundOp

TASK = "task.json"
ACCEPTED = "accepted.json"
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
FAILED_SECS = 1e9
"""MetaSchedule stores a failed candidate with run time 1e10 s; anything above this is a failure."""


def task_dir(root: Path, bound: BoundOp, target_name: str) -> Path:
    """Where the records of `bound` on `target_name` live under `root`."""
    key = hashlib.sha256(json.dumps(bound.key(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(root) / target_name / f"{bound.op.name}-{key}"


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Replace `path` atomically (a reader never sees half a file)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(partial, path)


def record_id(record: Any) -> str:
    """A short stable id of a MetaSchedule tuning record: sha256 of its JSON form."""
    return hashlib.sha256(json.dumps(record.as_json(), sort_keys=True).encode()).hexdigest()[:12]


def mean_secs(record: Any) -> float:
    """Mean measured seconds of a record; FAILED_SECS or more for a failed candidate."""
    runs = [float(t) for t in record.run_secs] if record.run_secs else []
    return sum(runs) / len(runs) if runs else float("inf")


@dataclass(frozen=True)
class TaskRecords:
    """The MetaSchedule records of one task directory, in the order they were measured."""

    directory: Path
    records: list[Any]
    """TuningRecords whose workload is this task's module, oldest first."""

    @classmethod
    def load(cls, directory: Path, *mods: Any) -> TaskRecords:
        """Records of any of `mods` (IRModules) in `directory`, in the order they were measured;
        none when the directory has no database."""
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
            for line in _lines(directory / RECORDS):
                index, body = json.loads(line)
                if ours[index]:
                    records.append(ms.database.TuningRecord.from_json(body, workloads[index]))
        except Exception as exc:
            raise UsageError(
                f"cannot read the tuning database in {directory}: {first_line(str(exc))}"
            ) from None
        return cls(directory, records)

    def valid(self) -> list[Any]:
        """Records that ran, fastest first."""
        return sorted((r for r in self.records if mean_secs(r) < FAILED_SECS), key=mean_secs)

    def by_id(self, wanted: str) -> Any | None:
        return next((r for r in self.records if record_id(r) == wanted), None)


def verdict(directory: Path) -> dict[str, Any] | None:
    """The task's verdict, if tuned: {"record": ID, "ms", "hand_ms", ...} for an accepted record,
    {"record": None, "kept": "hand", "hand_ms", ...} when the hand schedule stays."""
    path = directory / ACCEPTED
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    return body if isinstance(body, dict) and ("record" in body) else None


def still_stands(verdict: dict[str, Any] | None, records: int, device: str) -> bool:
    """Whether an earlier verdict holds: it judged as many records, on the same device."""
    return verdict is not None and (verdict.get("records"), verdict.get("device")) == (records, device)


def write_verdict(directory: Path, verdict: dict[str, Any], records: int, device: str) -> dict[str, Any]:
    """Write the task's verdict, noting what it judged (for `still_stands`); the verdict written."""
    written = verdict | {"device": device, "records": records}
    write_json(directory / ACCEPTED, written)
    return written


def accepted(directory: Path) -> dict[str, Any] | None:
    """The accepted record's entry ({"record", "ms", "max_error", "device", ...}), if any."""
    body = verdict(directory)
    return body if body is not None and body.get("record") else None


def _lines(path: Path) -> list[str]:
    """The non-empty lines of a JSON-lines file (none when it is missing)."""
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def apply_record(mod: Any, record: Any) -> Any:
    """`mod` scheduled by the record's trace (postprocessors included), as an IRModule."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def tuned_module(directory: Path, record: str, mod: Any) -> Any | None:
    """`mod` scheduled by the record with id `record` in the task `directory`; None when it is not
    there for this module (its records were tuned for another computation)."""
    found = TaskRecords.load(directory, mod).by_id(record)
    return apply_record(mod, found) if found is not None else None


def drop_partial_lines(directory: Path) -> int:
    """Cut a half-written last line off the database files (a run killed mid-write); return how
    many files were cut. Every complete line, so every finished record, stays."""
    cut = 0
    for name in (WORKLOADS, RECORDS):
        path = directory / name
        if not path.exists():
            continue
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as stream:
                stream.truncate(data.rfind(b"\n") + 1)
            cut += 1
    return cut
