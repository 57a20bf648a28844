"""Max pooling and the memory-bound ops at sizes well beyond the last-level cache:
our x86 builds against the copy roofline, numpy and PyTorch (CPU, same thread count), all
measured in one run, every output checked against numpy first.

    TVM_NUM_THREADS=2 .venv/bin/python bench/roofline_targets.py [--target x86] [--repeat 15]

Targets (issue #7): max_pool2d (3x3, stride 2, padding 1) within 1.5x of the roofline and at least
2x faster than PyTorch; add, leaky_relu and argmax within 1.5x of their rooflines.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path

import numpy as np

from devices import get_device
from ops import TensorType, bind, get_op
from toolchain.bench.roofline import measure_bandwidth, read_bytes, written_bytes
from toolchain.bench.torch_baseline import torch_ms, torch_version
from toolchain.build.compile import compile_op
from toolchain.build.targets import get_target
from toolchain.verify.compare import random_input
from toolchain.verify.measure import check_and_time, host_ms

# (op, attrs, input shapes, x roofline target, x faster than PyTorch target)
WORKLOADS = [
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, [(32, 64, 112, 112)], 1.5, 2.0),
    ("add", {}, [(32, 64, 112, 112), (32, 64, 112, 112)], 1.5, None),
    ("leaky_relu", {}, [(32, 64, 112, 112)], 1.5, None),
    ("argmax", {}, [(256, 100_000)], 1.5, None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    target = get_target(args.target)
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    device = get_device("local")
    with device.open() as session, tempfile.TemporaryDirectory() as tmp:
        print(f"target {target.name}, TVM_NUM_THREADS={threads}, torch {torch_version() or 'not installed'},"
              f" medians of {args.repeat}; read, write and copy bandwidth are measured right before each"
              " workload (this machine's bandwidth drifts between minutes)")  # fmt: skip
        header = f"{'workload':38} {'MB':>6} {'copy GB/s':>9} {'ms':>7} {'roof ms':>7} {'x roof':>6}"
        header += f" {'x floor':>7} {'numpy':>8} {'torch':>7}"
        print(f"{header} {'vs torch':>8}  targets")
        for name, attrs, shapes, roof_goal, torch_goal in WORKLOADS:
            bound = bind(get_op(name), attrs, [TensorType(s, "float32") for s in shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            compiled = compile_op(bound, target)
            roof = measure_bandwidth(session, target, emulated=False)
            bandwidth = roof.copy
            ms = check_and_time(session, compiled, Path(tmp), args.repeat).ms
            read, written = read_bytes(inputs), written_bytes(bound.output)
            moved = read + written
            roof_ms = roof.copy_ms(moved)
            floor = ms / roof.floor_ms(read, written)
            numpy_ms = host_ms(
                functools.partial(bound.op.reference, bound.attrs, *inputs), max(3, args.repeat // 3)
            )
            torch = torch_ms(name, bound.attrs, inputs, args.repeat)
            met = [f"roofline {'met' if ms / roof_ms <= roof_goal else 'MISSED'} (<= {roof_goal}x)"]
            if torch_goal is not None and torch is not None:
                met.append(f"torch {'met' if torch / ms >= torch_goal else 'MISSED'} (>= {torch_goal}x)")
            label = f"{name} {' '.join('x'.join(map(str, s)) for s in shapes)}"
            torch_text = f"{torch:7.2f} {torch / ms:7.2f}x" if torch is not None else f"{'-':>7} {'-':>8}"
            figures = f"{moved / 1e6:6.1f} {bandwidth:9.1f} {ms:7.2f} {roof_ms:7.2f} {ms / roof_ms:6.2f}"
            figures += f" {floor:7.2f} {numpy_ms:8.2f}"
            print(f"{label:38} {figures} {torch_text}  {', '.join(met)}")


if __name__ == "__main__":
    main()
