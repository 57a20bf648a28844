"""deploy's kernels inside ExecuTorch (docs/engines.md): a PyTorch model calling
deploy's ops, exported to a .pte, runs in ExecuTorch with the kernel library `deploy build
--engine executorch` writes, on x86 and under qemu-aarch64, compared with the model run eagerly
with the ops' numpy references; a bad shape or a missing runtime is one line."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from deploy.engines.executorch_library import AARCH64_VARIABLE, DIR_VARIABLE, aarch64_lib, run_host
from tests.conftest import DEPLOY, REPO, run_deploy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("executorch") is None,
    reason="torch and executorch are the extra 'executorch': pip install -e '.[executorch]' (ci/setup.sh)",
)
ARM_LIB = aarch64_lib()
"""Where the aarch64 libraries are outside the tests' own cache (read when this module is
imported, before conftest moves the cache): ci/setup.sh unpacked them there."""
ENV = {AARCH64_VARIABLE: str(ARM_LIB)}
NEEDS_ARM = pytest.mark.skipif(
    not (ARM_LIB / "libexecutorch.so").is_file() or shutil.which("qemu-aarch64") is None,
    reason=f"no ExecuTorch aarch64 libraries in {ARM_LIB} (run ci/setup.sh) or no qemu-aarch64",
)
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 2.5, -2.5, 1e-40], np.float32)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a failed deploy command (torch's import noise on stderr left out)."""
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/executorch_model.py's model (conv, deploy::hard_sigmoid, linear, deploy::leaky_relu)."""
    path = tmp_path_factory.mktemp("model") / "conv_hsig_linear_leaky.pt2"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "executorch_model.py"), str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


@pytest.mark.parametrize("target", ["x86", pytest.param("arm", marks=NEEDS_ARM)])
def test_the_model_runs_in_executorch_and_matches(model: Path, target: str) -> None:
    done = run_deploy("test", "--model", str(model), "--engine", "executorch", "--target", target, env=ENV)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(
        f"in ExecuTorch on {target} with deploy::hard_sigmoid.out, deploy::leaky_relu.out from deploy: ok"
    )
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"  1 output(s) on {inputs} inputs" for inputs in ("random", "ties", "NaN, inf, ties")
    ]


