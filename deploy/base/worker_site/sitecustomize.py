"""Imported by Python at start-up in the processes deploy starts to run TVM's own entry points
(MetaSchedule's builder and runner workers, the RPC tracker), whose PYTHONPATH names this
directory (`deploy.base.tvm_workers`): importing deploy hides torch from TVM's imports there too
(deploy/__init__.py). Then the sitecustomize this one shadows, if the Python has one, runs as it
would have (Debian's, for one)."""

import importlib.machinery
import importlib.util
import os
import sys

import deploy  # noqa: F401  (its import is the point)

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
)
if _spec is not None and _spec.loader is not None:
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
