"""Running built ops on a device and comparing them with their numpy references: the checks
before a run (architecture, CPU features, sha256, ELF machine) and one verification."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from base.errors import UsageError
from devices import Device, Session
from devices.elf import check_machine
from ops.spec import BoundOp
from toolchain.build.cache import cached_build
from toolchain.build.manifest import Manifest
from toolchain.build.targets import Target
from toolchain.verify.compare import Comparison, compare


def check_device(target: Target, device: Device) -> None:
    """The device can run `target`'s modules: same architecture, and the CPU features they use."""
    if device.arch != target.arch:
        raise UsageError(
            f"target {target.name} builds {target.arch} modules; device {device.name} runs {device.arch}"
        )
    missing = device.missing_cpu_flags(target.cpu_flags)
    if missing:
        raise UsageError(
            f"target {target.name} needs CPU features device {device.name} lacks: {', '.join(missing)}"
        )


def run_artifact(
    session: Session, directory: Path, manifest: Manifest, inputs: list[np.ndarray]
) -> np.ndarray:
    """Check the module (sha256 against the manifest, ELF machine against the device), run it."""
    module = manifest.check_module(directory)
    if module.suffix == ".so":
        check_machine(module, session.arch, session.label)
    elif manifest.arch != session.arch:
        raise UsageError(f"artifact {directory} is for {manifest.arch}; {session.label} runs {session.arch}")
    out = manifest.output
    return session.run(module, inputs, tuple(out["shape"]), out["dtype"])


def for_device(target: Target, session: Session) -> Target:
    """`target` building for the session's device: split for its cores, unless --cores said."""
    cores = session.cores() if target.cores is None else None
    return target.with_cores(cores)


def verify(
    session: Session, bound: BoundOp, target: Target, inputs: list[np.ndarray]
) -> tuple[Comparison, str]:
    """Build (cached, for the session's device), run on the session, compare with the reference;
    with the schedule name."""
    directory, manifest = cached_build(bound, for_device(target, session))
    actual = run_artifact(session, directory, manifest, inputs)
    return against_reference(bound, inputs, actual), manifest.built_with


def against_reference(bound: BoundOp, inputs: list[np.ndarray], actual: np.ndarray) -> Comparison:
    """`actual` (the op's output on `inputs`) compared with the op's numpy reference."""
    with np.errstate(invalid="ignore", over="ignore"):  # inputs may hold NaN and infinities
        expected = bound.op.reference(bound.attrs, *inputs)
    return compare(np.asarray(expected), actual, bound.op.exact)
