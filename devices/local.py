"""The local host as a device: modules are loaded into this process."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devices.registry import register_device
from devices.session import TvmSession


class LocalDevice:
    """This machine's CPU."""

    name = "local"
    emulated = False

    def __init__(self) -> None:
        self.arch = platform.machine()

    @contextmanager
    def open(self) -> Iterator[TvmSession]:
        import tvm

        def load(path: Path) -> Any:
            return tvm.runtime.load_module(str(path))

        yield TvmSession(load, tvm.cpu(0), self.arch, self.name, tvm.get_global_func)


register_device("local")(LocalDevice)
