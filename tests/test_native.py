"""The native device runtime: deploy-rpc-server built for this host (x86_64, no emulator needed)
speaks TVM's RPC protocol to stock clients, refuses what it must, and missing tools are one-line
errors naming their Debian packages. The aarch64 build of the same source runs every op in the
emulator tests."""

from __future__ import annotations

import dataclasses
import platform
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.base.errors import DeployError, UsageError
from deploy.base.files import SUMS
from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.devices.elf import elf_machine, provided_versions, required_versions
from deploy.devices.emulator import Emulator
from deploy.devices.native import (
    RUNTIME_FILES,
    SERVER,
    WHEEL_SHA256,
    WHEELS,
    _wheel_name,
    native_runtime,
    runtime_libraries,
)
from deploy.devices.platforms import get_platform, tvm_runtime_platform
from deploy.devices.rpc import connect
from deploy.devices.server_process import Server, accepts, free_port, new_key_file, spawn
from deploy.ops import TensorType, bind, get_op
from deploy.verify.measure import check_artifact

HOST = platform.machine()
pytestmark = pytest.mark.skipif(HOST != "x86_64", reason="builds the x86_64 runtime natively")


@pytest.fixture(scope="module")
def runtime() -> Path:
    return native_runtime(get_platform(HOST))


@pytest.fixture
def server(runtime: Path, tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    key_file = new_key_file(tmp_path / "key")
    cmd = [
        str(runtime / SERVER),
        "--port",
        str(port),
        "--key-file",
        str(key_file),
        "--work-dir",
        str(tmp_path),
    ]
    running = Server.of(spawn(cmd, tmp_path / "log"), port, tmp_path / "log", key_file)
    deadline = time.monotonic() + 10
    while not accepts(port) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield running
    running.stop()


def test_runtime_directory_is_self_contained(runtime: Path):
    assert [str(p.relative_to(runtime)) for p in sorted(runtime.rglob("*")) if p.is_file()] == sorted(
        (*RUNTIME_FILES, SUMS)
    )
    assert all(elf_machine(runtime / name) == HOST for name in RUNTIME_FILES)
    assert native_runtime(get_platform(HOST)) == runtime, "a second build is the cached one"


def test_a_damaged_runtime_in_the_cache_is_staged_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A cut-short server was `emulator RPC server exited with -7: ` on every start, and a
    cut-short library a link error on every build: each was used as long as its file existed."""
    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))
    host = get_platform(HOST)
    built = native_runtime(host)
    server = (built / SERVER).read_bytes()
    (built / SERVER).write_bytes(server[:4096])
    assert native_runtime(host) == built and (built / SERVER).read_bytes() == server
    libraries = runtime_libraries(host)
    library = next(p for p in libraries.iterdir() if p.name != SUMS)
    whole = library.read_bytes()
    library.write_bytes(whole[:4096])
    assert runtime_libraries(host) == libraries and library.read_bytes() == whole
    (libraries / SUMS).unlink()
    assert runtime_libraries(host) == libraries and (libraries / SUMS).is_file()
    assert sorted(p.name for p in tmp_path.rglob(".*")) == [], "no staging directory left"


def test_required_versions_are_met_by_this_hosts_libraries(runtime: Path):
    needed = required_versions([runtime / name for name in RUNTIME_FILES])
    assert set(needed) == {"GLIBC", "GLIBCXX"}
    libc = next(p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/lib64/libc.so.6")) if p.exists())
    with libc.open("rb") as stream:
        assert provided_versions(stream, str(libc))["GLIBC"] >= needed["GLIBC"]


def test_stock_client_runs_a_module_and_is_verified(server: Server, tmp_path: Path):
    bound = bind(get_op("add"), {}, [TensorType((7, 13), "float32")] * 2)
    export(compile_op(bound, get_target("x86"), BuildOptions()), tmp_path / "add")
    with connect("127.0.0.1", server.port, HOST, "native server", key=server.session_key()) as session:
        assert check_artifact(session, bound, tmp_path / "add", Manifest.read(tmp_path / "add")) == 0
    deadline = time.monotonic() + 10  # the server sees the session end once its child exits
    while "session end" not in Path(server.log).read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    log = Path(server.log).read_text()
    assert "session start" in log and "load_module" in log and "session end" in log
    assert not list(tmp_path.glob("deploy-session-*")), "the session's work directory was removed"


def test_wrong_key_is_refused(server: Server):
    import tvm.rpc

    with pytest.raises(Exception, match="cannot find server that matches key"):
        tvm.rpc.connect("127.0.0.1", server.port, key="guess")
    assert server.alive()


def test_upload_outside_the_session_directory_is_refused(server: Server, tmp_path: Path):
    import tvm.rpc

    (tmp_path / "blob").write_bytes(b"x")
    remote = tvm.rpc.connect("127.0.0.1", server.port, key=server.session_key())
    with pytest.raises(Exception, match="must stay in the session directory"):
        remote.upload(str(tmp_path / "blob"), target="../escaped")
    assert not (tmp_path / "escaped").exists()


def test_session_timeout_ends_the_session_and_the_server_goes_on(server: Server):
    import tvm.rpc

    remote = tvm.rpc.connect("127.0.0.1", server.port, key=server.session_key(), session_timeout=1)
    time.sleep(1.5)
    with pytest.raises(Exception, match="RPCSessionTimeoutError"):
        remote.get_function("tvm.rpc.server.workpath")("x")
    again = tvm.rpc.connect("127.0.0.1", server.port, key=server.session_key())
    assert again.get_function("tvm.rpc.server.workpath")("x").endswith("/x")


def test_server_refuses_a_non_loopback_address(runtime: Path):
    import subprocess

    proc = subprocess.run([str(runtime / SERVER), "--host", "0.0.0.0", "--port", "9"], capture_output=True)
    assert proc.returncode == 2 and b"only loopback addresses" in proc.stderr


def test_missing_qemu_and_cross_compiler_name_their_packages(tmp_path: Path):
    emulator = Emulator(tmp_path)
    emulator.platform = dataclasses.replace(emulator.platform, qemu="qemu-missing-here")
    with pytest.raises(DeployError, match="install the Debian package qemu-user"):
        emulator.provision()
    if shutil.which("qemu-aarch64"):
        emulator.platform = dataclasses.replace(get_platform("aarch64"), gxx="aarch64-missing-g++")
        with pytest.raises(DeployError, match="install the Debian package g\\+\\+-aarch64-linux-gnu"):
            emulator.provision()


def test_architecture_without_wheels_is_one_line():
    with pytest.raises(UsageError, match=r"no native TVM runtime for armv7l: .* through their runner"):
        tvm_runtime_platform("armv7l")


def test_tampered_wheel_is_refused_before_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The runtime libraries a device runs come from wheels pinned by sha256: a cached (or
    fetched) wheel with other bytes is refused with one line, and nothing is extracted from it."""
    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))
    wheels = tmp_path / "wheels" / "aarch64"
    wheels.mkdir(parents=True)
    for name in WHEEL_SHA256:
        if name.endswith("_aarch64.whl"):
            (wheels / name).write_bytes(b"not the wheel PyPI serves")
    with pytest.raises(DeployError, match=r"has sha256 .*, pinned .*: refusing it"):
        runtime_libraries(get_platform("aarch64"))
    assert list((tmp_path / "runtime-libs").iterdir()) == []  # no staging, no libraries