def export_leaky(path: Path, shape: tuple[int, ...], alpha: float | None = 0.5) -> Path:
    """A .pte of a model that is deploy::leaky_relu(alpha) of its input of `shape`, nothing else."""
    import torch

    import deploy.engines.executorch_ops  # noqa: F401
    from deploy.engines.executorch import lower

    class Leaky(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.deploy.leaky_relu(x, alpha=alpha)

    program = torch.export.export(Leaky(), (torch.zeros(shape),))
    path.write_bytes(lower(program, path))
    return path


@pytest.fixture(scope="module")
def leaky_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`deploy build --op leaky_relu --shape 2x8 --engine executorch`'s directory."""
    folder = tmp_path_factory.mktemp("leaky") / "plugin"
    done = run_deploy(
        "build", "--op", "leaky_relu", "-a", "alpha=0.5", "--shape", "2x8", "--target", "x86",
        "--engine", "executorch", "-o", str(folder), env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deploy::leaky_relu.out: op leaky_relu float32[2, 8]" in done.stdout
    return folder


def test_an_op_build_runs_a_pte_bit_for_bit(leaky_plugin: Path, tmp_path: Path) -> None:
    """The kernel computes what numpy does, exactly (alpha=0.5: x * 0.5 rounds once, as numpy's),
    NaN and infinities included."""
    pte = export_leaky(tmp_path / "leaky.pte", (2, 8))
    x = np.resize(SPECIALS, (2, 8)) * np.float32(3)
    (got,) = run_host(leaky_plugin, pte, [x], 1, "x86_64")
    want = np.where(x > 0, x, x * np.float32(0.5))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("alpha", "said"), [(0.25, "0.25"), (None, "0.01")])
def test_an_attribute_the_kernel_was_not_built_for_is_one_line(
    leaky_plugin: Path, tmp_path: Path, alpha: float | None, said: str
) -> None:
    """A .pte with another alpha, or none (the op's default, 0.01), than the kernel's 0.5."""
    pte = export_leaky(tmp_path / "leaky.pte", (2, 8), alpha)
    from deploy.base.errors import DeployError

    with pytest.raises(DeployError) as raised:
        run_host(leaky_plugin, pte, [np.zeros((2, 8), np.float32)], 1, "x86_64")
    why = f"attribute alpha is {said}; the kernel was built for 0.5"
    assert str(raised.value) == f"ExecuTorch: {pte}: forward failed: deploy::leaky_relu.out: {why}"


def test_a_shape_the_kernel_was_not_built_for_is_one_line(leaky_plugin: Path, tmp_path: Path) -> None:
    pte = export_leaky(tmp_path / "leaky29.pte", (2, 9))
    from deploy.base.errors import DeployError

    with pytest.raises(DeployError) as raised:
        run_host(leaky_plugin, pte, [np.zeros((2, 9), np.float32)], 1, "x86_64")
    message = str(raised.value)
    said = "forward failed: deploy::leaky_relu.out: et0_leaky_relu: x has shape [2, 9], expected [2, 8]"
    assert message == f"ExecuTorch: {pte}: {said}", message


@pytest.mark.parametrize(
    ("given", "said"), [((2, 7), "holds 56 bytes"), ((3, 8), "holds more than 64 bytes")]
)
def test_an_input_of_another_size_is_refused_by_the_host(
    leaky_plugin: Path, tmp_path: Path, given: tuple[int, ...], said: str
) -> None:
    pte = export_leaky(tmp_path / "leaky.pte", (2, 8))
    from deploy.base.errors import UsageError

    with pytest.raises(UsageError) as raised:
        run_host(leaky_plugin, pte, [np.zeros(given, np.float32)], 1, "x86_64")
    message = str(raised.value)
    assert re.fullmatch(rf"ExecuTorch: input \S+/in0\.bin {said}, expected 64", message), message


HOST_TIMES = re.compile(r"forward: 3 runs on 2 threads: median ([\d.]+) ms \(min ([\d.]+), max ([\d.]+)\)")


def test_the_host_times_forward_on_the_threads_asked(leaky_plugin: Path, tmp_path: Path) -> None:
    """--repeat N: N timed calls after a warm-up, their median, least and most in one line;
    --threads T: ExecuTorch's threadpool of T threads. The outputs are still written."""
    pte = export_leaky(tmp_path / "leaky.pte", (2, 8))
    x = np.resize(SPECIALS, (2, 8))
    x.tofile(tmp_path / "x.bin")
    command = [str(leaky_plugin / "executorch-host"), str(pte), "-i", str(tmp_path / "x.bin"),
               "-o", str(tmp_path / "y.bin"), "--threads", "2", "--repeat", "3"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    timing, output = done.stdout.splitlines()
    found = HOST_TIMES.fullmatch(timing)
    assert found is not None, timing
    least, median, most = (float(found.group(i)) for i in (2, 1, 3))
    assert 0 < least <= median <= most
    assert output == "output 0 6 2x8"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(2, 8),
                                  np.where(x > 0, x, x * np.float32(0.5)))  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--repeat", "0"], "--repeat 0: expected a count from 1 to 1000000"),
        (["--repeat", "3x"], "--repeat 3x: expected a count from 1 to 1000000"),
        (["--threads", "0"], "--threads 0: expected a count from 1 to 1024"),
        (["--threads", "9" * 20], f"--threads {'9' * 20}: expected a count from 1 to 1024"),
        (["--threads"], "argument --threads: expected -i FILE, -o FILE, --threads T or --repeat N"),
        (["--fast", "1"], "argument --fast: expected -i FILE, -o FILE, --threads T or --repeat N"),
    ],
)  # fmt: skip
def test_a_bad_timing_flag_is_one_line(
    leaky_plugin: Path, tmp_path: Path, args: list[str], said: str
) -> None:
    command = [str(leaky_plugin / "executorch-host"), str(tmp_path / "none.pte"), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"executorch-host: {said}\n", "")


@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="deploy's own pool starts threads only with 2 CPUs or more"
)
def test_deploys_kernels_run_on_executorchs_threads(tmp_path: Path) -> None:
    """The library hands its parallel loops to ExecuTorch's threadpool: while the host runs at
    --threads 1 it has one thread (deploy's own pool would add one per CPU but the caller), at 2
    two. Counted as most samples see it: ExecuTorch's default pool lives briefly at the start."""
    folder = tmp_path / "plugin"
    done = run_deploy("build", "--op", "leaky_relu", "-a", "alpha=0.5", "--shape", "1024x1024", "--target",
                      "x86", "--engine", "executorch", "-o", str(folder), env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pte = export_leaky(tmp_path / "big.pte", (1024, 1024))
    x = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    x.tofile(tmp_path / "x.bin")
    for threads in (1, 2):
        command = [str(folder / "executorch-host"), str(pte), "-i", str(tmp_path / "x.bin"), "-o",
                   str(tmp_path / "y.bin"), "--threads", str(threads), "--repeat", "2000"]  # fmt: skip
        host = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        while host.poll() is None:
            status = Path(f"/proc/{host.pid}/status")
            with contextlib.suppress(OSError):  # it may end between the poll and the read
                seen.append(int(re.search(r"^Threads:\s+(\d+)", status.read_text(), re.M).group(1)))
            time.sleep(0.005)
        out, err = host.communicate()
        assert host.returncode == 0, err
        assert out.startswith(f"forward: 2000 runs on {threads} threads:"), out
        assert statistics.mode(seen) == threads, seen
        np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(x.shape),
                                      np.where(x > 0, x, x * np.float32(0.5)))  # fmt: skip


