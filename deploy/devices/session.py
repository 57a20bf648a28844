"""A session over any TVM runtime device, local or over RPC: load, run, time.

A module is called through its entry (the manifest's `entry`): "function", an op's PrimFunc
`main(inputs..., out)`, or "plan", a graph's `main(inputs..., outputs..., arena)` (deploy/
compiler/plan.py), whose arena of `workspace` bytes the session allocates on the device once per
call site, as a C bundle's caller does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy.base.errors import UsageError
from deploy.devices.registry import Outputs, checked_outputs


@dataclass(frozen=True)
class Entry:
    """How a loaded module's `main` is called: on the inputs and the outputs, then an arena
    (`takes_arena`) or not."""

    takes_arena: bool


ENTRIES = {"function": Entry(takes_arena=False), "plan": Entry(takes_arena=True)}
"""Entries by the name a manifest gives."""


def entry_named(name: str) -> Entry:
    if name not in ENTRIES:
        raise UsageError(
            f"module entry {name!r}: expected one of {', '.join(ENTRIES)} (rebuild the artifact)"
        )
    return ENTRIES[name]


class TvmSession:
    """Runs modules through a TVM runtime `loader(path) -> Module` on TVM device `dev`;
    `function(name)` finds a global function of that runtime; `arch` is the ELF machine it runs,
    `label` names it in messages, `cpu` its CPU's identification where known (`cpu_id`)."""

    bundles = False
    bundle_host: str | None = None

    def __init__(
        self,
        loader: Any,
        dev: Any,
        arch: str,
        label: str,
        function: Any,
        cpu: tuple[str, int, int] | None = None,
    ) -> None:
        self.arch = arch
        self._cpu = cpu
        self.label = label
        self._loader = loader
        self._dev = dev
        self._function_of = function
        self._loaded: dict[Path, Any] = {}
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

    def cpu_id(self) -> tuple[str, int, int] | None:
        """The CPU it was opened with: the local host's (`deploy.devices.local`); None over RPC."""
        return self._cpu

    def close(self) -> None:
        """Drop the loaded modules and the device; for RPC this ends the connection, which frees
        the server (a tracker hands it out again)."""
        self._loaded.clear()
        self._loader = self._dev = self._function_of = None

    def _callable(self, module: Path) -> Any:
        """The module, loaded once per path."""
        if module not in self._loaded:
            self._loaded[module] = self._loader(module)
        return self._loaded[module]

    def _args(self, inputs: list[np.ndarray], outputs: Outputs, entry: str, workspace: int) -> list[Any]:
        """The inputs, the outputs and, for an entry that takes one, an arena of `workspace` bytes."""
        import tvm

        tensors = [self._input(np.require(a, requirements="C")) for a in inputs]
        tensors += [tvm.runtime.empty(shape, dtype, self._dev) for shape, dtype in outputs]
        if entry_named(entry).takes_arena:
            tensors.append(tvm.runtime.empty((workspace,), "uint8", self._dev))
        return tensors

    def _input(self, array: np.ndarray) -> Any:
        """`array` (C-contiguous) as a tensor on the device."""
        import tvm

        return tvm.runtime.tensor(array, self._dev)

    def run(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[np.ndarray]:
        args = self._args(inputs, outputs, entry, workspace)
        self._callable(module)["main"](*args)
        results = [a.numpy() for a in args[len(inputs) : len(inputs) + len(outputs)]]
        return checked_outputs(results, outputs, module)

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
        evaluator = self._callable(module).time_evaluator("main", self._dev, number=number, repeat=repeat)
        args = self._args(inputs, outputs, entry, workspace)
        return [float(t) for t in evaluator(*args).results]
