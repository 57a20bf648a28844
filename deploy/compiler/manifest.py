"""`manifest.json`: what a built module is, for whom, and the sha256 that pins it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.base.errors import UsageError, reason
from deploy.base.files import load_json, sha256_file
from deploy.base.locks import locked
from deploy.compiler.plan import Size, arena_bytes
from deploy.compiler.runtime import ALIGNMENT
from deploy.ops.spec import TensorType, sizes_of

if TYPE_CHECKING:
    from deploy.compiler.artifacts import ArtifactKind

MANIFEST = "manifest.json"
FORMAT = 2
"""2: `outputs`, a list (a graph may return several), where 1 had one `output`."""
PARTIAL = ".deploy-partial"
"""The file inside the directories an export sets aside (the artifact it writes, the one it
replaces) until it is done with them: one that a killed export (SIGKILL, a power cut) left
behind is known by it as deploy's own."""


@contextmanager
def artifact_lock(directory: Path, shared: bool = False) -> Iterator[None]:
    """Lock the directory the artifact directory `directory` lives in (it must exist):
    exclusively while a build checks, writes and swaps one in, shared while the build cache reads
    one, so that concurrent builds into one place take turns and a cached build is never read
    mid-swap. (A reader of `-o DIR` outside deploy takes no lock.) The parent itself is locked,
    not a lock file beside it: nothing is left next to a user's output; builds into other
    directories of the same parent take turns too."""
    with locked(directory.parent, shared):
        yield


