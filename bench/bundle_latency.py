"""Per call through a C bundle against the same kernels through TVM's runtime and against
onnxruntime, at 1 and 2 threads, measured in one run; and the bundles' sizes per target.

    .venv/bin/python bench/bundle_latency.py [--rounds 9] [--threads 1,2] [--only NAME]
        [--fail-above 1.05]

Each workload is built once for this host (x86) as a bundle, checked against numpy through it,
then timed in interleaved rounds (`measure.interleaved_runs`): the bundle by a small C program
linked with its static library (a loop of calls, no Python in it: `NAME_set_num_threads`), the
module through TVM's runtime (`time_evaluator`, its pool at the same thread count) and
onnxruntime's CPU provider on the one-node (or the example) model with IOBinding and a
preallocated output, at the same thread count. Prints medians with the interquartile spread, and
the ratios bundle/TVM and bundle/onnxruntime (below 1: the bundle is faster); then the size of
an op's library and the stripped runner for x86 and aarch64.

With `--fail-above RATIO` it is a check (exit 1): it fails when on some row the bundle falls
behind TVM's runtime by more than RATIO beyond the noise (`harness.round_ratio`, the first
quartile of the per-round ratios, above RATIO; printed as `q1` on each row), naming each such
row; it needs 3 rounds at least. A check to run on a quiet machine before a release, not in the
test suite: timed asserts there would fail with a neighbour's job.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from harness import at_least_one, host_target, round_ratio, run, thread_counts

from deploy.base.errors import DeployError
from deploy.compiler.compile import compile_graph, compile_op
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target, get_target
from deploy.devices import get_device
from deploy.devices.platforms import get_platform
from deploy.model import load_model
from deploy.ops import TensorType, bind, get_op, load_ops_path
from deploy.ops.graph import BoundGraph, Graph, Node, bind_graph
from deploy.verify.compare import compare, random_input
from deploy.verify.measure import TARGET_SECONDS, Timer, calls_lasting

REPO = Path(__file__).resolve().parent.parent
F32 = "float32"
QUIET = 0.3
"""Seconds of rest before each timed run: the threads the last one left spinning (onnxruntime's,
TVM's pool) go to sleep, so that on a machine of few cores they do not slow the next."""


def one_node(op: str, attrs: dict[str, Any], shapes: list[tuple[int, ...]]) -> BoundGraph:
    """A graph of one node (so onnxruntime gets the same model)."""
    names = [f"x{i}" for i in range(len(shapes))]
    node = Node("y", get_op(op), attrs, tuple(names), "y")
    return bind_graph(
        Graph(op, tuple((n, TensorType(s, F32)) for n, s in zip(names, shapes, strict=True)), (node,), ("y",))
    )


def ladder(kernels: int) -> BoundGraph:
    """`kernels` adds of 1x64x56x56, each reading the last two results: none fuses, so a call
    launches `kernels` parallel loops (what a pool's wake-up costs shows in)."""
    shape = (1, 64, 56, 56)
    nodes, last = [], ("a", "b")
    for i in range(kernels):
        nodes.append(Node(f"t{i}", get_op("add"), {}, last, f"t{i}"))
        last = (last[1], f"t{i}")
    return bind_graph(
        Graph(
            "ladder", (("a", TensorType(shape, F32)), ("b", TensorType(shape, F32))), tuple(nodes), (last[1],)
        )
    )


def workloads() -> list[tuple[str, BoundGraph]]:
    load_ops_path(REPO / "deploy" / "ops" / "examples")
    pool = {"kernel": 3, "stride": 2, "padding": 1}
    return [
        ("add 1x64x56x56", one_node("add", {}, [(1, 64, 56, 56)] * 2)),
        ("leaky_relu 1x64x56x56", one_node("leaky_relu", {}, [(1, 64, 56, 56)])),
        ("argmax axis=1 1x1000x7x7", one_node("argmax", {"axis": 1}, [(1, 1000, 7, 7)])),
        ("max_pool2d k3s2p1 1x64x112x112", one_node("max_pool2d", pool, [(1, 64, 112, 112)])),
        (
            "maxpool_add (graph) 1x64x112x112",
            bind_graph(_batch_one(load_model(REPO / "examples" / "maxpool_add.yaml"))),
        ),
        (
            "pool_add_leaky_htanh.onnx 1x8x32x32",
            bind_graph(load_model(REPO / "examples" / "pool_add_leaky_htanh.onnx")),
        ),
        ("ladder of 16 add kernels 1x64x56x56", ladder(16)),
        ("max_pool2d k3s2p1 32x64x112x112", one_node("max_pool2d", pool, [(32, 64, 112, 112)])),
    ]


def _batch_one(graph: Graph) -> Graph:
    from dataclasses import replace

    return replace(graph, inputs=tuple((n, TensorType((1, *t.shape[1:]), t.dtype)) for n, t in graph.inputs))


DRIVER = """#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "{name}.h"

static double now(void) {{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}}

static void* filled(size_t bytes, unsigned seed) {{  /* floats in [-1, 1): timing data only */
  float* data = NULL;
  size_t i;
  if (posix_memalign((void**)&data, 64, bytes + 64) != 0) exit(3);
  for (i = 0; i < bytes / sizeof(float); ++i) {{
    seed = seed * 1103515245u + 12345u;
    data[i] = (float)(seed >> 9) / 4194304.0f - 1.0f;
  }}
  return data;
}}

/* argv: threads, calls per run, runs: prints milliseconds per call of each run. */
int main(int argc, char** argv) {{
  int threads, calls, runs, i, r;
  double start;
{tensors}
  if (argc != 4) return 3;
  threads = atoi(argv[1]);
  calls = atoi(argv[2]);
  runs = atoi(argv[3]);
  {name}_set_num_threads(threads);
  if ({name}({args}) != 0) return fprintf(stderr, "%s\\n", {name}_last_error()), 1;
  for (r = 0; r < runs; ++r) {{
    start = now();
    for (i = 0; i < calls; ++i) {name}({args});
    printf("%.9f\\n", (now() - start) / calls * 1e3);
  }}
  return 0;
}}
"""


def driver(directory: Path, graph: BoundGraph, static: bool = False) -> Path:
    """The timing program of the bundle in `directory` (graph `graph`, static shapes); `static`
    links it statically, to run on another machine of the architecture."""
    bundle = Manifest.read(directory).bundle
    assert bundle is not None, f"{directory} holds no bundle"
    name = bundle["name"]
    types = [*graph.inputs, *graph.outputs]
    lines = []
    for i, t in enumerate(types):
        code = {"float": "kDLFloat", "int": "kDLInt"}[t.dtype.rstrip("0123456789")]
        bits = int(t.dtype.lstrip("afilnotu"))
        lines.append(f"  static int64_t shape{i}[] = {{{', '.join(map(str, t.shape))}}};")
        lines.append(
            f"  DLTensor t{i} = {{filled({t.elements() * bits // 8}, {i + 1}u), {{kDLCPU, 0}},"
            f" {len(t.shape)},"
            f" {{{code}, {bits}, 1}}, shape{i}, NULL, 0}};"
        )
    source = directory / "timer.c"
    source.write_text(
        DRIVER.format(
            name=name, tensors="\n".join(lines), args=", ".join(f"&t{i}" for i in range(len(types)))
        )
    )
    program = directory / "timer"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-std=c11",
            f"-I{directory}",
            f"-I{directory / 'include'}",
            str(source),
            str(directory / f"lib{name}.a"),
            "-lm",
            "-lpthread",
            *(["-static"] if static else []),
            "-o",
            str(program),
        ],
        check=True,
    )
    return program


