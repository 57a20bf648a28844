"""Boards over SSH against a real OpenSSH server on loopback whose "board" is this x86_64 machine
with no Python on the login's PATH (tests/sshd.py): registration, host keys, setup and check,
an op's matrix and a model on deploy's native RPC server, a tracker, and failures.

Boards are added with --arch x86_64 and run --target x86, on the real native runtime for x86_64.
The aarch64 runtime is the same server source cross-compiled; it runs on the emulator
(tests/test_emulator.py), so it is covered there rather than under qemu behind sshd here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import paramiko
import psutil
import pytest

from deploy.base.errors import DeployError
from deploy.compiler.cache import cached_build
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import get_target
from deploy.devices import get_device
from deploy.devices.board_setup import require_versions
from deploy.devices.elf import provided_versions
from deploy.devices.native import RUNTIME_FILES, SERVER, native_runtime
from deploy.devices.platforms import get_platform
from deploy.devices.registry import DeviceLost
from deploy.devices.runner import RunnerSession
from deploy.devices.server_process import free_port
from deploy.ops import TensorType, bind, get_op
from deploy.tune.records import RECORDS
from deploy.verify.matrix import plan
from tests import sshd
from tests.conftest import DEPLOY, at_once, deploy_here, run_deploy

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(not sshd.available(), reason="needs openssh-server (/usr/sbin/sshd) and ssh-keygen"),
    pytest.mark.skipif(shutil.which("x86_64-linux-gnu-g++") is None, reason="needs g++ (x86_64)"),
]
HOST_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
HOST_LIBSTDCXX = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = sshd.start(tmp_path_factory.mktemp("sshd"))
    yield running
    sshd.stop(running)


def board_processes(remote_dir: Path) -> list[psutil.Process]:
    """Live processes started on the "board" for this remote dir (their cwd is under it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cwd", "status", "cmdline"]):
        cwd = proc.info["cwd"] or ""
        if cwd.startswith(str(remote_dir)) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def board_server_runs(remote_dir: Path) -> bool:
    return any(Path((p.info["cmdline"] or [""])[0]).name == SERVER for p in board_processes(remote_dir))


def settle(remote_dir: Path, timeout: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while board_processes(remote_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return board_processes(remote_dir)


def nothing_left(remote_dir: Path) -> None:
    """No server runs for `remote_dir`, and no server's directory (key file, sessions) is left."""
    assert settle(remote_dir) == []
    assert list((remote_dir / "servers").iterdir()) == []


def board_server_ready(remote_dir: Path) -> bool:
    """The board's server runs and deploy saw it listen: it removes the key file then."""
    servers = list((remote_dir / "servers").glob("*/"))
    return board_server_runs(remote_dir) and bool(servers) and not any((d / "key").exists() for d in servers)


def start_matrix(device: str, remote_dir: Path) -> subprocess.Popen[str]:
    """`deploy test --target x86 --device DEVICE` in the background, returned once the board's
    server is ready (the first case is then under way, 182 to go). Only running, it may not
    have told deploy its port yet: a crash then is one at start, not mid-run."""
    proc = subprocess.Popen(
        [DEPLOY, "test", "--target", "x86", "--device", device],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not board_server_ready(remote_dir):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc


def add(
    name: str, server: sshd.Sshd, remote_dir: Path, *extra: str, key: str | None = None, arch: str = "x86_64"
):
    return deploy_here(
        "device", "add", name, "--host", "127.0.0.1", "--port", str(server.port), "--user", server.user,
        "--key", key or str(server.key), "--arch", arch, "--remote-dir", str(remote_dir), *extra,
    )  # fmt: skip


def add_ready(name: str, server: sshd.Sshd, remote_dir: Path) -> None:
    """A board with its host key accepted and the runtime pushed."""
    assert add(name, server, remote_dir, "--accept-new-host-key").returncode == 0
    setup = deploy_here("device", "setup", name)
    assert setup.returncode == 0, setup.stdout + setup.stderr


def test_the_board_has_no_python(server):
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", server.port, server.user, key_filename=str(server.key), look_for_keys=False)
    try:
        probe = "for p in python3 python; do command -v $p || echo no $p; done; uname -m"
        _, stdout, _ = client.exec_command(probe)
        assert stdout.read().decode().split("\n") == ["no python3", "no python", "x86_64", ""]
    finally:
        client.close()


def test_unknown_host_key_is_refused_until_accepted(server, tmp_path):
    remote = tmp_path / "board"
    assert add("pi", server, remote).returncode == 0
    refused = deploy_here("device", "check", "pi")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: unknown host key for 127.0.0.1:")
    assert "--accept-new-host-key" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    accepted = run_deploy("device", "check", "pi", "--accept-new-host-key")  # nothing on fd 2
    assert accepted.returncode == 1 and accepted.stderr == "", accepted.stderr  # no runtime yet
    assert "pi: SSH ok, x86_64 (uname -m)" in accepted.stdout
    assert f"no runtime in {remote}/runtime (run `deploy device setup pi`)" in accepted.stdout
    assert run_deploy("device", "check", "pi").stderr == ""  # the key is known now
    listed = deploy_here("device", "list")
    assert f"pi         {server.user}@127.0.0.1:{server.port} x86_64" in listed.stdout
    assert deploy_here("device", "remove", "pi").returncode == 0
    assert "pi " not in deploy_here("device", "list").stdout


def test_changed_host_key_is_refused(server, tmp_path):
    from deploy.devices.boards import known_hosts_file

    assert add("moved", server, tmp_path, "--accept-new-host-key").returncode == 0
    other = sshd.keygen(tmp_path / "other_host_key")
    public = (tmp_path / "other_host_key.pub").read_text().split()
    saved = known_hosts_file().read_text()
    try:
        known_hosts_file().write_text(f"[127.0.0.1]:{server.port} {public[0]} {public[1]}\n")
        result = deploy_here("device", "check", "moved")
        assert result.returncode == 1
        assert "differs from the one in known_hosts" in result.stderr
    finally:
        known_hosts_file().write_text(saved)
        assert other.exists()


def test_wrong_key_and_unreachable_port_are_one_line_errors(server, tmp_path):
    stranger = sshd.keygen(tmp_path / "stranger")
    assert add("stranger", server, tmp_path, "--accept-new-host-key").returncode == 0
    add("stranger", server, tmp_path, "--replace", key=str(stranger))
    wrong = deploy_here("device", "check", "stranger")
    assert wrong.returncode == 1
    assert wrong.stderr.startswith(f"error: SSH login to {server.user}@127.0.0.1:{server.port} failed with")
    assert len(wrong.stderr.strip().splitlines()) == 1

    port = free_port()
    where = ("--host", "127.0.0.1", "--port", str(port), "--user", "x", "--arch", "x86_64")
    deploy_here("device", "add", "nowhere", *where)
    unreachable = deploy_here("test", "--target", "x86", "--device", "nowhere", "--op", "add")
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith(f"error: cannot reach nowhere at 127.0.0.1:{port}")
    assert len(unreachable.stderr.strip().splitlines()) == 1


def _key_becomes(kind: str, key: Path) -> str:
    """Make the board's key file `key` into `kind`; the words the error line should have."""
    key.unlink()
    if kind == "fifo":
        os.mkfifo(key)
        return "not a regular file"
    if kind == "zero":
        key.symlink_to("/dev/zero")
        return "not a regular file"
    if kind == "directory":
        key.mkdir()
        return "is a directory, expected a file"
    if kind == "text":
        key.write_text("not a key\n")
        return "not a private key paramiko reads"
    if kind == "binary":
        key.write_bytes(bytes(range(256)))
        return "not a private key paramiko reads"
    return "no such file"


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory", "text", "binary", "deleted"])
def test_a_key_file_changed_after_add_is_named(server, tmp_path, kind):
    """`device add` checks the key, but it may change later: a FIFO hung every login, /dev/zero
    filled memory at 0.5 GB/s, a text file was a lost device (exit 1), binary bytes a
    UnicodeDecodeError. Through a session's helper process too, with the same exit code."""
    name, key = f"rekeyed-{kind}", tmp_path / "key"
    key.write_bytes(server.key.read_bytes())
    key.chmod(0o600)
    assert add(name, server, tmp_path / "board", "--accept-new-host-key", key=str(key)).returncode == 0
    words = _key_becomes(kind, key)
    try:
        for command in (
            ["device", "check", name],
            ["test", "--target", "x86", "--device", name, "--op", "add"],
        ):
            result = subprocess.run([DEPLOY, *command], capture_output=True, text=True, timeout=60)
            assert result.returncode == 2, result.stderr
            assert result.stderr.startswith(f"error: board {name} key {key}: {words}"), result.stderr
            assert len(result.stderr.strip().splitlines()) == 1
    finally:
        deploy_here("device", "remove", name)


KNOWN_HOSTS_AS: dict[str, Callable[[Path], object]] = {
    "fifo": os.mkfifo,
    "directory": Path.mkdir,
    "binary": lambda path: path.write_bytes(b"\xff\xfe\n"),
    "devnull": lambda path: path.symlink_to(os.devnull),
}


@pytest.mark.parametrize("kind", sorted(KNOWN_HOSTS_AS))
def test_a_known_hosts_that_is_no_text_file_is_named(tmp_path, kind):
    """A FIFO hung every login; a directory or binary bytes were a generic traceback line. A link
    to /dev/null (an idiom for none) reads as empty, as it did."""
    from deploy.devices.boards import known_hosts_file

    ours = known_hosts_file()
    ours.parent.mkdir(parents=True, exist_ok=True)
    saved = tmp_path / "saved"
    if ours.exists():
        ours.rename(saved)
    where = ("--host", "127.0.0.1", "--port", str(free_port()), "--user", "x", "--arch", "x86_64")
    try:
        KNOWN_HOSTS_AS[kind](ours)
        assert deploy_here("device", "add", "hosts", *where).returncode == 0
        result = subprocess.run(
            [DEPLOY, "device", "check", "hosts"], capture_output=True, text=True, timeout=60
        )
        said = "error: cannot reach hosts at" if kind == "devnull" else f"error: known_hosts {ours}: "
        assert (result.returncode, result.stderr[: len(said)]) == (1 if kind == "devnull" else 2, said), (
            result.stderr
        )
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        deploy_here("device", "remove", "hosts")
        if ours.is_dir() and not ours.is_symlink():
            ours.rmdir()
        else:
            ours.unlink(missing_ok=True)
        if saved.exists():
            saved.rename(ours)


def test_a_port_that_closes_at_once_is_one_line(tmp_path):
    """paramiko's transport thread logged a 20-line traceback above deploy's own line."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def close_four() -> None:
        for _ in range(4):
            listener.accept()[0].close()

    closing = threading.Thread(target=close_four, daemon=True)
    closing.start()
    where = (
        "--host",
        "127.0.0.1",
        "--port",
        str(listener.getsockname()[1]),
        "--user",
        "x",
        "--arch",
        "x86_64",
    )
    assert deploy_here("device", "add", "closer", *where).returncode == 0
    result = deploy_here("device", "check", "closer")
    listener.close()
    deploy_here("device", "remove", "closer")
    assert result.returncode == 1 and result.stderr.startswith("error: SSH to x@127.0.0.1:"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_board_added_with_another_arch_is_named_once(server, tmp_path):
    """An x86_64 board re-added as aarch64: `deploy test --target arm` failed each case with an
    RPCError (the modules cannot load there); now the session start names it, one line."""
    remote = tmp_path / "board"
    add_ready("wrongarch", server, remote)
    assert add("wrongarch", server, remote, "--replace", arch="aarch64").returncode == 0
    result = deploy_here("test", "--target", "arm", "--device", "wrongarch", "--op", "add")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == (
        "error: wrongarch runs x86_64 (uname -m) but was added with arch aarch64: re-add it with"
        " --arch x86_64 (`deploy device add wrongarch ... --replace`), then `deploy device setup wrongarch`\n"
    )
    assert settle(remote) == [] and not (remote / "servers").exists(), "refused before a server started"


def test_bad_device_arguments(tmp_path):
    bad_arch = deploy_here("device", "add", "b", "--host", "h", "--user", "u", "--arch", "riscv")
    assert bad_arch.returncode == 2 and "board arch 'riscv': expected one of" in bad_arch.stderr
    no_key = str(tmp_path / "no")
    missing_key = deploy_here("device", "add", "b", "--host", "h", "--user", "u", "--key", no_key)
    assert missing_key.returncode == 2 and "no such file" in missing_key.stderr
    bad_name = deploy_here("device", "add", "emulator", "--host", "h", "--user", "u")
    assert bad_name.returncode == 2 and "device name 'emulator'" in bad_name.stderr
    assert deploy_here("device", "check", "ghost").stderr.startswith("error: no device named 'ghost'")
    gone = deploy_here("device", "add", "b", "--host", "h", "--user", "u", "--python", "python3")
    assert gone.returncode == 2 and "No such option '--python'" in gone.stderr
    port = str(free_port())
    assert deploy_here("device", "add", "v7", "--host", "127.0.0.1", "--port", port, "--user", "u",
                      "--arch", "armv7l").returncode == 0  # fmt: skip
    runner = deploy_here("device", "setup", "v7")  # no TVM runtime for armv7l: the runner protocol
    assert (runner.returncode, runner.stdout) == (
        0,
        "v7: the runner protocol needs nothing set up: each bundle carries its runner\n",
    )
    listed = deploy_here("device", "list").stdout
    assert "v7" in listed and " armv7l runner " in listed


def test_old_config_with_a_python_entry_still_loads(tmp_path, monkeypatch):
    import json

    from deploy.base.paths import config_dir
    from deploy.devices.boards import load_boards

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config_dir().mkdir(parents=True)
    old = {"pi": {"name": "pi", "host": "h", "user": "u", "port": 22, "key": None, "arch": "aarch64",
                  "python": 'python3 "unterminated', "remote_dir": ".deploy"}}  # fmt: skip
    (config_dir() / "devices.json").write_text(json.dumps(old))
    assert load_boards()["pi"].remote_dir == ".deploy"


def test_setup_pushes_the_runtime_once_and_repairs_it(server, tmp_path):
    remote = tmp_path / "bare"
    assert add("bare", server, remote, "--accept-new-host-key").returncode == 0
    before = deploy_here("device", "check", "bare")
    assert before.returncode == 1 and "no runtime in" in before.stdout
    glibc = ".".join(map(str, provided_versions(HOST_LIBC.open("rb"), "libc")["GLIBC"]))
    assert f"bare: glibc {glibc}, libstdc++ GLIBCXX_3.4." in before.stdout
    assert "on the board; the runtime needs glibc 2.34, libstdc++ GLIBCXX_3.4.26" in before.stdout

    first = deploy_here("device", "setup", "bare")
    assert first.returncode == 0, first.stderr
    assert re.search(r"bare: runtime missing; pushing \d\.\d MB to ", first.stdout), first.stdout
    assert f"runtime installed in {remote}/runtime (sha256 checked on the board)" in first.stdout
    local = native_runtime(get_platform("x86_64"))
    for name in RUNTIME_FILES:
        assert (remote / "runtime" / name).read_bytes() == (local / name).read_bytes()
        assert (remote / "runtime" / name).stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in remote.iterdir()) == ["runtime"]  # no runtime.new or .old left
    again = deploy_here("device", "setup", "bare")
    assert again.returncode == 0 and "matches this host's (sha256); nothing to do" in again.stdout
    assert deploy_here("device", "check", "bare").returncode == 0

    with (remote / "runtime" / "lib" / "libtvm_ffi.so").open("ab") as tampered:
        tampered.write(b"\0")
    check = deploy_here("device", "check", "bare")
    assert check.returncode == 1 and "differs from this host's (lib/libtvm_ffi.so)" in check.stdout
    repaired = deploy_here("device", "setup", "bare")
    assert repaired.returncode == 0 and "runtime differs (lib/libtvm_ffi.so); pushing" in repaired.stdout
    assert (remote / "runtime/lib/libtvm_ffi.so").read_bytes() == (local / "lib/libtvm_ffi.so").read_bytes()


def test_old_or_missing_c_libraries_are_refused_in_one_line():
    """What check and setup say for a board whose glibc or libstdc++ is older than the runtime
    needs (this host's real libraries against a newer requirement), or missing (musl)."""
    with HOST_LIBC.open("rb") as libc, HOST_LIBSTDCXX.open("rb") as libstdcxx:
        provided = provided_versions(libc, "libc.so.6") | provided_versions(libstdcxx, "libstdc++.so.6")
    glibc = ".".join(map(str, provided["GLIBC"]))
    glibcxx = ".".join(map(str, provided["GLIBCXX"]))
    require_versions("pi", provided, {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 26)})
    cases = {
        f"pi: glibc {glibc} on the board, the runtime needs 2.99": {"GLIBC": (2, 99), "GLIBCXX": (3, 4, 26)},
        f"pi: libstdc++ GLIBCXX_{glibcxx} on the board, the runtime needs GLIBCXX_3.4.99": {
            "GLIBC": (2, 34), "GLIBCXX": (3, 4, 99),
        },
    }  # fmt: skip
    for message, required in cases.items():
        with pytest.raises(DeployError) as refused:
            require_versions("pi", provided, required)
        assert str(refused.value) == message
    with pytest.raises(DeployError) as musl:
        require_versions("pi", {}, {"GLIBC": (2, 34)})
    assert str(musl.value) == "pi: no glibc on the board (libc.so.6 not found), the runtime needs glibc 2.34"


def test_setup_refuses_a_board_whose_glibc_is_too_old_before_pushing(server, tmp_path, monkeypatch):
    from deploy.devices import board_setup
    from tests.conftest import invoke

    remote = tmp_path / "old"
    assert add("old", server, remote, "--accept-new-host-key").returncode == 0
    monkeypatch.setattr(board_setup, "required_versions", lambda paths: {"GLIBC": (2, 99)})
    result = invoke("device", "setup", "old")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].endswith(
        "on the board, the runtime needs 2.99; the runner protocol needs none (each bundle's deploy-run is"
        " static): `deploy device add old ... --protocol runner --replace`"
    )
    assert not remote.exists()


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None, reason="needs g++-aarch64-linux-gnu")
def test_a_runtime_for_another_machine_is_refused_before_upload(server, tmp_path):
    remote = tmp_path / "wrong"
    assert add("wrong", server, remote, "--accept-new-host-key", arch="aarch64").returncode == 0
    result = deploy_here("device", "setup", "wrong")
    assert result.returncode == 1
    said = [line for line in result.stderr.splitlines() if not line.startswith("deploy: fetching")]
    assert said == [  # the fetch's progress line too, when this run's cache has no aarch64 runtime yet
        "error: wrong: the runtime is built for aarch64 (the board's arch aarch64) but the board runs x86_64:"
        " re-add it with arch x86_64"
    ]
    assert not remote.exists()


def test_a_board_without_sha256sum_is_refused(tmp_path):
    own = sshd.start(tmp_path / "sshd", tools=("uname", "rm", "sleep", "timeout"))
    try:
        assert add("nosum", own, tmp_path / "board", "--accept-new-host-key").returncode == 0
        result = deploy_here("device", "setup", "nosum")
        assert result.returncode == 1
        message = "error: nosum: the board has no sha256sum (deploy runs sha256sum, rm, sleep, timeout)\n"
        assert result.stderr == message
    finally:
        sshd.stop(own)


def test_a_board_without_the_runtime_says_to_run_setup(server, tmp_path):
    assert add("unset", server, tmp_path / "unset", "--accept-new-host-key").returncode == 0
    result = deploy_here("test", "--target", "x86", "--device", "unset", "--op", "add", "--dtype", "int8")
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: no deploy runtime on unset in {tmp_path}/unset/runtime: run `deploy"
    )
    assert len(result.stderr.splitlines()) == 1


def test_matrix_on_an_ssh_board_and_nothing_left_running(server, tmp_path):
    """add's int8 matrix (two inputs, broadcasts, a symbolic batch at three sizes) and a float32
    model over SSH: the transport, not the numbers, which test_bundle.py checks for every x86 case."""
    remote = tmp_path / "board"
    add_ready("board", server, remote)
    result = deploy_here("test", "--target", "x86", "--device", "board", "--op", "add", "--dtype", "int8")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert f"{len(plan([get_op('add')], ['int8']))} cases passed, 0 failed" in result.stdout
    model = run_deploy("--ops-path", str(REPO / "deploy/ops/examples"), "test", "--target", "x86", "--device",
                       "board", "--model",
                       str(REPO / "examples" / "pool_add_leaky_htanh_n.onnx"))  # fmt: skip
    assert model.returncode == 0, model.stdout[-2000:] + model.stderr
    assert "cpu/max_pool2d" in model.stdout and " 0 failed" in model.stdout  # the Relax VM over the tunnel
    nothing_left(remote)


def test_an_ssh_board_through_the_runner_protocol(server, tmp_path):
    """A board whose glibc deploy's RPC server cannot use (or armv7, riscv64) speaks the runner
    protocol (#38): nothing to set up; each bundle pushed once over SFTP, its sha256 checked on
    the board by its own runner at every call, each call's files removed after it."""
    remote = tmp_path / "oldrun"
    added = add("oldrun", server, remote, "--protocol", "runner", "--accept-new-host-key")
    assert added.returncode == 0, added.stderr
    assert "(x86_64, runner protocol); next: `deploy device check oldrun`" in added.stdout
    assert "needs nothing set up" in deploy_here("device", "setup", "oldrun").stdout
    checked = deploy_here("device", "check", "oldrun")
    assert checked.returncode == 0 and "x86_64 (uname -m)" in checked.stdout and "runner" in checked.stdout
    result = deploy_here("test", "--target", "x86", "--device", "oldrun", "--op", "add", "--dtype", "int8")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert f"{len(plan([get_op('add')], ['int8']))} cases passed, 0 failed" in result.stdout
    a = np.arange(12, dtype="float32").reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    ran = deploy_here("run", "--op", "leaky_relu", "--target", "x86", "--device", "oldrun", "-i",
                      str(tmp_path / "a.npy"), "-o", str(tmp_path / "out.npy"), "--check")  # fmt: skip
    assert ran.returncode == 0 and "check passed" in ran.stdout, ran.stdout + ran.stderr
    pushed = list((remote / "bundles").iterdir())
    assert pushed and all((b / "SHA256SUMS").is_file() and (b / "deploy-run").is_file() for b in pushed)
    assert list((remote / "calls").iterdir()) == [], "each call's inputs and output are removed"
    assert settle(remote) == []


def test_a_runner_board_run_past_its_timeout_is_killed_there(server, tmp_path):
    """Tuning's --timeout on a runner board: the board's `timeout` kills the run there (nothing
    keeps spinning), and the candidate's error is a DeviceLost."""
    remote = tmp_path / "slowrun"
    assert add("slowrun", server, remote, "--protocol", "runner", "--accept-new-host-key").returncode == 0
    bound = bind(get_op("leaky_relu"), {}, [TensorType((4, 1000), "float32")])
    x = np.ones((4, 1000), "float32")
    with get_device("slowrun").open() as session:
        assert isinstance(session, RunnerSession)
        directory, manifest = cached_build(bound, get_target("x86"), for_device(BuildOptions(), session))
        start = time.monotonic()
        with pytest.raises(
            DeviceLost, match=r"^deploy-run of \S+ ran over the 1 s limit \(--timeout\) on slowrun "
        ):
            session.time(directory / manifest.module, [x], [((4, 1000), "float32")], 10**9, 3, timeout_s=1)
        assert time.monotonic() - start < 20
    assert settle(remote) == []
    assert list((remote / "calls").iterdir()) == []


def test_a_runner_board_of_another_arch_is_refused_before_a_push(server, tmp_path):
    remote = tmp_path / "wrong"
    assert (
        add(
            "wrongrun", server, remote, "--protocol", "runner", "--accept-new-host-key", arch="riscv64"
        ).returncode
        == 0
    )
    a = tmp_path / "a.npy"
    np.save(a, np.zeros(4, "float32"))
    result = deploy_here("run", "--op", "add", "--target", "riscv64", "--device", "wrongrun", "-i", str(a),
                         "-i", str(a), "-o", str(tmp_path / "o.npy"))  # fmt: skip
    assert (result.returncode, result.stderr) == (
        2,
        "error: wrongrun runs x86_64 (uname -m) but was added with arch riscv64: re-add it with --arch"
        " x86_64 (`deploy device add wrongrun ... --replace`)\n",
    )
    assert not (remote / "bundles").exists() and not (tmp_path / "o.npy").exists()
    tvm = deploy_here(
        "device", "add", "rv", "--host", "h", "--user", "u", "--arch", "riscv64", "--protocol", "tvm"
    )
    assert (tvm.returncode, tvm.stderr) == (
        2,
        "error: board protocol tvm on riscv64: TVM has no runtime for it (expected --protocol runner)\n",
    )


@pytest.mark.slow
def test_tune_on_an_ssh_board(server, tmp_path):
    remote = tmp_path / "board"
    add_ready("tuneboard", server, remote)
    db = tmp_path / "db"
    result = run_deploy(
        "tune",
        "--op",
        "add",
        "--shape",
        "7x13",
        "--shape",
        "7x13",
        "--target",
        "x86",
        "--device",
        "tuneboard",
        "--trials",
        "2",
        "--db",
        str(db),
        env={"COLUMNS": "250"},
    )  # fmt: skip  (at 80 a wrap could fall inside the words)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    # a 7x13 add takes about 20 ns: which schedule wins there is noise, the verdict is not
    assert "vs numpy on tuneboard" in result.stdout or "found nothing faster on tuneboard" in result.stdout
    nothing_left(remote)


def test_sshd_killed_mid_run(tmp_path):
    """A crashed sshd: the run stops with a one-line error and the board's server goes away."""
    own = sshd.start(tmp_path / "sshd")
    remote = tmp_path / "board"
    try:
        add_ready("doomed", own, remote)
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


@pytest.mark.slow
def test_sshd_killed_mid_tune_stops_tuning_and_keeps_the_records(tmp_path):
    """A board lost while tuning: the tune stops at once with one line naming the board (not
    MetaSchedule's failure of every later candidate), and the trials measured stay recorded."""
    own = sshd.start(tmp_path / "sshd")
    remote, db = tmp_path / "board", tmp_path / "db"
    try:
        add_ready("lost_in_tune", own, remote)
        proc = subprocess.Popen(
            [DEPLOY, "tune", "--op", "add", "--shape", "7x13", "--shape", "7x13", "--target", "x86",
             "--device", "lost_in_tune", "--trials", "64", "--db", str(db)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while not any(p.stat().st_size for p in db.glob(f"x86/*/{RECORDS}")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        own.kill()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out[-1000:] + err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert "lost_in_tune" in err and "--debug" not in err, "our line, not MetaSchedule's failure"
        (records,) = db.glob(f"x86/*/{RECORDS}")
        assert records.read_text().strip(), "the trials measured before stay"
        assert settle(remote) == []
    finally:
        if own.proc.poll() is None:
            sshd.stop(own)


def test_sshd_killed_while_the_server_starts(tmp_path):
    """A connection lost before the board's server said it listens is a lost device, named as
    such: it was `RPC server on NAME exited: deploy-server-...-pgid=N`, as if the server had
    failed (and not a device lost: its case was not put back)."""
    own = sshd.start(tmp_path / "sshd")
    remote = tmp_path / "board"
    try:
        add_ready("cut", own, remote)
        never_ready = remote / "runtime" / SERVER
        never_ready.unlink()
        never_ready.write_text("#!/bin/sh\nexec sleep 300\n")
        never_ready.chmod(0o755)
        proc = subprocess.Popen(
            [DEPLOY, "test", "--target", "x86", "--op", "add", "--device", "cut"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not any("sleep" in " ".join(p.info["cmdline"] or []) for p in board_processes(remote)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        own.kill()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, out[-1000:] + err
        assert "lost the SSH connection to cut while its RPC server started" in out, out[
            -1000:
        ]  # its case requeued
        assert err.startswith("error: cannot reach cut at 127.0.0.1:") and len(err.splitlines()) == 1, err
        assert settle(remote) == []
    finally:
        if own.proc.poll() is None:
            sshd.stop(own)


def test_ctrl_c_stops_the_board_server(server, tmp_path):
    remote = tmp_path / "board"
    add_ready("interrupted", server, remote)
    proc = start_matrix("interrupted", remote)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    nothing_left(remote)
    commands = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    assert not [c for c in commands if "board_link" in c and '"interrupted"' in c]


def wait_free(port: int, key: str, count: int, serving: subprocess.Popen[str]) -> None:
    from deploy.devices.tracker import free_servers

    deadline = time.monotonic() + 60
    while free_servers("127.0.0.1", port, key) != count:
        assert serving.poll() is None, serving.communicate()
        assert time.monotonic() < deadline, f"{key} never had {count} free server(s)"
        time.sleep(0.2)


def test_board_serves_a_tracker(server, tmp_path):
    """`deploy device serve`: this host registers the board's server with a stock TVM tracker on
    the board's behalf; clients reach it through the SSH connection. Ctrl-C ends serving; so does
    losing the tracker (exit 1)."""
    from deploy.devices.tracker import TrackerProcess

    remote = tmp_path / "farm-board"
    tracker = TrackerProcess(tmp_path / "tracker")
    address = tracker.start(port=free_port())
    where = f"127.0.0.1:{address.port}"
    serve = [DEPLOY, "device", "serve", "farmed", "--tracker", where, "--key", "boards"]
    serving = None
    try:
        add_ready("farmed", server, remote)
        serving = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_free(address.port, "boards", 1, serving)
        status = deploy_here("tracker", "status", "--tracker", where)
        assert "boards: 1 free, 0 waiting requests" in status.stdout, status.stdout + status.stderr
        result = deploy_here(
            "test", "--target", "x86", "--tracker", where, "--key", "boards", "--op", "add",
            "--dtype", "float32",
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr
        assert " 0 failed" in result.stdout
        wait_free(address.port, "boards", 1, serving)  # offered again once the session ended
        serving.send_signal(signal.SIGINT)
        out, err = serving.communicate(timeout=60)
        assert "registered as 'boards'" in out and serving.returncode == 0, out + err
        nothing_left(remote)

        serving = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_free(address.port, "boards", 1, serving)
        tracker.stop()
        out, err = serving.communicate(timeout=60)
        assert serving.returncode == 1, out + err
        assert err.startswith(f"error: lost the RPC tracker at {where}") and len(err.splitlines()) == 1, err
        nothing_left(remote)
    finally:
        if serving is not None and serving.poll() is None:
            serving.kill()
        tracker.stop()


@pytest.fixture
def talkative(tmp_path):
    """An sshd of its own whose login shell runs `board-home/.bashrc` before each command."""
    own = sshd.start(tmp_path / "sshd")
    yield own, own.directory / "board-home" / ".bashrc"
    sshd.stop(own)


def test_a_login_shell_that_prints_does_not_confuse_replies(talkative, tmp_path):
    """A warning on stderr made a working board fail `device check` (issue #15, item 8): replies
    are read from stdout between markers, so start-up files may print on either stream."""
    own, rc = talkative
    rc.write_text(
        'echo "Welcome to the board"\necho "warning: setlocale: LC_ALL: cannot change locale" >&2\n'
    )
    remote = tmp_path / "board"
    assert add("chatty", own, remote, "--accept-new-host-key").returncode == 0
    check = run_deploy("device", "check", "chatty")  # the board's chatter on no fd 2 of ours
    assert check.returncode == 1 and check.stderr == "", check.stderr
    assert "chatty: SSH ok, x86_64 (uname -m)" in check.stdout
    assert f"chatty: no runtime in {remote}/runtime (run `deploy device setup chatty`)" in check.stdout
    setup = deploy_here("device", "setup", "chatty")
    assert setup.returncode == 0 and f"runtime installed in {remote}/runtime" in setup.stdout, setup.stderr
    assert deploy_here("device", "check", "chatty").returncode == 0
    result = deploy_here("test", "--target", "x86", "--device", "chatty", "--op", "add", "--dtype", "float32")
    assert result.returncode == 0 and " 0 failed" in result.stdout, result.stdout[-1000:] + result.stderr
    nothing_left(remote)


def test_what_a_board_prints_is_capped_and_inert(talkative, tmp_path):
    """A board's output was read whole (600 MB -> 3 GB on the host) and reached the terminal raw
    (an OSC escape set its title) (issue #15, item 9)."""
    own, rc = talkative
    assert add("hostile", own, tmp_path / "board", "--accept-new-host-key").returncode == 0
    rc.write_text("printf '%3000000s\\n' flood\n")
    start = time.monotonic()
    flood = deploy_here("device", "check", "hostile")
    assert flood.returncode == 1 and time.monotonic() - start < 60
    assert flood.stderr.startswith("error: hostile: the board printed more than 1 MiB for `uname -m;")
    assert len(flood.stderr.splitlines()) == 1 and len(flood.stderr) < 500
    for stream in ("", " >&2"):
        rc.write_text(f"uname() {{ printf '\\033]0;pwned\\007 no machine\\n'{stream}; }}\n")
        escaped = deploy_here("device", "check", "hostile")
        assert escaped.returncode == 1 and "\x1b" not in escaped.stderr + escaped.stdout
        assert (
            escaped.stderr
            == "error: hostile: `uname -m` failed on the board: \\x1b]0;pwned\\x07 no machine\n"
        )


def _set_remote_dir(name: str, remote_dir: str) -> None:
    """Edit a board's entry in devices.json as an older deploy (or a hand) may have left it."""
    import json

    from deploy.devices.boards import _config_file

    entries = json.loads(_config_file().read_text())
    entries[name]["remote_dir"] = remote_dir
    _config_file().write_text(json.dumps(entries))


def test_a_remote_dir_at_or_above_home_is_refused_before_anything_runs(server, tmp_path):
    """`--remote-dir .` made setup replace ~/runtime (issue #15, item 10): refused at `device
    add`, for entries already in devices.json when the config is read, and for a home given
    as an absolute path once the login's home is known."""
    import pwd

    home = Path(pwd.getpwnam(server.user).pw_dir)
    ours = ("runtime", "runtime.new", "runtime.old", "servers")
    before = [(home / name).exists() for name in ours]
    assert add("homely", server, tmp_path / "ok", "--accept-new-host-key").returncode == 0
    config = "device 'homely' in {}: ".format(Path(os.environ["XDG_CONFIG_HOME"]) / "deploy" / "devices.json")
    for remote_dir, message in {
        ".": f"{config}remote dir '.': expected a directory for deploy alone",
        "": f"{config}remote dir '': expected a directory for deploy alone",
        "sub/../..": f"{config}remote dir 'sub/../..': expected a directory for deploy alone",
        str(home): f"homely: remote dir {home} is the login's home or above it",
    }.items():
        _set_remote_dir("homely", remote_dir)
        for command in ("check", "setup"):
            refused = deploy_here("device", command, "homely")
            assert refused.returncode == 2 and refused.stderr.startswith(f"error: {message}"), refused.stderr
            assert len(refused.stderr.splitlines()) == 1
    assert [(home / name).exists() for name in ours] == before


@pytest.mark.parametrize("where", ["runtime", "runtime/lib", "runtime.old", "runtime.new"])
def test_setup_leaves_a_runtime_directory_it_did_not_write(server, tmp_path, where: str):
    """A remote dir shared with something else: a `runtime` (or the `.new`/`.old` an interrupted
    setup leaves) holding a file deploy did not write is neither replaced nor removed, even beside
    the runtime's own files."""
    remote, name = tmp_path / "shared", f"shared-{where.replace('/', '-')}"
    add_ready(name, server, remote)
    (remote / "runtime" / SERVER).write_bytes(b"changed on the board")  # so setup wants to push
    (remote / where).mkdir(parents=True, exist_ok=True)
    (remote / where / "notes.txt").write_text("mine")
    refused = deploy_here("device", "setup", name)
    assert refused.returncode == 1
    stray = "lib/notes.txt" if where == "runtime/lib" else "notes.txt"
    top = "runtime" if where.startswith("runtime/") else where
    assert refused.stderr == (
        f"error: {name}: {remote}/{top} holds {stray}, which deploy did not write: refusing to replace"
        " it (move it away, or re-add the board with another --remote-dir)\n"
    )
    assert (remote / where / "notes.txt").read_text() == "mine"


def test_a_board_library_is_read_up_to_a_limit(server, tmp_path):
    """The board's libc is read over SFTP for its version sections: headers claiming gigabytes
    (here a sparse 5 GB file whose section table would be 4 GB) stop at LIBRARY_READ_LIMIT."""
    import struct

    from deploy.devices import board_setup

    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, 64)
    struct.pack_into("<HH", header, 0x3A, 0xFFFF, 0xFFFF)
    library = tmp_path / "libc.so.6"
    with library.open("wb") as stream:
        stream.write(header)
        stream.truncate(5 << 30)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", server.port, server.user, key_filename=str(server.key), look_for_keys=False)
    try:
        with client.open_sftp() as sftp, pytest.raises(DeployError) as refused:
            board_setup._defined_version("pi", sftp, str(library), "GLIBC")
        assert str(refused.value) == (
            f"pi: {library} is not an ELF library deploy can read: its sections would take over 32 MiB"
        )
    finally:
        client.close()


def test_the_forward_to_a_board_refuses_clients_without_the_key(server, tmp_path):
    """Any local user can reach the forward's port on this host: the board's server still wants
    its session key, end to end (none, or a wrong one, gets no session)."""
    from deploy.devices.boards import require_board
    from deploy.devices.rpc import connect
    from deploy.devices.ssh import board_link

    add_ready("locked", server, tmp_path / "remote")
    with board_link(require_board("locked")) as ready:
        for key in ("", "wrong"):
            with pytest.raises(DeployError, match="cannot reach"):
                connect("127.0.0.1", ready["port"], "x86_64", "board", key=key).__enter__()
        with connect("127.0.0.1", ready["port"], "x86_64", "board", key=ready["key"]) as session:
            assert session is not None
    nothing_left(tmp_path / "remote")


def test_concurrent_host_key_acceptances_keep_every_key(tmp_path):
    """Four boards accepted at the same moment: deploy's known_hosts ends with all four keys."""
    from deploy.devices.boards import Board
    from deploy.devices.ssh import ssh_connect

    def accept(board: Board) -> None:
        ssh_connect(board, accept_new_host_key=True).close()

    servers = [sshd.start(tmp_path / f"sshd{i}") for i in range(4)]
    try:
        boards = [(Board(f"k{i}", "127.0.0.1", s.user, s.port, str(s.key)),) for i, s in enumerate(servers)]
        assert at_once(tmp_path, accept, boards) == [0] * len(servers)
        known = paramiko.HostKeys(str(tmp_path / "deploy" / "known_hosts"))
        assert sorted(known.keys()) == sorted(f"[127.0.0.1]:{s.port}" for s in servers)
    finally:
        for running in servers:
            sshd.stop(running)


def test_setup_names_a_remote_dir_that_is_a_file(server, tmp_path):
    """It failed as `uploading the runtime to .../rdfile/runtime.new failed: No such file`."""
    remote = tmp_path / "rdfile"
    remote.write_text("a file of the board's")
    assert add("rdfile", server, remote, "--accept-new-host-key").returncode == 0
    refused = deploy_here("device", "setup", "rdfile")
    assert refused.returncode == 1
    assert (
        refused.stderr
        == f"error: {remote} on the board is not a directory (the remote dir, or one above it)\n"
    )
    assert remote.read_text() == "a file of the board's"


def test_a_server_directory_whose_server_is_gone_is_removed_by_the_next(server, tmp_path):
    """A lost connection ends the board's server (its pty hangs up), but left its directory for
    ever: the next server start removes those whose process group is gone, and nothing else."""
    remote = tmp_path / "board"
    add_ready("tidy", server, remote)
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    alive = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        for name, pgid in (("abandoned", gone.pid), ("running", alive.pid), ("starting", None)):
            (remote / "servers" / name).mkdir(parents=True)
            if pgid is not None:
                (remote / "servers" / name / "pgid").write_text(f"{pgid} {os.uname().nodename}\n")
        result = run_deploy("test", "--target", "x86", "--device", "tidy", "--op", "add", "--dtype", "int8")
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr
        assert sorted(p.name for p in (remote / "servers").iterdir()) == ["running", "starting"]
    finally:
        alive.kill()
        alive.wait()


def test_the_board_scripts_work_under_dash(tmp_path):
    """Debian's /bin/sh (a new user's login shell) is dash, which reads `kill -0 -- -PGID` as an
    illegal number: the tidying removed live servers' directories and stop() signalled nothing."""
    from deploy.devices.ssh import abandoned_script, stop_script

    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("needs dash")
    servers = tmp_path / "servers"
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    alive = subprocess.Popen(["sleep", "120"], start_new_session=True)
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "pgid").write_text(f"{gone.pid} {os.uname().nodename}\n")
    host = os.uname().nodename
    entries = {
        "abandoned": f"{gone.pid} {host}",
        "running": f"{alive.pid} {host}",
        "elsewhere": f"{gone.pid} other",
    }
    try:
        for name, line in entries.items():
            (servers / name).mkdir(parents=True)
            (servers / name / "pgid").write_text(line + "\n")
        (servers / "starting").mkdir()
        (servers / "link").symlink_to(outside)
        subprocess.run([dash, "-c", abandoned_script(str(servers))], check=True, timeout=30)
        assert sorted(p.name for p in servers.iterdir()) == ["elsewhere", "link", "running", "starting"]
        assert (outside / "keep").is_dir()
        subprocess.run([dash, "-c", stop_script(alive.pid, str(servers / "running"))], check=True, timeout=30)
        assert alive.wait(timeout=10) is not None and not (servers / "running").exists()
    finally:
        alive.kill()
        alive.wait()
