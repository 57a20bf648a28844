"""The device registry and the interface every device backend implements."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import numpy as np

from ops.errors import DeployError, UsageError


class DeviceLost(DeployError):
    """The device stopped answering (server died, connection dropped)."""


class Session(Protocol):
    """An open connection to a device that runs `arch` modules; `label` names it."""

    arch: str
    label: str

    def run(
        self, module: Path, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str
    ) -> np.ndarray:
        """Load `module` (cached per path), call main(inputs..., out), return out."""
        ...

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        out_shape: tuple[int, ...],
        out_dtype: str,
        number: int,
        repeat: int,
    ) -> list[float]:
        """Seconds per call of main, one mean over `number` calls for each of `repeat` runs."""
        ...

    def cores(self) -> int | None:
        """Threads the device's runtime runs parallel loops on (None: not a CPU device), which
        builds for it split work for."""
        ...


class Device(Protocol):
    """A place to run modules: a name, the ELF machine it runs, whether it is emulated."""

    name: str
    arch: str
    emulated: bool

    def open(self) -> AbstractContextManager[Session]: ...


_DEVICES: dict[str, Callable[[], Device]] = {}
_SOURCES: list[Callable[[str], Device | None]] = []


def register_device(name: str) -> Callable[[Callable[[], Device]], Callable[[], Device]]:
    def add(factory: Callable[[], Device]) -> Callable[[], Device]:
        _DEVICES[name] = factory
        return factory

    return add


def register_device_source(find: Callable[[str], Device | None]) -> None:
    """Add a lookup for devices named at run time (e.g. boards from the config file)."""
    _SOURCES.append(find)


BACKENDS = ("devices.local", "devices.emulator", "devices.ssh", "devices.opencl")
"""Modules that register devices, imported on the first `get_device`."""


def get_device(name: str) -> Device:
    for module in BACKENDS:
        importlib.import_module(module)
    if name in _DEVICES:
        return _DEVICES[name]()
    for find in _SOURCES:
        device = find(name)
        if device is not None:
            return device
    raise UsageError(
        f"unknown device {name!r} (built in: {', '.join(sorted(_DEVICES))}; add a board with"
        " `deploy device add`)"
    )
