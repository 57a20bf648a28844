"""A device farm: an RPC tracker with two native emulator servers under one key (registered by
the host-side registrar), and a stock TVM Python server beside them."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.devices import DeviceLost
from deploy.devices.emulator import Emulator
from deploy.devices.server_process import Server, free_port, spawn
from deploy.devices.tracker import TrackerDevice, TrackerProcess, free_servers
from deploy.ops import all_ops, get_op
from deploy.verify.matrix import plan, run_matrix
from tests.conftest import run_deploy

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user"),
    pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs gcc-aarch64-linux-gnu"),
]
KEY = "farm"


@contextmanager
def running_farm(directory: Path) -> Iterator[tuple[int, list[Server]]]:
    """A tracker and two emulator servers registered under KEY: (tracker port, servers)."""
    tracker = TrackerProcess(directory)
    address = tracker.start(port=free_port())
    emulator = Emulator()
    servers = []
    try:
        servers = [emulator.start(tracker=f"127.0.0.1:{address.port}", key=KEY) for _ in range(2)]
        deadline = time.monotonic() + 60
        while free_servers("127.0.0.1", address.port, KEY) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        yield address.port, servers
    finally:
        for server in servers:
            server.stop()
        tracker.stop()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[Server]]]:
    """The farm the tests share; none of them stops its servers."""
    with running_farm(tmp_path_factory.mktemp("tracker")) as found:
        yield found


@pytest.fixture
def own_farm(tmp_path: Path) -> Iterator[tuple[int, list[Server]]]:
    """A farm for one test that stops one of its servers."""
    with running_farm(tmp_path / "tracker") as found:
        yield found


def summary(results):
    return [(r.op, r.dtype, r.case, r.ok, r.max_error) for r in results]


def test_tracker_cli_status(farm):
    port, _ = farm
    status = run_deploy("tracker", "status", "--tracker", f"127.0.0.1:{port}")
    assert status.returncode == 0 and f"{KEY}: 2 free" in status.stdout


def test_matrix_spreads_over_both_servers(farm):
    port, servers = farm
    result = run_deploy("test", "--target", "arm", "--tracker", f"127.0.0.1:{port}", "--key", KEY,
                        "--op", "add", "--dtype", "float32")  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    spread = next(line for line in result.stdout.splitlines() if line.startswith("cases per device session"))
    counts = [int(part.rsplit(":", 1)[1]) for part in spread.split(":", 1)[1].split(",")]
    assert len(counts) == 2 and all(count > 0 for count in counts), spread
    for server in servers:
        assert "load_module" in Path(server.log).read_text(), f"server on {server.port} got no work"


def test_a_symbolic_model_on_the_farm(farm):
    """A model's Relax VM executable on a tracker's server, its batch N run at 1, 3 and 32."""
    port, _ = farm
    repo = Path(__file__).resolve().parent.parent
    result = run_deploy("--ops-path", str(repo / "deploy" / "ops" / "examples"), "test", "--target", "arm",
                        "--tracker", f"127.0.0.1:{port}", "--key", KEY, "--model",
                        str(repo / "examples" / "pool_add_leaky_htanh_n.onnx"))  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "arm/max_pool2d" in result.stdout and " 0 failed" in result.stdout


def wait_free(port: int, key: str, count: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while (free := free_servers("127.0.0.1", port, key)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return free


def test_parallel_results_equal_a_single_device_run(farm):
    port, _ = farm
    target = get_target("arm")
    device = TrackerDevice("127.0.0.1", port, KEY, target.arch)
    planned = plan([get_op("argmax"), get_op("leaky_relu")], ["float32"])
    assert summary(run_matrix(planned, target, BuildOptions(), device, workers=2)) == summary(
        run_matrix(planned, target, BuildOptions(), device, workers=1)
    )
    assert wait_free(port, KEY, 2) == 2, "the registrar offered the servers again after their sessions"


def test_a_stock_python_server_on_the_tracker_still_works(farm, tmp_path: Path):
    """A user's own `python -m tvm.exec.rpc_server --tracker` (here on this x86 host) serves deploy."""
    port, _ = farm
    at = free_port()
    cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(at),
           "--port-end", str(at + 1), "--tracker", f"127.0.0.1:{port}", "--key", "stock"]  # fmt: skip
    server = Server.of(spawn(cmd, tmp_path / "stock.log"), at, tmp_path / "stock.log")
    try:
        assert wait_free(port, "stock", 1, timeout=60) == 1, server.log_tail()
        result = run_deploy("test", "--target", "x86", "--tracker", f"127.0.0.1:{port}", "--key", "stock",
                            "--op", "add", "--dtype", "float32")  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr
        assert "0 failed" in result.stdout
    finally:
        server.stop()


@pytest.mark.slow
def test_tune_measures_on_the_farm(farm, tmp_path: Path):
    port, _ = farm
    db = tmp_path / "db"
    where = ["--tracker", f"127.0.0.1:{port}", "--key", KEY]
    result = run_deploy("tune", "--op", "add", "--shape", "7x13", "--shape", "7x13", "--target", "arm",
                        *where, "--trials", "2", "--db", str(db))  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    # accepted or not (emulated timings decide), the verdict names the farm's device it measured on
    assert f" on {KEY}@127.0.0.1:{port}" in result.stdout.replace("\n", "")
    assert free_servers("127.0.0.1", port, KEY) == 2, "tuning sessions gave their servers back"


def test_a_server_dying_mid_run_requeues_its_cases(own_farm):
    port, servers = own_farm
    target = get_target("arm")
    device = TrackerDevice("127.0.0.1", port, KEY, target.arch)
    planned = plan(all_ops(), ["float32"])
    lost: list[DeviceLost] = []
    done: list[str] = []

    def on_result(result, worker: str) -> None:
        done.append(worker)
        if set(done) == {"#1", "#2"} and servers[0].alive():
            servers[0].stop()  # both workers are busy: one of them loses its server

    results = run_matrix(planned, target, BuildOptions(), device, on_result, lost.append, workers=2)
    assert len(results) == len(planned) and all(r.ok for r in results), [r for r in results if not r.ok]
    assert not servers[0].alive()
    assert lost, "the dead server was not reported"
    assert wait_free(port, KEY, 1) == 1
    time.sleep(1)  # both would be offered again by now: only the live one is
    assert free_servers("127.0.0.1", port, KEY) == 1, "the tracker withdrew the stopped server"


@pytest.mark.parametrize(
    "text,address",
    [
        ("127.0.0.1:9190", ("127.0.0.1", 9190)),
        ("[::1]:9190", ("::1", 9190)),
        ("farm.local:1", ("farm.local", 1)),
    ],
)
def test_a_tracker_address_is_host_and_port(text, address):
    from deploy.devices.tracker import parse_address

    assert parse_address(text) == address
