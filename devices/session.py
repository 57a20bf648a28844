"""A session over any TVM runtime device, local or over RPC: load, run, time.

A module is called through its entry (the manifest's `entry`): "function", an op's PrimFunc
`main(inputs..., out)`, or "vm", a graph's Relax VM executable whose `main(inputs...)` returns the
output (the VM is in libtvm_runtime, so it runs wherever the runtime does, over RPC too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from base.errors import DeployError, UsageError


@dataclass(frozen=True)
class Entry:
    """How a loaded module is called: `function(loaded, dev)` -> the callable and whether it
    takes the output as its last argument (else it returns it)."""

    function: Callable[[Any, Any], Any]
    takes_output: bool


def _vm_main(loaded: Any, dev: Any) -> Any:
    from tvm import relax

    return relax.VirtualMachine(loaded, dev)


ENTRIES = {
    "function": Entry(lambda loaded, dev: loaded, takes_output=True),
    "vm": Entry(_vm_main, takes_output=False),
}
"""Entries by the name a manifest gives; the callable's `main` is called, or timed."""


def entry_named(name: str) -> Entry:
    if name not in ENTRIES:
        raise UsageError(
            f"module entry {name!r}: expected one of {', '.join(ENTRIES)} (rebuild the artifact)"
        )
    return ENTRIES[name]


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
        self._loaded: dict[Path, Any] = {}
        self._modules: dict[tuple[Path, str], Any] = {}
        self._cores: int | None = None

    def cores(self) -> int:
        """The runtime's thread-pool size (`runtime.NumThreads`: TVM_NUM_THREADS, else the
        device's cores, halved on x86 for hyper-threading), asked once."""
        if self._cores is None:
            self._cores = max(1, int(self._function_of("runtime.NumThreads")()))
        return self._cores

    def fp16_arithmetic(self) -> bool:
        """LLVM builds compute float16 on any CPU (natively with +fullfp16, else by conversion)."""
        return True

    def close(self) -> None:
        """Drop the loaded modules and the device; for RPC this ends the connection, which frees
        the server (a tracker hands it out again)."""
        self._modules.clear()
        self._loaded.clear()
        self._loader = self._dev = self._function_of = None

    def _callable(self, module: Path, entry: str) -> Any:
        """The module loaded (once per path) and made callable through its entry."""
        if module not in self._loaded:
            self._loaded[module] = self._loader(module)
        if (module, entry) not in self._modules:
            self._modules[(module, entry)] = entry_named(entry).function(self._loaded[module], self._dev)
        return self._modules[(module, entry)]

    def _args(
        self, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str, entry: str
    ) -> list[Any]:
        import tvm

        tensors = [tvm.runtime.tensor(np.require(a, requirements="C"), self._dev) for a in inputs]
        if not entry_named(entry).takes_output:
            return tensors
        return [*tensors, tvm.runtime.empty(out_shape, out_dtype, self._dev)]

    def run(
        self,
        module: Path,
        inputs: list[np.ndarray],
        out_shape: tuple[int, ...],
        out_dtype: str,
        entry: str = "function",
    ) -> np.ndarray:
        args = self._args(inputs, out_shape, out_dtype, entry)
        returned = self._callable(module, entry)["main"](*args)
        out = args[-1] if entry_named(entry).takes_output else returned
        result = out.numpy()
        if result.shape != tuple(out_shape) or str(result.dtype) != out_dtype:
            raise DeployError(
                f"{module} returned {result.dtype}{list(result.shape)}, its manifest says"
                f" {out_dtype}{list(out_shape)}"
            )
        return result

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        out_shape: tuple[int, ...],
        out_dtype: str,
        number: int,
        repeat: int,
        entry: str = "function",
    ) -> list[float]:
        function = self._callable(module, entry)
        evaluator = function.time_evaluator("main", self._dev, number=number, repeat=repeat)
        return [float(t) for t in evaluator(*self._args(inputs, out_shape, out_dtype, entry)).results]
