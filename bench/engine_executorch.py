"""A real model with deploy's kernel inside ExecuTorch, against the same model on ExecuTorch's own kernels.

    .venv/bin/python bench/engine_executorch.py [--size 96] [--threads 1,2] [--rounds 9] [--runs 5]

A MobileNetV2 (torch, written here: no torchvision; batch norms folded into the convolutions'
biases, random weights) whose 35 ReLU6 are exported twice: as `deploy::hard_tanh(0, 6)`, served
by the kernel library `deploy build --engine executorch` makes (`build_library`), and as the
standard ReLU6 (`aten::hardtanh`), run by ExecuTorch's own kernel. Both .pte files run without a
delegate, so ExecuTorch's portable `convolution.out` runs every convolution on both sides (it
takes nearly all the time: 4.5 s a forward at 224x224, hence the default 96). deploy's library
serves one shape per op, so its kernel is built for a symbolic length and the model calls it on
each activation viewed flat (ExecuTorch's views, which copy nothing). Both run in the library's
host (`--repeat`, `--threads`: ExecuTorch's threadpool, on which deploy's kernel runs its
parallel loops too), one process per side in interleaved rounds; the outputs must be equal. Then
the cost of crossing into deploy's kernel: a chain of CHAIN ReLU6 on 64 floats, ours against
ExecuTorch's, the difference per node in microseconds. Prints medians over rounds with the
interquartile spread, and deploy/ExecuTorch (issue #52's goal: at most 1.05).
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from harness import at_least_one, host_target, run, spread, thread_counts
from torch import nn

from deploy.base.errors import DeployError
from deploy.compiler.options import BuildOptions
from deploy.engines.executorch import NOISY_LOGGERS, NOISY_WARNING, lower
from deploy.engines.executorch_library import HOST, build_library, library_name
from deploy.ops import bind, get_op, load_ops_path
from deploy.ops.spec import TensorType

REPO = Path(__file__).resolve().parent.parent
CHAIN = 64
"""ReLU6 nodes in the chain that measures the cost of a call into deploy's kernel."""
CHAIN_RUNS = 200
"""Timed forward calls of a chain per round (one takes tens of microseconds)."""
MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # fmt: skip
"""MobileNetV2's inverted residual stages: expansion, out channels, blocks, first stride."""
TIMED = re.compile(r"forward: \d+ runs on (\d+) threads: median ([\d.]+) ms")
HOST_SECONDS = 600


class Relu6(nn.Module):
    """ReLU6: deploy::hard_tanh(0, 6) on the tensor viewed flat (`ours`), or torch's."""

    def __init__(self, ours: bool) -> None:
        super().__init__()
        self.ours = ours

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ours:
            return nn.functional.relu6(x)
        return torch.ops.deploy.hard_tanh(x.reshape(-1), min_val=0.0, max_val=6.0).reshape(x.shape)


def conv(cin: int, cout: int, kernel: int, stride: int, groups: int, ours: bool | None) -> list[nn.Module]:
    """A convolution with a bias (padding kernel // 2), then a ReLU6 unless `ours` is None."""
    layer = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups)
    return [layer] if ours is None else [layer, Relu6(ours)]


class Inverted(nn.Module):
    """MobileNetV2's inverted residual block: 1x1 expansion, 3x3 depthwise, 1x1 projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, ours: bool) -> None:
        super().__init__()
        hidden = cin * expand
        layers = conv(cin, hidden, 1, 1, 1, ours) if expand != 1 else []
        layers += conv(hidden, hidden, 3, stride, hidden, ours) + conv(hidden, cout, 1, 1, 1, None)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2(ours: bool) -> nn.Module:
    """MobileNetV2 for 1000 classes, convolutions with biases (batch norms folded), its ReLU6s
    ours or torch's; weights from a fixed seed, so both variants hold the same ones."""
    torch.manual_seed(0)
    layers = conv(3, 32, 3, 2, 1, ours)
    cin = 32
    for expand, cout, blocks, stride in MOBILENET_V2:
        for i in range(blocks):
            layers.append(Inverted(cin, cout, stride if i == 0 else 1, expand, ours))
            cin = cout
    layers += [*conv(cin, 1280, 1, 1, 1, ours), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers).eval()


def chain(ours: bool) -> nn.Module:
    """x (64 floats) through CHAIN ReLU6s, ours or torch's."""
    return nn.Sequential(*(Relu6(ours) for _ in range(CHAIN))).eval()


