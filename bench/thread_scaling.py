"""How the CPU kernels scale with threads: `deploy bench` at 1, 2, 4, ... threads, each run with
its own roofline measured at that thread count (one thread cannot draw the bandwidth sixteen can),
so every ratio is against what that many threads can move. Counts go up to the host's CPUs, as
deploy takes TVM_NUM_THREADS.

    .venv/bin/python bench/thread_scaling.py [--target x86] [--threads 1,2,4,...] [--repeat 9]

Each count is one `deploy bench --json --no-baselines` in a process of its own with
TVM_NUM_THREADS set (TVM sizes its thread pool once per process); the bench times each op
interleaved with the bandwidth kernels, so the ratios hold at every count.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import at_least_one, run

from deploy.base.threads import THREADS_ENV, host_cpus
from deploy.bench.bench import refuse_wrong_answers

ROOT = Path(__file__).resolve().parent.parent


def bench_at(
    deploy: list[str], threads: int, target: str, repeat: int, min_mb: int | None
) -> list[dict[str, Any]]:
    """`deploy bench`'s JSON rows (run by the `deploy` command line) with TVM_NUM_THREADS=threads."""
    command = [*deploy, "bench", "--target", target, "--json", "--no-baselines", "--repeat", str(repeat)]
    if min_mb is not None:
        command += ["--min-mb", str(min_mb)]
    env = {**os.environ, THREADS_ENV: str(threads)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode == 1 and done.stdout.startswith("["):  # its rows, some of them wrong answers
        return json.loads(done.stdout)
    if done.returncode != 0:  # its own exit code: 2 bad input, 1 a failed check or a lost device
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]  # its error line comes last
        print(f"error: deploy bench at {threads} threads: {said}", file=sys.stderr)
        sys.exit(done.returncode)
    return json.loads(done.stdout)


def thread_counts(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; anything but counts from 1 to this host's CPUs (as deploy takes
    TVM_NUM_THREADS) is argparse's one-line error."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or max(counts) > host_cpus():
        raise argparse.ArgumentTypeError(f"{text!r}: expected thread counts from 1 to {host_cpus()} like 1,2")
    return counts


def default_counts() -> str:
    """1, 2, 4, ... up to this host's CPUs, and the CPUs themselves."""
    cpus = host_cpus()
    return ",".join(map(str, sorted({1 << k for k in range(cpus.bit_length())} | {cpus})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument(
        "--threads", type=thread_counts, default=default_counts(), help="comma-separated [1, 2, 4 ... CPUs]"
    )
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--min-mb", type=int, help="passed to deploy bench")
    parser.add_argument(
        "--deploy", default=f"{sys.executable} -m deploy", help="the deploy command [this Python's]"
    )
    args = parser.parse_args()
    at_least_one(parser, "--repeat", args.repeat)
    counts = args.threads
    print(f"target {args.target} on {host_cpus()} CPUs; medians of {args.repeat}; x floor = time"
          " / max(bytes read / read GB/s, bytes written / write GB/s), each at that count")  # fmt: skip
    print(f"{'threads':>7} {'read':>6} {'write':>6} {'copy':>6} {'op':>10} {'ms':>8} {'x floor':>7}"
          f" {'x copy':>6}  vs {counts[0]} thread(s)")  # fmt: skip
    first: dict[str, float] = {}
    every: list[dict[str, Any]] = []
    for threads in counts:
        rows = bench_at(shlex.split(args.deploy), threads, args.target, args.repeat, args.min_mb)
        every += rows
        for row in rows:
            if row["wrong_answer"]:
                print(f"{threads:>7} {'':>20} {row['op']:>10} wrong answer: {row['wrong_answer']}")
                continue
            ms = row["median_ms"]
            base = first.setdefault(f"{row['op']} {row['shapes']}", ms)
            print(f"{threads:>7} {row['read_gb_per_s']:>6.1f} {row['write_gb_per_s']:>6.1f}"
                  f" {row['roofline_gb_per_s']:>6.1f} {row['op']:>10} {ms:>8.3f} {row['x_floor']:>7.2f}"
                  f" {row['x_roofline']:>6.2f}  {base / ms:.2f}x")  # fmt: skip
    refuse_wrong_answers(every)


if __name__ == "__main__":
    run(main)
