"""Work that can kill its process, run in a forked child: LLVM ends the process with abort() on an
error it cannot report ("LLVM ERROR: Cannot select: ..." from an op whose computation calls an
intrinsic of another architecture), which would take the CLI down with exit 134 and no message.

The child is forked from the calling thread only and does the one call; its result is what it
writes to files, so nothing but an exception travels back. A fork costs a few milliseconds;
a process of its own each time would cost a second to import TVM, and ops a user's file
registered in this process would be unknown there.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import signal
import sys
import tempfile
import threading
from collections.abc import Callable

FORK_LOCK = threading.Lock()
"""Held while this process forks, and by whoever calls into LLVM in this process (`tvm.compile`):
a fork while another thread is inside LLVM would copy its locks held, and the child could wait
on them forever. (Other TVM calls take no lock the child's emission needs.)"""


class ChildDied(Exception):
    """The child was killed by `signum`; `said` is what it wrote on stderr."""

    def __init__(self, signum: int, said: str) -> None:
        super().__init__(f"killed by {signal.Signals(signum).name}")
        self.signum = signum
        self.said = said


def in_child(action: Callable[[], None]) -> None:
    """`action()` in a forked child: its exception is raised here, its stderr copied to ours; a
    death by a signal is ChildDied. The child dumps no core (an abort would leave one in the
    working directory)."""
    with tempfile.TemporaryFile() as said:
        reader, writer = os.pipe()
        with FORK_LOCK:
            pid = os.fork()
        if pid == 0:  # the child: only this thread, and out by os._exit (no atexit, no flushes)
            try:
                os.close(reader)
                _child(action, writer, said.fileno())
            finally:  # even a signal's exception before `_child` takes over never runs our caller
                os._exit(1)
        os.close(writer)
        try:
            with os.fdopen(reader, "rb") as pipe:
                raised = pipe.read()
            _, status = os.waitpid(pid, 0)
        except BaseException:  # a stop while waiting: the child goes too
            _end(pid)
            raise
        said.seek(0)
        text = said.read().decode(errors="replace")
    if os.WIFSIGNALED(status):
        raise ChildDied(os.WTERMSIG(status), text)
    if text:
        sys.stderr.write(text)
    if raised:
        raise pickle.loads(raised)


def _child(action: Callable[[], None], writer: int, stderr: int) -> None:
    """Run `action` as `in_child`'s child and exit: 0, or 1 with its exception pickled to `writer`."""
    code = 0
    try:
        faulthandler.disable()  # a test runner's, which would print the abort's Python stack
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        os.dup2(stderr, 2)  # LLVM's own line; Python's buffers are the parent's, never flushed here
        action()
    except BaseException as exc:  # handed to the parent, raised there
        code = 1
        try:
            data = pickle.dumps(exc)
            pickle.loads(data)
        except Exception:  # one that does not travel (some of TVM's): its text, as the RuntimeError it is
            data = pickle.dumps(RuntimeError(str(exc)))
        with os.fdopen(writer, "wb") as pipe:
            pipe.write(data)
    os._exit(code)


def _end(pid: int) -> None:
    """Kill the child `pid` and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
