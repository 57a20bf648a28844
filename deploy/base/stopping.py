"""Stopping a command from outside: Ctrl-C (SIGINT), `kill` (SIGTERM) and a closed terminal
(SIGHUP) unwind the same way, as a KeyboardInterrupt, so every cleanup written for Ctrl-C (servers
stopped, temporary files removed, records kept) runs for all three. The exit code tells which."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """What a stop by `signum` raises: Stopped, or a plain KeyboardInterrupt for Ctrl-C."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number, as shells report a process a signal ended."""
    return 128 + (interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT)


@contextmanager
def handled(handler: Any, signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Run `handler` for `signals` inside the block (main thread only), the previous handlers
    after it. A signal this process was told to ignore (`nohup`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig, before in previous.items():
        if before != signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, signal.SIG_DFL if before is None else before)


_received: list[int] = []
"""The signals that stopped the command under way (`stopping_like_ctrl_c`)."""


def stopped_by() -> KeyboardInterrupt | None:
    """What the signal that stopped the command under way raised, if one did. An exception raised
    in a Python callback that TVM calls (a TIR pass of ours, its own Relax pipeline) comes back
    from TVM's FFI as a RuntimeError: a Ctrl-C mid-compile would end as an error line, exit 1."""
    return interrupt_for(_received[0]) if _received else None


def raise_if_stopped() -> None:
    """Raise what stopped the command under way, if a signal did: called first by a handler that
    catches every exception (a candidate that fails is rejected, a case that fails is reported),
    which would take a stop handed back by TVM as another exception for a failure and go on."""
    stop = stopped_by()
    if stop is not None:
        raise stop


@contextmanager
def stopping_like_ctrl_c() -> Iterator[None]:
    """Raise Stopped on SIGTERM/SIGHUP inside the block, and KeyboardInterrupt on Ctrl-C, noting
    which (`stopped_by`). Further SIGTERM/SIGHUP are ignored while the command cleans up (which
    may take seconds: stopping a server, closing an SSH link); SIGKILL still ends it at once."""
    _received.clear()

    def stop(signum: int, frame: Any) -> None:
        _received.append(signum)
        for sig in STOP_SIGNALS if signum in STOP_SIGNALS else ():  # after Ctrl-C, `kill` still stops
            if signal.getsignal(sig) == stop:
                signal.signal(sig, signal.SIG_IGN)
        raise interrupt_for(signum)

    with handled(stop, (signal.SIGINT, *STOP_SIGNALS)):
        yield


_abandoned: list[threading.Event] = []
"""When each `interruptible` call under way or left running by a stop ends."""


def interruptible(call: Callable[[], T]) -> T:
    """`call()` on a worker thread that the main thread waits on, so that a stop is raised within
    milliseconds even during one long call into TVM: a signal's handler runs only when Python gets
    control back, and the TIR pipeline of a 2,000-node graph is one call of 37 s. TVM releases the
    GIL in its calls, so the wait costs nothing. A stopped call is abandoned: it runs on with its
    result unused, and the process ends without waiting for it (`abandoned`). It must not write
    files: what it computes is only handed back. Off the main thread, `call` runs there."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    outcome: list[Any] = []
    ended = threading.Event()  # not Thread.join: an interrupted join marks a running thread ended

    def work() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread, raised there
            outcome.append((False, exc))
        finally:
            ended.set()

    _abandoned.append(ended)  # from before the start: a stop inside Thread.start leaves it running too
    threading.Thread(target=work, name="deploy-interruptible", daemon=True).start()
    ended.wait()  # a signal's handler runs in here, and its exception leaves it
    _abandoned.remove(ended)
    done, value = outcome[0]
    if not done:
        raise value
    return value


def beside(work: Callable[[], None], name: str) -> threading.Event:
    """Run `work` (which raises nothing) on a daemon thread of its own, counted as an
    `interruptible` call is: a command stopped while it runs ends with `os._exit` (`abandoned`),
    without waiting for it, so it may write only what a kill may interrupt (the build cache's
    staging). Returns the event set when it ends."""
    ended = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            ended.set()  # kept in `_abandoned`, which `abandoned` reads without a lock

    _abandoned.append(ended)
    threading.Thread(target=run, name=name, daemon=True).start()
    return ended


def abandoned() -> bool:
    """Whether a stopped `interruptible` call still runs. The process must then end with
    `os._exit`: a normal exit runs C++ static destructors under the running call (a crash)."""
    return not all(ended.is_set() for ended in _abandoned)