@pytest.mark.parametrize(
    ("env", "target", "said"),
    [
        ({DIR_VARIABLE: "{tmp}"}, "x86", "headers not found: no {tmp}/include/executorch/runtime/"),
        ({AARCH64_VARIABLE: "{tmp}"}, "arm", "aarch64 libraries not found: no {tmp}/libexecutorch.so"),
    ],
)  # fmt: skip
def test_a_missing_runtime_is_one_line(tmp_path: Path, env: dict[str, str], target: str, said: str) -> None:
    given = {key: value.format(tmp=tmp_path) for key, value in env.items()}
    done = run_deploy(
        "build", "--op", "leaky_relu", "--shape", "4", "--target", target, "--engine", "executorch",
        "-o", str(tmp_path / "out"), env={**ENV, **given},
    )  # fmt: skip
    assert done.returncode == 1
    assert one_line(done).startswith("error: ExecuTorch's " + said.format(tmp=tmp_path)), done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    import torch

    plain = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(torch.nn.ReLU(), (torch.zeros(3),)), str(plain))
    (tmp_path / "junk.pt2").write_text("not a program")
    cases = [
        (["--model", str(plain), "--target", "x86"], 2, "it calls no deploy:: op: nothing to serve"),
        (["--model", str(tmp_path / "junk.pt2"), "--target", "x86"], 2, "expected a torch.export program"),
        (["--model", str(tmp_path / "none.pt2"), "--target", "x86"], 2, "no such file"),
        (["--model", str(plain), "--target", "armv7"], 2, "expected x86 or arm"),
    ]
    for args, code, said in cases:
        done = run_deploy("test", "--engine", "executorch", *args, env=ENV)
        assert done.returncode == code, (args, done.stderr)
        assert said in one_line(done), done.stderr


@NEEDS_ARM
def test_the_docs_steps_run(tmp_path: Path) -> None:
    """docs/engines.md's steps, each line of its block in order in an empty directory
    (`python` this interpreter, `deploy` the installed command), with its lower.py."""
    page = (REPO / "docs" / "engines.md").read_text()
    section = page[page.index("## Step by step (ExecuTorch)") :]
    steps = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lower = re.search(r"```python\n( *)(# lower.py.*?)```", section, re.S)
    (tmp_path / "lower.py").write_text(textwrap.dedent(lower.group(1) + lower.group(2)))
    for line in steps.splitlines():
        words = shlex.split(line, comments=True)
        if words[0] == "python":
            words = [sys.executable, *(str(REPO / w) if w.startswith("examples/") else w for w in words[1:])]
        elif words[0] == "deploy":
            words[0] = DEPLOY
        done = subprocess.run(
            words, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, **ENV},
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr)
        if words[0] == DEPLOY and "test" in words:
            assert done.stdout.startswith("model.pt2 in ExecuTorch on "), done.stdout
    assert (tmp_path / "et-x86" / "plugin.json").is_file()
    y = np.fromfile(tmp_path / "y.bin", np.float32)
    assert y.shape == (10,) and np.isfinite(y).all()


HARD_TANH_MODEL = """
import sys
import torch
from deploy.ops import load_ops_path
load_ops_path(sys.argv[1])
import deploy.engines.executorch_ops

class Clip(torch.nn.Module):
    def forward(self, x):
        return torch.ops.deploy.hard_tanh(torch.relu(x))

torch.export.save(torch.export.export(Clip(), (torch.zeros(4, 5),)), sys.argv[2])
"""
"""A model calling an op of the user's own files (deploy/ops/examples/hard_tanh.py)."""


def test_an_op_of_the_users_files(tmp_path: Path) -> None:
    examples, model = str(REPO / "deploy" / "ops" / "examples"), tmp_path / "clip.pt2"
    (tmp_path / "export.py").write_text(HARD_TANH_MODEL)
    made = subprocess.run(
        [sys.executable, str(tmp_path / "export.py"), examples, str(model)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    args = ("test", "--model", str(model), "--engine", "executorch", "--target", "x86")
    done = run_deploy("--ops-path", examples, *args, env=ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{model} in ExecuTorch on x86 with deploy::hard_tanh.out from deploy: ok")
    unknown = run_deploy(*args, env=ENV)
    assert unknown.returncode == 2
    assert one_line(unknown) == (
        f"error: --model {model}: it calls deploy::hard_tanh, which is no registered op"
        " (an op of your own files: deploy --ops-path DIR)"
    )


def test_the_bench_script_runs_end_to_end() -> None:
    """bench/engine_executorch.py at its smallest: a row per thread count, with deploy's time,
    ExecuTorch's, their ratio and the crossing cost; a bad size is one line, exit 2."""
    script = [sys.executable, str(REPO / "bench" / "engine_executorch.py")]
    done = subprocess.run([*script, "--size", "32", "--rounds", "2", "--runs", "1"],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("MobileNetV2 1x3x32x32: 35 ReLU6 served by deploy"), lines
    number, times = r"-?\d+\.\d+", r"\d+\.\d+ \[\d+\.\d+-\d+\.\d+\]"
    for row, threads in zip(lines[2:], (1, 2), strict=True):
        assert re.fullmatch(rf" +{threads} +{times} +{times} +{number} +{number}", row), row
    bad = subprocess.run([*script, "--size", "31"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1].endswith(
        "error: --size 31: expected 32 to 1024 (the net halves it five times)"
    )
