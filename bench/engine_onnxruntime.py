"""A real model with deploy's kernels inside onnxruntime, against the same model in onnxruntime alone.

    .venv/bin/python bench/engine_onnxruntime.py [--model resnet50] [--threads 1,2] [--rounds 9]

Takes one of the onnx package's light models (`onnx/backend/test/data/light`: the architecture,
its weights made by ConstantOfShape, small random initializers here) and replaces every Relu by
ReLU6 twice over: as
`com.example::HardTanh(0, 6)`, served by the plugin `deploy build --engine onnxruntime` makes of
the model (a bundle per node, at its shape), and as the standard `Clip(0, 6)` for onnxruntime
alone (which may fuse it into the convolution before it). Both sessions run at the same
intra-op threads (the plugin's kernels run on them), timed in interleaved rounds. Then the cost
of crossing into the plugin: a chain of CHAIN HardTanh nodes on 64 floats against a chain of
Clips, the difference per node in microseconds. Prints medians with the interquartile spread,
and plugin/alone (issue #52's goal: at most 1.05).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from harness import at_least_one, host_target, run, spread, thread_counts
from onnx import helper

from deploy.compiler.options import BuildOptions
from deploy.engines import get_engine
from deploy.ops import load_ops_path

REPO = Path(__file__).resolve().parent.parent
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
CUSTOM = "com.example"
CHAIN = 64
"""Custom nodes in the chain that measures the cost of a call into the plugin."""
SECONDS = 0.3
"""Each timed run lasts about this long (a light model's run: milliseconds)."""


def with_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each ConstantOfShape of a constant shape (a light model's weights) replaced by
    an initializer of small random numbers: shape inference sees every tensor's shape then."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    given = {t.name: t for t in model.graph.initializer}
    made, kept = [], []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in given:
            shape = numpy_helper.to_array(given[node.input[0]]).astype(int)
            values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            made.append(numpy_helper.from_array(values, node.output[0]))
        else:
            kept.append(node)
    shapes = {n.input[0] for n in model.graph.node if n.op_type == "ConstantOfShape"}
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(kept)
    initializers = [t for t in model.graph.initializer if t.name not in shapes] + made
    del result.graph.initializer[:]
    result.graph.initializer.extend(initializers)
    names = {t.name for t in initializers} | shapes
    inputs = [i for i in model.graph.input if i.name not in names]
    del result.graph.input[:]
    result.graph.input.extend(inputs)
    result.ir_version = max(result.ir_version, 7)  # initializers need not be inputs (IR 4 and later)
    return result


def relu6(model: onnx.ModelProto, custom: bool) -> onnx.ModelProto:
    """`model` with each Relu as HardTanh(0, 6) of com.example (`custom`) or Clip(0, 6)."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    graph = changed.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for index, node in enumerate(graph.node):
        if node.op_type != "Relu":
            continue
        if custom:
            new = helper.make_node("HardTanh", list(node.input), list(node.output), domain=CUSTOM,
                                   name=f"relu6_{index}", min_val=0.0, max_val=6.0)  # fmt: skip
        elif opset < 11:  # Clip's bounds were attributes then
            new = helper.make_node("Clip", [node.input[0]], list(node.output), name=f"relu6_{index}",
                                   min=0.0, max=6.0)  # fmt: skip
        else:
            bounds = [f"relu6_{index}_low", f"relu6_{index}_high"]
            graph.initializer.extend(
                helper.make_tensor(name, onnx.TensorProto.FLOAT, [], [value])
                for name, value in zip(bounds, (0.0, 6.0), strict=True)
            )
            new = helper.make_node("Clip", [node.input[0], *bounds], list(node.output), name=f"relu6_{index}")
        graph.node[index].CopyFrom(new)
    if custom:
        changed.opset_import.append(helper.make_opsetid(CUSTOM, 1))
    return changed


def chain(custom: bool) -> onnx.ModelProto:
    """x (1x64) through CHAIN ReLU6 nodes, custom or Clip."""
    nodes, last, inits = [], "x", []
    for i in range(CHAIN):
        out = f"y{i}"
        if custom:
            nodes.append(helper.make_node("HardTanh", [last], [out], domain=CUSTOM, name=f"n{i}",
                                          min_val=0.0, max_val=6.0))  # fmt: skip
        else:
            nodes.append(helper.make_node("Clip", [last, "low", "high"], [out], name=f"n{i}"))
        last = out
    if not custom:
        inits = [helper.make_tensor("low", onnx.TensorProto.FLOAT, [], [0.0]),
                 helper.make_tensor("high", onnx.TensorProto.FLOAT, [], [6.0])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(last, onnx.TensorProto.FLOAT, [1, 64])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(CUSTOM, 1)] if custom else [])
    return helper.make_model(graph, opset_imports=opsets)


def plugin_for(model: Path, work: Path) -> Path:
    """The plugin deploy builds for `model`'s custom nodes (x86)."""
    get_engine("onnxruntime").build(None, model, host_target(argparse.ArgumentParser(), "x86"),
                                    BuildOptions(), work / f"{model.stem}-plugin")  # fmt: skip
    return next((work / f"{model.stem}-plugin").glob("lib*.so"))


def session(model: Path, threads: int, library: Path | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # not the light models' unused-initializer warnings
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def timed(
    runner: Any, feeds: dict[str, np.ndarray], rounds: int, other: Any
) -> tuple[list[float], list[float]]:
    """Milliseconds per run of `runner` and of `other`, interleaved: a run of calls each round."""
    runner.run(None, feeds), other.run(None, feeds)
    start = time.perf_counter()
    runner.run(None, feeds)
    calls = max(1, int(SECONDS / max(time.perf_counter() - start, 1e-6)))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for kept, s in zip(times, (runner, other), strict=True):
            start = time.perf_counter()
            for _ in range(calls):
                s.run(None, feeds)
            kept.append((time.perf_counter() - start) / calls * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a light model: resnet50, bvlc_alexnet, ...")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    source = LIGHT / f"light_{args.model}.onnx"
    if not source.is_file():
        known = ", ".join(sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx")))
        parser.error(f"--model {args.model}: expected one of {known}")
    counts = thread_counts(parser, args.threads)
    host_target(parser, "x86")
    load_ops_path(REPO / "deploy" / "ops" / "examples")
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        work = Path(tmp)
        base = with_weights(onnx.load(str(source)))
        paths = {}
        for name, model in (("custom", relu6(base, True)), ("alone", relu6(base, False)),
                            ("chain_custom", chain(True)), ("chain_alone", chain(False))):  # fmt: skip
            paths[name] = work / f"{name}.onnx"
            onnx.save(model, str(paths[name]))
        plugins = {name: plugin_for(paths[name], work) for name in ("custom", "chain_custom")}
        served = sum(1 for n in base.graph.node if n.op_type == "Relu")
        (data,) = [i for i in base.graph.input if i.name not in {t.name for t in base.graph.initializer}]
        shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
        feeds = {data.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        small = {"x": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)}
        print(
            f"light_{args.model}: {served} ReLU6 nodes served by the plugin; medians of {args.rounds} rounds"
        )
        print(f"{'threads':>7}  {'plugin ms':>24}  {'alone ms':>24}  plugin/alone  crossing us/node")
        for threads in counts:
            ours, alone = timed(session(paths["custom"], threads, plugins["custom"]), feeds, args.rounds,
                                session(paths["alone"], threads, None))  # fmt: skip
            c_ours, c_alone = timed(session(paths["chain_custom"], threads, plugins["chain_custom"]), small,
                                    args.rounds, session(paths["chain_alone"], threads, None))  # fmt: skip
            crossing = (statistics.median(c_ours) - statistics.median(c_alone)) * 1e3 / CHAIN
            ratio = statistics.median(ours) / statistics.median(alone)
            print(f"{threads:>7}  {spread(ours):>24}  {spread(alone):>24}  {ratio:12.3f}  {crossing:16.2f}")


if __name__ == "__main__":
    run(main)
