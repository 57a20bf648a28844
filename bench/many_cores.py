"""x86 kernels on a many-core machine and OpenCL kernels on its GPU, with no TVM there: `build`
makes everything on this host, `run` times it on that machine.

    .venv/bin/python bench/many_cores.py build DIR [--cores 16] [--no-cpu]
    PYTHONPATH=. python3 bench/many_cores.py run DIR [--threads 1,2,4,8,16] [--rounds 7] [--no-gpu] [--no-cpu]

`build` writes x86 bundles (split for `--cores`, the machine's core count), each checked against
numpy here and given a static C timer (`bundle_latency.driver`), and OpenCL artifacts (float32,
and float16 stored as half for a GPU without cl_khr_fp16), each beside a copy kernel (the `copy`
of deploy bench's roofline) that moves as many bytes: what the op reads and writes.

`run` needs Python 3 and numpy, and for the GPU pyopencl and an OpenCL driver; no TVM. Per thread
count (one thread cannot draw the bandwidth sixteen can) each CPU workload and its copy run in
turn, `--rounds` timed runs each; it prints medians with the interquartile spread, GB/s and
"x copy", the op's time over the copy's at that count (1.0: as fast as copying its bytes). On the
GPU each artifact runs on numpy inputs, is checked against numpy, then timed beside its copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import at_least_one, run

F32 = "float32"
POOL = {"kernel": 3, "stride": 2, "padding": 1}
CPU_WORKLOADS: list[tuple[str, str, dict[str, Any], list[tuple[int, ...]]]] = [
    ("add 32x64x112x112 + same", "add", {}, [(32, 64, 112, 112)] * 2),
    ("leaky_relu 32x64x112x112", "leaky_relu", {}, [(32, 64, 112, 112)]),
    ("max_pool2d k3s2p1 32x64x112x112", "max_pool2d", POOL, [(32, 64, 112, 112)]),
    ("argmax axis=-1 256x100000", "argmax", {"axis": -1}, [(256, 100_000)]),
    ("argmax axis=1 8x1000x56x56", "argmax", {"axis": 1}, [(8, 1000, 56, 56)]),
]
GPU_WORKLOADS: list[tuple[str, str, dict[str, Any], list[tuple[int, ...]], str]] = [
    ("argmax axis=-1 2560x100000", "argmax", {"axis": -1}, [(2560, 100_000)], F32),
    ("argmax axis=-1 2560x100000", "argmax", {"axis": -1}, [(2560, 100_000)], "float16"),
    ("add 128x64x112x112 + same", "add", {}, [(128, 64, 112, 112)] * 2, "float16"),
    ("max_pool2d k3s2p1 256x64x112x112", "max_pool2d", POOL, [(256, 64, 112, 112)], "float16"),
    ("max_pool2d k3s2p1 256x64x112x112", "max_pool2d", POOL, [(256, 64, 112, 112)], F32),
]
GRAPH_BATCH = 32
"""examples/maxpool_add.yaml's batch on the CPU; on the GPU 8 times as many (past its L2)."""


