"""Engines on a board over SSH (docs/engines.md): `deploy test --model M --engine E --device BOARD`
pushes the engine's C or C++ host, the plugin, the engine's libraries and the model to a real
OpenSSH server on loopback whose "board" is this x86_64 machine with no Python on the login's
PATH (tests/sshd.py), runs the model there and compares its outputs here; the refused
combinations and a lost board are one line."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.devices.server_process import free_port
from deploy.engines.onnxruntime import HEADERS_VARIABLE, headers_dir
from tests import sshd
from tests.conftest import REPO, run_deploy
from tests.test_engines import leaky_hard_tanh

HEADERS = headers_dir()[0]
"""Where ci/setup.sh put onnxruntime's headers (read before conftest moves the cache)."""
ENV = {HEADERS_VARIABLE: str(HEADERS)}
EXAMPLES = ("--ops-path", str(REPO / "deploy" / "ops" / "examples"))
pytestmark = [
    pytest.mark.skipif(not sshd.available(), reason="needs openssh-server (/usr/sbin/sshd) and ssh-keygen"),
    pytest.mark.skipif(shutil.which("x86_64-linux-gnu-gcc") is None, reason="needs gcc (x86_64)"),
]
NEEDS_ORT = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None or not (HEADERS / "onnxruntime_c_api.h").is_file(),
    reason=f"needs onnxruntime and its C API headers in {HEADERS} (ci/setup.sh)",
)
NEEDS_ET = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("executorch") is None,
    reason="torch and executorch are the extra 'executorch': pip install -e '.[executorch]' (ci/setup.sh)",
)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory):
    """A runner board "enginebox" (x86_64) on a real sshd, and its remote directory."""
    folder = tmp_path_factory.mktemp("board")
    running = sshd.start(folder / "sshd")
    remote = folder / "remote"
    added = run_deploy(
        "device", "add", "enginebox", "--host", "127.0.0.1", "--port", str(running.port), "--user",
        running.user, "--key", str(running.key), "--arch", "x86_64", "--remote-dir", str(remote),
        "--protocol", "runner", "--accept-new-host-key",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    yield remote
    sshd.stop(running)


def pushed_and_cleaned(remote: Path, host: str) -> None:
    """The board holds the pushed files (with their SHA256SUMS and the host) and no call's files."""
    bundles = [b for b in (remote / "bundles").iterdir() if (b / host).is_file()]
    assert bundles and all((b / "SHA256SUMS").is_file() for b in bundles)
    assert list((remote / "calls").iterdir()) == [], "each call's inputs and outputs are removed"


@NEEDS_ORT
def test_onnxruntime_runs_the_model_on_a_board(board: Path, tmp_path: Path) -> None:
    """The C host, onnxruntime's x86_64 library and the plugin run on the board; a pushed file
    changed there afterwards is refused by the board's sha256sum before the next run."""
    model = leaky_hard_tanh(tmp_path / "leaky.onnx")
    args = (*EXAMPLES, "test", "--target", "x86", "--engine", "onnxruntime", "--model", str(model))
    tested = run_deploy(*args, "--device", "enginebox", env=ENV)
    assert tested.returncode == 0, tested.stderr
    lines = tested.stdout.splitlines()
    first = f"{model} in onnxruntime (x86, board enginebox) with deploy's plugin: 1 node(s) served, ok"
    assert lines[0] == first
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"  output 'y' on {inputs} inputs" for inputs in ("random", "ties", "NaN, inf, ties")
    ]
    pushed_and_cleaned(board, "deploy-ort-host")
    (bundle,) = [b for b in (board / "bundles").iterdir() if (b / "model.onnx").is_file()]
    (bundle / "model.onnx").write_bytes(b"changed on the board")
    again = run_deploy(*args, "--device", "enginebox", env=ENV)
    assert again.returncode == 1
    said = f"error: enginebox: the files pushed to {bundle} do not match their SHA256SUMS there"
    assert again.stderr.startswith(f"{said} (model.onnx: FAILED): changed on the board;"), again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr


@NEEDS_ET
def test_executorch_runs_the_model_on_a_board(board: Path, tmp_path: Path) -> None:
    """examples/executorch_model.py's model: the host, the kernel library and ExecuTorch's lib/
    run on the board."""
    model = tmp_path / "conv_hsig_linear_leaky.pt2"
    made = subprocess.run(
        [sys.executable, str(REPO / "examples" / "executorch_model.py"), str(model)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tested = run_deploy("test", "--model", str(model), "--engine", "executorch", "--target", "x86",
                        "--device", "enginebox")  # fmt: skip
    assert tested.returncode == 0, tested.stderr
    lines = tested.stdout.splitlines()
    assert lines[0].endswith(
        " in ExecuTorch on x86, board enginebox with deploy::hard_sigmoid.out, deploy::leaky_relu.out"
        " from deploy: ok"
    )
    assert len(lines) == 4 and all(": ok (max error" in line for line in lines[1:]), tested.stdout
    pushed_and_cleaned(board, "executorch-host")


@NEEDS_ORT
@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--target", "arm", "--device", "enginebox"),
         "error: --device enginebox is an x86_64 board: --target arm builds for aarch64 (expected a target"
         " for x86_64)"),
        (("--target", "x86", "--tracker", "127.0.0.1:9190", "--key", "k"),
         "error: --engine onnxruntime runs the model here, under the emulator or on a board (--device NAME):"
         " not through --tracker, --key or --cl-device"),
        (("--target", "x86", "--device", "emulator"),
         "error: --device emulator: --engine onnxruntime --target x86 runs on local or on a board added with"
         " `deploy device add`"),
        (("--target", "x86", "--device", "nosuchboard"),
         "error: no device named 'nosuchboard' (see `deploy device list`)"),
    ],
)  # fmt: skip
def test_a_refused_combination_is_one_line(
    board: Path, tmp_path: Path, extra: tuple[str, ...], said: str
) -> None:
    model = leaky_hard_tanh(tmp_path / "leaky.onnx")
    done = run_deploy(*EXAMPLES, "test", "--engine", "onnxruntime", "--model", str(model), *extra, env=ENV)
    assert (done.returncode, done.stderr) == (2, said + "\n")


@NEEDS_ORT
def test_an_unreachable_board_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    added = run_deploy("device", "add", "gonebox", "--host", "127.0.0.1", "--port", str(port), "--user", "x",
                       "--arch", "x86_64", "--protocol", "runner")  # fmt: skip
    assert added.returncode == 0, added.stderr
    model = leaky_hard_tanh(tmp_path / "leaky.onnx")
    done = run_deploy(*EXAMPLES, "test", "--target", "x86", "--engine", "onnxruntime", "--model", str(model),
                      "--device", "gonebox", env=ENV)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot reach gonebox at 127.0.0.1:{port}")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
