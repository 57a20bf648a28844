"""Every op fast by default (issue #51): user ops written with no schedule code
(`bench/fast_ops/`), built with the generic schedule (before) and with the default by
structure (after: `deploy.schedules.cpu.generic`), against onnxruntime's kernel for the same work
and a numpy formulation of it, all timed interleaved in one process per thread count.

    .venv/bin/python bench/fast_by_default.py [--threads 1,2] [--rounds 7] [--ops softmax,gelu]
                                              [--tuned DIR] [--target x86-avx512] [--avx2-host]

Per op and thread count it prints the median ms of each and the spread (interquartile range,
ms) of ours, then ours/onnxruntime and ours/numpy before and after. Both builds are checked
against the op's reference first (a failed check is printed; matmul's float32 sums of 768
terms fail the fixed float32 tolerance, issue #51 item 3, and are timed anyway). A row also
says when a build still calls a scalar libm function (`nm -u`: expf, erff, ...). With `--tuned
DIR` (a `deploy tune --db DIR` of the same ops and shapes on x86), the record each op's tuning
accepted is timed too (t/ort; `-` where tuning kept the default). Issue #51's goals: within 1.5x
of onnxruntime by default and 1.0x after a tune of at most 64 trials, never slower than numpy.
`--target` builds for another x86 target the host runs (x86-avx512: onnxruntime's MLAS picks
AVX-512 kernels on such a host, so an AVX2 build is not the comparison a user there makes).
`--avx2-host` makes that host time as an AVX2 one: the processes that time see no AVX-512 in
CPUID (`hide_avx512.c`), so onnxruntime and numpy run their AVX2 kernels beside our x86 build.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    AVX2_HOST_HELP,
    HostTimer,
    at_least_one,
    avx2_host,
    host_target,
    quartiles,
    run,
    thread_counts,
    thread_env,
)

HERE = Path(__file__).resolve().parent
WORKLOADS: dict[str, tuple[list[tuple[int, ...]], dict[str, Any]]] = {
    "softmax": ([(1, 12, 128, 128)], {}),
    "layer_norm": ([(1, 128, 768), (768,), (768,)], {}),
    "gelu": ([(1, 128, 3072)], {}),
    "depthwise_conv": ([(1, 32, 112, 112), (32, 1, 3, 3)], {}),
    "matmul": ([(128, 768), (768, 768)], {}),
    "batch_matmul": ([(12, 128, 64), (12, 64, 128)], {}),
    "mean_channels": ([(1, 256, 56, 56)], {}),
    "transpose_heads": ([(1, 128, 12, 64)], {}),
    "pointwise_conv": ([(1, 64, 56, 56), (128, 64, 1, 1)], {}),
    "grouped_conv": ([(1, 64, 56, 56), (64, 16, 3, 3)], {"groups": 4}),
    "log_softmax": ([(1, 12, 128, 128)], {}),
    "transpose2d": ([(1024, 1024)], {}),
    "dense": ([(128, 768), (768, 768)], {}),
    "image_to_nhwc": ([(1, 3, 224, 224)], {}),
    "dense_bias": ([(128, 768), (768, 768), (768,)], {}),
    "depthwise_bias_relu": ([(1, 32, 112, 112), (32, 1, 3, 3), (32,)], {}),
    "global_avg_pool": ([(1, 2048, 7, 7)], {}),
    "depthwise_conv_s2": ([(1, 32, 112, 112), (32, 1, 3, 3)], {"stride": 2}),
}
"""The issue's five ops at its shapes, then one more per structure: a dot product (attention's
scores), an outer reduction, data movement (attention's head split, a 2-D transpose); the
convolutions that are dot products (1x1, and grouped 3x3: a channel sum with window taps); and
a row reduction calling log (log_softmax); a dot product whose weight is read along its sum (a
Linear layer's w[n, k], as PyTorch keeps it); an image's NCHW to NHWC (output rows of 3); and
that Linear layer with its bias (a dot product, then an elementwise stage on its output); the
depthwise convolution with its bias and a ReLU (a window, then a stage on its output); a
classifier's global average pool (a row reduction over two axes, ResNet-50's 2048x7x7); the
depthwise convolution at stride 2 (MobileNet's downsampling: every other column of each row)."""
VARIANT_OF = {"depthwise_conv_s2": "depthwise_conv"}
"""Workloads that time an op at other attributes than its own name's: workload -> the op."""
LIBM = ("expf", "erff", "tanhf", "logf", "exp", "erf", "tanh", "log")


def onnx_nodes(name: str, inputs: list[np.ndarray]) -> tuple[list[Any], list[Any]]:
    """The ONNX nodes doing the op's work in onnxruntime (one, or a convolution then its ReLU,
    which onnxruntime fuses), and their initializers (opset 20)."""
    from onnx import helper

    if name == "depthwise_bias_relu":
        (conv,), _ = onnx_nodes("depthwise_conv", inputs)
        conv.output[0] = "sums"
        return [conv, helper.make_node("Relu", ["sums"], ["y"])], []
    node, initializers = onnx_node(name, inputs)
    return [node], initializers


def onnx_node(name: str, inputs: list[np.ndarray]) -> tuple[Any, list[Any]]:
    """The one ONNX node doing the op's work in onnxruntime, and its initializers."""
    from onnx import helper, numpy_helper

    names, stride = [f"i{i}" for i in range(len(inputs))], WORKLOADS[name][1].get("stride", 1)
    name = VARIANT_OF.get(name, name)
    if name == "softmax":
        return helper.make_node("Softmax", names, ["y"], axis=-1), []
    if name == "layer_norm":
        return helper.make_node("LayerNormalization", names, ["y"], axis=-1, epsilon=1e-5), []
    if name == "gelu":
        return helper.make_node("Gelu", names, ["y"]), []
    if name in ("depthwise_conv", "grouped_conv"):  # 3x3, pad 1; groups from the channels
        groups = inputs[0].shape[1] // inputs[1].shape[1]
        return helper.make_node("Conv", names, ["y"], group=groups, pads=[1] * 4, strides=[stride] * 2), []
    if name in ("matmul", "batch_matmul"):
        return helper.make_node("MatMul", names, ["y"]), []
    if name == "pointwise_conv":
        return helper.make_node("Conv", names, ["y"]), []
    if name in ("dense", "dense_bias"):
        return helper.make_node("Gemm", names, ["y"], transB=1), []
    if name == "mean_channels":
        axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
        return helper.make_node("ReduceMean", [*names, "axes"], ["y"], keepdims=1), [axes]
    if name == "transpose_heads":
        return helper.make_node("Transpose", names, ["y"], perm=[0, 2, 1, 3]), []
    if name == "log_softmax":
        return helper.make_node("LogSoftmax", names, ["y"], axis=-1), []
    if name == "transpose2d":
        return helper.make_node("Transpose", names, ["y"], perm=[1, 0]), []
    if name == "image_to_nhwc":
        return helper.make_node("Transpose", names, ["y"], perm=[0, 2, 3, 1]), []
    if name == "global_avg_pool":
        return helper.make_node("GlobalAveragePool", names, ["y"]), []
    raise ValueError(name)


def onnxruntime_call(
    name: str, inputs: list[np.ndarray], threads: int, constants: tuple[int, ...] = ()
) -> Callable[[], Any]:
    """One call of onnxruntime's kernel through IOBinding into a preallocated output; the inputs
    at `constants` are the model's initializers (a layer's weights, which onnxruntime may pack
    once when the session loads), the others fed each call."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers = onnx_nodes(name, inputs)
    initializers += [numpy_helper.from_array(inputs[i], f"i{i}") for i in constants]
    feeds = {f"i{i}": a for i, a in enumerate(inputs) if i not in constants}
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, a.shape) for k, a in feeds.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    out = np.empty_like(session.run(None, feeds)[0])
    binding = session.io_binding()
    for key, array in feeds.items():
        binding.bind_cpu_input(key, array)
    binding.bind_output("y", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

    def call() -> np.ndarray:
        session.run_with_iobinding(binding)
        return out  # held by the call: onnxruntime writes into it

    return call


def numpy_call(name: str, inputs: list[np.ndarray]) -> Callable[[], Any]:
    """The op's work as a numpy user writes it for speed (not the op's reference, written for
    correctness); GELU's erf is scipy's (numpy has none)."""
    x, stride = inputs[0], WORKLOADS[name][1].get("stride", 1)
    name = VARIANT_OF.get(name, name)
    if name == "softmax":

        def softmax() -> Any:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        return softmax
    if name == "layer_norm":
        gamma, beta = inputs[1:]
        return lambda: (
            (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta
        )
    if name == "gelu":
        from scipy.special import erf

        return lambda: 0.5 * x * (1 + erf(x * np.float32(1 / np.sqrt(2))))
    if name == "depthwise_bias_relu":
        depthwise, b = numpy_call("depthwise_conv", inputs[:2]), inputs[2][None, :, None, None]
        return lambda: np.maximum(depthwise() + b, 0)
    if name == "depthwise_conv":
        w = inputs[1]
        padded = np.empty((*x.shape[:2], x.shape[2] + 2, x.shape[3] + 2), x.dtype)
        oh, ow = ((size - 1) // stride + 1 for size in x.shape[2:])

        def depthwise() -> Any:
            padded[:] = 0
            padded[:, :, 1:-1, 1:-1] = x
            out = np.zeros((*x.shape[:2], oh, ow), x.dtype)
            for i in range(3):
                for j in range(3):
                    taps = padded[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
                    out += taps * w[None, :, 0, i, j, None, None]
            return out

        return depthwise
    if name in ("matmul", "batch_matmul"):
        return lambda: np.matmul(x, inputs[1])
    if name == "dense":
        return lambda: np.matmul(x, inputs[1].T)
    if name == "dense_bias":
        return lambda: np.matmul(x, inputs[1].T) + inputs[2]
    if name == "pointwise_conv":
        w = inputs[1][:, :, 0, 0]
        return lambda: np.matmul(w, x.reshape(x.shape[0], x.shape[1], -1)).reshape(
            x.shape[0], w.shape[0], *x.shape[2:]
        )
    if name == "grouped_conv":
        return grouped_conv(x, inputs[1])
    if name == "mean_channels":
        return lambda: x.mean(axis=1, keepdims=True)
    if name == "transpose_heads":
        return lambda: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    if name == "log_softmax":

        def log_softmax() -> Any:
            shifted = x - x.max(axis=-1, keepdims=True)
            return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

        return log_softmax
    if name == "transpose2d":
        return lambda: np.ascontiguousarray(x.T)
    if name == "image_to_nhwc":
        return lambda: np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if name == "global_avg_pool":
        return lambda: x.mean(axis=(2, 3), keepdims=True)
    raise ValueError(name)


def grouped_conv(x: np.ndarray, w: np.ndarray) -> Callable[[], Any]:
    """A grouped 3x3 convolution (pad 1) in numpy: per group and tap, one matmul of the group's
    weights by the shifted input's pixels."""
    groups, (out_c, group_c, k, _) = x.shape[1] // w.shape[1], w.shape
    per_group, (n, _, h, wd) = out_c // groups, x.shape
    padded = np.zeros((n, x.shape[1], h + 2, wd + 2), x.dtype)

    def conv() -> Any:
        padded[:, :, 1:-1, 1:-1] = x
        out = np.zeros((n, out_c, h, wd), x.dtype)
        for g in range(groups):
            inputs, outputs = (
                padded[:, g * group_c : (g + 1) * group_c],
                out[:, g * per_group : (g + 1) * per_group],
            )
            for i in range(k):
                for j in range(k):
                    taps = inputs[:, :, i : i + h, j : j + wd]
                    outputs += np.einsum(
                        "oc,nchw->nohw", w[g * per_group : (g + 1) * per_group, :, i, j], taps
                    )
        return out

    return conv


def libm_calls(directory: Path) -> list[str]:
    """The scalar libm functions the exported module calls (`nm -u`)."""
    found = []
    for library in directory.rglob("*.so"):
        listing = subprocess.run(["nm", "-u", str(library)], capture_output=True, text=True).stdout
        found += [line.split()[-1] for line in listing.splitlines() if line.split()[-1].split("@")[0] in LIBM]
    return sorted(set(found))


def built(
    session: Any, bound: Any, target: Any, mod: Any, label: str, tmp: Path, at: Any = None
) -> tuple[Any, str]:
    """(timer, note) of `mod` compiled and exported, run at the shapes of `at` (a bound op; by
    default `bound`, which may have a symbolic batch): the note says a failed check and libm calls."""
    from deploy.compiler.compile import compile_scheduled
    from deploy.compiler.export import export
    from deploy.compiler.options import BuildOptions
    from deploy.schedules.vector_math import libm_in_vector_loops, lower_math
    from deploy.verify.compare import random_input
    from deploy.verify.measure import Timer
    from deploy.verify.run import against_reference, run_artifact

    compiled = compile_scheduled(bound, target, BuildOptions(), mod, label)
    directory = Path(tempfile.mkdtemp(prefix=f"{bound.op.name}-{label}-", dir=tmp))
    manifest = export(compiled, directory)
    notes, at = [], at or bound
    for specials in (False, True):
        inputs = [random_input(t, np.random.default_rng(1), specials=specials) for t in at.inputs]
        comparison = against_reference(at, inputs, run_artifact(session, directory, manifest, inputs))
        if not comparison.ok:
            notes.append(f"{label} check failed: {comparison.detail}")
            break
    calls, in_vectors = libm_calls(directory), libm_in_vector_loops(lower_math(mod["main"]))
    if calls:
        notes.append(f"{label} calls libm's {', '.join(calls)} (nm -u)")
    if in_vectors:
        notes.append(f"{label} calls {', '.join(in_vectors)} in vector loops: a scalar libm call a lane")
    inputs = [random_input(t, np.random.default_rng(0)) for t in at.inputs]
    return Timer(session, directory, manifest, inputs), "; ".join(notes)


def child(names: list[str], rounds: int, threads: int, tuned: Path | None, target_name: str) -> None:
    """Time each op at this process's TVM_NUM_THREADS: before, after, onnxruntime, numpy, and the
    record tuning accepted under `tuned` where there is one."""
    import tvm

    from deploy.compiler.compile import context, prim_module
    from deploy.compiler.options import BuildOptions
    from deploy.devices import get_device
    from deploy.ops import TensorType, bind, get_op, load_ops_path
    from deploy.schedules.cpu.elementwise import elementwise_cpu
    from deploy.schedules.cpu.generic import schedule_by_structure
    from deploy.tune.tuners import AcceptedRecords
    from deploy.verify.compare import random_input
    from deploy.verify.measure import interleaved_runs

    records = (
        AcceptedRecords(tuned, lambda line: print(f"{'':19}note: {line}", flush=True)) if tuned else None
    )

    target = host_target(argparse.ArgumentParser(), target_name)
    load_ops_path(HERE / "fast_ops")
    with tempfile.TemporaryDirectory() as tmp, get_device("local").open() as session:
        for name in names:
            shapes, attrs = WORKLOADS[name]
            op = get_op(VARIANT_OF.get(name, name))
            bound = bind(op, attrs, [TensorType(s, "float32") for s in shapes])
            ctx = context(bound, target, BuildOptions())
            before, after = (
                tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions())),
                tvm.s_tir.Schedule(prim_module(bound, target, BuildOptions())),
            )
            elementwise_cpu(before, ctx)
            taken = schedule_by_structure(after, ctx)
            timer_before, note_before = built(session, bound, target, before.mod, "before", Path(tmp))
            timer_after, note_after = built(session, bound, target, after.mod, "after", Path(tmp))
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            timers = [timer_before, timer_after, HostTimer(onnxruntime_call(name, inputs, threads)),
                      HostTimer(numpy_call(name, inputs))]  # fmt: skip
            accepted = records.schedule(bound, target, BuildOptions(tuned=records)) if records else None
            note_tuned = ""
            if accepted is not None:
                timer_tuned, note_tuned = built(session, bound, target, accepted[0], "tuned", Path(tmp))
                timers.append(timer_tuned)
            runs = interleaved_runs(timers, rounds)
            ms = [statistics.median(r) for r in runs]
            iqr = [high - low for low, _, high in map(quartiles, runs)]
            rule = taken.rule + (f" (fell through: {taken.fell_through})" if taken.fell_through else "")
            tuned_ratio = f"{ms[4] / ms[2]:6.2f}" if accepted is not None else f"{'-':>6}"
            print(
                f"{name:19} {threads:>2} {ms[0]:8.4f}±{iqr[0]:<7.4f} {ms[1]:8.4f}±{iqr[1]:<7.4f}"
                f" {ms[2]:8.4f} {ms[3]:8.4f}  {ms[0] / ms[2]:6.2f} {ms[1] / ms[2]:6.2f} {tuned_ratio}"
                f"  {ms[0] / ms[3]:6.2f} {ms[1] / ms[3]:6.2f}  {rule}",
                flush=True,
            )
            for note in (note_before, note_after, note_tuned):
                if note:
                    print(f"{'':19}note: {note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians of these)")
    parser.add_argument("--ops", default=",".join(WORKLOADS), help="ops, comma-separated")
    parser.add_argument("--tuned", type=Path, help="a deploy tune --db directory: time its accepted records")
    parser.add_argument("--target", default="x86", help="an x86 target this host runs [default: x86]")
    parser.add_argument("--avx2-host", action="store_true", help=AVX2_HOST_HELP)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    if args.tuned is not None and not args.tuned.is_dir():
        parser.error(f"--tuned {args.tuned}: expected the directory of a deploy tune --db")
    names = [n for n in args.ops.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"--ops {','.join(unknown)}: expected some of {','.join(WORKLOADS)}")
    host_target(parser, args.target)
    if args.child:
        child(names, args.rounds, int(os.environ["TVM_NUM_THREADS"]), args.tuned, args.target)
        return
    counts = thread_counts(parser, args.threads)
    if max(counts) > (os.cpu_count() or 1):  # more threads than cores times the contention
        parser.error(f"--threads {args.threads}: expected counts from 1 to {os.cpu_count()}")
    hidden = avx2_host(parser, args.target) if args.avx2_host else ""
    print(
        f"medians of {args.rounds} interleaved rounds, ms ± interquartile range;"
        f" load average {os.getloadavg()[0]:.1f}{hidden}"
    )
    print(f"{'op':19} {'th':>2} {'before ms':>16} {'after ms':>16} {'ort ms':>8} {'numpy ms':>8}"
          f"  {'b/ort':>6} {'a/ort':>6} {'t/ort':>6}  {'b/np':>6} {'a/np':>6}  rule")  # fmt: skip
    for threads in counts:
        env = thread_env(threads)
        command = [
            sys.executable,
            __file__,
            "--child",
            "--rounds",
            str(args.rounds),
            "--ops",
            ",".join(names),
            "--target",
            args.target,
            *(["--tuned", str(args.tuned)] if args.tuned is not None else []),
        ]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    run(main)
