"""The build cache: artifacts keyed by op, attributes, input types, target and code version.

Lives in `builds/` of the cache root (`deploy/base/paths.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from deploy.base.files import name_part
from deploy.base.paths import cache_root, check_cache_writable
from deploy.compiler.compile import LaidOut, compile_graph, compile_op, lay_out, prim_module
from deploy.compiler.export import export, tvm_version
from deploy.compiler.fingerprint import DEPLOY_PACKAGES, code_fingerprint
from deploy.compiler.manifest import Manifest, artifact_lock
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.ops.graph import BoundGraph
from deploy.ops.spec import BoundOp
from deploy.schedules.registry import strategy_modules

Buildable = BoundOp | BoundGraph
"""What deploy builds: one op, or a graph of them."""

_BUILDING = threading.Lock()
"""One build at a time: workers verifying in parallel share the cache (other processes sharing
it take turns through `artifact_lock`)."""


def _tuned(item: Buildable, target: Target, options: BuildOptions, laid: LaidOut | None) -> Any:
    """What the records `--tuned` names say for the item: for a graph (`laid` out as they say,
    else laid out here), the layout tuning accepted and the verdict per kernel."""
    if options.tuned is None:
        return None
    if isinstance(item, BoundGraph):
        laid = laid or lay_out(item, target, options)
        return {
            "layout": laid.layout.name,
            "kernels": [options.tuned.verdict(k.bound, target) for k in laid.kernels],
        }
    return options.tuned.verdict(item, target)


def user_computations(item: Buildable, target: Target, options: BuildOptions) -> list[str]:
    """A hash of the computation (its TIR) of each node of `item` whose op is a user's (its file
    outside deploy's packages): what a user op computes may hang on more than its source, on a
    data file it reads or a module it loads with importlib, and an edited one gave the cached
    module's stale answer (#37). Deploy's own ops are keyed by their source alone: computing a
    TIR costs milliseconds a build, and the matrix asks thousands of times."""
    bounds = [item] if isinstance(item, BoundOp) else [n.bound for n in item.nodes]
    return [
        hashlib.sha256(prim_module(bound, target, options).script().encode()).hexdigest()[:24]
        for bound in bounds
        if not any(type(op).__module__.partition(".")[0] in DEPLOY_PACKAGES for op in bound.ops())
    ]


def build_key(item: Buildable, target: Target, options: BuildOptions, laid: LaidOut | None = None) -> str:
    """The cache key of (an op or a graph, target, options): the item, the target's fields and
    every build choice (the records as the verdicts they give, `_tuned`: not the records object),
    the TVM and code versions, and what user ops compute (`user_computations`)."""
    choices = dataclasses.asdict(dataclasses.replace(options, tuned=None))
    settings = {**dataclasses.asdict(target), **choices}
    key = {
        **item.key(),
        "target": json.loads(json.dumps(settings, default=str)),
        "tvm": tvm_version(),
        "code": code_fingerprint({type(op).__module__ for op in item.ops()} | strategy_modules()),
        "tuned": _tuned(item, target, options, laid),
        "user": user_computations(item, target, options),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def _cached(directory: Path, key: str, target: Target) -> Manifest | None:
    """The manifest of the entry at `directory` when it is the whole build of `key`."""
    with artifact_lock(directory, shared=True):
        return Manifest.cached(directory, key, target.artifact)


def cached_build(item: Buildable, target: Target, options: BuildOptions) -> tuple[Path, Manifest]:
    """The artifact directory for (an op or a graph, target, options), building it on a miss; an entry
    that is not the whole build of its key (`Manifest.cached`) is built again. A `--tuned`
    graph is laid out once (`lay_out`: its verdicts read once), for its key and its build; any
    other is laid out only on a miss (its key does not need it)."""
    laid = (
        lay_out(item, target, options) if isinstance(item, BoundGraph) and options.tuned is not None else None
    )
    key = build_key(item, target, options, laid)
    directory = cache_root() / "builds" / f"{name_part(item.name)}-{target.name}-{key}"
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        manifest = _cached(directory, key, target)
        if manifest is not None:  # a lookup waits for no other thread's build
            return directory, manifest
        with _BUILDING:
            manifest = _cached(directory, key, target)  # built while this thread waited
            if manifest is not None:
                return directory, manifest
            compiled = (
                compile_graph(item, target, options, laid)
                if isinstance(item, BoundGraph)
                else compile_op(item, target, options)
            )
            return directory, export(compiled, directory, cache_key=key)
    except OSError:
        check_cache_writable(directory.parent)
        raise
