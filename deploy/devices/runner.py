"""The runner protocol: a device that runs deploy's C bundles (`deploy/compiler/bundle.py`) through
their own runner, `deploy-run`, and needs nothing else: no TVM, no Python, any libc (the runner is
linked statically). A call hands the device the bundle and the inputs as .npy files, runs the
runner, and takes back the outputs and, when timing, its seconds per call (`deploy-run --time`: a
warm-up call, then runs of many calls, each at least MIN_REPEAT_MS, as TVM's time evaluator).

How files and commands reach the device is a `RunnerLink`: qemu-user on this host for the
emulators of architectures TVM has no runtime for (`emulator-armv7`, `emulator-riscv64`, here),
SFTP and a shell for boards (`deploy/devices/ssh.py`). Builds for a session of this protocol carry their
bundle (`Session.bundles`, `deploy/compiler/options.py:for_device`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np

from deploy.base.errors import DeployError, printable
from deploy.base.threads import runtime_threads
from deploy.devices.platforms import Platform, get_platform
from deploy.devices.registry import Device, DeviceLost, Outputs, checked_outputs, register_device

RUNNER = "deploy-run"
"""The runner's file name in a bundle (as `bundle.RUNNER`)."""
RUNNER_PROTOCOL = "runner"
"""The protocol's name in `Device.protocols`."""
MIN_REPEAT_MS = 20
"""The shortest timed run: one shorter is done again with more calls (the runner's `--time`)."""
BAD_INPUT, FAILED = 2, 1
"""The runner's exit codes: bad input or a modified bundle; the call failed."""


class RunnerLink(Protocol):
    """How a runner session reaches its device."""

    label: str

    def bundle(self, directory: Path) -> str:
        """Where the bundle in `directory` is on the device (handed over once per session)."""
        ...

    def call(
        self,
        bundle: str,
        inputs: list[Path],
        outputs: list[Path],
        options: list[str],
        timeout_s: float | None = None,
    ) -> tuple[int, str, str]:
        """Run the bundle's runner on the `inputs` (files here), its outputs fetched into
        `outputs`: (exit status, stdout, stderr); a negative status is a signal's. A run past
        `timeout_s` (None: no limit) is stopped, a DeviceLost."""
        ...


def ran_over(bundle: str, timeout_s: float, label: str) -> DeviceLost:
    """The error of a run of the runner in `bundle` stopped at `timeout_s`."""
    return DeviceLost(
        f"{RUNNER} of {PurePosixPath(bundle).name} ran over the {timeout_s:g} s limit (--timeout)"
        f" on {label}: stopped"
    )


def file_args(inputs: list[str], outputs: list[str]) -> list[str]:
    """The runner's arguments naming its files: `-i` each input, then `-o` each output."""
    return [*(w for path in inputs for w in ("-i", path)), *(w for path in outputs for w in ("-o", path))]


