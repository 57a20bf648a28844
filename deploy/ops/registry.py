"""The op registry: `@register` on an Op subclass adds it; discovery imports op files.

Built-in ops are every module of this package; user ops come from `--ops-path DIR` (every
`*.py` in it) and from the `deploy.ops` entry-point group (each entry names a module).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import linecache
import pkgutil
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from types import TracebackType

from deploy.base.errors import UsageError, printable, reason
from deploy.ops.attrs import Attr, AttrKind
from deploy.ops.onnx_mapping import domain_key, onnx_label
from deploy.ops.spec import ALL_DTYPES, Case, Input, Op
from deploy.ops.tolerance import tolerance_problem

LIBRARY = "deploy.ops.library"
"""The package of the ops deploy ships, apart from the framework that defines what an op is."""

_OPS: dict[str, Op] = {}
_ONNX: dict[tuple[str, str], Op] = {}
"""(domain, op_type) -> the op that declares it in `Op.onnx`."""


def _source(cls: type[Op]) -> str:
    """The file that defined `cls` (its module's name where there is none: an interactive session)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return str(Path(path).resolve()) if path else cls.__module__


def op_frame(trace: TracebackType | None) -> str:
    """' at FILE:LINE' of the innermost frame of `trace` in a registered op's file (where an op's
    compute misused TVM, say Python's min on expressions); "" when none is in it."""
    files = {_source(type(op)) for op in _OPS.values()}
    found = ""
    for frame, line in traceback.walk_tb(trace):
        path = str(Path(frame.f_code.co_filename).resolve())
        if path in files:
            found = f" at {path}:{line}"
    return found


def failure_line(exc: BaseException) -> str:
    """An unexpected exception in one line: its type, its first line of reason (a schedule
    error's primitive and TVM's reason: `schedule_reason`) and, when an op's code raised it, that
    op file's line (`op_frame`)."""
    return f"{type(exc).__name__}: {schedule_reason(exc) or reason(exc)}{op_frame(exc.__traceback__)}"


PRIMITIVE = re.compile(r"schedule primitive '([^']+)'")
TVM_REASON = "Error message: "
"""What precedes TVM's reason in a ScheduleError's rendered ("detail") message, after the IR."""


def schedule_reason(exc: BaseException) -> str | None:
    """A TVM ScheduleError as one line, the primitive and TVM's reason ("primitive 'parallel':
    The "parallel" cannot be fulfilled ... because some block iter ... is not a data parallel
    block iter"); None for any other exception. Its first line alone names only the primitive,
    and its reason comes after the whole IR it renders."""
    if "tvm" not in sys.modules:  # not imported: no schedule ran
        return None
    from tvm.s_tir.schedule import ScheduleError

    if not isinstance(exc, ScheduleError):
        return None
    text = str(exc)
    primitive = PRIMITIVE.search(text)
    said = text.rpartition(TVM_REASON)[2].strip() if TVM_REASON in text else ""
    if said:
        said = printable(" ".join(said.split()))
    where = f"primitive {primitive.group(1)!r}" if primitive else "a schedule primitive"
    return f"{where}: {said}" if said else None


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
"""An op's, input's or attribute's name: it names artifact directories, C functions and
parameters of a bundle, and `-a NAME=VALUE`."""


def check_definition(cls: type[Op]) -> None:
    """What `register` needs of an op class, checked as data (a user's op file may hold
    anything): a name that is an identifier, its own infer, compute and reference, inputs and
    attributes with distinct identifier names and defaults of their kinds, dtypes deploy knows, a
    `tolerance` of numbers >= 0 (or none), and at least one case."""
    name = getattr(cls, "name", None)
    where = f"op class {cls.__name__} in {_source(cls)}"
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        raise UsageError(f"{where}: name {name!r}: expected letters, digits and _ (not first), at most 64")
    where = f"op {name} ({_source(cls)})"
    missing = [m for m in ("infer", "compute", "reference") if getattr(cls, m) is getattr(Op, m)]
    if missing:
        raise UsageError(f"{where} defines no {missing[0]}(): an op needs infer, compute and reference")
    for field, kind in (("inputs", Input), ("attrs", Attr), ("cases", Case)):
        value = getattr(cls, field, None)
        if not isinstance(value, tuple) or not all(isinstance(v, kind) for v in value):
            raise UsageError(f"{where}: {field} {value!r}: expected a tuple of {kind.__name__}")
    kinds = [a.kind for a in cls.attrs if not isinstance(a.kind, AttrKind)]
    if kinds:
        raise UsageError(
            f"{where}: attrs: kind {kinds[0]!r}: expected an attribute kind of"
            " deploy.ops.attrs (Float(), ...)"
        )
    for field, names in (("inputs", [i.name for i in cls.inputs]), ("attrs", [a.name for a in cls.attrs])):
        bad = [n for n in names if not isinstance(n, str) or not IDENTIFIER.fullmatch(n)]
        twice = [n for n in names if names.count(n) > 1]
        if bad or twice:
            said = f"{bad[0]!r} is no identifier" if bad else f"{twice[0]!r} is named twice"
            raise UsageError(f"{where}: {field}: {said}")
    for attr in cls.attrs:
        if attr.default is not None:
            try:
                attr.kind.normalize(attr.name, attr.default)
            except UsageError as exc:
                raise UsageError(f"{where}: attrs: the default of {exc}") from None
    if not cls.cases:
        raise UsageError(f"{where}: cases (): expected at least one Case for `deploy test` to verify")
    problem = tolerance_problem(getattr(cls, "tolerance", None))
    if problem:
        raise UsageError(f"{where}: {problem}")
    dtypes = cls.dtypes
    if not isinstance(dtypes, tuple) or not dtypes or not all(d in ALL_DTYPES for d in dtypes):
        raise UsageError(f"{where}: dtypes {dtypes!r}: expected a tuple of some of {', '.join(ALL_DTYPES)}")


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: check the definition (`check_definition`), instantiate the op and add
    it under `cls.name`.

    The same file may register again (it was imported twice); another file using the name is an
    error naming both, so a user op never silently replaces a built-in one or another user op.
    Likewise for the ONNX (domain, op_type) an op declares in `onnx`: one op implements each."""
    check_definition(cls)
    existing = _OPS.get(cls.name)
    if existing is not None and _source(type(existing)) != _source(cls):
        raise UsageError(
            f"op {cls.name!r} is defined twice: in {_source(type(existing))} and in {_source(cls)}"
        )
    for mapping in cls.onnx:
        other = _ONNX.get(mapping.key())
        if other is not None and (other.name, _source(type(other))) != (cls.name, _source(cls)):
            raise UsageError(
                f"ONNX op {onnx_label(mapping.domain, mapping.op_type)} is implemented twice: by op"
                f" {other.name!r} in {_source(type(other))} and by op {cls.name!r} in {_source(cls)}"
            )
    op = cls()
    _OPS[cls.name] = op
    for mapping in cls.onnx:
        _ONNX[mapping.key()] = op
    return cls


def get_op(name: str) -> Op:
    """The op registered as `name`; a UsageError listing the known ones when there is none."""
    op = find_op(name)
    if op is None:
        close = difflib.get_close_matches(name, list(_OPS), n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UsageError(
            f"unknown op {name!r}: {hint}known: {', '.join(sorted(_OPS))}; an op of your own needs"
            " the folder of its file, as in `deploy --ops-path DIR ...`"
        )
    return op


def find_op(name: str) -> Op | None:
    """The op registered as `name`, or None."""
    load_builtin()
    return _OPS.get(name)


def op_for_onnx(domain: str, op_type: str) -> Op | None:
    """The op declaring the ONNX (domain, op_type) in its `onnx` ("" and "ai.onnx" alike), if any."""
    load_builtin()
    return _ONNX.get((domain_key(domain), op_type))


def all_ops() -> list[Op]:
    """Every registered op (the built-in ones loaded), by name."""
    load_builtin()
    return [_OPS[name] for name in sorted(_OPS)]


def load_builtin() -> None:
    """Import every module of the shipped ops (`deploy/ops/library/`); op files register
    themselves, helpers do nothing. `deploy/ops/examples/` holds user-style ops, not built in."""
    package = importlib.import_module(LIBRARY)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            importlib.import_module(f"{LIBRARY}.{info.name}")


def load_ops_path(directory: str | Path) -> list[str]:
    """Import every `*.py` in `directory`; returns the names of the ops it registered."""
    folder = Path(directory)
    if not str(directory) or not folder.is_dir():  # '' would be the working directory
        raise UsageError(f"--ops-path {str(directory)!r} is not a directory")
    load_builtin()
    before = set(_OPS)
    for path in sorted(folder.glob("*.py")):
        where = folder.resolve()  # two folders named alike (a/ops, b/ops) must not share modules
        module_name = (
            f"deploy_user_ops.{where.name}_{hashlib.sha256(str(where).encode()).hexdigest()[:12]}.{path.stem}"
        )
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot import op file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        with _importing(f"op file {path}"), _old_imports(path):
            spec.loader.exec_module(module)
    return sorted(set(_OPS) - before)


def ops_in(directory: str | Path) -> list[str]:
    """The names of the registered ops defined by a `*.py` file right in `directory` (an
    `--ops-path` folder), loaded now or before."""
    folder = Path(directory).resolve()
    return sorted(name for name, op in _OPS.items() if Path(_source(type(op))).parent == folder)


MOVED = {
    "ops": "the op framework is deploy.ops now (from deploy.ops import Op, Input, Case, register, ...;"
    " the shipped ops are deploy.ops.library)",
    "base": "deploy's shared helpers are deploy.base now (from deploy.base.errors import UsageError)",
    "schedules": "the schedules are deploy.schedules now",
    "devices": "the devices are deploy.devices now",
    "toolchain": "the toolchain is deploy now (toolchain.build is deploy.compiler, toolchain.X is deploy.X)",
}
"""The top-level packages deploy had before it became one package, and what to import instead."""


@contextmanager
def _old_imports(path: Path) -> Iterator[None]:
    """An op file importing one of deploy's old top-level packages (`from ops import Op`), which
    are gone, gets one line naming what to import instead, not ModuleNotFoundError."""
    try:
        yield
    except ModuleNotFoundError as exc:
        old = (exc.name or "").partition(".")[0]
        if exc.name is None or old not in MOVED or importlib.util.find_spec(old) is not None:
            raise
        frames = [(f.f_code.co_filename, line) for f, line in traceback.walk_tb(exc.__traceback__)]
        file, line = next((f, n) for f, n in reversed(frames) if not f.startswith("<"))
        where = f"{path}:{line}" if Path(file) == path else f"{path} (through {file}:{line})"
        source = linecache.getline(file, line).strip()
        raise UsageError(f"op file {where}: {source!r}: {MOVED[old]}") from None


@contextmanager
def _importing(what: str) -> Iterator[None]:
    """Whatever importing `what` (an op file, an entry point) raises, as one line: its UsageError
    as it is, exit() and anything else (a BaseException of its own too) named; Ctrl-C stays."""
    try:
        yield
    except (UsageError, KeyboardInterrupt):
        raise
    except SystemExit as exc:
        raise UsageError(f"{what} called exit({exc.code!r}) while being imported") from exc
    except BaseException as exc:
        raise UsageError(f"{what} failed to import: {type(exc).__name__}: {reason(exc)}") from exc


def load_entry_points(group: str = "deploy.ops") -> None:
    """Import the modules named by installed packages' `deploy.ops` entry points."""
    for entry in entry_points(group=group):
        with _importing(f"entry point {entry.name} ({entry.value})"):
            entry.load()