def test_a_fetch_is_announced_with_its_size_and_the_offline_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Issue #36: the first ARM command fetched about 95 MB without a word. It says so first, with
    the wheels' names and the directory to copy them into on a machine without internet."""
    import deploy.devices.native

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))

    def offline(*args: object) -> None:
        raise DeployError("pip could not fetch the aarch64 TVM wheels: no network")

    monkeypatch.setattr(deploy.devices.native, "_pip_download", offline)
    with pytest.raises(DeployError, match="no network"):
        runtime_libraries(get_platform("aarch64"))
    said = capsys.readouterr().err
    assert "about 95 MB" in said and f"copy those files into {tmp_path / 'wheels' / 'aarch64'}" in said
    assert all(_wheel_name(package, get_platform("aarch64")) in said for package in WHEELS)


@pytest.mark.parametrize("arch", ["aarch64", "x86_64"])
def test_every_wheel_is_pinned_for_this_python(arch: str):
    for package in WHEELS:
        assert _wheel_name(package, get_platform(arch)) in WHEEL_SHA256


def test_emulator_directory_with_shell_syntax_is_only_a_name(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """DEPLOY_EMULATOR_DIR reaches the server as arguments, never through a shell (no wrapper
    script is generated): a `$(...)` in it is part of a name, not a command."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "$(touch pwned)`touch pwned2`"
    monkeypatch.setenv("DEPLOY_EMULATOR_DIR", str(base))
    server = Emulator(arch=HOST).start()
    try:
        assert accepts(server.port)
    finally:
        server.stop()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert (base / "sessions").is_dir()
