"""The memory-bound ops at their bench cases (well beyond the last-level cache) against issue #7's
targets: `deploy bench` on this host (each op timed interleaved with the bandwidth kernels),
numpy and PyTorch (CPU, same thread count) beside it, all measured in one run.

    TVM_NUM_THREADS=2 .venv/bin/python bench/roofline_targets.py [--target x86] [--repeat 15]

Targets (issue #7): max_pool2d (3x3, stride 2, padding 1) within 1.5x of the copy roofline and
at least 2x faster than PyTorch; add, leaky_relu and argmax within 1.5x of their rooflines.
"""

from __future__ import annotations

import argparse
import os

from harness import at_least_one, host_target, run

from deploy.bench.bench import BenchOptions, bench_ops, refuse_wrong_answers
from deploy.bench.torch_baseline import torch_version
from deploy.compiler.options import BuildOptions
from deploy.devices import get_device
from deploy.ops import all_ops

ROOF_GOAL = 1.5
"""Times the copy roofline every op may take (issue #7)."""
TORCH_GOALS = {"max_pool2d": 2.0}
"""Times faster than PyTorch an op must be, where issue #7 set a goal."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    at_least_one(parser, "--repeat", args.repeat)
    target, device = host_target(parser, args.target), get_device("local")
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    rows = bench_ops(all_ops(), "float32", target, BuildOptions(), device, BenchOptions(repeat=args.repeat))
    print(f"target {target.name}, TVM_NUM_THREADS={threads}, torch {torch_version() or 'not installed'},"
          f" medians of {args.repeat} rounds, each op beside the bandwidth kernels")  # fmt: skip
    print(f"{'workload':44} {'MB':>6} {'copy GB/s':>9} {'ms':>7} {'x copy':>6} {'x floor':>7} {'numpy':>8}"
          f" {'torch':>7} {'vs torch':>8}  targets")  # fmt: skip
    for r in rows:
        if r["wrong_answer"]:
            print(f"{r['op'] + ' ' + r['shapes']:44} {r['mb_moved']:6.1f} wrong answer: {r['wrong_answer']}")
            continue
        met = [f"roofline {'met' if r['x_roofline'] <= ROOF_GOAL else 'MISSED'} (<= {ROOF_GOAL}x)"]
        goal, torch = TORCH_GOALS.get(r["op"]), r["torch_ms"]
        if goal is not None and torch is not None:
            met.append(f"torch {'met' if r['speedup_vs_torch'] >= goal else 'MISSED'} (>= {goal}x)")
        torch_text = f"{'-':>7} {'-':>8}" if torch is None else f"{torch:7.2f} {r['speedup_vs_torch']:7.2f}x"
        print(f"{r['op'] + ' ' + r['shapes']:44} {r['mb_moved']:6.1f} {r['roofline_gb_per_s']:9.1f}"
              f" {r['median_ms']:7.2f} {r['x_roofline']:6.2f} {r['x_floor']:7.2f} {r['numpy_ms']:8.2f}"
              f" {torch_text}  {', '.join(met)}")  # fmt: skip
    refuse_wrong_answers(rows)


if __name__ == "__main__":
    run(main)
