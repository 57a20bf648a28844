"""Artifact kinds: what `deploy build` writes for a target, and what each kind can do.

A kind compiles a scheduled IRModule and writes the result into an artifact directory; its flags
say what else applies to it (core splitting, unscheduled builds, C bundles). A target names its
kind (`targets.py`); the code of each kind lives in a module of its own (`shared_object.py`,
`opencl.py`). A new kind is one such module, a subclass instance the targets that use it name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploy.compiler.compile import ScheduledKernel
    from deploy.compiler.options import BuildOptions
    from deploy.compiler.plan import Plan
    from deploy.compiler.targets import Target
    from deploy.ops.graph import BoundGraph, Constant
    from deploy.ops.spec import TensorType


@dataclass(frozen=True)
class ArtifactKind:
    """One kind of artifact. Subclasses implement `compile` and `write`."""

    name: str
    splits_for_cores: bool
    """Its parallel loops are split for the device's core count (CPU code), which the manifest records."""
    builds_unscheduled: bool
    """The op's PrimFunc builds with no schedule at all (GPU code needs its work-items bound first)."""
    bundles: bool
    """`deploy build --bundle` can wrap it in a C library (it is a TVM module a runtime loads)."""
    graph_entry: str
    """How a runtime calls the compiled form of a graph (the manifest's `entry`): "plan"
    (`main(inputs..., outputs..., arena)`, `plan.py`) or "function" (like an op's: `main(inputs..., out)`)."""
    symbolic_batch: bool
    """One module runs every size of a symbolic batch (the runtime reads N from the arrays); an
    OpenCL plan's launch sizes are numbers, fixed when it is built."""
    machine_code: bool
    """Its module is machine code (an ELF shared object), whose machine is checked against the
    device's before it is loaded; any other module is checked by the manifest's `arch`."""
    fp16_choice: bool = False
    """float16 builds either way, half arithmetic or half storage computed in float32 (`deploy
    build --fp16`), for devices that lack half arithmetic (an OpenCL device without cl_khr_fp16)."""
    bundle_host: str | None = None
    """The CPU a bundle's host code is compiled for unless `--host-arch` says another (an OpenCL
    bundle's); None: a bundle is the target's own CPU code."""

    def tvm_target(self, spec: dict[str, Any]) -> Any:
        """The TVM target for the target's `spec` dict."""
        import tvm

        return tvm.target.Target(spec)

    def files(self, module: str) -> tuple[str, ...]:
        """The files `write` puts in an artifact directory, given the module's name."""
        return (module,)

    def whole(self, directory: Path, module: str) -> bool:
        """Whether the files beside the module (which the manifest pins) are as it pins them."""
        return True

    def compile(self, mod: Any, target: Target, options: BuildOptions, stored: tuple[TensorType, ...]) -> Any:
        """The compiled form of a scheduled IRModule `main(inputs..., out)`, whose parameters are
        `stored` in memory (inputs, then the output; float16 even where `main` computes them as
        float32, `BuildOptions.fp16_storage`)."""
        raise NotImplementedError

    def compile_graph(
        self, graph: BoundGraph, kernels: list[ScheduledKernel], target: Target, options: BuildOptions
    ) -> Any:
        """The compiled form of a graph whose kernels are scheduled: run in order, each reading the
        graph tensors its kernel names and writing one."""
        raise NotImplementedError

    def graph_plan(self, graph: BoundGraph, kernels: list[ScheduledKernel]) -> Plan | None:
        """The arena its graph entry takes (None: it takes none)."""
        return None

    def write(self, compiled: Any, staging: Path, target: Target, constants: tuple[Constant, ...]) -> Path:
        """Write the compiled form into `staging`, with a graph's `constants` (as its kernels read
        them); returns the file the manifest pins."""
        raise NotImplementedError

    def write_bundle(
        self, compiled: Any, staging: Path, name: str | None, host: str | None
    ) -> dict[str, str]:
        """Write the C library of the compiled form into `staging` (all but SHA256SUMS), its
        functions prefixed `name`, host code for `host` where `bundle_host` applies; returns the
        manifest's `bundle` entry. The writer is the one registered for this kind."""
        return _BUNDLE_WRITERS[self.name](compiled, staging, name, host or self.bundle_host)


BundleWriter = Callable[[Any, Path, "str | None", "str | None"], dict[str, str]]
"""(compiled form, staging directory, C prefix, host arch) -> the manifest's `bundle` entry."""
_BUNDLE_WRITERS: dict[str, BundleWriter] = {}


def bundle_writer(kind: str) -> Callable[[BundleWriter], BundleWriter]:
    """Register the function writing the C bundles of the artifact kind named `kind` (a module
    of its own: `bundle.py` for CPU code, `cl_bundle.py` for OpenCL plans)."""

    def add(writer: BundleWriter) -> BundleWriter:
        _BUNDLE_WRITERS[kind] = writer
        return writer

    return add
