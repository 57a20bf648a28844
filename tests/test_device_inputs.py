"""Bad device and tracker arguments are one line (exit 2) before anything starts, a tracker is
public only when asked, and a tracker that is not there fails in one line within seconds (issue
#15, item 10). Boards over SSH are in tests/test_ssh.py."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from deploy.devices.server_process import free_port
from tests.conftest import deploy_here, run_deploy


def one_line_error(result, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment in lines[0], lines[0]


BAD_REMOTE_DIRS = ["", ".", "./", "/", "//", "..", "../x", "a/../..", "x/..", "x\ny", "x\x1b]0;t\x07"]


@pytest.mark.parametrize("remote_dir", BAD_REMOTE_DIRS, ids=repr)
def test_a_remote_dir_that_is_not_deploys_own_is_refused(remote_dir):
    """Setup replaces <remote_dir>/runtime: '.' meant ~/runtime, '/' meant /runtime."""
    result = deploy_here("device", "add", "b", "--host", "h", "--user", "u", "--remote-dir", remote_dir)
    one_line_error(result, 2, "remote dir '")
    assert "\x1b" not in result.stderr
    listed = deploy_here("device", "list").stdout.splitlines()
    assert not [line for line in listed if line.startswith("b ")], listed  # other files' boards may be there


@pytest.mark.parametrize("remote_dir", [".deploy", "boards/pi", "/srv/deploy", "~"])
def test_remote_dirs_of_deploys_own_are_accepted(remote_dir):
    added = deploy_here("device", "add", "ok", "--host", "h", "--user", "u", "--remote-dir", remote_dir)
    assert added.returncode == 0, added.stderr
    assert deploy_here("device", "remove", "ok").returncode == 0


BAD_LISTEN = {
    "tracker port too big": (["tracker", "start", "--port", "70000"], "--port 70000: expected a port from 1"),
    "tracker port zero": (["tracker", "start", "--port", "0"], "--port 0: expected a port from 1 to 65535"),
    "tracker port negative": (["tracker", "start", "--port", "-1"], "--port -1: expected a port from 1"),
    "every interface": (["tracker", "start", "--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other"),
    "every interface v6": (["tracker", "start", "--host", "::"], "add --public to mean it"),
    "empty host": (["tracker", "start", "--host", ""], "--host '': expected an address of this host"),
    "unknown host": (["tracker", "start", "--host", "no-such-host.invalid"], "'no-such-host.invalid'"),
    "emulator port too big": (["device", "emulator", "start", "--port", "70000"], "--port 70000: expected"),
    "emulator port zero": (["device", "emulator", "start", "--port", "0"], "--port 0: expected a port"),
}


@pytest.mark.parametrize("argv,fragment", BAD_LISTEN.values(), ids=BAD_LISTEN.keys())
def test_bad_listen_arguments_start_nothing(argv, fragment):
    result = run_deploy(*argv)
    one_line_error(result, 2, fragment)
    status = run_deploy(*(["tracker"] if argv[0] == "tracker" else ["device", "emulator"]), "status")
    assert status.returncode == 1 and "not running" in status.stdout


def test_a_public_tracker_needs_public_and_says_so(tmp_path):
    port = str(free_port())
    started = run_deploy("tracker", "start", "--host", "0.0.0.0", "--port", port, "--public")
    try:
        assert started.returncode == 0, started.stderr
        assert started.stderr.startswith(f"warning: the tracker on 0.0.0.0:{port} is public: anyone")
        assert len(started.stderr.splitlines()) == 1
    finally:
        assert run_deploy("tracker", "stop").returncode == 0
    local = run_deploy("tracker", "start", "--host", "localhost", "--port", port)
    try:
        assert local.returncode == 0 and local.stderr == "", local.stderr
    finally:
        assert run_deploy("tracker", "stop").returncode == 0


def test_an_unreachable_tracker_is_one_line_within_seconds():
    """It took 63 s and a dozen TVM warnings (TVM's client retries for a minute)."""
    where = f"127.0.0.1:{free_port()}"
    for argv in (
        ["tracker", "status", "--tracker", where],
        ["test", "--target", "x86", "--tracker", where, "--key", "k", "--op", "add"],
    ):
        start = time.monotonic()
        result = run_deploy(*argv)
        one_line_error(result, 1, f"cannot reach the RPC tracker at {where}: Connection refused")
        assert time.monotonic() - start < 20


def test_a_tracker_that_never_answers_is_one_line_within_seconds():
    """A port that accepts connections but says nothing: TVM's client waits forever."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        where = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        result = run_deploy("tracker", "status", "--tracker", where)
        one_line_error(result, 1, f"the RPC tracker at {where} did not answer")
        assert time.monotonic() - start < 20


def test_a_server_registered_then_gone_is_a_lost_device_not_a_hang(tmp_path, monkeypatch):
    """The tracker gives the server, which refuses the connection: TVM's client asked again and
    waited for ever, since nothing offers that server any more (`deploy test` hung for minutes)."""
    from tvm.rpc.base import TrackerCode

    from deploy.devices import DeviceLost
    from deploy.devices import tracker as farm

    process = farm.TrackerProcess(tmp_path)
    address = process.start(port=free_port())
    ghost = farm.tracker_socket("127.0.0.1", address.port)
    try:
        farm.tracker_call(ghost, [TrackerCode.UPDATE_INFO, {"key": "server:ghost", "addr": ["127.0.0.1", 1]}])
        farm.tracker_call(ghost, [TrackerCode.PUT, "ghost", (1, "ghost:x"), "127.0.0.1"])
        monkeypatch.setattr(farm, "GRANT_TIMEOUT_S", 2.0)
        device = farm.TrackerDevice("127.0.0.1", address.port, "ghost", "x86_64")
        failures: list[BaseException] = []

        def open_session() -> None:
            try:
                with device.session():
                    pass
            except BaseException as exc:  # checked below, in the test's thread
                failures.append(exc)

        asking = threading.Thread(target=open_session, daemon=True)
        asking.start()
        asking.join(timeout=20)
        assert not asking.is_alive(), "still waiting for the tracker"
        (lost,) = failures
        assert isinstance(lost, DeviceLost)
        assert re.fullmatch(
            r"tracker 127\.0\.0\.1:\d+ gave no 'ghost' server within 2 s after one did not answer"
            r" \(127\.0\.0\.1:1: .*\)",
            str(lost),
        ), lost
    finally:
        ghost.close()
        process.stop()


@pytest.mark.parametrize(
    "name, user, fragment",
    [
        ("opencl", "u", "device name 'opencl': a built-in device's name"),  # was added, then never used
        ("local", "u", "(built in: emulator, emulator-armv7, emulator-riscv64, local, opencl)"),
        ("x\n", "u", "device name 'x\\n'"),  # `$` matched before a final newline
        ("b", "\x1b[31mRED\x07", "board user '\\x1b[31mRED\\x07': expected a login name"),
    ],
)
def test_a_board_named_like_a_built_in_device_or_with_control_characters_is_refused(name, user, fragment):
    one_line_error(deploy_here("device", "add", name, "--host", "h", "--user", user), 2, fragment)


def test_a_tracker_that_cannot_bind_names_why(tmp_path):
    """The port is bound by another process but not listened on: the line quoted the traceback
    TVM's tracker prints from `__del__` afterwards (`'Tracker' object has no attribute 'host'`)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        result = run_deploy("tracker", "start", "--port", str(port), env={"DEPLOY_CACHE_DIR": str(tmp_path)})
    one_line_error(result, 1, f"did not start: ValueError: cannot bind to any port in [{port}, {port + 1})")


def test_a_second_tracker_on_another_port_is_refused_not_reported_as_started(tmp_path):
    """One tracker per machine: `start --port B` while one runs on A printed `tracker already
    running ... A` with exit 0, as if B were served."""
    env = {"DEPLOY_CACHE_DIR": str(tmp_path)}
    first, second = free_port(), free_port()
    assert run_deploy("tracker", "start", "--port", str(first), env=env).returncode == 0
    try:
        again = run_deploy("tracker", "start", "--port", str(first), env=env)
        assert again.returncode == 0 and "tracker running: pid" in again.stdout
        other = run_deploy("tracker", "start", "--port", str(second), env=env)
        one_line_error(other, 1, f"a tracker already runs on 127.0.0.1:{first} (pid ")
        assert f"to start one on 127.0.0.1:{second}" in other.stderr
    finally:
        assert run_deploy("tracker", "stop", env=env).returncode == 0
