"""Build an op for a target: TE -> PrimFunc -> schedule -> compiled module -> artifact directory."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ops.errors import DeployError
from ops.spec import BoundOp
from schedules import ScheduleContext, find_schedule
from toolchain.bundle import write_bundle
from toolchain.cpu_lowering import compile_cpu
from toolchain.manifest import MANIFEST, Manifest, sha256_file
from toolchain.targets import Target

MODULE_FILE = "module.so"
OPENCL_SOURCE = "kernels.cl"
OPENCL_PLAN = "launch.json"


def deploy_version() -> str:
    try:
        return version("deploy-toolchain")
    except PackageNotFoundError:
        return "0+unknown"


def tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def context(bound: BoundOp, target: Target) -> ScheduleContext:
    """What the target's strategy sees: the op, vector width, the device's cores, work-group size."""
    return ScheduleContext(bound, target.vector_bits, target.build_cores(), target.work_group)


def prim_module(bound: BoundOp, target: Target) -> Any:
    """The op as an IRModule with one PrimFunc `main(inputs..., out)`: the computation the target's
    strategy pairs with its schedule (the op's own unless the family has a variant), run inside the
    target's context (`tvm.target.Target.current()`), as TOPI does."""
    import tvm
    from tvm import te

    placeholders = [
        te.placeholder(t.shape, t.dtype, name=spec.name)
        for spec, t in zip(bound.op.inputs, bound.inputs, strict=True)
    ]
    strategy = find_schedule(target.schedules, bound.op.name)
    with target.tvm_target():
        if strategy is not None and strategy.compute is not None:
            out = strategy.compute(context(bound, target), *placeholders)
        else:
            out = bound.op.compute(bound.attrs, bound.output, *placeholders)
    return tvm.IRModule({"main": te.create_prim_func([*placeholders, out])})


def schedule(bound: BoundOp, target: Target) -> tuple[Any, str, str | None]:
    """The scheduled IRModule, the schedule's name ("tuned", "cpu/maxpool_add", "cpu/generic",
    "default") and, for "tuned", the id of the tuning record it applies."""
    if target.tuned is not None:
        tuned = tuned_schedule(bound, target)
        if tuned is not None:
            return tuned[0], "tuned", tuned[1]
    return (*hand_schedule(bound, target), None)


def tuned_schedule(bound: BoundOp, target: Target) -> tuple[Any, str] | None:
    """The op scheduled as the accepted record in `target.tuned` says, with the record's id: a
    MetaSchedule trace, or for OpenCL the GPU schedule with the tuned work-group size. None when
    there is no accepted record for this op, these attributes and input types."""
    from toolchain.tuning_db import accepted, task_dir, tuned_module

    if target.tuned is None:
        return None
    directory = task_dir(target.tuned, bound, target.name)
    entry = accepted(directory)
    if entry is None:
        return None
    if "work_group" in entry:
        sized = replace(target, work_group=int(entry["work_group"]))
        return hand_schedule(bound, sized)[0], entry["record"]
    tuned = tuned_module(directory, entry["record"], prim_module(bound, target))
    return (tuned, entry["record"]) if tuned is not None else None


def hand_schedule(bound: BoundOp, target: Target) -> tuple[Any, str]:
    """The op scheduled by the target's strategy (or left as is: "default"), with its label."""
    import tvm

    sch = tvm.s_tir.Schedule(prim_module(bound, target))
    strategy = find_schedule(target.schedules, bound.op.name)
    if strategy is None:
        return sch.mod, "default"
    strategy.schedule(sch, context(bound, target))
    return sch.mod, strategy.label


@dataclass
class Compiled:
    """A compiled op: the TVM executable, the schedule it was built with and, for a tuned
    schedule, the tuning record's id."""

    bound: BoundOp
    target: Target
    executable: Any
    schedule: str
    tuning_record: str | None = None


def compile_op(bound: BoundOp, target: Target) -> Compiled:
    """Schedule and compile: a TVM executable, or for OpenCL targets the source and launch plan."""
    mod, name, record = schedule(bound, target)
    return compile_scheduled(bound, target, mod, name, record)


def compile_scheduled(
    bound: BoundOp, target: Target, mod: Any, name: str, record: str | None = None
) -> Compiled:
    """Compile an already scheduled IRModule of `bound` for `target`."""
    if target.artifact == "opencl":
        from toolchain.opencl import compile_opencl

        return Compiled(
            bound, target, compile_opencl(mod, target.tvm_target(), len(bound.inputs)), name, record
        )
    return Compiled(bound, target, compile_cpu(mod, target.tvm_target()), name, record)


def _write_shared_object(compiled: Compiled, staging: Path) -> Path:
    module = staging / MODULE_FILE
    linker = _linker(compiled.target)
    if linker is None:
        compiled.executable.export_library(str(module))
    else:
        compiled.executable.export_library(str(module), fcompile=linker)
    return module


def _write_opencl(compiled: Compiled, staging: Path) -> Path:
    """kernels.cl and launch.json (which pins the source by sha256); the manifest pins launch.json."""
    source = staging / OPENCL_SOURCE
    source.write_text(compiled.executable.source)
    plan = staging / OPENCL_PLAN
    body = {"source": OPENCL_SOURCE, "source_sha256": sha256_file(source), **compiled.executable.plan}
    plan.write_text(json.dumps(body, indent=2) + "\n")
    return plan


ARTIFACT_WRITERS = {"shared-object": _write_shared_object, "opencl": _write_opencl}
"""How each kind of target artifact is written into the staging directory; returns the module file."""


def _linker(target: Target) -> Any:
    if target.cross_compiler is None:
        return None
    from tvm.support import cc

    if shutil.which(target.cross_compiler) is None:
        raise DeployError(
            f"cross compiler {target.cross_compiler} for target {target.name} not found:"
            f" install the Debian package {target.cross_package}"
        )
    return cc.cross_compiler(target.cross_compiler)


def export(compiled: Compiled, directory: Path, bundle: bool = False) -> Manifest:
    """Write `directory` with the module and manifest.json, atomically (all or nothing); with
    `bundle`, also the files that call the module from C (see toolchain/bundle.py)."""
    directory = Path(directory)
    if directory.exists() and not (directory / MANIFEST).exists() and any(directory.iterdir()):
        raise DeployError(f"output directory {directory} exists and is not an artifact: not replacing it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        module = ARTIFACT_WRITERS[compiled.target.artifact](compiled, staging)
        bound = compiled.bound
        bundled = write_bundle(bound, compiled.target, staging, module) if bundle else None
        key = bound.key()
        manifest = Manifest(
            op=bound.op.name,
            attrs=key["attrs"],
            inputs=[
                {"name": spec.name, **t.to_json()}
                for spec, t in zip(bound.op.inputs, bound.inputs, strict=True)
            ],
            output=bound.output.to_json(),
            target=compiled.target.name,
            tvm_target=dict(compiled.target.tvm),
            arch=compiled.target.arch,
            schedule=compiled.schedule,
            tuning_record=compiled.tuning_record,
            cores=None if compiled.target.artifact == "opencl" else compiled.target.build_cores(),
            bundle=bundled,
            module=module.name,
            sha256=sha256_file(module),
            tvm_version=tvm_version(),
            deploy_version=deploy_version(),
        )
        manifest.write(staging)
        _replace_dir(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _replace_dir(staging: Path, directory: Path) -> None:
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
        os.replace(directory, old / "previous")
        os.replace(staging, directory)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, directory)
