"""Shapes that are not whole tiles (issue #51): dot products with a ragged m (ViT's 197 tokens,
131 rows), a symbolic m (a sequence length) or a 1x1 convolution's batch of images, and sliding
windows whose output rows are longer than 4 vectors and not whole ones (35 and 75 columns), each
built per size static, and once with the dimension N symbolic, against onnxruntime's kernel for
the same work, timed interleaved with it in one process per kind of build and thread count (two
of TVM's thread pools in one process take turns spinning on this 2-core machine: the module
loaded second ran 1.5-2.5x slower at 2 threads, whichever it was), with a pause after each
(onnxruntime's workers spin after a run: the call timed next ran at half speed at 2 threads).

    .venv/bin/python bench/ragged_shapes.py [--threads 1,2] [--rounds 7] [--target x86-avx512]
                                            [--avx2-host]

Per row: the build (static, or symbolic run at the row's size), the median ms of ours and of
onnxruntime, and their ratio. Each build is checked against the op's reference (NaN and
infinities included) first; a failed check is printed. `--target` builds for another x86
target the host runs (as in `fast_by_default.py`: on an AVX-512 host onnxruntime runs its
AVX-512 kernels; `--avx2-host` hides them there, as in `fast_by_default.py`). Before this
round a ragged m tested its rows inside the sum (matmul 131x768x768: 1.7x onnxruntime's time),
a symbolic m or image batch fell through to the generic schedule (29-50x), and so did a window
row of 35 or 75 columns (1.7-1.9x onnxruntime, slower than numpy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from fast_by_default import HERE, built, onnxruntime_call
from harness import (
    AVX2_HOST_HELP,
    HostTimer,
    at_least_one,
    avx2_host,
    host_target,
    run,
    thread_counts,
    thread_env,
)

WORKLOADS: list[tuple[str, list[tuple[int | str, ...]], list[int], tuple[int, ...]]] = [
    ("matmul", [("N", 768), (768, 768)], [128, 131, 197], ()),
    ("matmul", [("N", 768), (768, 3072)], [1, 2, 4, 6], (1,)),
    ("dense", [("N", 768), (3072, 768)], [1, 2, 4, 6, 128], (1,)),
    ("pointwise_conv", [("N", 64, 56, 56), (128, 64, 1, 1)], [1, 2], ()),
    ("pointwise_conv", [("N", 64, 28, 28), (128, 64, 1, 1)], [1, 4], ()),
    ("depthwise_conv", [("N", 32, 75, 75), (32, 1, 3, 3)], [1], ()),
    ("depthwise_conv", [("N", 32, 35, 35), (32, 1, 3, 3)], [1, 4], ()),
    ("softmax", [("N", 1000)], [8, 64], ()),
    ("log_softmax", [("N", 1000)], [8, 64], ()),
]
"""(op of bench/fast_ops, shapes with the symbolic dimension N, the sizes N runs at, the inputs
that are constants in onnxruntime's model). A classifier's rows of 1000 scores are no whole
vectors of 16 floats (AVX-512). A linear layer's few rows (a decoder's tokens, a small batch)
by a 9 MiB weight, also as PyTorch keeps it (`dense`: w[n, k]): onnxruntime packs a constant
weight once when it loads the model (fed each call, it packed it each call: 4 ms for 2 or 4
rows), deploy reads it as it is."""


def child(rounds: int, threads: int, kind: str, target_name: str) -> None:
    """Time each workload's `kind` of build (static, symbolic) at this process's TVM_NUM_THREADS."""
    from deploy.compiler.compile import hand_schedule
    from deploy.compiler.options import BuildOptions
    from deploy.devices import get_device
    from deploy.ops import TensorType, bind, get_op, load_ops_path
    from deploy.verify.compare import random_input
    from deploy.verify.measure import interleaved_runs

    target = host_target(argparse.ArgumentParser(), target_name)
    load_ops_path(HERE / "fast_ops")

    def bound_at(name: str, shapes: list[tuple[int | str, ...]], size: int | str) -> Any:
        return bind(
            get_op(name),
            {},
            [TensorType(tuple(size if d == "N" else d for d in s), "float32") for s in shapes],
        )

    pause: Any = HostTimer(lambda: time.sleep(0.001))  # both thread pools go idle between timers
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        for name, shapes, sizes, constants in WORKLOADS:
            symbolic = bound_at(name, shapes, "N")
            mod = hand_schedule(symbolic, target, BuildOptions())[0] if kind == "symbolic" else None
            for size in sizes:
                bound = bound_at(name, shapes, size)
                build = symbolic if kind == "symbolic" else bound
                scheduled = mod if mod is not None else hand_schedule(bound, target, BuildOptions())[0]
                timer, note = built(session, build, target, scheduled, kind, Path(tmp), at=bound)
                inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
                timers: list[Any] = [timer, HostTimer(onnxruntime_call(name, inputs, threads, constants))]
                runs = interleaved_runs([*timers, pause], rounds)
                ours, ort = (statistics.median(r) for r in runs[:2])
                shape = f"{name} " + " @ ".join(
                    "x".join(map(str, t.shape)) + (" const" if i in constants else "")
                    for i, t in enumerate(bound.inputs)
                )
                print(
                    f"{kind:9} {shape:48} {threads:>2} {ours:9.4f} {ort:9.4f}  {ours / ort:6.2f}", flush=True
                )
                if note:
                    print(f"{'':12}note: {note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians of these)")
    parser.add_argument("--target", default="x86", help="an x86 target this host runs [default: x86]")
    parser.add_argument("--avx2-host", action="store_true", help=AVX2_HOST_HELP)
    parser.add_argument("--child", choices=("static", "symbolic"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    host_target(parser, args.target)
    if args.child:
        child(args.rounds, int(os.environ["TVM_NUM_THREADS"]), args.child, args.target)
        return
    counts = thread_counts(parser, args.threads)
    hidden = avx2_host(parser, args.target) if args.avx2_host else ""
    print(f"medians of {args.rounds} interleaved rounds, ms; load average {os.getloadavg()[0]:.1f}{hidden}")
    print(f"{'build':9} {'op, shapes':48} {'th':>2} {'ours':>9} {'ort':>9}  {'ratio':>6}")
    for threads in counts:
        env = thread_env(threads)
        for kind in ("static", "symbolic"):
            command = [sys.executable, __file__, "--child", kind, "--rounds", str(args.rounds)]
            command += ["--target", args.target]
            subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    run(main)
