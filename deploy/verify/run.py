"""Running built ops on a device and comparing them with their numpy references: the checks
before a run (architecture, CPU features, sha256, ELF machine) and one verification."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deploy.base.errors import UsageError
from deploy.compiler.cache import Buildable, cached_build
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target, get_target
from deploy.devices import Device, Session
from deploy.devices.elf import check_machine
from deploy.verify.compare import Comparison, compare_all


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
) -> list[np.ndarray]:
    """Check the module (sha256 against the manifest, ELF machine against the device), run it:
    its outputs, in order."""
    module = manifest.check_module(directory)
    if get_target(manifest.target).artifact.machine_code:
        check_machine(module, session.arch, session.label)
    elif manifest.arch != session.arch:
        raise UsageError(f"artifact {directory} is for {manifest.arch}; {session.label} runs {session.arch}")
    shapes = [a.shape for a in inputs]
    outputs = [(t.shape, t.dtype) for t in manifest.output_types(shapes)]
    workspace = manifest.arena_bytes(shapes)
    return session.run(module, inputs, outputs, entry=manifest.entry, workspace=workspace)


def verify(
    session: Session, item: Buildable, target: Target, options: BuildOptions, inputs: list[np.ndarray]
) -> tuple[Comparison, str]:
    """Build (cached, with `options` for the session's device: `for_device`) an op or a graph, run
    it on the session, compare with the numpy reference; with the schedule name."""
    comparison, manifest = verify_built(session, item, target, options, inputs)
    return comparison, manifest.built_with


def verify_built(
    session: Session, item: Buildable, target: Target, options: BuildOptions, inputs: list[np.ndarray]
) -> tuple[Comparison, Manifest]:
    """`verify`, with the manifest of what it built (its schedule and notes)."""
    directory, manifest = cached_build(item, target, for_device(options, session))
    actual = run_artifact(session, directory, manifest, inputs)
    return against_reference(item, inputs, actual), manifest


@dataclass(frozen=True)
class Expected:
    """What an item's outputs on some inputs are compared with: numpy's outputs, and where the
    item's comparison rule has a per-term part (`deploy/ops/tolerance.py`), the reference on the
    inputs' magnitudes that scales each output's bound (else None)."""

    outputs: list[np.ndarray]
    magnitudes: list[np.ndarray] | None


def expected_of(
    item: Buildable, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None
) -> Expected:
    """What `item`'s outputs on `inputs` are compared with: its numpy reference's, or `outputs`
    where another reference gave them (`matrix.py`'s onnxruntime)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inputs may hold NaN and infinities
        if outputs is None:
            outputs = item.references(*inputs)
        rule = item.rule()
        magnitudes = None
        if rule.per_term and not rule.exact and any(np.asarray(e).dtype.kind == "f" for e in outputs):
            magnitudes = item.references(*[np.abs(a) for a in inputs])
    return Expected(outputs, magnitudes)


def against_reference(item: Buildable, inputs: list[np.ndarray], actual: list[np.ndarray]) -> Comparison:
    """`actual` (the outputs of an op or a graph on `inputs`) compared with its numpy reference."""
    return against(item, expected_of(item, inputs), actual)


def against(item: Buildable, expected: Expected, actual: list[np.ndarray]) -> Comparison:
    """`actual` compared with `expected` under the item's rule (`deploy/ops/tolerance.py`):
    `deploy test`, `tune` and `bench` all compare here."""
    return compare_all(
        expected.outputs, actual, item.exact, list(item.output_names), item.rule(), expected.magnitudes
    )
