"""The device registry and the interface every device backend implements."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deploy.base.errors import DeployError, UsageError

Outputs = list[tuple[tuple[int, ...], str]]
"""The outputs a call writes, in order: each one's (shape, dtype name)."""


def checked_outputs(results: list[np.ndarray], outputs: Outputs, module: Path) -> list[np.ndarray]:
    """`results` if they are `outputs` (count, shapes, dtypes); else a DeployError naming the
    first that is not, against the manifest."""
    if len(results) != len(outputs):
        raise DeployError(f"{module} returned {len(results)} outputs, its manifest says {len(outputs)}")
    for result, (shape, dtype) in zip(results, outputs, strict=True):
        if result.shape != tuple(shape) or str(result.dtype) != dtype:
            raise DeployError(
                f"{module} returned {result.dtype}{list(result.shape)}, its manifest says"
                f" {dtype}{list(shape)}"
            )
    return results


class DeviceLost(DeployError):
    """The device stopped answering (server died, connection dropped)."""


class Session(Protocol):
    """An open connection to a device that runs `arch` modules; `label` names it."""

    arch: str
    label: str
    bundles: bool
    """It runs an artifact's C bundle (through its `deploy-run`: `deploy/devices/runner.py`), not its
    module: builds for it carry one."""
    bundle_host: str | None
    """The CPU its bundles' host code runs on where that is not the device (an OpenCL device's
    board: `BuildOptions.bundle_host`); None: the device's own, or the kind's default."""

    def run(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[np.ndarray]:
        """Load `module` (cached per path), call its main through `entry` (`session.ENTRIES`:
        main(inputs..., outputs...), or a graph's plan main(inputs..., outputs..., arena) with an
        arena of `workspace` bytes), return the outputs, of the (shape, dtype) `outputs` says."""
        ...

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        number: int,
        repeat: int,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[float]:
        """Seconds per call of main, one mean over `number` calls for each of `repeat` runs."""
        ...

    def cores(self) -> int | None:
        """Threads the device's runtime runs parallel loops on (None: not a CPU device), which
        builds for it split work for."""
        ...

    def fp16_arithmetic(self) -> bool:
        """It computes in float16 (else builds for it keep float16 in memory only and compute in
        float32)."""
        ...

    def cpu_id(self) -> tuple[str, int, int] | None:
        """Its CPU as /proc/cpuinfo names it, (vendor_id, cpu family, model), by which builds
        pick a CPU model's hand defaults (`deploy.schedules.cpu_models`); None: a device that
        cannot say (a board, an emulator, RPC) or no x86 CPU."""
        ...


class Device:
    """A place to run modules: a name, the ELF machine it runs (`arch`), whether it is emulated,
    and what it supports. A backend subclasses it and overrides the capabilities it has; the
    defaults are the plain case (one session at a time, every dtype, nothing known about CPU
    features, not usable for tuning)."""

    name: str
    arch: str
    emulated: bool = False
    protocols: tuple[str, ...] = ("tvm",)
    """How deploy runs artifacts there: "tvm" (a TVM runtime, in this process or its RPC server),
    "runner" (a bundle's own `deploy-run`, `deploy/devices/runner.py`), "opencl" (the OpenCL runner)."""
    measures_in_process: bool = False
    """Modules for it can be loaded and timed in worker processes of this host (the host's own CPU):
    MetaSchedule's local runner measures tuning candidates there."""

    def open(self) -> AbstractContextManager[Session]:
        """A session on the device, ended when the block ends."""
        raise NotImplementedError

    def capacity(self) -> int:
        """Sessions it serves at once now (a tracker key: its free servers)."""
        return 1

    def missing_cpu_flags(self, flags: tuple[str, ...]) -> list[str]:
        """Which of the CPU `flags` (as /proc/cpuinfo names them) it is known to lack."""
        return []

    def rpc_endpoint(self) -> AbstractContextManager[Any]:
        """Its RPC server kept up while a context lasts (`rpc.RpcEndpoint`), for tuning."""
        raise UsageError(f"device {self.name} cannot measure tuning candidates (local or RPC devices can)")


_DEVICES: dict[str, Callable[[], Device]] = {}
_SOURCES: list[Callable[[str], Device | None]] = []
_SIDES: list[Callable[[str, str], Device | None]] = []


def register_device(name: str) -> Callable[[Callable[[], Device]], Callable[[], Device]]:
    """Decorator: make the factory it decorates the device called `name` (a backend module's)."""

    def add(factory: Callable[[], Device]) -> Callable[[], Device]:
        _DEVICES[name] = factory
        return factory

    return add


def register_device_source(find: Callable[[str], Device | None]) -> None:
    """Add a lookup for devices named at run time (e.g. boards from the config file)."""
    _SOURCES.append(find)


def register_device_side(find: Callable[[str, str], Device | None]) -> None:
    """Add a lookup for another side of the device named `name`, the one that runs `arch`
    modules where the device itself runs others (a board's OpenCL device beside its CPU)."""
    _SIDES.append(find)


BACKENDS = (
    "deploy.devices.local",
    "deploy.devices.emulator",
    "deploy.devices.runner",
    "deploy.devices.ssh",
    "deploy.devices.board_runner",
    "deploy.devices.opencl",
    "deploy.devices.board_opencl",
)
"""Modules that register devices, imported on the first `get_device`."""


def built_in_names() -> list[str]:
    """The names of the backends' devices (local, emulator, opencl ...), which a board's name
    may not be: `get_device` finds them first."""
    for module in BACKENDS:
        importlib.import_module(module)
    return sorted(_DEVICES)


def get_device(name: str, arch: str | None = None) -> Device:
    """The device called `name`: a backend's (local, emulator, opencl ...) or a board of
    devices.json; with `arch`, the side of it that runs `arch` modules where it has one
    (`register_device_side`); a UsageError when there is none."""
    if name in built_in_names():
        return _DEVICES[name]()
    for find in _SOURCES:
        device = find(name)
        if device is not None:
            if arch is not None and device.arch != arch:
                sides = (side(name, arch) for side in _SIDES)
                return next((side for side in sides if side is not None), device)
            return device
    raise UsageError(
        f"unknown device {name!r} (built in: {', '.join(built_in_names())}; add a board with"
        " `deploy device add`)"
    )
