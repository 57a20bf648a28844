"""Parsing the CLI's value syntax: shapes `32x64x112x112`, attributes `key=value`, .npy files."""

from __future__ import annotations

import math
import os
import re
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.lib.format as npy_format

from deploy.base.errors import DeployError, UsageError, clipped, quoted, reason
from deploy.base.files import check_regular

_DIMS = re.compile(r"[0-9]+(?:[xX][0-9]+)*|[A-WYZa-wyz_][A-WYZa-wyz0-9_]*(?:[xX][0-9]+)+")
"""Sizes, or a symbolic batch's name first and at least one size after it (a lone name is more
likely a typo than a rank-1 batch)."""


def parse_shape(text: str) -> tuple[int | str, ...]:
    """`32x64x112x112` -> (32, 64, 112, 112); `Nx64x112x112` -> ("N", 64, 112, 112), a symbolic
    batch (a name without x in it, sizes after it); `scalar` or `()` -> (), never an empty string.

    Dims are ASCII digits only: int() alone would also take fullwidth digits and `1_000`."""
    cleaned = text.strip()
    if cleaned.lower() in ("()", "scalar"):
        return ()
    expected = (
        f"--shape {text!r}: expected dims like 32x64x112x112 (or 'scalar' for rank 0; a symbolic"
        " batch first: Nx64x112x112)"
    )
    if not _DIMS.fullmatch(cleaned):
        raise UsageError(expected)
    first, *rest = re.split("[xX]", cleaned)
    try:
        dims = tuple(int(part) for part in rest)
        batch: int | str = first if not first.isdigit() else int(first)
    except ValueError:  # more digits than int() converts
        raise UsageError(expected) from None
    if any(d < 1 for d in dims) or batch == 0:
        raise UsageError(f"--shape {text!r}: every dim must be >= 1")
    return (batch, *dims)


def parse_attrs(pairs: tuple[str, ...]) -> dict[str, str]:
    """`('kernel=3', 'stride=2')` -> {'kernel': '3', 'stride': '2'}."""
    attrs: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"-a {pair!r}: expected key=value, e.g. -a kernel=3")
        if name.strip() in attrs:
            raise UsageError(f"-a {pair!r}: attribute {name.strip()} is given twice")
        attrs[name.strip()] = value.strip()
    return attrs


NPY_HEADERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
"""The .npy format versions read (3.0 differs only in allowing utf-8 field names, which no op takes)."""
ZIP_MAGIC = b"PK\x03\x04"


