"""How many threads the TVM runtime starts, here and in the emulator's server: `TVM_NUM_THREADS`,
checked once per command, else this host's CPUs."""

from __future__ import annotations

import os
import re

from deploy.base.errors import UsageError

THREADS_ENV = "TVM_NUM_THREADS"


def host_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, `taskset`), else the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity outside Linux
        return os.cpu_count() or 1


def check_thread_env() -> None:
    """`TVM_NUM_THREADS`, where set, must be a count from 1 to this host's CPUs. TVM starts that
    many threads, spinning: 500 on 2 CPUs kept a finished `deploy run` alive for 156 s, and
    100000 aborted it; 0, negative or not a number, TVM would quietly ignore."""
    text = os.environ.get(THREADS_ENV, "")
    if not text:
        return
    cpus = host_cpus()
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or not 1 <= int(text) <= cpus:
        raise UsageError(
            f"{THREADS_ENV}={text!r}: expected a thread count from 1 to {cpus} (this host's CPUs)"
        )


def runtime_threads() -> str:
    """The value for `TVM_NUM_THREADS` in a process deploy starts or tunes in: as set, else
    every CPU (TVM's own default halves them on x86)."""
    return os.environ.get(THREADS_ENV) or str(host_cpus())
