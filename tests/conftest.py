"""Shared fixtures: an isolated build cache and config, the CLI runner, a local device session."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from deploy.base.threads import host_cpus

REPO = Path(__file__).resolve().parent.parent
DEPLOY = str(Path(sys.executable).with_name("deploy"))
_FILE_SECONDS: dict[str, float] = {}


LONGEST_FILES = (
    "test_ops_matrix.py", "test_bundle.py", "test_tune.py", "test_graphs.py", "test_ssh.py",
    "test_executorch.py", "test_bench.py", "test_tracker.py", "test_device_inputs.py", "test_engines.py",
)  # fmt: skip
"""The files that took longest in CI (1127 s for the matrix down to 100 s), longest first: each
CI worker takes the next whole file when it is done with one (`--dist loadfile`), so these go
first and the short ones fill in at the end, where a long file started last would leave the
other workers idle (longest-first scheduling). Update it from a CI run's "slowest files"."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of LONGEST_FILES first, longest first; the others after, as collected (with
    `--no-loadscope-reorder`, the order CI's workers take the files in)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per test file (setup, call and teardown), for the summary below."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The 12 test files that took longest: where a CI run's time goes, by file (the slowest
    single tests are listed by --durations)."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("slowest files")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:12]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("deploy-cache")
    os.environ["DEPLOY_CACHE_DIR"] = str(cache)
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))  # boards, known_hosts
    os.environ.setdefault("TVM_NUM_THREADS", str(host_cpus()))
    return cache


def invoke(*args: str) -> Result:
    """Run the `deploy` CLI in-process."""
    from deploy.cli.main import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def deploy_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`run_deploy`'s result from the CLI run in this process (`invoke`): for tests of what a
    command does, says and returns, not of its process (signals, environment, exit by a crash),
    where a subprocess costs TVM's import and the CLI's start (0.6-1.5 s here) each time. Not
    for a command that may end its process with `os._exit` (a `deploy test` stopped while it
    builds ahead: `stopping.abandoned`), nor where nothing may reach stderr: what is written
    to file descriptor 2 (TVM's C++ log, a Python warning) is not in `stderr` here."""
    result = invoke(*args)
    return subprocess.CompletedProcess(["deploy", *args], result.exit_code, result.stdout, result.stderr)


def run_deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `deploy` console script in a subprocess."""
    return subprocess.run(
        [DEPLOY, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600
    )


@pytest.fixture(scope="module")
def local_session() -> Iterator[object]:
    from deploy.devices import get_device

    with get_device("local").open() as session:
        yield session


def _released(
    barrier: multiprocessing.synchronize.Barrier,
    config: str,
    action: Callable[..., object],
    args: tuple[object, ...],
) -> None:
    os.environ["XDG_CONFIG_HOME"] = config
    barrier.wait()
    action(*args)


def at_once(
    config: Path, action: Callable[..., object], arguments: Sequence[tuple[object, ...]]
) -> list[int | None]:
    """Run `action(*args)` for each of `arguments` in a forked process of its own, with deploy's
    config in `config`, all released at one moment by a barrier (what a race needs to show);
    their exit codes."""
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(len(arguments))
    processes = [
        fork.Process(target=_released, args=(barrier, str(config), action, args)) for args in arguments
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    return [process.exitcode for process in processes]


@contextmanager
def registry_kept() -> Iterator[None]:
    """Ops loaded inside (the example ops, duplicates) leave the registry as it was."""
    from deploy.ops import registry

    registry.load_builtin()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_OPS", dict(registry._OPS))
        patch.setattr(registry, "_ONNX", dict(registry._ONNX))
        yield


@contextmanager
def examples_registered() -> Iterator[None]:
    """The example ops (`deploy/ops/examples`: hard_tanh) registered inside, and only there."""
    from deploy.ops import load_ops_path

    with registry_kept():
        load_ops_path(REPO / "deploy" / "ops" / "examples")
        yield


@pytest.fixture
def own_registry() -> Iterator[None]:
    """Ops a test loads leave the registry as it was."""
    with registry_kept():
        yield


@pytest.fixture
def example_ops() -> Iterator[None]:
    """The example ops registered for one test."""
    with examples_registered():
        yield
