"""deploy: one namespace, so nothing else installed named `ops` or `base` shadows ours. The pipeline:
`ops` (what an op is; `ops/library` the shipped ones) -> `schedules` -> `compiler` (modules, bundles)
-> `devices` -> `verify`; `tune`, `bench`, `model` and the `cli` on top; `base` beneath all."""

import os
import sys
from types import FrameType
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
"""numpy's OpenBLAS on the calling thread only, unless asked otherwise (before numpy loads it):
its at-fork handler joins its worker threads, and a fork of `base/forked.py` while the main
thread was finishing a float64 reference matmul (`deploy test` of dense, 128x768 @ 768x768^T)
waited on one of them for good. The bench scripts set it per thread count for their numpy
baselines (`bench/harness.py`)."""


class _TorchHiddenFromTvm:
    """A finder that refuses `import torch` to TVM's own modules. tvm_ffi imports torch first
    whenever it can (a workaround for a symbol clash on Windows) and tvm.relax imports its DLPack
    helpers: 2.7 of the 5.5 s `import tvm` took on a 2-core VM, in every process that imports
    deploy (each CLI call), though deploy hands TVM no torch tensors. Anyone else's import of
    torch (the PyTorch baseline, ExecuTorch's export) finds it as usual."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name != "torch":
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
            frame = frame.f_back
        importer = "" if frame is None else str(frame.f_globals.get("__name__", ""))
        if importer.split(".")[0] in ("tvm", "tvm_ffi"):
            raise ModuleNotFoundError("deploy hides torch from TVM", name=name)


sys.meta_path.insert(0, _TorchHiddenFromTvm())
