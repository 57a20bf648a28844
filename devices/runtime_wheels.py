"""The TVM runtime for a device, installed from PyPI wheels with the host's pip.

`pip install --target` with the device's platform and Python version fetches the right wheels on
any host (the pip cache keeps them for boards without internet); the compiler library is removed,
since a device only loads and runs modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ops.errors import DeployError

TVM_VERSION = "0.27.0"
WHEELS = (
    "apache-tvm==0.27.0.post1",
    "apache-tvm-ffi==0.1.14.post1",
    "numpy<2.3",
    "typing_extensions",
    "psutil",
    "cloudpickle",
)
PLATFORMS = {
    "aarch64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64"),
    "x86_64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"),
}


def install_runtime(target: Path, arch: str, python_version: tuple[int, int]) -> None:
    """Install the runtime wheels for `arch` and CPython `python_version` into `target`."""
    if arch not in PLATFORMS:
        raise DeployError(f"no TVM wheels for {arch} on PyPI (have: {', '.join(PLATFORMS)})")
    major, minor = python_version
    platforms = [arg for tag in PLATFORMS[arch] for arg in ("--platform", tag)]
    target.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--upgrade", "--target", str(target),
        *platforms, "--python-version", f"{major}.{minor}", "--implementation", "cp",
        "--abi", f"cp{major}{minor}", "--only-binary=:all:", *WHEELS,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise DeployError(f"pip could not fetch the {arch} TVM runtime for Python {major}.{minor}: {tail}")
    for library in (target / "tvm" / "lib").glob("libtvm_compiler*.so"):
        library.unlink()
