"""The environment of the Python processes deploy starts that import TVM (MetaSchedule's builder
and runner workers, the RPC tracker): their PYTHONPATH names `worker_site`, whose sitecustomize
imports deploy at start-up, so that TVM's imports skip torch there as in deploy's own process
(deploy/__init__.py). Importing TVM took 6.4 s with torch and 2.4 s without on a 2-core VM, and
a 40-trial tune starts 13 workers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SITE = str(Path(__file__).with_name("worker_site"))


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `SITE` first on its PYTHONPATH (once)."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE]
    return {**env, "PYTHONPATH": os.pathsep.join([SITE, *paths])}


def hide_torch_in_workers() -> None:
    """This process's environment as `worker_env` makes it: MetaSchedule starts its workers with
    it, and gives no way to pass them another."""
    os.environ.update(worker_env(os.environ))
