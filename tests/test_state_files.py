"""Files deploy keeps between commands (server.json, tracker.json, devices.json) under hostile or
concurrent use: a stale pid file never makes deploy signal a process it did not start, and
concurrent commands never lose each other's writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.devices.boards import Board, add_board, load_boards
from tests.conftest import DEPLOY, at_once, run_deploy


@pytest.fixture
def bystander():
    """An unrelated process leading its own process group, as a reused pid would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _state(pid: int, with_start_time: bool) -> dict[str, object]:
    state: dict[str, object] = {"pid": pid, "port": 1, "log": "/nonexistent.log", "key_file": None}
    if with_start_time:  # field 22 of /proc/PID/stat, as deploy records it, but another value
        state["started"] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) - 1
    return state


@pytest.mark.parametrize("with_start_time", [True, False], ids=["other start time", "older format"])
@pytest.mark.parametrize(
    "command, state_file",
    [
        (["device", "emulator", "stop"], "emulator/server.json"),
        (["device", "emulator", "status"], "emulator/server.json"),
        (["tracker", "stop"], "tracker.json"),
        (["tracker", "status"], "tracker.json"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_stale_state_naming_a_live_pid_is_no_server(
    bystander, tmp_path: Path, command: list[str], state_file: str, with_start_time: bool
):
    cache = tmp_path / "cache"
    path = cache / state_file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_state(bystander.pid, with_start_time)))
    env = {"DEPLOY_CACHE_DIR": str(cache), "DEPLOY_EMULATOR_DIR": str(cache / "emulator")}
    result = run_deploy(*command, env=env)
    assert "not running" in result.stdout, result.stdout + result.stderr
    time.sleep(0.2)
    assert bystander.poll() is None, f"`deploy {' '.join(command)}` signalled a process it did not start"


@pytest.mark.parametrize(
    "command, state_file",
    [
        (["device", "emulator", "start"], "emulator/server.json"),
        (["device", "emulator", "stop"], "emulator/server.json"),
        (["tracker", "start"], "tracker.json"),
        (["tracker", "stop"], "tracker.json"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_a_state_file_that_is_a_directory_is_named(tmp_path: Path, command: list[str], state_file: str):
    """`start` started a server it then could not remember (and stopped), `stop` could not forget
    the file: both were a generic IsADirectoryError line."""
    cache = tmp_path / "cache"
    (cache / state_file / "mine").mkdir(parents=True)
    result = run_deploy(*command, env={"DEPLOY_CACHE_DIR": str(cache)})
    said = f"error: {cache / state_file} is not a file: expected deploy's server state there"
    assert (result.returncode, result.stderr.strip()) == (2, said)
    assert (cache / state_file / "mine").is_dir() and not list((cache / state_file).parent.glob("*.log"))


def test_concurrent_device_adds_keep_every_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Twelve `device add` at the same moment (released together by a barrier): all twelve stay."""
    boards = [(Board(f"b{i}", f"10.0.0.{i}", "pi"),) for i in range(12)]
    assert at_once(tmp_path, add_board, boards) == [0] * 12
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert sorted(load_boards()) == sorted(f"b{i}" for i in range(12))


def test_device_add_from_the_cli_is_stored(tmp_path: Path):
    result = run_deploy("device", "add", "b1", "--host", "10.0.0.1", "--user", "pi",
                        env={"XDG_CONFIG_HOME": str(tmp_path)})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "deploy" / "devices.json").read_text())["b1"]["host"] == "10.0.0.1"


def test_a_devices_json_that_links_into_dotfiles_stays_a_link(tmp_path: Path):
    """`device add` and `device remove` replaced the link with a file of their own, and the
    user's copy behind it never saw the board."""
    dotfiles = tmp_path / "dotfiles" / "devices.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text("{}\n")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "devices.json").symlink_to(dotfiles)
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    for command in (
        ["add", "b1", "--host", "10.0.0.1", "--user", "pi"],
        ["add", "b2", "--host", "10.0.0.2", "--user", "pi"],
    ):
        assert run_deploy("device", *command, env=env).returncode == 0
    assert run_deploy("device", "remove", "b1", env=env).returncode == 0
    assert (tmp_path / "deploy" / "devices.json").is_symlink()
    assert list(json.loads(dotfiles.read_text())) == ["b2"]


def test_a_devices_json_linked_where_nothing_can_be_written_is_named(tmp_path: Path):
    """A link into a store deploy cannot write in (read-only, or here a path through a file) was
    a generic OSError line naming a temporary file."""
    store = tmp_path / "store"
    store.write_text("a file, where the link expects a directory")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "devices.json").symlink_to(store / "devices.json")
    done = run_deploy(
        "device", "add", "b1", "--host", "10.0.0.1", "--user", "pi", env={"XDG_CONFIG_HOME": str(tmp_path)}
    )
    link = tmp_path / "deploy" / "devices.json"
    said = f"error: cannot write {store / 'devices.json'} (where the link {link} points)"
    assert (done.returncode, done.stderr.strip().rpartition(":")[0]) == (1, said), done.stderr
    assert link.is_symlink()


def test_a_relative_key_is_stored_as_an_absolute_path(tmp_path: Path):
    """`--key keys/id` was stored as given: a command run from another directory found no key."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    add = [DEPLOY, "device", "add", "b1", "--host", "10.0.0.1", "--user", "pi", "--key", "keys/id"]
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    done = subprocess.run(add, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    stored = json.loads((tmp_path / "deploy" / "devices.json").read_text())["b1"]["key"]
    assert stored == str(tmp_path / "keys" / "id")


@pytest.mark.parametrize(
    "command, lock_file",
    [
        (["tracker", "stop"], "cache/tracker.json.lock"),
        (["device", "add", "b", "--host", "h", "--user", "u"], "config/deploy/devices.json.lock"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_a_fifo_lock_file_is_named_not_waited_on(tmp_path: Path, command: list[str], lock_file: str):
    """Opening a FIFO to read blocks until a writer comes: every command taking that lock hung."""
    path = tmp_path / lock_file
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    env = {
        **os.environ,
        "DEPLOY_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    result = subprocess.run([DEPLOY, *command], capture_output=True, text=True, env=env, timeout=60)
    said = f"error: {path} is no regular file: deploy keeps a lock there (remove it)"
    assert (result.returncode, result.stderr.strip()) == (2, said)
