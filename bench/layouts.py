"""max_pool2d + add in NCHW against NCHW8c, with and without the layout conversions, in one run.

    .venv/bin/python bench/layouts.py [--target x86] [--layout NCHW8c] [--rounds 9]

Three graphs over a[32, 64, 112, 112] + b[32, 1, 56, 56] fp32 (k3 s2 p1): NCHW as
`examples/maxpool_add.yaml`; the same two nodes in the packed layout on an input already packed
(`[32, 8, 112, 112, 8]`, no conversion counted); and NCHW in and out with `layout_transform`
around them (both conversions counted). Each is checked against numpy, then timed in interleaved
rounds (`measure.interleaved_runs`). Prints median ms, the interquartile spread and the ratio to
NCHW.
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


def document(name: str, layout: str, packed_input: bool, convert: bool) -> dict[str, Any]:
    """A graph file's content: pool then add in `layout`, its input given packed or converted."""
    shape = list(LAYOUTS[layout].shape(tuple(A))) if packed_input else A
    nodes: list[dict[str, Any]] = []
    source = "a"
    if convert:
        nodes.append(
            {
                "name": "pack",
                "op": "layout_transform",
                "attrs": {"src": "NCHW", "dst": layout},
                "inputs": ["a"],
            }
        )
        source = "pack"
    nodes += [
        {"name": "pool", "op": "max_pool2d", "attrs": {**POOL, "layout": layout}, "inputs": [source]},
        {"name": "sum", "op": "add", "attrs": {"layout": layout}, "inputs": ["pool", "b"]},
    ]
    output = "sum"
    if convert:
        unpack = {"src": layout, "dst": "NCHW", "channels": A[1]}
        nodes.append({"name": "unpack", "op": "layout_transform", "attrs": unpack, "inputs": ["sum"]})
        output = "unpack"
    inputs = {"a": {"shape": shape}, "b": {"shape": B}}
    return {"name": name, "inputs": inputs, "nodes": nodes, "output": output}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--layout", default="NCHW8c", choices=[n for n in LAYOUTS if LAYOUTS[n].packed])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    graphs = [
        document("NCHW", "NCHW", packed_input=False, convert=False),
        document(f"{args.layout}, input packed", args.layout, packed_input=True, convert=False),
        document(f"{args.layout}, converted in and out", args.layout, packed_input=False, convert=True),
    ]
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {args.target}, TVM_NUM_THREADS={threads}, medians of {args.rounds} interleaved rounds")
    try:
        with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
            target = for_device(get_target(args.target), session)
            checked = [
                check(
                    session, compile_graph(bind_graph(graph_from_document(d, d["name"])), target), Path(tmp)
                )
                for d in graphs
            ]
            measured = time_interleaved(session, checked, args.rounds)
    except DeployError as exc:
        sys.exit(f"error: {reason(exc)}")
    base = measured[0].ms
    print(f"{'graph':36} {'kernels':>7} {'ms':>8} {'spread':>7} {'vs NCHW':>8}")
    for d, item, m in zip(graphs, checked, measured, strict=True):
        kernels = len(item.compiled.kernels)
        print(f"{d['name']:36} {kernels:7} {m.ms:8.3f} {m.spread:7.3f} {m.ms / base:8.2f}")


if __name__ == "__main__":
    main()