@dataclass
class Timed:
    """One way to call a workload: `runs(count)` gives that many timed runs (ms per call)."""

    label: str
    runs: Callable[[int], list[float]]


def bundle_timer(program: Path, threads: int) -> Timed:
    once = float(
        subprocess.run(
            [str(program), str(threads), "1", "1"], capture_output=True, text=True, check=True
        ).stdout
    )
    calls = calls_lasting(TARGET_SECONDS, once / 1e3)

    def runs(count: int) -> list[float]:
        out = subprocess.run(
            [str(program), str(threads), str(calls), str(count)], capture_output=True, text=True, check=True
        ).stdout
        return [float(line) for line in out.split()]

    return Timed("bundle", runs)


def tvm_timer(directory: Path, inputs: list[Path], threads: int) -> Timed:
    """The module through TVM's runtime, timed in a process of its own per run (TVM's pool, once
    used, keeps a thread busy that would slow whatever this process times next)."""
    command = [sys.executable, __file__, "--time-tvm", str(directory), "--tvm-threads", str(threads)]
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}

    def runs(count: int) -> list[float]:
        out = subprocess.run([*command, "--rounds", str(count), *map(str, inputs)], capture_output=True,
                             text=True, check=True, env=env).stdout  # fmt: skip
        return [float(line) for line in out.split()]

    return Timed("TVM runtime", runs)


