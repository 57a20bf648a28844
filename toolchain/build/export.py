"""Write a compiled op into an artifact directory with its manifest, atomically (all or nothing)."""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from base.errors import DeployError
from toolchain.build.bundle import write_bundle
from toolchain.build.compile import Compiled
from toolchain.build.manifest import MANIFEST, Manifest, sha256_file


def deploy_version() -> str:
    try:
        return version("deploy-toolchain")
    except PackageNotFoundError:
        return "0+unknown"


def tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def export(compiled: Compiled, directory: Path, bundle: bool = False) -> Manifest:
    """Write `directory` with the artifact and manifest.json, atomically (all or nothing); with
    `bundle`, also the files that call the module from C (see `bundle.py`)."""
    directory = Path(directory)
    if directory.exists() and not (directory / MANIFEST).exists() and any(directory.iterdir()):
        raise DeployError(f"output directory {directory} exists and is not an artifact: not replacing it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        target, bound = compiled.target, compiled.bound
        module = target.artifact.write(compiled.executable, staging, target)
        bundled = write_bundle(bound, target, staging, module) if bundle else None
        key = bound.key()
        manifest = Manifest(
            op=bound.op.name,
            attrs=key["attrs"],
            inputs=[
                {"name": spec.name, **t.to_json()}
                for spec, t in zip(bound.op.inputs, bound.inputs, strict=True)
            ],
            output=bound.output.to_json(),
            target=target.name,
            tvm_target=dict(target.tvm),
            arch=target.arch,
            schedule=compiled.schedule,
            tuning_record=compiled.tuning_record,
            tuning=compiled.tuning,
            cores=target.build_cores() if target.artifact.splits_for_cores else None,
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
