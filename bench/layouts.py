"""max_pool2d + add in NCHW against NCHW8c, with and without the layout conversions, in one run.

    .venv/bin/python bench/layouts.py [--target x86] [--layout NCHW8c] [--rounds 9]

Three graphs over a[32, 64, 112, 112] + b[32, 1, 56, 56] fp32 (k3 s2 p1): NCHW as
`examples/maxpool_add.yaml`; the same two nodes in the packed layout on an input already packed
(`[32, 8, 112, 112, 8]`, no conversion counted); and the NCHW graph built with `--layout`, which
converts its input and output around them (both conversions counted, each a kernel of its own).
Each is checked against numpy, then timed in interleaved rounds (`measure.interleaved_runs`).
Prints median ms, the interquartile spread and the ratio to NCHW.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from base.errors import DeployError, reason
from devices import get_device
from ops.graph import bind_graph
from ops.layouts import LAYOUTS
from toolchain.build.compile import compile_graph
from toolchain.build.targets import get_target
from toolchain.model.graph_file import graph_from_document
from toolchain.verify.measure import check, time_interleaved
from toolchain.verify.run import for_device

A, B = [32, 64, 112, 112], [32, 1, 56, 56]
POOL = {"kernel": 3, "stride": 2, "padding": 1}


def document(name: str, layout: str) -> dict[str, Any]:
    """A graph file's content: pool then add in `layout`, its input given in it."""
    nodes = [
        {"name": "pool", "op": "max_pool2d", "attrs": {**POOL, "layout": layout}, "inputs": ["a"]},
        {"name": "sum", "op": "add", "attrs": {"layout": layout}, "inputs": ["pool", "b"]},
    ]
    inputs = {"a": {"shape": list(LAYOUTS[layout].shape(tuple(A)))}, "b": {"shape": B}}
    return {"name": name, "inputs": inputs, "nodes": nodes, "output": "sum"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--layout", default="NCHW8c", choices=[n for n in LAYOUTS if LAYOUTS[n].packed])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    nchw = document("NCHW", "NCHW")
    graphs = [  # (label, graph file, the layout the build lays it out in)
        ("NCHW", nchw, "NCHW"),
        (f"{args.layout}, input packed", document(args.layout, args.layout), "NCHW"),
        (f"NCHW, --layout {args.layout}", nchw, args.layout),
    ]
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {args.target}, TVM_NUM_THREADS={threads}, medians of {args.rounds} interleaved rounds")
    try:
        with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
            target = for_device(get_target(args.target), session)
            checked = [
                check(
                    session,
                    compile_graph(bind_graph(graph_from_document(d, d["name"])), target.with_layout(layout)),
                    Path(tmp),
                )
                for _, d, layout in graphs
            ]
            measured = time_interleaved(session, checked, args.rounds)
    except DeployError as exc:
        sys.exit(f"error: {reason(exc)}")
    base = measured[0].ms
    print(f"{'graph':36} {'kernels':>7} {'ms':>8} {'spread':>7} {'vs NCHW':>8}")
    for (label, _, _), item, m in zip(graphs, checked, measured, strict=True):
        kernels = len(item.compiled.kernels)
        print(f"{label:36} {kernels:7} {m.ms:8.3f} {m.spread:7.3f} {m.ms / base:8.2f}")


if __name__ == "__main__":
    main()
