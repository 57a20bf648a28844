"""A graph's constant tensors in its artifact: one blob, each constant at an ALIGNMENT-byte
offset, stored once however many kernels read it.

On CPUs the blob is linked into the module (and the C bundle) as read-only data behind one hidden
function, `deploy_constants()`, which the plan's `main` calls for the blob's address
(`plan.py`): the module runs as before, `main(inputs..., outputs..., arena)`, with nothing for a caller
to pass. OpenCL plans keep the blob as a file beside kernels.cl, pinned by launch.json's sha256,
which the runner uploads once (`opencl.py`).

The object is assembled with the target's C compiler (`.incbin` of the blob: no C initializer
of millions of bytes to compile).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from deploy.base.errors import DeployError, printable
from deploy.compiler.plan import CONSTANTS_SYMBOL, constant_offsets
from deploy.compiler.runtime import ALIGNMENT
from deploy.ops.graph import Constant

BLOB = "constants.bin"

SOURCE = f"""\
/* The graph's constants (deploy/compiler/constants.py): {BLOB}, {ALIGNMENT}-byte aligned. */
__asm__(".section .rodata\\n"
        ".balign {ALIGNMENT}\\n"
        "deploy_constant_blob:\\n"
        ".incbin \\"{BLOB}\\"\\n"
        ".previous\\n");
/* hidden: addressed PC-relative, never through a GOT entry (aarch64's GOT relocations against a
 * local label plus an addend give another address in a static link) */
extern const unsigned char deploy_constant_blob[] __attribute__((visibility("hidden")));
__attribute__((visibility("hidden"))) const void* {CONSTANTS_SYMBOL}(void) {{ return deploy_constant_blob; }}
"""


def write_blob(constants: Sequence[Constant], path: Path) -> None:
    """The blob: the constants' bytes at their `constant_offsets`, zeros between."""
    with path.open("wb") as out:
        for constant, offset in zip(constants, constant_offsets(constants), strict=True):
            out.write(b"\0" * (offset - out.tell()))
            out.write(constant.data)


def constants_object(constants: Sequence[Constant], gcc: str, work: Path) -> Path:
    """The object defining `deploy_constants()` over the blob of `constants`, compiled as C by
    `gcc` (the target's compiler, g++ too) in `work` (a directory of the build's own)."""
    write_blob(constants, work / BLOB)
    (work / "constants.c").write_text(SOURCE)
    obj = work / "constants.o"
    try:
        proc = subprocess.run(
            [gcc, "-x", "c", "-c", "-fPIC", "-O2", "constants.c", "-o", obj.name],
            cwd=work,
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        raise DeployError(f"{gcc} on the graph's constants failed: {printable(str(exc))}") from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        raise DeployError(f"{gcc} on the graph's constants failed: {printable(said[0] if said else '')}")
    return obj