def time_tvm(directory: Path, threads: int, runs: int, inputs: list[Path]) -> None:
    """Print `runs` timed runs (ms per call) of the module in `directory` through TVM's runtime,
    its pool at `threads` threads (the child process of `tvm_timer`)."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, threads)
    with get_device("local").open() as session:
        timer = Timer(session, directory, Manifest.read(directory), [np.load(p) for p in inputs])
        for ms in timer.runs(runs):
            print(f"{ms:.9f}")


def ort_timer(graph: BoundGraph, model: bytes, inputs: list[np.ndarray], threads: int) -> Timed:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    for arg, array in zip(session.get_inputs(), inputs, strict=True):
        binding.bind_cpu_input(arg.name, array)
    (result,) = graph.outputs
    out = np.empty(result.shape, result.dtype)
    binding.bind_output(session.get_outputs()[0].name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
    session.run_with_iobinding(binding)
    start = time.perf_counter()
    session.run_with_iobinding(binding)
    calls = calls_lasting(TARGET_SECONDS, time.perf_counter() - start)

    def runs(count: int) -> list[float]:
        found = []
        assert out.size  # the output buffer onnxruntime writes lives as long as this timer
        for _ in range(count):
            start = time.perf_counter()
            for _ in range(calls):
                session.run_with_iobinding(binding)
            found.append((time.perf_counter() - start) / calls * 1e3)
        return found

    return Timed("onnxruntime", runs)


def onnx_model(label: str, graph: BoundGraph) -> bytes:
    """The workload as onnxruntime runs it: the example model with its custom-domain HardTanh as
    the standard Clip (the same math, its bounds as inputs), else the graph's nodes as standard
    ONNX nodes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if label.startswith("pool_add_leaky_htanh"):
        model = onnx.load(REPO / "examples" / "pool_add_leaky_htanh.onnx")
        for node in model.graph.node:
            if node.domain == "com.example":
                bounds = {a.name: a.f for a in node.attribute}
                for name in ("min_val", "max_val"):
                    limit = np.array(bounds[name], np.float32)
                    model.graph.initializer.append(numpy_helper.from_array(limit, name))
                clip = helper.make_node(
                    "Clip", [node.input[0], "min_val", "max_val"], list(node.output), node.name
                )
                node.CopyFrom(clip)
        del model.opset_import[1:]
        return model.SerializeToString()
    types = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    nodes = []
    for n in graph.nodes:
        op, attrs = n.bound.op.name, n.bound.attrs
        if op == "max_pool2d":
            k, s, p = attrs["kernel"], attrs["stride"], attrs["padding"]
            nodes.append(
                helper.make_node(
                    "MaxPool",
                    list(n.node.inputs),
                    [n.node.output],
                    kernel_shape=list(k),
                    strides=list(s),
                    pads=[*p, *p],
                )
            )
        elif op == "argmax":
            nodes.append(
                helper.make_node(
                    "ArgMax", list(n.node.inputs), [n.node.output], axis=attrs["axis"], keepdims=0
                )
            )
        elif op == "leaky_relu":
            nodes.append(
                helper.make_node("LeakyRelu", list(n.node.inputs), [n.node.output], alpha=attrs["alpha"])
            )
        else:
            nodes.append(helper.make_node("Add", list(n.node.inputs), [n.node.output]))
    inputs = [helper.make_tensor_value_info(name, types[t.dtype], t.shape) for name, t in graph.graph.inputs]
    (name,), (result,) = graph.graph.outputs, graph.outputs
    output = helper.make_tensor_value_info(name, types[result.dtype], result.shape)
    made = helper.make_model(
        helper.make_graph(nodes, "bench", inputs, [output]), opset_imports=[helper.make_opsetid("", 17)]
    )
    return made.SerializeToString()


def sizes(work: Path) -> None:
    """Bytes of add's library and stripped runner per target (a cross compiler missing: said so)."""
    bound = bind(get_op("add"), {}, [TensorType((1, 64, 56, 56), F32)] * 2)
    print("\nsizes of an op's bundle (add 1x64x56x56):")
    for name in ("x86", "arm"):
        target = get_target(name)
        directory = work / f"size-{name}"
        try:
            export(compile_op(bound, target, BuildOptions(cores=4)), directory, bundle=True)
        except Exception as exc:
            print(f"  {name}: not built here ({exc})")
            continue
        print(
            f"  {name} ({get_platform(target.arch).arch}):"
            f" libadd.a {(directory / 'libadd.a').stat().st_size / 1e3:.1f} KB,"
            f" libadd.so {(directory / 'libadd.so').stat().st_size / 1e3:.1f} KB,"
            f" deploy-run {(directory / 'deploy-run').stat().st_size / 1e3:.0f} KB (static, stripped)"
        )


