"""The emulator's lifecycle: long-lived start/status/stop, automatic start/stop, Ctrl-C and a
server that dies mid-run leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from deploy.base.paths import emulator_dir
from deploy.devices import DeviceLost
from deploy.devices.emulator import Emulator
from deploy.devices.rpc import connect
from deploy.devices.server_process import free_port
from deploy.ops import get_op
from tests.conftest import DEPLOY, run_deploy

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not __import__("shutil").which("qemu-aarch64"), reason="needs qemu-user"),
]


def rpc_servers() -> set[int]:
    """Pids of this test session's emulator RPC servers (qemu running the native RPC server, its
    files in this session's emulator directory): another pytest worker's servers come and go
    meanwhile."""
    found, ours = set(), str(emulator_dir())
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "deploy-rpc-server" in cmdline and "qemu-aarch64" in cmdline and ours in cmdline:
            found.add(proc.info["pid"])
    return found


def gone(pids: set[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.fixture(autouse=True)
def no_leftover_servers():
    before = rpc_servers()
    yield
    Emulator().stop_detached()
    assert gone(rpc_servers() - before), "an emulator RPC server was left running"


def test_long_lived_emulator_start_status_stop(tmp_path):
    assert run_deploy("device", "emulator", "status").returncode == 1
    started = run_deploy("device", "emulator", "start")
    assert started.returncode == 0, started.stderr
    server = Emulator().running()
    assert server is not None and server.alive()
    status = run_deploy("device", "emulator", "status")
    assert status.returncode == 0 and f"127.0.0.1:{server.port}" in status.stdout

    x = (np.arange(24, dtype="float32") - 12).reshape(2, 3, 4)
    np.save(tmp_path / "x.npy", x)
    args = ["--op", "argmax", "--target", "arm", "-a", "axis=1", "-i", str(tmp_path / "x.npy")]
    ran = run_deploy("run", *args, "-o", str(tmp_path / "o.npy"), "--check")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "on emulator" in ran.stdout and "check passed" in ran.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.argmax(x, axis=1))
    assert "load_module" in Path(server.log).read_text(), "run did not use the long-lived server"

    stopped = run_deploy("device", "emulator", "stop")
    assert stopped.returncode == 0 and f"pid {server.pid}" in stopped.stdout
    assert gone({server.pid})
    assert run_deploy("device", "emulator", "status").returncode == 1


def test_sessions_leave_no_directory_behind(tmp_path):
    """Issue #36: each command on the emulator left its session directory (the uploaded modules)
    when deploy stopped its server mid-session; now the server removes it as it stops. Two runs
    on servers of their own, then two on a long-lived one, stopped after."""
    sessions = Emulator().base / "sessions"
    before = set(sessions.glob("deploy-session-*"))
    np.save(tmp_path / "x.npy", np.arange(12, dtype="float32").reshape(3, 4))
    args = [
        "run",
        "--op",
        "argmax",
        "--target",
        "arm",
        "-i",
        str(tmp_path / "x.npy"),
        "-o",
        str(tmp_path / "o.npy"),
    ]
    for _ in range(2):
        ran = run_deploy(*args)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    assert set(sessions.glob("deploy-session-*")) == before
    assert run_deploy("device", "emulator", "start").returncode == 0
    for _ in range(2):
        assert run_deploy(*args).returncode == 0
    assert set(sessions.glob("deploy-session-*")) == before, "the long-lived server kept a session"
    assert run_deploy("device", "emulator", "stop").returncode == 0
    assert set(sessions.glob("deploy-session-*")) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_ctrl_c_term_and_hangup_stop_the_automatic_server(sig: signal.Signals):
    """Ctrl-C, `kill` and a closed terminal mid-run: the server deploy started goes with it. The
    run is every op (a minute on the emulator), so that it is still running when the signal comes:
    one op with its builds cached could finish first on a loaded machine."""
    before = rpc_servers()
    proc = subprocess.Popen([DEPLOY, "test", "--target", "arm"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: rpc_servers() - before)
        started = rpc_servers() - before
        time.sleep(2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert gone(started), f"{sig.name} left the emulator running"
    assert proc.returncode == 128 + sig and f"stopped by {sig.name}" in err.splitlines()[-1], err


def test_a_killed_command_takes_its_automatic_server_with_it():
    """SIGKILL gives deploy no chance to stop the server it started: the server stops itself once
    its parent is gone (`--parent`), a session in progress included."""
    before = rpc_servers()
    proc = subprocess.Popen(
        [DEPLOY, "test", "--target", "arm"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: rpc_servers() - before)
        started = rpc_servers() - before
        time.sleep(2)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert gone(started), "SIGKILL left the emulator running"


def test_concurrent_starts_run_one_server():
    """Two `emulator start` at once: both report the same server, and only it runs."""
    before = rpc_servers()
    starts = [subprocess.Popen([DEPLOY, "device", "emulator", "start"], stdout=subprocess.PIPE, text=True)
              for _ in range(2)]  # fmt: skip
    outs = [proc.communicate(timeout=120)[0] for proc in starts]
    assert [proc.returncode for proc in starts] == [0, 0], outs
    server = Emulator().running()
    assert server is not None
    assert all(f"pid {server.pid}" in out for out in outs), outs
    assert rpc_servers() - before == {server.pid}


@pytest.mark.parametrize("key", ["", "wrong"], ids=["no key", "wrong key"])
def test_server_refuses_clients_without_its_key(key: str):
    """Any local user can reach the port: without the 0600 key file's secret, no session."""
    assert run_deploy("device", "emulator", "start").returncode == 0
    server = Emulator().running()
    assert server is not None and server.key_file is not None
    assert oct(Path(server.key_file).stat().st_mode & 0o777) == "0o600"
    with pytest.raises(DeviceLost, match="cannot reach"):
        connect("127.0.0.1", server.port, "aarch64", "e", key=key).__enter__()
    with connect("127.0.0.1", server.port, "aarch64", "e", key=server.session_key()) as session:
        assert session is not None


