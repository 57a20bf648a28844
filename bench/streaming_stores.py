"""Streaming stores (issue #53): the large elementwise ops built with plain stores and with
streaming ones (`deploy/compiler/streaming.py`), against onnxruntime (IOBinding, preallocated
output) and PyTorch (`out=`), all timed interleaved in one process per thread count.

    .venv/bin/python bench/streaming_stores.py [--threads 1,2] [--rounds 9] [--target x86]

Each op runs at its bench case (32x64x112x112 float32, past the last-level cache). Both builds
are checked against numpy first. Per op and thread count it prints the median ms and the
interquartile range of each, then plain/streamed and streamed against onnxruntime and PyTorch
(above 1: they are faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from harness import HostTimer, at_least_one, host_target, quartiles, run, thread_counts, thread_env

OPS = ("add", "leaky_relu", "hard_sigmoid", "layout_transform")


def built(session: Any, bound: Any, target: Any, work: Path) -> Any:
    """A timer of `bound` built for `target` (its default schedule), checked against numpy."""
    from deploy.base.errors import DeployError
    from deploy.compiler.compile import compile_op
    from deploy.compiler.export import export
    from deploy.compiler.options import BuildOptions
    from deploy.verify.compare import random_input
    from deploy.verify.measure import Timer
    from deploy.verify.run import against_reference, run_artifact

    directory = Path(tempfile.mkdtemp(dir=work))
    manifest = export(compile_op(bound, target, BuildOptions()), directory)
    inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
    comparison = against_reference(bound, inputs, run_artifact(session, directory, manifest, inputs))
    if not comparison.ok:
        raise DeployError(f"{bound.op.name} on {target.name}: {comparison.detail}")
    return Timer(session, directory, manifest, inputs)


def torch_call(bound: Any, inputs: list[np.ndarray]) -> Any:
    """PyTorch's op into a preallocated output, or None (no torch, no `out=` form)."""
    from deploy.bench.torch_baseline import BASELINES, torch_version

    baseline = BASELINES.get(bound.op.name)
    if torch_version() is None or baseline is None or baseline.into is None:
        return None
    import torch

    torch.set_num_threads(int(os.environ["TVM_NUM_THREADS"]))
    tensors = [torch.from_numpy(a) for a in inputs]
    out = torch.empty_like(baseline.call(bound.attrs, *tensors))
    return lambda: baseline.into(bound.attrs, out, *tensors)


def child(target_name: str, rounds: int, threads: int, names: list[str]) -> None:
    """Time each op at this process's TVM_NUM_THREADS."""
    from deploy.bench.onnxruntime_baseline import onnxruntime_call
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.ops import TensorType, bind, get_op
    from deploy.verify.compare import random_input
    from deploy.verify.measure import interleaved_runs

    streamed = get_target(target_name)
    plain = replace(streamed, streaming_store_bytes=None)
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        for name in names:
            op = get_op(name)
            case = op.bench_case()
            bound = bind(op, case.attrs, [TensorType(s, "float32") for s in case.shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            timers = {"plain": built(session, bound, plain, Path(tmp))}
            timers["streamed"] = built(session, bound, streamed, Path(tmp))
            baselines = {"ort": onnxruntime_call(bound, inputs), "torch": torch_call(bound, inputs)}
            for label, call in baselines.items():
                if call is not None:
                    timers[label] = HostTimer(call)
            runs = dict(zip(timers, interleaved_runs(list(timers.values()), rounds), strict=True))
            print(row(name, threads, runs), flush=True)


def row(name: str, threads: int, runs: dict[str, list[float]]) -> str:
    """One op's line: each build's and baseline's median ms ± interquartile range, then their
    medians over the streamed build's."""
    ms = {label: statistics.median(times) for label, times in runs.items()}
    cells, ratios = [], []
    for label in ("plain", "streamed", "ort", "torch"):
        if label not in runs:
            cells.append(f"{'-':>17}")
            ratios.append(f"{'-':>6}")
            continue
        low, _, high = quartiles(runs[label])
        cells.append(f"{ms[label]:8.3f}±{high - low:<8.3f}")
        ratios.append(f"{ms[label] / ms['streamed']:6.2f}")
    del ratios[1]
    return f"{name:17} {threads:>2} {' '.join(cells)} {' '.join(ratios)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians of these)")
    parser.add_argument("--target", default="x86", help="an x86 target this host runs")
    parser.add_argument("--ops", default=",".join(OPS), help="ops, comma-separated")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    target = host_target(parser, args.target)
    if target.streaming_store_bytes is None:
        parser.error(f"--target {args.target}: expected a target with streaming stores")
    if args.child:
        child(args.target, args.rounds, int(os.environ["TVM_NUM_THREADS"]), args.ops.split(","))
        return
    counts = thread_counts(parser, args.threads)
    print(f"medians of {args.rounds} interleaved rounds, ms ± interquartile range; load average"
          f" {os.getloadavg()[0]:.1f}; ratios: their ms / streamed ms")  # fmt: skip
    print(f"{'op':17} {'th':>2} {'plain ms':>17} {'streamed ms':>17} {'ort ms':>17} {'torch ms':>17}"
          f" {'plain':>6} {'ort':>6} {'torch':>6}")  # fmt: skip
    for threads in counts:
        env = thread_env(threads)
        command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--target", args.target,
                   "--ops", args.ops]  # fmt: skip
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    run(main)
