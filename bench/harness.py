"""How the bench scripts start and end, as `deploy` does: a target this host can run (they time on
it) and counts of at least one are checked before any work, each a usage error (exit 2); a
DeployError is one `error:` line with its exit code (2 bad input, 1 a failed check or a lost
device); Ctrl-C is exit 130. Imported by the scripts beside it (`python bench/NAME.py`)."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deploy.base.errors import DeployError, reason
from deploy.base.paths import check_places
from deploy.base.stopping import exit_code
from deploy.base.threads import check_thread_env

if TYPE_CHECKING:
    from deploy.compiler.targets import Target


def host_target(parser: argparse.ArgumentParser, name: str) -> Target:
    """The target `name`, which this host must run: else `parser.error` (exit 2)."""
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.verify.run import check_device

    try:
        target = get_target(name)
        check_device(target, get_device("local"))
    except DeployError as exc:
        parser.error(reason(exc))
    return target


def at_least_one(parser: argparse.ArgumentParser, option: str, count: int) -> int:
    """`count` (--repeat, --rounds), which must be at least 1: else `parser.error`."""
    if count < 1:
        parser.error(f"{option} {count}: expected at least 1")
    return count


def thread_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """`--threads` as a list of counts of at least 1 (`1,2`): else `parser.error`."""
    words = text.split(",")
    counts = [int(w) for w in words if w.strip().isdigit() and int(w) > 0]
    if len(counts) != len(words):
        parser.error(f"--threads {text}: expected thread counts of at least 1, comma-separated")
    return counts


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a bench child timing at `threads`: TVM's pool and numpy's BLAS
    (OpenMP, OpenBLAS: deploy otherwise keeps it on one thread) both that wide."""
    import os

    wide = {name: str(threads) for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return {**os.environ, **wide}


def spread(times: list[float]) -> str:
    """The median of `times` (ms) and, from two on, their interquartile range: `m [q1-q3]`."""
    if len(times) < 2:
        return f"{times[0]:.4f}"
    low, mid, high = statistics.quantiles(times, n=4, method="inclusive")
    return f"{mid:.4f} [{low:.4f}-{high:.4f}]"


def run(main: Callable[[], None]) -> None:
    """Run a script's `main` with deploy's errors and exit codes."""
    try:
        check_thread_env()
        check_places()
        main()
    except DeployError as exc:
        print(f"error: {reason(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as interrupt:  # SIGTERM and SIGHUP end a script as the shell says
        print("error: stopped by SIGINT", file=sys.stderr)
        sys.exit(exit_code(interrupt))


class HostTimer:
    """A host function timed as `deploy.verify.measure.Timer` times an artifact: runs of calls
    lasting about 0.2 s, milliseconds per call."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        import time

        from deploy.verify.measure import TARGET_SECONDS, calls_lasting

        start = time.perf_counter()
        fn()
        self.fn, self.number = fn, calls_lasting(TARGET_SECONDS, time.perf_counter() - start)

    def runs(self, repeat: int) -> list[float]:
        import time

        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(self.number):
                self.fn()
            times.append((time.perf_counter() - start) / self.number * 1e3)
        return times
