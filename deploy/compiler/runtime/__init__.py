"""The C every bundle is built from (package data beside this file, compiled by `bundle.py` and
`cl_bundle.py` into each bundle), and the constants Python reads from its one public header:

    abi.h             the alignment, the tensors' most dims and the error codes, spelled only there
    runtime.h/.c      what TVM's kernels call: parallel launch, scratch memory, errors (one
                      runtime per process: its SHARED functions, exported weak)
    bundle.h          what a bundle was built for (its tensors, its arena), for its API and runner
    bundle_names.h    the API's names: DEPLOY_API(_run) is NAME_run
    bundle_check.h/.c the checks the API makes of every tensor, and its one-line errors (the
                      .c compiled once per compiler, the .h making the bundle it checks for)
    bundle.c          a CPU bundle's API over its kernels (an op's `main` or a graph's plan)
    cl_bundle.c       an OpenCL bundle's API over its launch plan
    runner_glue.c     the bundle's signature for its runner
    run.cc, sha256.h  deploy-run, the bundle's runner on .npy files (the same for every bundle)
"""

from __future__ import annotations

import re
from pathlib import Path

SOURCES = Path(__file__).resolve().parent
ABI_HEADER = SOURCES / "abi.h"


def _defines(header: Path) -> dict[str, int]:
    """The integer `#define DEPLOY_X value` lines of `header`, as {X: value}, in order."""
    found = re.findall(r"^#define DEPLOY_(\w+) \(?(-?\d+)\)?(?:\s|$)", header.read_text(), re.M)
    return {name: int(value) for name, value in found}


ABI = _defines(ABI_HEADER)
"""Every constant of abi.h by its name less DEPLOY_ (ALIGNMENT, ERR_ARGUMENT ...)."""
ALIGNMENT = ABI["ALIGNMENT"]
"""Bytes TVM's kernels assume every buffer is aligned to (its kAllocAlignment): the arena, its
slots and the constants' blob are laid out to it, and it is a target's default tensor alignment."""
MAX_DIMS = ABI["MAX_DIMS"]
"""The most dims a bundle's tensor may have."""
ERRORS = {name: value for name, value in ABI.items() if name.startswith("ERR_")}
"""What a bundle's functions return when they fail, by name (ERR_ARGUMENT ...): NAME.h defines
NAME_ERR_ARGUMENT ... with these values."""
SHARED = tuple(
    re.findall(
        r"^DEPLOY_RT_SHARED [^(]*?\b(deploy_rt\d+_\w+)\(",
        (SOURCES / "runtime.h").read_text(),
        re.M,
    )
)
"""The runtime's functions every bundle exports weak, so that the bundles of one process bind to
one runtime (runtime.h): deploy_rt1_set_num_threads ..."""
