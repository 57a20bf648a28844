"""Work that can kill its process, run in a forked child: LLVM ends the process with abort() on an
error it cannot report ("LLVM ERROR: Cannot select: ..." from an op whose computation calls an
intrinsic of another architecture), or with exit(1) (`report_fatal_error`), which would take the
CLI down with no message.

The child is forked from the calling thread only and does the one call; its result is what it
writes to files, so nothing but an exception travels back, through a temporary file (a pipe's
write end would be inherited by another thread's child, and reading to its end would wait for
that child too). A fork costs a few milliseconds; a process of its own each time would cost a
second to import TVM, and ops a user's file registered in this process would be unknown there.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import resource
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

PR_SET_PDEATHSIG = 1
"""Linux's prctl option: the signal a process gets when the thread that forked it ends."""
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
"""Looked up here: a child of a process with threads must not load anything (the loader's lock)."""
FORK_LOCK = threading.Lock()
"""Held while this process forks, and by whoever calls into LLVM in this process (`tvm.compile`):
a fork while another thread is inside LLVM would copy its locks held, and the child could wait
on them forever. That other TVM calls take no lock the child's emission needs is assumed, not
checked: a child that waits anyway is killed at its deadline (`DEADLINE_S`)."""

DEADLINE_S = 30 * 60.0
"""Longest a child may run: far past any export (seconds), short of a build hung for good."""
_RUNNING: dict[str, int] = {}
"""The scratch directory of each `in_child` call under way, and its child's pid (0 before the
fork), for `end_children`."""


class ChildDied(Exception):
    """The child ended without a result: killed by a signal or at its deadline, or exited nonzero
    with no exception sent; `said` is what it wrote on stderr."""

    def __init__(self, how: str, said: str) -> None:
        super().__init__(how)
        self.said = said


@contextmanager
def signals_after(parent: int) -> Iterator[None]:
    """Signals that arrive inside the block take effect after it, in process `parent` only.
    Blocking them holds those sent to this thread; but the kernel gives a process's signal to
    any thread not blocking it, and on the main thread its Python handler (a ^C's
    KeyboardInterrupt) would then run at the next bytecode, inside the block, or inside an
    at-fork hook, where its exception is lost. So the main thread's Python handlers only record
    the signal inside, and it is raised again after, when this process is `parent` (a forked
    child drops it: it has its own to do)."""
    deferred: list[int] = []
    replaced: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in signal.valid_signals():
            handler = signal.getsignal(signum)
            if callable(handler):
                replaced[signum] = signal.signal(signum, lambda number, _frame: deferred.append(number))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
        if os.getpid() == parent:
            for number in dict.fromkeys(deferred):
                signal.raise_signal(number)


def in_child(action: Callable[[], None], deadline_s: float = DEADLINE_S) -> None:
    """`action()` in a forked child: its exception is raised here, its stderr copied to ours; any
    other end is ChildDied. The child dumps no core (an abort would leave one in the working
    directory). Its temporary files go in a directory of ours, removed whatever its end: a child
    killed mid-export had left TVM's `lib0.o` behind."""
    parent, pid = os.getpid(), 0
    with (
        tempfile.TemporaryFile() as said,
        tempfile.TemporaryFile() as sent,
        tempfile.TemporaryDirectory(prefix="deploy-child-") as scratch,
    ):
        _RUNNING[scratch] = 0
        try:
            with FORK_LOCK, signals_after(parent):  # a ^C during the fork: raised once `pid` is set
                pid = os.fork()
            if pid == 0:  # the child: only this thread, and out by os._exit (no atexit, no flushes)
                tempfile.tempdir = scratch
                _child(action, sent.fileno(), said.fileno(), parent)
            _RUNNING[scratch] = pid
            status = _wait(pid, deadline_s)
        except BaseException:  # a stop (^C) anywhere here: the child goes too, and never returns
            if os.getpid() != parent:
                os._exit(1)
            if pid > 0:
                _end(pid)
            raise
        finally:
            _RUNNING.pop(scratch, None)
        said.seek(0)
        text = said.read().decode(errors="replace")
        exit_code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
        raised = _received(sent) if exit_code == 1 else None
    if status is None:
        raise ChildDied(f"ran past {deadline_s:g} s and was killed", text)
    if os.WIFSIGNALED(status):
        raise ChildDied(f"was killed by {signal.Signals(os.WTERMSIG(status)).name}", text)
    if raised is None and os.WEXITSTATUS(status) != 0:
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        raise ChildDied(f"exited with status {os.WEXITSTATUS(status)}" + (f": {last}" if last else ""), text)
    if text:
        sys.stderr.write(text)
    if raised is not None:
        raise raised


def end_children() -> None:
    """Kill the children `in_child` calls of other threads wait for, and remove their scratch
    directories: for a process about to end with `os._exit` under such a call (a command stopped
    while another thread exports, `stopping.abandoned`), which runs no `finally`. Each child
    would die with its thread anyway (`_child`), but its directory would stay in $TMPDIR."""
    for scratch, pid in list(_RUNNING.items()):
        if pid > 0:
            _end(pid)
        shutil.rmtree(scratch, ignore_errors=True)


def _wait(pid: int, deadline_s: float) -> int | None:
    """The child `pid`'s status once it ends; None if it ran past `deadline_s` (then killed). Woken
    by the child's end itself (a pidfd), not by polling: an export takes tens of milliseconds, and
    a poll's sleeps had doubled that."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # a kernel before 5.3, or a sandbox that forbids it: poll, 1 ms apart
        return _polled(pid, deadline_s)
    try:
        waiting = select.poll()
        waiting.register(fd, select.POLLIN)
        ended = waiting.poll(deadline_s * 1000)
    finally:
        os.close(fd)
    if not ended:
        _end(pid)
        return None
    return os.waitpid(pid, 0)[1]


def _polled(pid: int, deadline_s: float) -> int | None:
    """`_wait` where there is no pidfd: waitpid polled every millisecond."""
    end = time.monotonic() + deadline_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= end:
            _end(pid)
            return None
        time.sleep(0.001)


def _received(sent: IO[bytes]) -> BaseException | None:
    """The exception the child pickled into `sent`; None if it sent none or only part of one."""
    sent.seek(0)
    data = sent.read()
    try:
        exc = pickle.loads(data) if data else None
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def _child(action: Callable[[], None], sent: int, stderr: int, parent: int) -> None:
    """Run `action` as `in_child`'s child and exit: 0, or 1 with its exception pickled to `sent`
    (1 with nothing sent if even that fails). It is killed when the thread that forked it ends
    (`PR_SET_PDEATHSIG`): a command stopped while another thread exports ends with `os._exit`
    (`stopping.beside`), and an orphan would hold the build cache's lock until it ended."""
    code = 1
    try:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the line above
            return
        faulthandler.disable()  # a test runner's, which would print the abort's Python stack
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        os.dup2(stderr, 2)  # LLVM's own line; Python's buffers are the parent's, never flushed here
        try:
            action()
            code = 0
        except BaseException as exc:  # handed to the parent, raised there
            try:
                data = pickle.dumps(exc)
                pickle.loads(data)
            except Exception:  # one that does not travel (some of TVM's): its text, as the RuntimeError it is
                data = pickle.dumps(RuntimeError(str(exc)))
            with open(sent, "wb", closefd=False) as out:
                out.write(data)
    finally:  # whatever is raised here, a signal's exception included, never runs our caller
        os._exit(code)


def _end(pid: int) -> None:
    """Kill the child `pid` and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
