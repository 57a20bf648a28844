"""The native emulator against the Python RPC server it replaced, measured in one run.

    .venv/bin/python bench/emulator_start.py [--repeat 5]

Prints, for each server, the cold start (server process start to the first case verified against
numpy: start, connect, upload, load, run, compare) and the wall time of
`deploy test --target arm --op max_pool2d --dtype float32` (builds cached by an untimed first
run). The Python server runs TVM's `tvm.exec.rpc_server` on Debian's arm64 python3.11 under
qemu-aarch64 (`bench/python_emulator.py` provisions that sysroot once, ~1 minute); deploy reaches
it through an RPC tracker, so its test time is its start-up until registered plus the test run.
Medians, with min-max in brackets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness import at_least_one, run
from python_emulator import Sysroot

from deploy.base.paths import cache_root
from deploy.base.threads import THREADS_ENV, host_cpus, runtime_threads
from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.devices.emulator import Emulator
from deploy.devices.rpc import connect
from deploy.devices.server_process import Server, accepts, free_port, spawn
from deploy.devices.tracker import TrackerProcess, free_servers
from deploy.ops import TensorType, bind, get_op
from deploy.ops.spec import BoundOp
from deploy.verify.measure import check_artifact

DEPLOY = str(Path(sys.executable).with_name("deploy"))
TEST = ["test", "--target", "arm", "--op", "max_pool2d", "--dtype", "float32"]


def python_server(sysroot: Sysroot, tracker: str | None = None, key: str = "") -> Server:
    """TVM's Python server under qemu, once it accepts connections (or is registered)."""
    port = free_port()
    log = sysroot.base / f"server-{port}.log"
    proc = spawn(sysroot.server_command(port, tracker, key), log)
    server = Server.of(proc, port, log)
    while not ("bind to" in log.read_text(errors="replace") and accepts(port)):
        if proc.poll() is not None:
            raise SystemExit(f"python server exited: {server.log_tail()}")
        time.sleep(0.02)
    return server


def first_case(start: Callable[[], Server], bound: BoundOp, artifact: Path) -> float:
    """Seconds from starting a server to the first case verified on it (random inputs and ties)."""
    began = time.perf_counter()
    server = start()
    try:
        with connect("127.0.0.1", server.port, "aarch64", "bench", key=server.session_key()) as session:
            check_artifact(session, bound, artifact, Manifest.read(artifact))
        return time.perf_counter() - began
    finally:
        server.stop()


def deploy_test(*extra: str) -> float:
    began = time.perf_counter()
    proc = subprocess.run([DEPLOY, *TEST, *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"deploy test failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return time.perf_counter() - began


def python_test(sysroot: Sysroot, tracker_port: int) -> float:
    """Start-up until registered, then the test through the tracker."""
    key = f"py{free_port()}"
    began = time.perf_counter()
    server = python_server(sysroot, f"127.0.0.1:{tracker_port}", key)
    try:
        while free_servers("127.0.0.1", tracker_port, key) < 1:
            time.sleep(0.02)
        started = time.perf_counter() - began
        return started + deploy_test("--tracker", f"127.0.0.1:{tracker_port}", "--key", key)
    finally:
        server.stop()


def spread(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):6.2f} s [{min(seconds):.2f}-{max(seconds):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = at_least_one(parser, "--repeat", parser.parse_args().repeat)
    os.environ[THREADS_ENV] = runtime_threads()
    sysroot = Sysroot(cache_root() / "bench-python-emulator")
    print("provisioning the Python baseline's sysroot (once)...", flush=True)
    sysroot.provision()
    emulator = Emulator(Path(tempfile.mkdtemp(prefix="bench-emulator-")))
    emulator.provision()

    with tempfile.TemporaryDirectory() as tmp:
        target = get_target("arm")
        bound = bind(get_op("add"), {}, [TensorType((7, 13), "float32")] * 2)
        artifact = Path(tmp) / "add"
        export(compile_op(bound, target, BuildOptions()), artifact)
        native_start = [first_case(emulator.start, bound, artifact) for _ in range(repeat)]
        python_start = [first_case(lambda: python_server(sysroot), bound, artifact) for _ in range(repeat)]

    deploy_test()  # builds the cases once; both servers then run the same cached modules
    native_test = [deploy_test() for _ in range(repeat)]
    tracker = TrackerProcess(Path(tempfile.mkdtemp(prefix="bench-tracker-")))
    address = tracker.start(port=free_port())
    try:
        python_runs = [python_test(sysroot, address.port) for _ in range(repeat)]
    finally:
        tracker.stop()

    print(f"\n{'':34} {'native':>22} {'Python server':>22} {'Python/native':>14}")
    rows = [("cold start to first verified case", native_start, python_start),
            ("deploy test max_pool2d float32", native_test, python_runs)]  # fmt: skip
    for label, native, python in rows:
        ratio = statistics.median(python) / statistics.median(native)
        print(f"{label:34} {spread(native):>22} {spread(python):>22} {ratio:13.1f}x")
    print(f"({repeat} runs each, {host_cpus()} CPUs, TVM_NUM_THREADS={os.environ[THREADS_ENV]})")


if __name__ == "__main__":
    run(main)
