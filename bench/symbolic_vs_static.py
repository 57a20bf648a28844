"""One module for a symbolic batch N against a module built for each fixed batch, measured in one run.

    TVM_NUM_THREADS=2 .venv/bin/python bench/symbolic_vs_static.py [--target x86] [--rounds 9]

For each workload and batch size, the symbolic module (built once) and the module built for that
batch are checked against numpy, then timed in interleaved rounds (`measure.interleaved_runs`: one
run of each per round, so drift falls on both). Prints the medians, the interquartile spread and
the ratio symbolic/static.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from harness import at_least_one, host_target, run

from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions, for_device
from deploy.devices import get_device
from deploy.ops import TensorType, bind, get_op
from deploy.verify.compare import random_input
from deploy.verify.measure import Measured, Timer, interleaved_runs

WORKLOADS: list[tuple[str, dict[str, Any], list[tuple[int, ...]]]] = [
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, [(64, 112, 112)]),
    ("add", {}, [(64, 56, 56), (1, 56, 56)]),
    ("leaky_relu", {}, [(64, 56, 56)]),
    ("argmax", {"axis": -1}, [(256, 1024)]),
]
"""(op, attributes, input shapes after the batch dim)."""
BATCHES = (1, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    host = host_target(parser, args.target)
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {args.target}, TVM_NUM_THREADS={threads}, medians of {args.rounds} interleaved rounds")
    print(f"{'workload':34} {'N':>3} {'static ms':>14} {'symbolic ms':>14} {'sym/static':>10}")
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        options = for_device(BuildOptions(), session)

        def built(
            shapes: list[tuple[int | str, ...]], op_name: str, attrs: dict[str, Any]
        ) -> tuple[Any, ...]:
            """The op bound to `shapes`, compiled and exported: (bound op, directory, manifest)."""
            bound = bind(get_op(op_name), attrs, [TensorType(s, "float32") for s in shapes])
            directory = Path(tempfile.mkdtemp(dir=tmp))
            return bound, directory, export(compile_op(bound, host, options), directory)

        for op_name, attrs, tails in WORKLOADS:
            symbolic = built([("N", *t) for t in tails], op_name, attrs)
            for n in BATCHES:
                static = built([(n, *t) for t in tails], op_name, attrs)
                rng = np.random.default_rng(0)
                inputs = [random_input(TensorType((n, *t), "float32"), rng) for t in tails]
                errors, timers = [], []
                for bound, directory, manifest in (static, symbolic):
                    timers.append(Timer(session, directory, manifest, inputs, bound))  # checked first
                    assert timers[-1].max_error is not None  # it was given the op: it checked
                    errors.append(timers[-1].max_error)
                s, y = (
                    Measured(error, tuple(runs))
                    for error, runs in zip(errors, interleaved_runs(timers, args.rounds), strict=True)
                )
                shapes = " ".join("x".join(map(str, t)) for t in tails)
                print(
                    f"{op_name + ' Nx' + shapes:34} {n:3} {s.ms:8.3f} ±{s.spread:5.3f}"
                    f" {y.ms:8.3f} ±{y.spread:5.3f} {y.ms / s.ms:10.3f}"
                )


if __name__ == "__main__":
    run(main)