def median_spread(runs: list[float]) -> str:
    q = statistics.quantiles(runs, n=4) if len(runs) > 1 else [runs[0]] * 3
    return f"{statistics.median(runs):.4f} ({q[0]:.4f}-{q[2]:.4f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", help="only the workloads whose label contains this")
    parser.add_argument(
        "--fail-above",
        metavar="RATIO",
        help="exit 1 when the bundle is behind TVM's runtime by more than RATIO beyond the noise on a row",
    )
    parser.add_argument("--time-tvm", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tvm-threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("inputs", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_tvm is not None:
        time_tvm(args.time_tvm, args.tvm_threads, args.rounds, args.inputs)
        return
    at_least_one(parser, "--rounds", args.rounds)
    limit = None if args.fail_above is None else fail_above(parser, args.fail_above, args.rounds)
    every = workloads()
    chosen = [
        (i, label, graph) for i, (label, graph) in enumerate(every) if args.only is None or args.only in label
    ]
    if not chosen:
        parser.error(
            f"--only {args.only}: no workload's label holds it ({', '.join(label for label, _ in every)})"
        )
    behind: list[str] = []
    counts = thread_counts(parser, args.threads)
    host: Target = host_target(parser, "x86")
    print(
        f"x86, medians of {args.rounds} interleaved rounds, ms per call (interquartile range);"
        " ratios below 1: the bundle is faster"
    )
    print(
        f"{'workload':38} {'thr':>3} {'bundle':>24} {'TVM runtime':>24} {'onnxruntime':>24}"
        f" {'/TVM':>6} {'/ort':>6}{'  q1 /TVM' if limit is not None else ''}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for index, label, graph in chosen:
            directory = work / f"w{index}"
            compiled = compile_graph(graph, host, BuildOptions(cores=max(counts)))
            export(compiled, directory, bundle=True, name=f"w{index}")
            rng = np.random.default_rng(index)
            inputs = [random_input(t, rng) for t in graph.inputs]
            paths = check(directory, graph, inputs, work / f"c{index}")
            program = driver(directory, graph)
            model = onnx_model(label, graph)
            for threads in counts:
                timers = [
                    bundle_timer(program, threads),
                    tvm_timer(directory, paths, threads),
                    ort_timer(graph, model, inputs, threads),
                ]
                runs: list[list[float]] = [[] for _ in timers]
                for round_ in range(args.rounds):
                    for k in range(len(timers)):
                        turn = (k + round_) % len(timers)
                        time.sleep(QUIET)
                        runs[turn] += timers[turn].runs(1)
                medians = [statistics.median(r) for r in runs]
                verdict = ""
                if limit is not None:
                    q1 = round_ratio(runs[0], runs[1])
                    verdict = f" {q1:>8.2f}{' behind' if q1 > limit else ''}"
                    if q1 > limit:
                        behind.append(f"{label} at {threads} thread{'s' if threads > 1 else ''} ({q1:.2f})")
                print(
                    f"{label:38} {threads:>3} {median_spread(runs[0]):>24} {median_spread(runs[1]):>24}"
                    f" {median_spread(runs[2]):>24} {medians[0] / medians[1]:>6.2f}"
                    f" {medians[0] / medians[2]:>6.2f}{verdict}",
                    flush=True,
                )
        sizes(work)
    if behind:
        rows = f"{len(behind)} row{'s' if len(behind) > 1 else ''}"
        raise DeployError(
            f"the bundle is behind TVM's runtime by more than {limit} (first quartile of"
            f" the per-round ratios) on {rows}: {'; '.join(behind)}"
        )


def fail_above(parser: argparse.ArgumentParser, text: str, rounds: int) -> float:
    """`--fail-above`'s limit: a finite ratio above 0, with 3 rounds at least (fewer, and one slow
    round decides); else `parser.error` (exit 2)."""
    try:
        limit = float(text)
    except ValueError:
        limit = math.nan
    if not (math.isfinite(limit) and limit > 0):
        parser.error(f"--fail-above {text}: expected a ratio above 0, such as 1.05")
    if rounds < 3:
        parser.error(
            f"--fail-above with --rounds {rounds}: expected 3 rounds at least (one slow round would decide)"
        )
    return limit


def check(directory: Path, graph: BoundGraph, inputs: list[np.ndarray], work: Path) -> list[Path]:
    """The bundle's runner on `inputs` against numpy (a time is never printed for a wrong answer);
    the inputs' files."""
    work.mkdir()
    paths = []
    for i, array in enumerate(inputs):
        paths.append(work / f"in{i}.npy")
        np.save(paths[-1], array)
    command = [str(directory / "deploy-run"), str(directory), *[w for p in paths for w in ("-i", str(p))]]
    subprocess.run([*command, "-o", str(work / "out.npy")], check=True)
    result = compare(np.asarray(graph.references(*inputs)[0]), np.load(work / "out.npy"), graph.exact)
    if not result.ok:
        raise SystemExit(f"error: the bundle of {graph.name} differs from numpy: {result.detail}")
    return paths


if __name__ == "__main__":
    run(main)
