"""Hand schedules against the generic CPU schedule and numpy, measured in one run.

    TVM_NUM_THREADS=2 .venv/bin/python bench/hand_vs_generic.py [--target x86]

Prints median milliseconds per call and the ratios (generic / hand, numpy / hand).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import tvm

from devices import get_device
from ops import TensorType, bind, get_op
from schedules.cpu import generic_cpu
from toolchain.build import context, prim_module, schedule
from toolchain.compare import compare, random_input
from toolchain.cpu_lowering import compile_cpu
from toolchain.targets import get_target
from toolchain.timing import host_ms

WORKLOADS = [
    ("maxpool_add", {}, [(32, 64, 112, 112), (32, 1, 56, 56)]),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, [(32, 64, 112, 112)]),
    ("argmax", {"axis": 1}, [(2, 64, 56, 56)]),
    ("argmax", {"axis": -1}, [(8, 256, 1024)]),
]


def export(mod, target, folder: Path, name: str) -> Path:
    executable = compile_cpu(mod, target.tvm_target())
    path = folder / f"{name}.so"
    executable.export_library(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    target = get_target(args.target)
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {target.name}, TVM_NUM_THREADS={threads}, medians of {args.repeat}")
    print(f"{'workload':44} {'generic ms':>10} {'hand ms':>9} {'numpy ms':>9} {'gen/hand':>8} {'np/hand':>8}")
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        for index, (op_name, attrs, shapes) in enumerate(WORKLOADS):
            bound = bind(get_op(op_name), attrs, [TensorType(s, "float32") for s in shapes])
            rng = np.random.default_rng(0)
            inputs = [random_input(t, rng) for t in bound.inputs]
            expected = bound.op.reference(bound.attrs, *inputs)
            generic = tvm.s_tir.Schedule(prim_module(bound, target))
            generic_cpu(generic, context(bound, target))
            hand, name, _ = schedule(bound, target)
            timings = {}
            for label, mod in (("generic", generic.mod), ("hand", hand)):
                path = export(mod, target, Path(tmp), f"{index}-{op_name}-{label}")
                out = bound.output
                result = session.run(path, inputs, out.shape, out.dtype)
                assert compare(expected, result, bound.op.exact).ok, f"{label} schedule is wrong"
                runs = session.time(path, inputs, out.shape, out.dtype, number=5, repeat=args.repeat)
                timings[label] = statistics.median(runs) * 1e3
            ref = host_ms(functools.partial(bound.op.reference, bound.attrs, *inputs), args.repeat)
            label = f"{op_name} {' '.join('x'.join(map(str, s)) for s in shapes)} {name}"
            print(
                f"{label:44} {timings['generic']:10.2f} {timings['hand']:9.2f} {ref:9.2f}"
                f" {timings['generic'] / timings['hand']:8.2f} {ref / timings['hand']:8.2f}"
            )


if __name__ == "__main__":
    main()
