"""The build cache: artifacts keyed by op, attributes, input types, target and code version.

Lives in `builds/` of the cache root (`base/paths.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
from functools import cache
from pathlib import Path

import ops
import schedules
import toolchain
from base.paths import cache_root
from ops.spec import BoundOp
from toolchain.build.compile import compile_op
from toolchain.build.export import export, tvm_version
from toolchain.build.manifest import MANIFEST, Manifest, artifact_lock
from toolchain.build.targets import Target

_BUILDING = threading.Lock()
"""One build at a time: workers verifying in parallel share the cache (other processes sharing
it take turns through `artifact_lock`)."""


@cache
def _source_digest(module_file: str) -> str:
    return hashlib.sha256(Path(module_file).read_bytes()).hexdigest()


@cache
def _package_sources() -> tuple[str, ...]:
    """Every source file of the packages that shape a module (the op definitions, the schedules,
    the toolchain that lowers and links), found on disk: the key must not depend on what this
    process happened to import."""
    roots = [Path(directory) for package in (ops, schedules, toolchain) for directory in package.__path__]
    return tuple(sorted(str(path) for root in roots for path in root.rglob("*.py")))


def code_fingerprint(bound: BoundOp) -> str:
    """Hash of the source that decides the module: the packages above and the op's own file (a
    user op may live anywhere)."""
    files = {*_package_sources(), sys.modules[type(bound.op).__module__].__file__ or ""}
    return hashlib.sha256("".join(_source_digest(f) for f in sorted(files) if f).encode()).hexdigest()


def build_key(bound: BoundOp, target: Target) -> str:
    key = {
        **bound.key(),
        "target": json.loads(json.dumps(dataclasses.asdict(target), default=str)),
        "tvm": tvm_version(),
        "code": code_fingerprint(bound),
        "tuned": target.tuned.verdict(bound, target) if target.tuned else None,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def cached_build(bound: BoundOp, target: Target) -> tuple[Path, Manifest]:
    """The artifact directory for (bound, target), building it on a miss."""
    directory = cache_root() / "builds" / f"{bound.op.name}-{target.name}-{build_key(bound, target)}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _BUILDING:
        with artifact_lock(directory, shared=True):
            if (directory / MANIFEST).exists():
                return directory, Manifest.read(directory)
        return directory, export(compile_op(bound, target), directory, keep_existing=True)
