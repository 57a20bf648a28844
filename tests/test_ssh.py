"""Boards over SSH against a real OpenSSH server on loopback whose "board" is this machine running
the emulator's aarch64 Python: registration, host keys, setup, the whole matrix, and failures."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from devices.emulator import Emulator
from devices.server_process import free_port
from tests import sshd
from tests.conftest import DEPLOY, run_deploy

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not sshd.available(), reason="needs openssh-server (/usr/sbin/sshd) and ssh-keygen"),
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user"),
    pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs gcc-aarch64-linux-gnu"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = sshd.start(tmp_path_factory.mktemp("sshd"))
    yield running
    sshd.stop(running)


@pytest.fixture(scope="module")
def aarch64_python() -> str:
    emulator = Emulator()
    emulator.provision()
    return str(emulator.wrapper())


def board_processes(remote_dir: Path) -> list[psutil.Process]:
    """Live processes started on the "board" for this remote dir (their cwd is under it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cwd", "status"]):
        cwd = proc.info["cwd"] or ""
        if cwd.startswith(str(remote_dir)) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def settle(remote_dir: Path, timeout: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while board_processes(remote_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return board_processes(remote_dir)


def start_matrix(device: str, remote_dir: Path) -> subprocess.Popen[str]:
    """`deploy test --target arm --device DEVICE` in the background, once cases run on the board."""
    proc = subprocess.Popen(
        [DEPLOY, "test", "--target", "arm", "--device", device],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not board_processes(remote_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(15)  # the server starts (~8 s), then cases run
    return proc


def add(name: str, server: sshd.Sshd, python: str, remote_dir: Path, *extra: str, key: str | None = None):
    return run_deploy(
        "device", "add", name, "--host", "127.0.0.1", "--port", str(server.port), "--user", server.user,
        "--key", key or str(server.key), "--python", python, "--remote-dir", str(remote_dir), *extra,
    )  # fmt: skip


def test_unknown_host_key_is_refused_until_accepted(server, aarch64_python, tmp_path):
    remote = tmp_path / "board"
    assert add("pi", server, aarch64_python, remote).returncode == 0
    refused = run_deploy("device", "check", "pi")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: unknown host key for 127.0.0.1:")
    assert "--accept-new-host-key" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    accepted = run_deploy("device", "check", "pi", "--accept-new-host-key")
    assert accepted.returncode == 0, accepted.stderr
    assert "Python 3.11 on aarch64" in accepted.stdout and "TVM runtime 0.27.0" in accepted.stdout
    assert run_deploy("device", "check", "pi").returncode == 0  # the key is known now
    listed = run_deploy("device", "list")
    assert f"pi         {server.user}@127.0.0.1:{server.port} aarch64" in listed.stdout
    assert run_deploy("device", "remove", "pi").returncode == 0
    assert "pi " not in run_deploy("device", "list").stdout


def test_changed_host_key_is_refused(server, aarch64_python, tmp_path):
    from devices.boards import known_hosts_file

    assert add("moved", server, aarch64_python, tmp_path, "--accept-new-host-key").returncode == 0
    other = sshd.keygen(tmp_path / "other_host_key")
    public = (tmp_path / "other_host_key.pub").read_text().split()
    saved = known_hosts_file().read_text()
    try:
        known_hosts_file().write_text(f"[127.0.0.1]:{server.port} {public[0]} {public[1]}\n")
        result = run_deploy("device", "check", "moved")
        assert result.returncode == 1
        assert "differs from the one in known_hosts" in result.stderr
    finally:
        known_hosts_file().write_text(saved)
        assert other.exists()


def test_wrong_key_and_unreachable_port_are_one_line_errors(server, aarch64_python, tmp_path):
    stranger = sshd.keygen(tmp_path / "stranger")
    assert add("stranger", server, aarch64_python, tmp_path, "--accept-new-host-key").returncode == 0
    add("stranger", server, aarch64_python, tmp_path, "--replace", key=str(stranger))
    wrong = run_deploy("device", "check", "stranger")
    assert wrong.returncode == 1
    assert wrong.stderr.startswith(f"error: SSH login to {server.user}@127.0.0.1:{server.port} failed with")
    assert len(wrong.stderr.strip().splitlines()) == 1

    port = free_port()
    run_deploy("device", "add", "nowhere", "--host", "127.0.0.1", "--port", str(port), "--user", "x")
    unreachable = run_deploy("test", "--target", "arm", "--device", "nowhere", "--op", "add")
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith(f"error: cannot reach nowhere at 127.0.0.1:{port}")
    assert len(unreachable.stderr.strip().splitlines()) == 1


def test_bad_device_arguments(tmp_path):
    bad_arch = run_deploy("device", "add", "b", "--host", "h", "--user", "u", "--arch", "riscv")
    assert bad_arch.returncode == 2 and "--arch 'riscv': expected one of" in bad_arch.stderr
    no_key = str(tmp_path / "no")
    missing_key = run_deploy("device", "add", "b", "--host", "h", "--user", "u", "--key", no_key)
    assert missing_key.returncode == 2 and "no such file" in missing_key.stderr
    bad_name = run_deploy("device", "add", "emulator", "--host", "h", "--user", "u")
    assert bad_name.returncode == 2 and "device name 'emulator'" in bad_name.stderr
    assert run_deploy("device", "check", "ghost").stderr.startswith("error: no device named 'ghost'")


def test_setup_pushes_the_runtime_once(server, aarch64_python, tmp_path):
    """With site-packages off (`-S`), the board has no TVM: setup installs ours, then does nothing."""
    remote = tmp_path / "bare"
    python = f"{aarch64_python} -S"
    assert add("bare", server, python, remote, "--accept-new-host-key").returncode == 0
    before = run_deploy("device", "check", "bare")
    assert before.returncode == 1 and "no TVM runtime" in before.stdout
    first = run_deploy("device", "setup", "bare")
    assert first.returncode == 0, first.stderr
    assert "installed in" in first.stdout and (remote / "runtime" / "tvm").is_dir()
    again = run_deploy("device", "setup", "bare")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert not (remote / "runtime" / "tvm" / "lib" / "libtvm_compiler.so").exists()


def test_whole_matrix_on_an_ssh_board_and_nothing_left_running(server, aarch64_python, tmp_path):
    remote = tmp_path / "board"
    assert add("board", server, aarch64_python, remote, "--accept-new-host-key").returncode == 0
    result = run_deploy("test", "--target", "arm", "--device", "board")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert " 0 failed" in result.stdout
    assert "on board" in result.stdout
    assert settle(remote) == []


@pytest.mark.slow
def test_tune_on_an_ssh_board(server, aarch64_python, tmp_path):
    remote = tmp_path / "board"
    assert add("tuneboard", server, aarch64_python, remote, "--accept-new-host-key").returncode == 0
    db = tmp_path / "db"
    result = run_deploy("tune", "--op", "add", "--shape", "7x13", "--shape", "7x13", "--target", "arm",
                        "--device", "tuneboard", "--trials", "2", "--db", str(db))  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "vs numpy on tuneboard" in result.stdout.replace("\n", "")
    assert settle(remote) == []


def test_sshd_killed_mid_run(tmp_path, aarch64_python):
    """A crashed sshd: the run stops with a one-line error and the board's server goes away."""
    own = sshd.start(tmp_path / "sshd")
    remote = tmp_path / "board"
    try:
        assert add("doomed", own, aarch64_python, remote, "--accept-new-host-key").returncode == 0
        proc = start_matrix("doomed", remote)
        own.kill()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out[-1000:] + err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert "doomed" in err
        assert "device lost" in out, err
        assert settle(remote) == []
    finally:
        if own.proc.poll() is None:
            sshd.stop(own)


def test_board_serves_a_tracker(server, aarch64_python, tmp_path):
    """`deploy device serve`: the board registers with a tracker through the SSH connection."""
    import signal

    from devices.tracker import TrackerProcess, free_servers

    remote = tmp_path / "farm-board"
    tracker = TrackerProcess(tmp_path / "tracker")
    address = tracker.start(port=free_port())
    where = f"127.0.0.1:{address.port}"
    serving = None
    try:
        assert add("farmed", server, aarch64_python, remote, "--accept-new-host-key").returncode == 0
        serving = subprocess.Popen(
            [DEPLOY, "device", "serve", "farmed", "--tracker", where, "--key", "boards"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while free_servers("127.0.0.1", address.port, "boards") < 1 and time.monotonic() < deadline:
            assert serving.poll() is None, serving.communicate()
            time.sleep(0.5)
        result = run_deploy("test", "--target", "arm", "--tracker", where, "--key", "boards", "--op", "add")
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr
        assert " 0 failed" in result.stdout
        serving.send_signal(signal.SIGINT)
        out, err = serving.communicate(timeout=60)
        assert "registered as 'boards'" in out and serving.returncode == 0, out + err
        assert settle(remote) == []
    finally:
        if serving is not None and serving.poll() is None:
            serving.kill()
        tracker.stop()


def test_ctrl_c_stops_the_board_server(server, aarch64_python, tmp_path):
    import signal

    remote = tmp_path / "board"
    assert add("interrupted", server, aarch64_python, remote, "--accept-new-host-key").returncode == 0
    proc = start_matrix("interrupted", remote)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert settle(remote) == []
    commands = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    assert not [c for c in commands if "board_link" in c and '"interrupted"' in c]
