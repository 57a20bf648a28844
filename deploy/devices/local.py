"""The local host as a device: modules are loaded into this process."""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.devices.registry import Device, register_device
from deploy.devices.session import TvmSession


class LocalDevice(Device):
    """This machine's CPU."""

    name = "local"
    measures_in_process = True

    def __init__(self) -> None:
        self.arch = platform.machine()

    @contextmanager
    def open(self) -> Iterator[TvmSession]:
        import tvm

        def load(path: Path) -> Any:
            return tvm.runtime.load_module(str(path))

        yield TvmSession(load, tvm.cpu(0), self.arch, self.name, tvm.get_global_func, host_cpu_id())

    def missing_cpu_flags(self, flags: tuple[str, ...]) -> list[str]:
        """The `flags` this host's CPU lacks, read from /proc/cpuinfo (none known when unreadable)."""
        present: set[str] = set()
        for line in cpuinfo().splitlines():
            if line.startswith(("flags", "Features")):
                present.update(line.split(":", 1)[1].split())
        return [flag for flag in flags if flag not in present]


def cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where it cannot be read)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_id_of(text: str) -> tuple[str, int, int] | None:
    """The first CPU a /proc/cpuinfo `text` describes as (vendor_id, cpu family, model), what
    the schedules' CPU models are named by (`deploy.schedules.cpu_models.identify`); None where
    the fields are missing (aarch64 writes others) or not numbers."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    try:
        return fields["vendor_id"], int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return None


@functools.cache
def host_cpu_id() -> tuple[str, int, int] | None:
    """This host's CPU as `cpu_id_of` reads it; read once (every session opened here asks, and
    /proc/cpuinfo grows with the cores)."""
    return cpu_id_of(cpuinfo())


register_device("local")(LocalDevice)