def test_server_killed_mid_run_is_reported_and_retried():
    emulator = Emulator()
    assert run_deploy("device", "emulator", "start").returncode == 0
    server = emulator.running()
    args = ["test", "--target", "arm", "--op", "add", "--dtype", "int8", "--dtype", "float32"]
    proc = subprocess.Popen([DEPLOY, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: Path(server.log).read_text().count("load_module") >= 2)
        os.killpg(server.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "device lost" in out
    assert f"{2 * len(get_op('add').cases)} cases passed, 0 failed" in out


def test_unreachable_server_is_one_line():
    port = free_port()
    with pytest.raises(DeviceLost, match=f"cannot reach test server at 127.0.0.1:{port}"), \
            connect("127.0.0.1", port, "aarch64", "test server"):  # fmt: skip
        pass


def test_a_session_uploads_an_input_once_for_runs_on_the_same_data(monkeypatch):
    """An RPC session keeps what it uploaded by content: a second run on equal data (another
    array object) uploads nothing, data that differs in one element is uploaded and used."""
    import tvm

    from deploy.compiler.cache import cached_build
    from deploy.compiler.options import BuildOptions, for_device
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.ops import TensorType, bind
    from deploy.verify.run import run_artifact

    uploads = []
    upload = tvm.runtime.tensor

    def counted(array: np.ndarray, dev: object) -> object:
        uploads.append(array.shape)
        return upload(array, dev)

    monkeypatch.setattr(tvm.runtime, "tensor", counted)
    target, x = get_target("arm"), np.linspace(-3, 3, 64, dtype="float32").reshape(4, 16)
    bound = bind(get_op("leaky_relu"), {"alpha": 0.5}, [TensorType(x.shape, "float32")])
    with get_device(target.default_device).open() as session:
        directory, manifest = cached_build(bound, target, for_device(BuildOptions(), session))
        for data in (x, x.copy(), np.where(x == 3, np.float32(-8), x)):
            (out,) = run_artifact(session, directory, manifest, [data])
            np.testing.assert_array_equal(out, np.where(data > 0, data, data * np.float32(0.5)))
    assert uploads == [(4, 16), (4, 16)]