class RunnerSession:
    """A session of the runner protocol over `link`: bundles of `arch` modules, whose runner
    uses `threads` threads (a CPU's) or, with `threads` None, runs on the device `options` name
    (an OpenCL bundle's `--cl-device P:D`, its host code running on the CPU `bundle_host`)."""

    bundles = True

    def __init__(
        self,
        link: RunnerLink,
        arch: str,
        threads: int | None,
        options: tuple[str, ...] = (),
        fp16: bool = True,
        bundle_host: str | None = None,
    ) -> None:
        self.link, self.arch, self.label, self.threads = link, arch, link.label, threads
        self.bundle_host = bundle_host
        self._options = [*(["--threads", str(threads)] if threads is not None else []), *options]
        self._fp16 = fp16
        self._placed: dict[Path, str] = {}

    def cores(self) -> int | None:
        return self.threads

    def fp16_arithmetic(self) -> bool:
        """LLVM builds compute float16 on any CPU (by conversion where it has no half arithmetic);
        an OpenCL device only with cl_khr_fp16 (`fp16`, as its board says)."""
        return self._fp16

    def cpu_id(self) -> None:
        """Not asked: a runner board's defaults are the schedules' own."""
        return None

    def run(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[np.ndarray]:
        return self._call(module, inputs, outputs, [])[0]

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        number: int,
        repeat: int,
        entry: str = "function",
        workspace: int = 0,
        timeout_s: float | None = None,
    ) -> list[float]:
        """As `Session.time`; a run past `timeout_s` (tuning's `--timeout`) is stopped, a DeviceLost."""
        timing = ["--time", f"{number},{repeat},{MIN_REPEAT_MS}"]
        return self._call(module, inputs, outputs, timing, timeout_s)[1]

    def _call(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        options: list[str],
        timeout_s: float | None = None,
    ) -> tuple[list[np.ndarray], list[float]]:
        """Run the bundle beside `module` (the artifact's directory) on `inputs`: the outputs and
        the seconds per call of each timed run (`options`)."""
        directory = module.parent
        if not (directory / RUNNER).is_file():
            raise DeployError(
                f"{directory} has no C bundle: {self.label} runs bundles only (build with --bundle)"
            )
        if directory not in self._placed:
            self._placed[directory] = self.link.bundle(directory)
        with tempfile.TemporaryDirectory(prefix=".deploy-runner-") as scratch:
            files = [Path(scratch, f"in{i}.npy") for i in range(len(inputs))]
            for path, array in zip(files, inputs, strict=True):
                np.save(path, np.require(array, requirements="C"), allow_pickle=False)
            written = [Path(scratch, f"out{i}.npy") for i in range(len(outputs))]
            status, stdout, stderr = self.link.call(
                self._placed[directory], files, written, [*self._options, *options], timeout_s
            )
            said = printable(stderr.strip().splitlines()[-1] if stderr.strip() else "no message")
            if status < 0:
                died = f"{RUNNER} of {directory.name} died on {self.label} (signal {-status})"
                raise DeviceLost(f"{died}: {said}")
            if status != 0:
                raise DeployError(f"{self.label}: {said}")
            results = checked_outputs(
                [np.load(path, allow_pickle=False) for path in written], outputs, directory
            )
        timed = [line.split()[1] for line in stdout.splitlines() if line.startswith("seconds-per-call ")]
        times = [float(t) for t in timed]
        return results, times


class EmulatedLink:
    """The runner under qemu-user on this host: the bundle and the files stay where they are."""

    def __init__(self, platform: Platform, label: str) -> None:
        self.platform, self.label = platform, label

    def bundle(self, directory: Path) -> str:
        return str(directory)

    def call(
        self,
        bundle: str,
        inputs: list[Path],
        outputs: list[Path],
        options: list[str],
        timeout_s: float | None = None,
    ) -> tuple[int, str, str]:
        command = [*self.platform.emulator_command(), str(Path(bundle, RUNNER)), bundle]
        command += [*file_args(list(map(str, inputs)), list(map(str, outputs))), *options]
        with subprocess.Popen(  # a group of its own: a stop ends whatever qemu started too
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout_s)
            except BaseException as exc:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                if not isinstance(exc, subprocess.TimeoutExpired):
                    raise
                raise ran_over(bundle, exc.timeout, self.label) from None
        return process.returncode, stdout, stderr


class RunnerEmulator(Device):
    """An architecture TVM has no runtime for, under qemu-user on this host: bundles run through
    their runner (correctness, not performance)."""

    emulated = True
    protocols = (RUNNER_PROTOCOL,)

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.platform = get_platform(arch)
        self.name = f"emulator-{EMULATED[arch]}"

    @contextmanager
    def open(self) -> Iterator[RunnerSession]:
        self.platform.require_emulator()
        link = EmulatedLink(self.platform, f"{self.name} ({self.platform.qemu})")
        yield RunnerSession(link, self.arch, int(runtime_threads()))


EMULATED = {"armv7l": "armv7", "riscv64": "riscv64"}
"""The architectures emulated through the runner protocol, by their emulator's name suffix."""
for _arch in EMULATED:
    register_device(f"emulator-{EMULATED[_arch]}")(partial(RunnerEmulator, _arch))
