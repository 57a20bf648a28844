"""3-D MaxPool (issue #53): ONNX's MaxPool over D, H and W, built by deploy (`max_pool3d`, one
pass over the input) and run by onnxruntime (IOBinding, preallocated output), timed interleaved
in one process per thread count.

    .venv/bin/python bench/pool3d.py [--threads 1,2] [--rounds 9] [--shape 8,32,16,56,56]

The pool is k3 s2 p1 on each axis, float32. Our build is checked against numpy first. Per thread
count it prints the median ms and the interquartile range of each and onnxruntime's time over
ours (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from harness import HostTimer, at_least_one, host_target, quartiles, run, thread_counts, thread_env


def model(path: Path, shape: tuple[int, ...]) -> None:
    """The one-node ONNX model of the pool on an input of `shape`."""
    import onnx
    from onnx import TensorProto, helper

    out = [*shape[:2], *((d - 1) // 2 + 1 for d in shape[2:])]
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3] * 3, strides=[2] * 3, pads=[1] * 6)
    graph = helper.make_graph(
        [node], "pool3d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def onnxruntime_call(path: Path, x: np.ndarray, threads: int) -> Any:
    """onnxruntime's run of the model into a preallocated output."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    out = np.empty_like(session.run(None, {"x": x})[0])
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

    def call() -> np.ndarray:
        session.run_with_iobinding(binding)
        return out  # held by the call: onnxruntime writes into it

    return call


def child(rounds: int, threads: int, shape: tuple[int, ...]) -> None:
    """Build, check and time the pool at this process's TVM_NUM_THREADS."""
    from deploy.base.errors import DeployError
    from deploy.compiler.cache import cached_build
    from deploy.compiler.options import BuildOptions, for_device
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.model import load_model
    from deploy.ops.graph import bind_graph
    from deploy.verify.compare import random_input
    from deploy.verify.measure import Timer, interleaved_runs
    from deploy.verify.run import against_reference, run_artifact

    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        path = Path(tmp) / "pool3d.onnx"
        model(path, shape)
        graph = bind_graph(load_model(path))
        directory, manifest = cached_build(graph, get_target("x86"), for_device(BuildOptions(), session))
        x = random_input(graph.inputs[0], np.random.default_rng(0))
        comparison = against_reference(graph, [x], run_artifact(session, directory, manifest, [x]))
        if not comparison.ok:
            raise DeployError(f"pool3d: {comparison.detail}")
        baseline = HostTimer(onnxruntime_call(path, x, threads))
        timers: list[Any] = [Timer(session, directory, manifest, [x]), baseline]
        ours, theirs = interleaved_runs(timers, rounds)
        cells = []
        for times in (ours, theirs):
            low, _, high = quartiles(times)
            cells.append(f"{statistics.median(times):8.3f}±{high - low:<7.3f}")
        ratio = statistics.median(theirs) / statistics.median(ours)
        print(f"{threads:>7} {cells[0]} {cells[1]} {ratio:9.2f}  {manifest.schedule}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians of these)")
    parser.add_argument("--shape", default="8,32,16,56,56", help="N,C,D,H,W of the input")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    words = args.shape.split(",")
    if len(words) != 5 or not all(w.isdigit() and int(w) > 0 for w in words):
        parser.error(f"--shape {args.shape}: expected five sizes of at least 1, such as 8,32,16,56,56")
    shape = tuple(int(w) for w in words)
    host_target(parser, "x86")
    if args.child:
        child(args.rounds, int(os.environ["TVM_NUM_THREADS"]), shape)
        return
    counts = thread_counts(parser, args.threads)
    print(f"MaxPool k3 s2 p1 of {'x'.join(words)} float32; medians of {args.rounds} interleaved rounds,"
          f" ms ± interquartile range; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'threads':>7} {'deploy ms':>16} {'ort ms':>16} {'ort/ours':>9}  schedule")
    for threads in counts:
        env = thread_env(threads)
        command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--shape", args.shape]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    run(main)
