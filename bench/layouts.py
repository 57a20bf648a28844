"""max_pool2d + add in NCHW against a packed layout, with and without the conversions, per shape.

    .venv/bin/python bench/layouts.py [--target x86] [--layout NCHW8c] [--rounds 9] [--shape 1x512x7x7 ...]

For each input shape `a[N, C, H, W]` (with `b[N, 1, H/2, W/2]`, fp32, k3 s2 p1; default: the
memory-bound 32x64x112x112 and batch-1 maps from 56x56 down to 7x7), three graphs: NCHW as
`examples/maxpool_add.yaml`; the same two nodes in the packed layout on an input already packed
(no conversion counted); and the NCHW graph built with `--layout`, which converts its input and
output around them (both counted, each a kernel of its own). Each is checked against numpy,
then the three are timed in interleaved rounds (`measure.interleaved_runs`). Prints median ms,
the interquartile spread and the ratio to NCHW.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import at_least_one, host_target, run

from deploy.base.errors import UsageError
from deploy.cli.args import parse_shape
from deploy.compiler.compile import compile_graph
from deploy.compiler.options import BuildOptions, for_device
from deploy.devices import get_device
from deploy.model.graph_file import graph_from_document
from deploy.ops.graph import bind_graph
from deploy.ops.layouts import LAYOUTS
from deploy.verify.measure import check, time_interleaved

SHAPES = ("32x64x112x112", "1x64x56x56", "1x256x14x14", "1x512x7x7", "1x1024x7x7")
POOL = {"kernel": 3, "stride": 2, "padding": 1}


def document(shape: tuple[int, ...], layout: str) -> dict[str, Any]:
    """A graph file's content: pool then add in `layout` over an input of NCHW `shape`, given in
    that layout."""
    n, _, h, w = shape
    nodes = [
        {"name": "pool", "op": "max_pool2d", "attrs": {**POOL, "layout": layout}, "inputs": ["a"]},
        {"name": "sum", "op": "add", "attrs": {"layout": layout}, "inputs": ["pool", "b"]},
    ]
    inputs = {
        "a": {"shape": list(LAYOUTS[layout].shape(shape))},
        "b": {"shape": [n, 1, (h + 1) // 2, (w + 1) // 2]},
    }
    return {"name": layout, "inputs": inputs, "nodes": nodes, "output": "sum"}


def nchw_shape(text: str) -> tuple[int, ...]:
    """An NCHW shape like 1x512x7x7 (argparse's type: a bad one is a usage error)."""
    try:
        shape = parse_shape(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    sizes = tuple(d for d in shape if isinstance(d, int))
    if len(sizes) != 4 or len(shape) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NxCxHxW, four sizes")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86")
    parser.add_argument("--layout", default="NCHW8c", choices=[n for n in LAYOUTS if LAYOUTS[n].packed])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--shape", dest="shapes", type=nchw_shape, action="append", help="NxCxHxW, repeatable"
    )
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    host = host_target(parser, args.target)
    shapes = args.shapes or [nchw_shape(s) for s in SHAPES]
    threads = os.environ.get("TVM_NUM_THREADS", "runtime default")
    print(f"target {args.target}, TVM_NUM_THREADS={threads}, medians of {args.rounds} interleaved rounds")
    print(f"{'input':16} {'NCHW ms':>9} {'spread':>7} {'packed input':>13} {'--layout ' + args.layout:>16}")
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        options = for_device(BuildOptions(), session)
        for shape in shapes:
            nchw = document(shape, "NCHW")
            graphs = [(nchw, "NCHW"), (document(shape, args.layout), "NCHW"), (nchw, args.layout)]
            checked = [
                check(
                    session,
                    compile_graph(
                        bind_graph(graph_from_document(d, d["name"])), host, replace(options, layout=layout)
                    ),
                    Path(tmp),
                )
                for d, layout in graphs
            ]
            base, packed, converted = time_interleaved(session, checked, args.rounds)
            label = "x".join(map(str, shape))
            print(
                f"{label:16} {base.ms:9.4f} {base.spread:7.4f} {packed.ms / base.ms:13.2f}"
                f" {converted.ms / base.ms:16.2f}"
            )


if __name__ == "__main__":
    run(main)
