"""How the bench scripts start and end, as `deploy` does: a target this host can run (they time on
it) and counts of at least one are checked before any work, each a usage error (exit 2); a
DeployError is one `error:` line with its exit code (2 bad input, 1 a failed check or a lost
device); Ctrl-C is exit 130. Imported by the scripts beside it (`python bench/NAME.py`)."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
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


AVX2_HOST_HELP = (
    "time as on an AVX2 host: AVX-512 hidden from CPUID in the timing processes, so onnxruntime,"
    " numpy and PyTorch run the AVX2 kernels they would there (with --target x86, on an AVX-512 host)"
)
HIDE_AVX512 = Path(__file__).resolve().parent / "hide_avx512.c"


def avx2_host(parser: argparse.ArgumentParser, target_name: str) -> str:
    """`--avx2-host`: the processes this script starts from here on (its timing children) see no
    AVX-512 in CPUID (`hide_avx512.c` as LD_PRELOAD, built once into the cache with the host's
    cc), so baselines that dispatch on CPUID run their AVX2 kernels beside our `x86` build: the
    comparison of an AVX2 host, on the same cores. Returns what the script's header says of it
    (nothing where the host has no AVX-512 to hide); refused (`parser.error`) for another target
    or where Linux offers no CPUID faulting."""
    from deploy.base.paths import cache_root
    from deploy.devices import get_device

    if target_name != "x86":
        parser.error(f"--avx2-host with --target {target_name}: expected --target x86 (AVX2 builds)")
    host = get_device("local")
    if host.missing_cpu_flags(("avx512f",)):
        print("note: --avx2-host: this host has no AVX-512 to hide", file=sys.stderr)
        return ""
    if host.missing_cpu_flags(("cpuid_fault",)):
        parser.error("--avx2-host: this host offers no CPUID faulting (no cpuid_fault in /proc/cpuinfo)")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        parser.error("--avx2-host: no C compiler to build bench/hide_avx512.c (Debian: gcc)")
    source = HIDE_AVX512.read_bytes()
    library = cache_root() / "bench" / f"hide_avx512-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not library.is_file():
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as staging:
            built = Path(staging) / library.name
            command = [cc, "-O2", "-shared", "-fPIC", str(HIDE_AVX512), "-o", str(built)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                said = (done.stderr.strip().splitlines() or ["no message"])[-1]
                parser.error(f"--avx2-host: {cc} could not build {HIDE_AVX512.name}: {said}")
            built.replace(library)
    os.environ["LD_PRELOAD"] = " ".join(filter(None, (str(library), os.environ.get("LD_PRELOAD"))))
    probe = "import numpy; print(numpy._core._multiarray_umath.__cpu_features__['AVX512F'])"
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    if seen != "False":
        parser.error(f"--avx2-host: AVX-512 still shows through CPUID (numpy's AVX512F: {seen or 'none'})")
    return "; AVX-512 hidden from CPUID"


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
    wide = {name: str(threads) for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return {**os.environ, **wide}


def quartiles(times: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `times`; one time (`--rounds 1`) is all three."""
    if len(times) < 2:
        return times[0], times[0], times[0]
    low, mid, high = statistics.quantiles(times, n=4, method="inclusive")
    return low, mid, high


def round_ratio(ours: list[float], theirs: list[float]) -> float:
    """The first quartile of the per-round ratios ours/theirs (ms, one run of each per
    interleaved round): above a limit means ours was slower than the limit times theirs in three
    rounds of four, so one slow round of a noisy neighbour is not enough (from 3 rounds on). A
    round's pair shares the machine's state of that moment, so drift between rounds cancels."""
    return quartiles([a / b for a, b in zip(ours, theirs, strict=True)])[0]


def spread(times: list[float]) -> str:
    """The median of `times` (ms) and, from two on, their interquartile range: `m [q1-q3]`."""
    if len(times) < 2:
        return f"{times[0]:.4f}"
    low, mid, high = quartiles(times)
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
