"""Errors that every layer of the pipeline raises for bad input or failed work.

The CLI turns them into one line on stderr and the error's exit code.
"""

from __future__ import annotations

import errno
import os
import reprlib
from typing import Any

NO_ROOM = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT))
"""What a tool that found the disk or the quota full says ("No space left on device", "Disk
quota exceeded"): the line of its output that names the cause."""


class DeployError(Exception):
    """A failure the user should see as one line (exit code 1)."""

    exit_code = 1


class UsageError(DeployError):
    """Bad input from the user: op, attribute, shape, dtype, file (exit code 2)."""

    exit_code = 2


def first_line(text: str) -> str:
    """The first non-blank line of an error message (compiler errors run to pages)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def reason(exc: BaseException) -> str:
    """Why `exc` was raised, as one line safe to print: the first line of its message (which may
    quote a board, a tracker or a file) through `printable`, else the name of its type."""
    return printable(first_line(str(exc))) or type(exc).__name__


def clipped(text: str, most: int = 48) -> str:
    """`text` cut to its first and last characters when longer than `most`, saying how long it
    was: a 5000-digit number or a string a YAML alias chain repeated stays a short message."""
    if len(text) <= most:
        return text
    return f"{text[: most - 16]}...{text[-8:]} ({len(text)} characters)"


SHOWN_MOST = 160
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 8, 8
_SHORT.maxstring = _SHORT.maxlong = _SHORT.maxother = 48


def shown(value: Any) -> str:
    """`value`'s repr as a message quotes it, bounded however large the value is (built bounded:
    a list a YAML alias chain made of a million long strings is never printed whole), then cut to
    SHOWN_MOST characters."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHOWN_MOST else f"{text[: SHOWN_MOST - 20]}...{text[-16:]}"


def quoted(path: str) -> str:
    """A path as a message quotes it, as deploy-run does too (run.cc's `Quoted`): in single
    quotes, with ' and \\ escaped and every character a terminal acts on as `printable` writes it
    (Python's repr would switch to double quotes for a path with a ')."""
    return "'" + printable(path.replace("\\", "\\\\").replace("'", "\\'")) + "'"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, carriage returns,
    line breaks, bidi overrides) written as a Python escape: what a board or a tracker says is
    shown on one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