def build(directory: Path, cores: int, cpu: bool) -> None:
    """Every bundle, timer and artifact under `directory` (the x86 ones only where `cpu`), and
    `plan.json` listing them."""
    import numpy as np
    from bundle_latency import REPO, check, driver, one_node

    from deploy.bench.roofline import Copy
    from deploy.compiler.compile import Compiled, CompiledGraph, compile_graph, compile_op
    from deploy.compiler.export import export
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.targets import get_target
    from deploy.model import load_model
    from deploy.ops import TensorType, bind, get_op
    from deploy.ops.graph import BoundGraph, Graph, Node, bind_graph
    from deploy.ops.spec import BoundOp
    from deploy.verify.compare import random_input

    x86, split = get_target("x86"), BuildOptions(cores=cores)
    opencl = get_target("opencl")
    plan: dict[str, list[dict[str, Any]]] = {"cpu": [], "gpu": []}

    def copy_of(moved: int) -> BoundGraph:
        shape = (moved // 8,)  # reads and writes 4 bytes an element
        node = Node("y", Copy(), {}, ("x0",), "y")
        return bind_graph(Graph("copy", (("x0", TensorType(shape, F32)),), (node,), ("y",)))

    def graph_at(batch: int, dtype: str) -> BoundGraph:
        graph = load_model(REPO / "examples" / "maxpool_add.yaml")
        inputs = tuple((n, TensorType((batch, *t.shape[1:]), dtype)) for n, t in graph.inputs)
        return bind_graph(replace(graph, inputs=inputs))

    def moved_by(graph: Any) -> int:
        return sum(t.nbytes() for t in (*graph.inputs, *graph.outputs))

    def cpu_bundle(name: str, graph: Any) -> str:
        target = directory / name
        export(compile_graph(graph, x86, split), target, bundle=True, name=name)
        rng = np.random.default_rng(0)
        with tempfile.TemporaryDirectory() as work:  # the inputs' files: too big to carry along
            check(target, graph, [random_input(t, rng) for t in graph.inputs], Path(work) / "check")
        return str(driver(target, graph, static=True).relative_to(directory))

    bundles = [(label, one_node(op, attrs, shapes)) for label, op, attrs, shapes in CPU_WORKLOADS]
    bundles.append((f"maxpool_add graph, batch {GRAPH_BATCH}", graph_at(GRAPH_BATCH, F32)))
    for index, (label, graph) in enumerate(bundles if cpu else []):
        moved = moved_by(graph)
        plan["cpu"].append(
            {
                "label": label,
                "moved": moved,
                "timer": cpu_bundle(f"cpu{index}", graph),
                "copy": cpu_bundle(f"copy{index}", copy_of(moved)),
            }
        )
        print(f"built {label} for x86 ({cores} cores)", flush=True)

    gpu: list[tuple[str, str, BoundOp | BoundGraph]] = [
        (f"{label} {dtype}", op, bind(get_op(op), attrs, [TensorType(s, dtype) for s in shapes]))
        for label, op, attrs, shapes, dtype in GPU_WORKLOADS
    ]
    gpu.append(
        (f"maxpool_add graph, batch {8 * GRAPH_BATCH} float32", "maxpool_add", graph_at(8 * GRAPH_BATCH, F32))
    )
    for index, (label, op, item) in enumerate(gpu):
        compiled: Compiled | CompiledGraph
        if isinstance(item, BoundGraph):
            compiled = compile_graph(item, opencl, BuildOptions())
        else:
            half = any(t.dtype == "float16" for t in item.inputs)  # stored as half, computed in float
            compiled = compile_op(item, opencl, BuildOptions(fp16_storage=half))
        export(compiled, directory / f"gpu{index}")
        moved = moved_by(item)
        copy = compile_op(bind(Copy(), {}, [TensorType((moved // 8,), F32)]), opencl, BuildOptions())
        export(copy, directory / f"gcopy{index}")
        plan["gpu"].append(
            {
                "label": label,
                "op": op,
                "inputs": [[list(t.shape), t.dtype] for t in item.inputs],
                "output": [list(item.outputs[0].shape), item.outputs[0].dtype],
                "moved": moved,
                "plan": f"gpu{index}/launch.json",
                "copy": f"gcopy{index}/launch.json",
                "copy_elements": moved // 8,
            }
        )
        print(f"built {label} for OpenCL", flush=True)
    (directory / "plan.json").write_text(json.dumps(plan, indent=1))


def median_spread(runs: list[float]) -> str:
    q = statistics.quantiles(runs, n=4) if len(runs) > 1 else [runs[0]] * 3
    return f"{statistics.median(runs):.4g} ({q[0]:.4g}-{q[2]:.4g})"


def timed(program: Path, threads: int, rounds: int) -> list[float]:
    """`rounds` runs of the timer (ms per call), each of calls lasting about 0.2 s."""

    def call(calls: int, runs: int) -> list[float]:
        done = subprocess.run(
            [str(program), str(threads), str(calls), str(runs)], capture_output=True, text=True, check=True
        )
        return [float(line) for line in done.stdout.split()]

    once = call(1, 1)[0]
    return call(max(1, int(200 / max(once, 1e-6))), rounds)


def run_cpu(directory: Path, plan: list[dict[str, Any]], counts: list[int], rounds: int) -> None:
    print(
        f"x86 bundles, {rounds} runs each, ms per call (interquartile range); x copy: op / copy of its bytes"
    )
    print(f"{'workload':36} {'thr':>3} {'op ms':>28} {'GB/s':>7} {'copy ms':>28} {'x copy':>6}")
    for item in plan:
        for threads in counts:
            op = timed(directory / item["timer"], threads, rounds)
            copy = timed(directory / item["copy"], threads, rounds)
            ms, copy_ms = statistics.median(op), statistics.median(copy)
            print(
                f"{item['label']:36} {threads:>3} {median_spread(op):>28} {item['moved'] / ms / 1e6:>7.1f}"
                f" {median_spread(copy):>28} {ms / copy_ms:>6.2f}",
                flush=True,
            )


def reference(item: dict[str, Any], inputs: list[Any]) -> Any:
    """numpy's answer for a GPU workload (its op on these inputs, as deploy/ops/ computes it)."""
    import numpy as np

    def pool(x: Any) -> Any:
        n, c, h, w = x.shape
        padded = np.full((n, c, h + 2, w + 2), -np.inf, dtype=x.dtype)
        padded[:, :, 1:-1, 1:-1] = x
        out_h, out_w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        taps = [
            padded[:, :, dh : dh + 2 * out_h : 2, dw : dw + 2 * out_w : 2]
            for dh in range(3)
            for dw in range(3)
        ]
        return np.maximum.reduce(taps)

    op = item["op"]
    if op == "argmax":
        return np.argmax(inputs[0], axis=-1)
    if op == "add":
        return inputs[0] + inputs[1]
    if op == "max_pool2d":
        return pool(inputs[0])
    return pool(inputs[0]) + inputs[1]


def run_gpu(directory: Path, plan: list[dict[str, Any]], rounds: int) -> None:
    import numpy as np

    from deploy.devices.opencl import OpenClDevice

    with OpenClDevice(0, 0).open() as session:
        print(f"\n{session.label}, {rounds} runs each, ms per call (interquartile range)")
        print(f"{'workload':44} {'MB':>6} {'op ms':>28} {'GB/s':>7} {'copy ms':>28} {'x copy':>6}")
        for item in plan:
            rng = np.random.default_rng(0)
            inputs = [
                rng.standard_normal(tuple(shape), dtype=np.float32).astype(dtype)
                for shape, dtype in item["inputs"]
            ]
            outputs = [(tuple(item["output"][0]), item["output"][1])]
            (got,) = session.run(directory / item["plan"], inputs, outputs)
            dtype = outputs[0][1]
            want = reference(item, inputs)
            if not np.array_equal(got, want.astype(dtype)):
                raise SystemExit(f"error: {item['label']} differs from numpy on {session.label}")
            number = max(1, int(0.05 / session.time(directory / item["plan"], inputs, outputs, 1, 1)[0]))
            op = [t * 1e3 for t in session.time(directory / item["plan"], inputs, outputs, number, rounds)]
            source = [np.zeros(item["copy_elements"], dtype=np.float32)]
            copy_plan = directory / item["copy"]
            copy = [
                t * 1e3
                for t in session.time(copy_plan, source, [(source[0].shape, "float32")], number, rounds)
            ]
            ms, copy_ms = statistics.median(op), statistics.median(copy)
            print(
                f"{item['label']:44} {item['moved'] / 1e6:>6.0f} {median_spread(op):>28}"
                f" {item['moved'] / ms / 1e6:>7.0f} {median_spread(copy):>28} {ms / copy_ms:>6.2f}",
                flush=True,
            )


def thread_counts(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; anything but counts of at least 1 is argparse's one-line error (the
    machine's own CPUs bound them there, not here)."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected thread counts like 1,2,4")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    made = sub.add_parser("build", help="bundles, timers and OpenCL artifacts (needs deploy)")
    made.add_argument("directory", type=Path)
    made.add_argument("--cores", type=int, default=16, help="the machine's cores, which builds split for")
    made.add_argument("--no-cpu", action="store_true", help="the OpenCL artifacts only")
    timing = sub.add_parser("run", help="time them (needs numpy; pyopencl for the GPU)")
    timing.add_argument("directory", type=Path)
    timing.add_argument("--threads", type=thread_counts, default=[1, 2, 4, 8, 16])
    timing.add_argument("--rounds", type=int, default=7)
    timing.add_argument("--no-gpu", action="store_true")
    timing.add_argument("--no-cpu", action="store_true")
    args = parser.parse_args()
    if args.mode == "build":
        at_least_one(parser, "--cores", args.cores)
        if args.directory.exists() and not args.directory.is_dir():
            parser.error(f"{args.directory}: not a directory")
        ours = (args.directory / "plan.json").is_file()  # a directory this script built: rebuilt in place
        if args.directory.is_dir() and any(args.directory.iterdir()) and not ours:
            parser.error(f"{args.directory}: not empty and not an earlier build (no plan.json); expected a"
                         " new or empty directory")  # fmt: skip
        args.directory.mkdir(parents=True, exist_ok=True)
        build(args.directory, args.cores, cpu=not args.no_cpu)
        return
    at_least_one(parser, "--rounds", args.rounds)
    plan = json.loads((args.directory / "plan.json").read_text())
    if not args.no_cpu:
        run_cpu(args.directory, plan["cpu"], args.threads, args.rounds)
    if not args.no_gpu:
        run_gpu(args.directory, plan["gpu"], args.rounds)


if __name__ == "__main__":
    run(main)