@dataclass(frozen=True)
class Manifest:
    """The description of one artifact directory."""

    op: str
    attrs: dict[str, Any]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    """Each output's name, shape and dtype, in the order the module writes them (an op's: "out")."""
    target: str
    tvm_target: dict[str, Any]
    arch: str
    schedule: str
    module: str
    sha256: str
    tvm_version: str
    deploy_version: str
    tuning_record: str | None = None
    """For `schedule: "tuned"`: the id of the `deploy tune` record it was built from."""
    tuning: str | None = None
    """For a `--tuned` build of an op whose tuning kept the hand schedule: "hand, tuning found
    nothing faster"."""
    notes: list[str] | None = None
    """What the build said of its schedule, a line each: a default rule that fell through to the
    generic schedule and why, scalar libm calls left inside vector loops (`Scheduled.notes`)."""
    cores: int | None = None
    """Threads the module's parallel loops were split for (CPU targets): the device's."""
    cpu_model: str | None = None
    """The CPU model whose hand defaults its schedules took (`BuildOptions.cpu_model`); None:
    the schedules' own."""
    bundle: dict[str, str] | None = None
    """For `deploy build --bundle`: its C prefix (`name`), the header, library and runner file
    names, and the sha256 of SHA256SUMS (which pins every other file of the bundle)."""
    entry: str = "function"
    """How a runtime calls the module: "function" (`main(inputs..., out)`) or "plan" (a graph's
    `main(inputs..., outputs..., arena)`, `plan.py`)."""
    alignment: int = ALIGNMENT
    """Bytes the data of the tensors the module is called with must be aligned to."""
    arena: list[dict[str, Any]] | None = None
    """For the "plan" entry: the arena's slots in order, each {"bytes", "times": the symbolic
    dims that multiply it, "tensors" it holds}."""
    graph: dict[str, Any] | None = None
    """For a graph (`op` is its name): its nodes (name, op, attributes, tensors read and written)
    and its kernels in the order they run, each with the nodes it computes and its schedule."""
    constants: list[dict[str, Any]] | None = None
    """For a graph with constants: each one's name, shape, dtype and the sha256 of its bytes (C
    order, little-endian), as the model gives it; the module holds them (`constants.py`)."""
    build_key: str | None = None
    """For a build in the cache: its key (`cache.build_key`), which a hit must match (`cached`)."""
    format: int = FORMAT

    def write(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST
        try:
            fields = load_json(path)
            if isinstance(fields, dict) and fields.get("format", FORMAT) != FORMAT:
                raise UsageError(
                    f"artifact manifest {path} is format {fields['format']!r}; this deploy reads format"
                    f" {FORMAT}: rebuild the artifact"
                )
            return cls(**fields)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"cannot read artifact manifest {path}: {reason(exc)}") from None

    @classmethod
    def cached(cls, directory: Path, key: str, artifact: ArtifactKind) -> Manifest | None:
        """The manifest of the `artifact` kind's artifact in `directory` if it is the build of
        `key` and whole (its module's sha256 as the manifest says, the files beside it as the
        module pins them); None if it is missing or damaged, or another build's (a cache entry
        copied over, a module cut short by a full disk)."""
        try:
            manifest = cls.read(directory)
            manifest.check_module(directory)
            whole = artifact.whole(directory, manifest.module)
        except (UsageError, OSError, RuntimeError):  # RuntimeError: a symlink loop
            return None
        return manifest if whole and manifest.build_key == key else None

    def arena_bytes(self, shapes: list[tuple[int, ...]]) -> int:
        """The bytes of the arena the entry takes when the module runs on arrays of `shapes`
        (0: it takes none)."""
        if self.arena is None:
            return 0
        try:
            slots = [Size(int(slot["bytes"]), tuple(map(str, slot["times"]))) for slot in self.arena]
            return arena_bytes(slots, self._sizes(shapes)[0])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"artifact manifest of {self.op}: malformed arena ({reason(exc)})") from None

    def output_types(self, shapes: list[tuple[int, ...]]) -> list[TensorType]:
        """The outputs' types when the module runs on arrays of `shapes`: a symbolic dim (a batch)
        sized as the inputs give it, once they are checked against the manifest's inputs (each
        static dim as built, every symbolic dim the same in all of them)."""
        sizes, outputs = self._sizes(shapes)
        for output in outputs:
            if set(output.symbols) - set(sizes):
                raise UsageError(f"artifact manifest of {self.op}: output {output} has a dim no input gives")
        return [output.at(sizes) for output in outputs]

    @property
    def output_names(self) -> list[str]:
        return [str(o.get("name", f"output {i}")) for i, o in enumerate(self.outputs)]

    def _sizes(self, shapes: list[tuple[int, ...]]) -> tuple[dict[str, int], list[TensorType]]:
        """The symbolic dims' sizes on arrays of `shapes` (checked against the inputs), and the
        declared output types."""
        try:
            declared = [(str(i["name"]), TensorType(tuple(i["shape"]), i["dtype"])) for i in self.inputs]
            outputs = [TensorType(tuple(o["shape"]), o["dtype"]) for o in self.outputs]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"artifact manifest of {self.op}: malformed inputs or outputs ({exc})") from None
        if not outputs:
            raise UsageError(f"artifact manifest of {self.op}: no outputs")
        if len(shapes) != len(declared):
            raise UsageError(f"{self.op} takes {len(declared)} input(s), got {len(shapes)}")
        return sizes_of(declared, shapes), outputs

    @property
    def built_with(self) -> str:
        """The schedule as messages name it; a `--tuned` build on the hand schedule says why
        (tuning kept it, or the accepted record failed its checks)."""
        return f"{self.schedule} ({self.tuning})" if self.tuning else self.schedule

    def module_path(self, directory: Path) -> Path:
        """The module inside `directory`: a manifest is data from disk, so a `module` that is not
        a plain file name there (`../x.so`, an absolute path, a symlink out) is refused, never
        loaded."""
        module = self.module
        plain = isinstance(module, str) and module not in ("", "..") and "\0" not in module
        if not plain or Path(module).name != module:
            raise UsageError(f"artifact {directory}: manifest module {module!r} is not a file name")
        path = directory / module
        if path.resolve().parent != directory.resolve():
            raise UsageError(f"artifact {directory}: module {module} links outside the artifact directory")
        return path

    def check_module(self, directory: Path) -> Path:
        """The module's path after checking its sha256 against the manifest."""
        path = self.module_path(directory)
        if not path.is_file():
            raise UsageError(f"artifact {directory} has no module file {self.module}")
        actual = sha256_file(path)
        if actual != self.sha256:
            raise UsageError(
                f"module {path} has sha256 {actual[:16]}…, manifest says {self.sha256[:16]}…:"
                " the artifact was modified or is incomplete"
            )
        return path