def pte(module: nn.Module, shape: tuple[int, ...], path: Path) -> Path:
    """`module` exported for an input of `shape` and lowered to `path` (no delegate)."""
    program = torch.export.export(module, (torch.zeros(shape),))
    path.write_bytes(lower(program, path))
    return path


def host_run(host: Path, model: Path, data: Path, out: Path, threads: int, runs: int) -> float:
    """The median ms of `runs` forward calls of `model` in the host on `threads` threads."""
    command = [str(host), str(model), "-i", str(data), "-o", str(out), "--threads", str(threads),
               "--repeat", str(runs)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=HOST_SECONDS, check=False)
    found = TIMED.search(done.stdout)
    if done.returncode != 0 or found is None:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise DeployError(f"{model.name}: {lines[-1]}")
    if int(found.group(1)) != threads:
        raise DeployError(f"{model.name} ran on {found.group(1)} threads, not {threads}")
    return float(found.group(2))


def timed(
    host: Path, pair: tuple[Path, Path], data: Path, threads: int, rounds: int, runs: int
) -> list[list[float]]:
    """Per round, the median ms of ours and of ExecuTorch's (interleaved), after checking that
    both compute the same output."""
    outs = [data.with_name(f"{model.stem}.out") for model in pair]
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for kept, model, out in zip(times, pair, outs, strict=True):
            kept.append(host_run(host, model, data, out, threads, runs))
    ours, theirs = (np.fromfile(out, np.float32) for out in outs)
    if not np.array_equal(ours, theirs):
        raise DeployError(f"{pair[0].name} and {pair[1].name} differ: max {np.max(np.abs(ours - theirs))}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", type=int, default=96, help="the input's height and width (96 to 224 in MobileNetV2's paper)"
    )
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=5, help="timed forward calls of the net per round")
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    at_least_one(parser, "--runs", args.runs)
    if not 32 <= args.size <= 1024:
        parser.error(f"--size {args.size}: expected 32 to 1024 (the net halves it five times)")
    counts = thread_counts(parser, args.threads)
    target = host_target(parser, "x86")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", NOISY_WARNING, FutureWarning)
    load_ops_path(REPO / "deploy" / "ops" / "examples")
    import deploy.engines.executorch_ops  # noqa: F401  (defines deploy::hard_tanh, loaded above)

    with tempfile.TemporaryDirectory(prefix="engine-et-bench-") as tmp:
        work = Path(tmp)
        flat = bind(get_op("hard_tanh"), {"min_val": 0.0, "max_val": 6.0}, [TensorType(("N",), "float32")])
        place = build_library(
            {"hard_tanh": flat}, target, BuildOptions(), work / "plugin", library_name("mobilenet_v2")
        )
        shape = (1, 3, args.size, args.size)
        net = mobilenet_v2(True)
        nets = (pte(net, shape, work / "net_ours.pte"), pte(mobilenet_v2(False), shape, work / "net_et.pte"))
        chains = (pte(chain(True), (CHAIN,), work / "chain_ours.pte"),
                  pte(chain(False), (CHAIN,), work / "chain_et.pte"))  # fmt: skip
        rng = np.random.default_rng(0)
        image, small = work / "image.bin", work / "small.bin"
        rng.standard_normal(shape, dtype=np.float32).tofile(image)
        (rng.standard_normal(CHAIN, dtype=np.float32) * 4).tofile(small)
        served = sum(1 for m in net.modules() if isinstance(m, Relu6))
        print(
            f"MobileNetV2 1x3x{args.size}x{args.size}: {served} ReLU6 served by deploy, convolutions by"
            f" ExecuTorch's portable kernel; medians of {args.rounds} rounds of {args.runs} runs"
        )
        print(f"{'threads':>7}  {'deploy ms':>24}  {'ExecuTorch ms':>24}  deploy/ET  crossing us/node")
        host = place / HOST
        for threads in counts:
            ours, theirs = timed(host, nets, image, threads, args.rounds, args.runs)
            c_ours, c_theirs = timed(host, chains, small, threads, args.rounds, CHAIN_RUNS)
            crossing = (statistics.median(c_ours) - statistics.median(c_theirs)) * 1e3 / CHAIN
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"{threads:>7}  {spread(ours):>24}  {spread(theirs):>24}  {ratio:9.3f}  {crossing:16.2f}")


if __name__ == "__main__":
    run(main)
