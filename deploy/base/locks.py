"""Advisory locks (flock) that serialize deploy's read-modify-write of shared files: the boards
config, server state files, a task's tuning records, artifact directories. Released when the
holder exits, however it exits, so a killed command never leaves a stale lock."""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.base.errors import UsageError


@contextmanager
def guarding(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of a file deploy reads, changes and writes back (`path`): the lock
    file `<path>.lock` beside it, its directory created if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(path.name + ".lock")):
        yield


@contextmanager
def locked(path: Path, shared: bool = False, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold a lock on `path`, a directory or a lock file (created if missing), exclusive or
    `shared`; `waiting()` is called once if another holder makes us wait."""
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:  # not blocking: opening a FIFO to read waits for a writer, forever
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"{path} is no regular file: deploy keeps a lock there (remove it)")
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)
