"""A session over any TVM runtime device, local or over RPC: load, run, time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class TvmSession:
    """Runs modules through a TVM runtime `loader(path) -> Module` on TVM device `dev`;
    `function(name)` finds a global function of that runtime; `arch` is the ELF machine it runs,
    `label` names it in messages."""

    def __init__(self, loader: Any, dev: Any, arch: str, label: str, function: Any) -> None:
        self.arch = arch
        self.label = label
        self._loader = loader
        self._dev = dev
        self._function_of = function
        self._modules: dict[Path, Any] = {}
        self._cores: int | None = None

    def cores(self) -> int:
        """The runtime's thread-pool size (`runtime.NumThreads`: TVM_NUM_THREADS, else the
        device's cores, halved on x86 for hyper-threading), asked once."""
        if self._cores is None:
            self._cores = max(1, int(self._function_of("runtime.NumThreads")()))
        return self._cores

    def close(self) -> None:
        """Drop the loaded modules and the device; for RPC this ends the connection, which frees
        the server (a tracker hands it out again)."""
        self._modules.clear()
        self._loader = self._dev = self._function_of = None

    def _function(self, module: Path) -> Any:
        if module not in self._modules:
            self._modules[module] = self._loader(module)
        return self._modules[module]["main"]

    def _args(self, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str) -> list[Any]:
        import tvm

        tensors = [tvm.runtime.tensor(np.require(a, requirements="C"), self._dev) for a in inputs]
        return [*tensors, tvm.runtime.empty(out_shape, out_dtype, self._dev)]

    def run(
        self, module: Path, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str
    ) -> np.ndarray:
        args = self._args(inputs, out_shape, out_dtype)
        self._function(module)(*args)
        return args[-1].numpy()

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        out_shape: tuple[int, ...],
        out_dtype: str,
        number: int,
        repeat: int,
    ) -> list[float]:
        self._function(module)
        evaluator = self._modules[module].time_evaluator("main", self._dev, number=number, repeat=repeat)
        return [float(t) for t in evaluator(*self._args(inputs, out_shape, out_dtype)).results]
