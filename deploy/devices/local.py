"""The local host as a device: modules are loaded into this process."""

from __future__ import annotations

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

        yield TvmSession(load, tvm.cpu(0), self.arch, self.name, tvm.get_global_func)

    def missing_cpu_flags(self, flags: tuple[str, ...]) -> list[str]:
        """The `flags` this host's CPU lacks, read from /proc/cpuinfo (none known when unreadable)."""
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
        present: set[str] = set()
        for line in text.splitlines():
            if line.startswith(("flags", "Features")):
                present.update(line.split(":", 1)[1].split())
        return [flag for flag in flags if flag not in present]


register_device("local")(LocalDevice)
