"""A build's choices: what one build of an op or a graph makes of its target (`targets.py`: what
the hardware is), given on the command line or asked from the device it is for (`for_device`).

Every build takes them explicitly beside its target; the build cache key holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from deploy.base.threads import host_cpus
from deploy.compiler.runtime import ALIGNMENT
from deploy.schedules.cpu_models import identify

if TYPE_CHECKING:
    from deploy.compiler.targets import Target
    from deploy.devices import Session
    from deploy.ops.graph import BoundGraph
    from deploy.ops.spec import BoundOp

KEPT_HAND = "hand, tuning found nothing faster"
"""The verdict of a tuning that measured no record faster than the hand schedule."""
REFUSED = "hand, the accepted record failed its checks"
"""Why a `--tuned` build keeps the hand schedule when the records fail a check on reading."""


class TunedSchedules(Protocol):
    """Where `--tuned` builds find their schedules (the tune room's verdicts): build asks, and
    never reads the tuner's files itself."""

    def schedule(self, bound: BoundOp, target: Target, options: BuildOptions) -> tuple[Any, str] | None:
        """The op's IRModule scheduled as accepted for `target` (computed as `options` say), with
        the record's id; None when no record was accepted for this op, these attributes and
        input types."""
        ...

    def verdict(self, bound: BoundOp, target: Target) -> str | None:
        """Cheap (for the build cache key): the accepted record's id with a digest of the records
        it is read from (what the build depends on), KEPT_HAND when tuning
        found nothing faster than the hand schedule, REFUSED when the verdict cannot be read,
        None when the op was not tuned."""
        ...

    def layout(self, graph: BoundGraph, target: Target) -> str | None:
        """The layout tuning measured the graph fastest in on the device (its verdict read
        cheaply: the build cache key holds it); None when it was not measured or NCHW won."""
        ...


@dataclass(frozen=True)
class BuildOptions:
    """The choices of one build for a target: from the command line (`--tuned`, `--cores`,
    `--layout`, `--alignment`, `--fp16`) and from the device the build is for (`for_device`).
    The defaults build for this host's cores, hand schedules, NCHW and no bundle."""

    tuned: TunedSchedules | None = None
    """Schedules `deploy tune` accepted (a records directory): build from them where they match."""
    cores: int | None = None
    """Threads the device runs parallel loops on, which the schedules split work for: asked from
    the device or given with --cores (None: this host's count, for library callers)."""
    layout: str | None = None
    """The layout a graph's pooling runs in (`deploy/ops/relayout.py`), a name of
    `deploy.ops.layouts.LAYOUTS`, from `--layout`. None: the layout tuning accepted for the graph
    (`--tuned`), else NCHW: with its conversions a packed graph is faster only at some shapes
    (docs/layouts.md)."""
    alignment: int = ALIGNMENT
    """Bytes the data of every tensor a module is called with is aligned to, which its kernels
    assume (aligned vector loads): TVM's own allocations give ALIGNMENT; `--alignment 16` builds for an
    engine whose allocator gives less (ncnn's on ARM), with unaligned loads."""
    bundle: bool = False
    """Every artifact carries its C bundle (`bundle.py`): for a device that runs bundles through
    their runner (`deploy/devices/runner.py`), set from the device the build is for (`for_device`)."""
    bundle_host: str | None = None
    """The CPU those bundles' host code is compiled for where the artifact kind has a choice (an
    OpenCL bundle's: its board's arch); None: the kind's `bundle_host`."""
    fp16_storage: bool = False
    """float16 tensors stay half in memory but are computed in float32: for a device without
    half arithmetic (an OpenCL device without cl_khr_fp16 loads and stores them with OpenCL
    1.2's vload_half/vstore_half). Set from the device the build is for (`for_device`)."""
    cpu_model: str | None = None
    """The device's CPU model, a name of `deploy.schedules.cpu_models.CPU_MODELS`, whose hand
    defaults the schedules take: named from the CPU of the device the build is for (`for_device`;
    the local host reads /proc/cpuinfo). None: the defaults measured on Intel Xeons."""

    def build_cores(self) -> int:
        """The core count builds split work for."""
        return self.cores or host_cpus()


def for_device(options: BuildOptions, session: Session) -> BuildOptions:
    """`options` for a build for the session's device: split for its cores, unless --cores said,
    float16 computed in float32 where the device has no half arithmetic, with the C bundle
    where the device runs bundles (the runner protocol), its host code for the CPU that runs it
    (an OpenCL device's board), and the hand defaults of its CPU model."""
    cores = session.cores() if options.cores is None else options.cores
    storage = not session.fp16_arithmetic()
    bundle = session.bundles
    host = session.bundle_host if bundle else None
    model = identify(session.cpu_id())
    return replace(
        options, cores=cores, fp16_storage=storage, bundle=bundle, bundle_host=host, cpu_model=model
    )
