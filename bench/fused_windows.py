"""Two windowed ops in a row (max_pool2d -> add -> max_pool2d): build time and kernel time as the
fusion cuts them (the second pool reads a buffer the first wrote) against one kernel with the
first pool inlined into the second's taps (as before the cut), in one run.

    TVM_NUM_THREADS=2 .venv/bin/python bench/fused_windows.py [--rounds 9] [--shape 1x64x112x112 ...]

Per input shape `a[N, C, H, W]` (`b[N, C, H/2, W/2]`, fp32, k3 s2 p1 both pools): the CPU seconds
of compiling each variant for x86 and for OpenCL (`time.process_time`: this process's threads,
TVM's included; no OpenCL device is needed to compile), then on this host (x86) each is checked
against numpy and the two are timed in interleaved rounds (`measure.interleaved_runs`). Prints
the build seconds and the median ms with the interquartile spread, and cut/one-kernel ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import at_least_one, host_target, run

from deploy.compiler.compile import LaidOut, as_computed_graph, compile_graph, lay_out
from deploy.compiler.fusion import _fused_kernel
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target, get_target
from deploy.devices import get_device
from deploy.model.graph_file import graph_from_document
from deploy.ops.graph import BoundGraph, bind_graph
from deploy.verify.measure import Answers, check, time_interleaved

SHAPES = ("1x64x112x112", "8x64x112x112")
POOL = {"kernel": 3, "stride": 2, "padding": 1}


def two_pools(shape: tuple[int, ...]) -> BoundGraph:
    """pool -> add -> pool over an input of NCHW `shape`."""
    n, c, h, w = shape
    nodes = [
        {"name": "p1", "op": "max_pool2d", "attrs": POOL, "inputs": ["a"]},
        {"name": "sum", "op": "add", "inputs": ["p1", "b"]},
        {"name": "p2", "op": "max_pool2d", "attrs": POOL, "inputs": ["sum"]},
    ]
    inputs = {"a": {"shape": list(shape)}, "b": {"shape": [n, c, (h + 1) // 2, (w + 1) // 2]}}
    return bind_graph(graph_from_document({"inputs": inputs, "nodes": nodes, "output": "p2"}, "two_pools"))


def one_kernel(graph: BoundGraph, target: Target, options: BuildOptions) -> LaidOut:
    """The graph as one fused kernel anchored on the last pool, every node inlined into it."""
    laid = lay_out(graph, target, options)
    computed = as_computed_graph(laid.graph, options)
    return replace(laid, kernels=[_fused_kernel(computed, list(computed.nodes), len(computed.nodes) - 1)])


def timed_build(graph: BoundGraph, target: Target, options: BuildOptions, one: bool) -> tuple[Any, float]:
    """(the compiled graph, CPU seconds its fusion, scheduling and compiling took)."""
    start = time.process_time()
    laid = one_kernel(graph, target, options) if one else lay_out(graph, target, options)
    compiled = compile_graph(graph, target, options, laid)
    return compiled, time.process_time() - start


def nchw(text: str) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in text.split("x") if s.isdigit())
    if len(sizes) != 4 or len(text.split("x")) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NxCxHxW, four sizes")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shape", dest="shapes", type=nchw, action="append", help="NxCxHxW, repeatable")
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    host = host_target(parser, "x86")
    opencl = get_target("opencl")
    shapes = args.shapes or [nchw(s) for s in SHAPES]
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"TVM_NUM_THREADS={threads}, kernel medians of {args.rounds} interleaved rounds")
    print(
        f"{'input':14} {'build s x86 cut/one':>20} {'opencl cut/one':>15}"
        f" {'one ms':>8} {'spread':>7} {'cut ms':>8} {'spread':>7} {'cut/one':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        options = for_device(BuildOptions(), session)
        for shape in shapes:
            graph = two_pools(shape)
            one, one_x86 = timed_build(graph, host, options, one=True)
            cut, cut_x86 = timed_build(graph, host, options, one=False)
            _, one_cl = timed_build(graph, opencl, BuildOptions(), one=True)
            _, cut_cl = timed_build(graph, opencl, BuildOptions(), one=False)
            answers = Answers(graph)
            checked = [check(session, compiled, Path(tmp), answers) for compiled in (one, cut)]
            single, split = time_interleaved(session, checked, args.rounds)
            label = "x".join(map(str, shape))
            print(
                f"{label:14} {f'{cut_x86:.1f}/{one_x86:.1f}':>20} {f'{cut_cl:.1f}/{one_cl:.1f}':>15}"
                f" {single.ms:8.3f} {single.spread:7.3f} {split.ms:8.3f} {split.spread:7.3f}"
                f" {split.ms / single.ms:8.2f}"
            )


if __name__ == "__main__":
    run(main)
