"""Hand schedules against the generic CPU schedule and numpy, measured in one run.

    TVM_NUM_THREADS=2 .venv/bin/python bench/hand_vs_generic.py [--target x86]

Prints median milliseconds per call and the ratios (generic / hand, numpy / hand).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from harness import at_least_one, host_target, run

from deploy.compiler.compile import compile_scheduled, context, hand_schedule, prim_module
from deploy.compiler.options import BuildOptions
from deploy.devices import get_device
from deploy.ops import TensorType, bind, get_op
from deploy.schedules.cpu.generic import generic_cpu
from deploy.verify.compare import random_input
from deploy.verify.measure import check_and_time, host_ms

WORKLOADS: list[tuple[str, dict[str, Any], list[tuple[int, ...]]]] = [
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, [(32, 64, 112, 112)]),
    ("argmax", {"axis": 1}, [(2, 64, 56, 56)]),
    ("argmax", {"axis": -1}, [(8, 256, 1024)]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    at_least_one(parser, "--repeat", args.repeat)
    target = host_target(parser, args.target)
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {target.name}, TVM_NUM_THREADS={threads}, medians of {args.repeat}")
    print(f"{'workload':44} {'generic ms':>10} {'hand ms':>9} {'numpy ms':>9} {'gen/hand':>8} {'np/hand':>8}")
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        for op_name, attrs, shapes in WORKLOADS:
            bound = bind(get_op(op_name), attrs, [TensorType(s, "float32") for s in shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            generic = tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions()))
            generic_cpu(generic, context(bound, target, BuildOptions()))
            hand, name = hand_schedule(bound, target, BuildOptions())
            timings = {
                label: check_and_time(session, compiled, Path(tmp), args.repeat).ms
                for label, compiled in (
                    ("generic", compile_scheduled(bound, target, BuildOptions(), generic.mod, "cpu/generic")),
                    ("hand", compile_scheduled(bound, target, BuildOptions(), hand, name)),
                )
            }
            ref = host_ms(functools.partial(bound.op.reference, bound.attrs, *inputs), args.repeat)
            label = f"{op_name} {' '.join('x'.join(map(str, s)) for s in shapes)} {name}"
            print(
                f"{label:44} {timings['generic']:10.2f} {timings['hand']:9.2f} {ref:9.2f}"
                f" {timings['generic'] / timings['hand']:8.2f} {ref / timings['hand']:8.2f}"
            )


if __name__ == "__main__":
    run(main)