def load_npy(path: str) -> np.ndarray:
    """One array from a .npy file. The size its header claims is checked against the file's before
    anything is allocated: a forged header is bad input, not a MemoryError. A FIFO or a device is
    refused before it is opened: reading one would block until a writer came."""
    try:
        check_regular(Path(path))
        with open(path, "rb") as stream:
            if stream.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
                raise UsageError(f"input {quoted(path)} holds several arrays (.npz); expected one .npy array")
            stream.seek(0)
            version = npy_format.read_magic(stream)
            if version not in NPY_HEADERS:
                raise UsageError(
                    f"input {quoted(path)} is .npy format {version[0]}.{version[1]}; expected 1.0 or 2.0"
                )
            shape, _, dtype = NPY_HEADERS[version](stream)
            if dtype.byteorder == ">":
                raise UsageError(f"input {quoted(path)} is big-endian ({dtype.str}): save it little-endian")
            claimed = math.prod(shape) * dtype.itemsize
            held = os.fstat(stream.fileno()).st_size - stream.tell()
            if claimed != held and not dtype.hasobject:  # object arrays are refused by read_array
                dims = "x".join(map(str, shape)) or "scalar"
                raise UsageError(
                    f"input {quoted(path)}: its header claims a {dims} {dtype}"
                    f" array ({claimed} bytes) but the file holds {held} bytes of data"
                )
            stream.seek(0)
            return npy_format.read_array(stream, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        if isinstance(exc, IsADirectoryError):
            why = "it is a directory"  # as deploy-run says it
        elif isinstance(exc, OSError) and exc.strerror:
            why = exc.strerror  # not "[Errno 2] ...: 'PATH'": the path is said once
        else:
            why = clipped(reason(exc), 160)  # numpy quotes the whole header: a 5,000-digit shape
        raise UsageError(f"cannot read input {quoted(path)} as a .npy array: {why}") from None


def output_mode(path: str) -> int | None:
    """The mode of what `path` names now (None: nothing yet), once it is known that an array can
    be written there: not a directory, and a file's directory exists. Checked before a command
    runs anything, and again when it writes."""
    if not path:
        raise UsageError("-o '': expected a .npy file path")
    try:
        mode: int | None = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        raise UsageError(f"cannot write output {quoted(path)}: {exc.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"output {quoted(path)} is a directory; expected a .npy file path")
    if mode is None or stat.S_ISREG(mode):
        parent = Path(os.path.realpath(path)).parent
        if not parent.is_dir():
            problem = "is not a directory" if parent.exists() else "does not exist"
            raise UsageError(f"cannot write output {quoted(path)}: {parent} {problem}")
    return mode


def check_not_read(output: str, reads: list[str], writes: list[str]) -> None:
    """`-o` may not name a file the command reads (an `-i` array, the model), nor one an earlier
    `-o` writes: the output would replace it (a model overwritten with .npy bytes, exit 0), or
    one output the other. A character device (`-o /dev/null`, to discard outputs) may be named
    any number of times. deploy-run refuses the same, in the same words."""
    try:
        if stat.S_ISCHR(os.stat(output).st_mode):
            return
    except OSError:
        pass  # nothing there yet
    for path, which in [
        *((r, "which this command reads") for r in reads),
        *((w, "which another -o writes") for w in writes),
    ]:
        try:
            same = os.path.samefile(output, path)
        except OSError:  # one of them does not exist (yet): one file if both paths name it
            same = os.path.realpath(output) == os.path.realpath(path)
        if same:
            raise UsageError(f"-o {quoted(output)} is {quoted(path)}, {which}; expected another file")


def save_npy(path: str, array: np.ndarray) -> None:
    """Write `array` to `path` as .npy. A regular file, or the file a symlink names (the link
    stays), is replaced in one rename; a device or FIFO (`/dev/stdout`, `/dev/null`) is written in
    place; a directory is refused. A path that cannot be written is bad input (exit 2); a write
    that fails midway (a full disk) is a failure (exit 1) and leaves no partial file."""
    mode = output_mode(path)
    if written_in_place(path, mode):
        _write_in_place(path, array)
        return
    target = Path(os.path.realpath(path))
    partial = target.with_name(f".deploy-{secrets.token_hex(4)}.partial.npy")  # fits beside any name
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write output {quoted(path)}: {exc.strerror} in {target.parent}") from None
    try:
        with os.fdopen(fd, "wb") as stream:
            if mode is not None:
                os.fchmod(stream.fileno(), stat.S_IMODE(mode))  # the file replaced keeps its mode
            _write_npy(stream, array)
        os.replace(partial, target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DeployError(f"cannot write output {quoted(path)}: {exc.strerror}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _is_our_stdout(path: str) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except OSError:
        return False


def written_in_place(path: str, mode: int | None) -> bool:
    """Whether the output `path` (of mode `mode`, from output_mode) is written as it is, not
    replaced: a device or FIFO, whose node a rename would replace, and this process's own stdout
    even when it is a file (`-o /dev/stdout >> log`: a rename would replace the log, reopening it
    would truncate it)."""
    return mode is not None and (not stat.S_ISREG(mode) or _is_our_stdout(path))


def _write_in_place(path: str, array: np.ndarray) -> None:
    """Write to a device, a FIFO or our stdout as it is (stdout through its own descriptor, so its
    position and append mode hold)."""
    try:
        stream = os.fdopen(os.dup(1), "wb") if _is_our_stdout(path) else open(path, "wb")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot write output {quoted(path)}: {exc.strerror}") from None
    try:
        with stream:
            _write_npy(stream, array)
    except OSError as exc:
        raise DeployError(f"cannot write output {quoted(path)}: {exc.strerror}") from None


def _write_npy(stream: BinaryIO, array: np.ndarray) -> None:
    """What `np.save` writes, with plain writes only: its fast path seeks, which a pipe or a
    terminal (`-o /dev/stdout`) cannot."""
    data = np.asarray(array, order="C")
    npy_format.write_array_header_1_0(stream, npy_format.header_data_from_array_1_0(data))
    stream.write(data.data)
