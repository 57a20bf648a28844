"""User ops at batch 1, in cache, as an edge device calls them: the schedule an op gets without
schedule code (the generic one) against numpy and against what a short `deploy tune` finds.

    TVM_NUM_THREADS=2 .venv/bin/python bench/user_ops.py [--target x86] [--trials 16]

The ops have no schedule of their own (they get the generic one): `bench/myops/` (hard_swish,
channel_shuffle, scale_bias), written as a user writes them, and the built-in hard_sigmoid
(MobileNetV3's h-sigmoid, first written as a user's example op); the shapes are
ShuffleNetV2's and MobileNetV3's at batch 1 (0.1 to 0.8 MB a tensor). Per workload it prints the
default's median ms and numpy's (timed the same way: many calls a run, warm), then tunes
(`--trials`, 0 to skip) and prints the default and the best tuned schedule timed side by side,
as `deploy tune` judges them, and the default over the tuned. Issue #36's goals: no slower than
numpy, within 1.5x of the tuned.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from harness import at_least_one, host_target, run

from deploy.compiler.compile import compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions
from deploy.devices import get_device
from deploy.ops import TensorType, bind, get_op, load_ops_path
from deploy.tune.tuners import tune
from deploy.verify.compare import random_input
from deploy.verify.measure import check_and_time, host_ms

HERE = Path(__file__).resolve().parent
SHAPES = ((1, 24, 56, 56), (1, 116, 28, 28), (1, 232, 14, 14), (1, 464, 7, 7))
"""ShuffleNetV2 1.0x's stages at batch 1 (MobileNetV3's are alike: rows of 7 to 56)."""
OPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("hard_swish", {}), ("hard_sigmoid", {"alpha": 1 / 6, "beta": 0.5}),
    ("channel_shuffle", {"groups": 2}), ("scale_bias", {}),
)  # fmt: skip


def shapes_of(op_name: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The input shapes of a workload: scale_bias also reads a scale and a bias per channel."""
    return [shape, (shape[1],), (shape[1],)] if op_name == "scale_bias" else [shape]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--trials", type=int, default=16, help="tuning trials per workload (0: no tuning)")
    args = parser.parse_args()
    at_least_one(parser, "--repeat", args.repeat)
    if args.trials < 0:
        parser.error(f"--trials {args.trials}: expected 0 or more")
    target = host_target(parser, args.target)
    load_ops_path(HERE / "myops")
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {target.name}, TVM_NUM_THREADS={threads}, medians of {args.repeat}, {args.trials} trials")
    print(f"{'workload':34} {'default ms':>10} {'numpy ms':>9} {'np/default':>10} {'side by side':>20}"
          f" {'default/tuned':>13}")  # fmt: skip
    device = get_device("local")
    with tempfile.TemporaryDirectory() as tmp, device.open() as session:
        for (op_name, attrs), shape in ((op, shape) for op in OPS for shape in SHAPES):
            types = [TensorType(s, "float32") for s in shapes_of(op_name, shape)]
            bound = bind(get_op(op_name), attrs, types)
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            default = compile_scheduled(
                bound, target, BuildOptions(), *hand_schedule(bound, target, BuildOptions())
            )
            ours = check_and_time(session, default, Path(tmp), args.repeat).ms
            numpy = host_ms(functools.partial(bound.op.reference, bound.attrs, *inputs), args.repeat)
            tuned = "-"
            if args.trials:
                verdict = (
                    tune(bound, target, BuildOptions(), device, Path(tmp) / "records", args.trials).accepted
                    or {}
                )
                best = verdict.get("ms") or verdict.get("best_tuned_ms")
                if best is not None:
                    tuned = f"{verdict['hand_ms']:.4f} / {best:.4f} {verdict['hand_ms'] / best:13.2f}"
            label = f"{op_name} {'x'.join(map(str, shape))}"
            print(f"{label:34} {ours:10.4f} {numpy:9.4f} {numpy / ours:10.2f} {tuned:>34}", flush=True)


if __name__ == "__main__":
    run(main)
