"""The emulator deploy had before the native runtime, kept as the baseline of
`bench/emulator_start.py`: TVM's Python RPC server on Debian's arm64 python3.11 under qemu-aarch64.

The sysroot is built in `<cache>/bench-python-emulator` without touching the host's package
state: apt runs with a private configuration (arm64 architecture, empty dpkg status, its own lists
and archives), the .debs are unpacked with `dpkg -x`, and pip installs the aarch64 wheels with
`--target` (the compiler library removed). Each step leaves a stamp, so an interrupted run resumes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from deploy.base.errors import DeployError

DEBIAN_PACKAGES = ("python3.11", "libpython3.11-stdlib", "libstdc++6")
PYTHON = "usr/bin/python3.11"
SITE = "usr/lib/python3/dist-packages"
STEPS = ("apt-update", "apt-download", "unpack", "wheels")
WHEELS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy<2.3", "typing_extensions",
          "psutil", "cloudpickle")  # fmt: skip

Progress = Callable[[str, int, int], None]
"""progress(step description, steps done, steps total)."""


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise DeployError(f"emulator set-up failed while {what}: {tail}")


class Sysroot:
    """An arm64 root filesystem under `root.parent` with its apt state beside it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "sysroot"
        self.apt = base / "apt"

    @property
    def python(self) -> Path:
        return self.root / PYTHON

    def ready(self) -> bool:
        return all((self.base / f".done-{step}").exists() for step in STEPS)

    def _apt_env(self) -> dict[str, str]:
        config = self.apt / "apt.conf"
        if not config.exists():
            for sub in ("lists/partial", "archives/partial", "etc"):
                (self.apt / sub).mkdir(parents=True, exist_ok=True)
            (self.apt / "status").touch()
            sources = [str(p) for p in Path("/etc/apt/sources.list.d").glob("*.sources")]
            sources += [str(p) for p in Path("/etc/apt/sources.list.d").glob("*.list")]
            lines = [
                'APT::Architecture "arm64";',
                'APT::Architectures { "arm64"; };',
                f'Dir::State "{self.apt}";',
                f'Dir::State::status "{self.apt / "status"}";',
                f'Dir::State::Lists "{self.apt / "lists"}";',
                f'Dir::Cache "{self.apt}";',
                f'Dir::Cache::Archives "{self.apt / "archives"}";',
                f'Dir::Etc::SourceParts "{self.apt / "etc"}";',
                'Dir::Etc::SourceList "/dev/null";',
                'APT::Sandbox::User "root";' if os.geteuid() == 0 else "",
                'Debug::NoLocking "true";',
            ]
            for source in sources:
                if source.endswith((".sources", ".list")) and "disabled" not in source:
                    shutil.copy(source, self.apt / "etc")
            config.write_text("\n".join(line for line in lines if line) + "\n")
        return {"APT_CONFIG": str(config)}

    def provision(self, progress: Progress = lambda step, done, total: None) -> None:
        """Build whatever is missing; a no-op when the sysroot is complete."""
        if shutil.which("apt-get") is None:
            raise DeployError("emulator set-up needs apt-get (a Debian or Ubuntu host)")
        self.base.mkdir(parents=True, exist_ok=True)
        actions = {
            "apt-update": ("updating arm64 package lists", self._apt_update),
            "apt-download": ("downloading arm64 python3.11", self._apt_download),
            "unpack": ("unpacking the sysroot", self._unpack),
            "wheels": ("installing the aarch64 TVM runtime", self._wheels),
        }
        for index, step in enumerate(STEPS):
            stamp = self.base / f".done-{step}"
            description, action = actions[step]
            progress(description, index, len(STEPS))
            if not stamp.exists():
                action()
                stamp.touch()
        progress("sysroot ready", len(STEPS), len(STEPS))

    def _apt_update(self) -> None:
        _run(["apt-get", "update", "-q"], "updating arm64 package lists", self._apt_env())

    def _apt_download(self) -> None:
        _run(
            ["apt-get", "install", "-d", "-y", "-q", "--no-install-recommends", *DEBIAN_PACKAGES],
            "downloading arm64 packages",
            self._apt_env(),
        )

    def _unpack(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        debs = sorted((self.apt / "archives").glob("*.deb"))
        if not debs:
            raise DeployError("emulator set-up: apt downloaded no arm64 packages")
        for deb in debs:
            _run(["dpkg", "-x", str(deb), str(self.root)], f"unpacking {deb.name}")

    def _wheels(self) -> None:
        site = self.root / SITE
        _run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(site),
             "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64",
             "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
             "--only-binary=:all:", *WHEELS],
            "installing the aarch64 TVM wheels",
        )  # fmt: skip
        for library in (site / "tvm" / "lib").glob("libtvm_compiler*.so"):
            library.unlink()

    def server_command(self, port: int, tracker: str | None = None, key: str = "") -> list[str]:
        """TVM's Python RPC server under qemu (`-0` makes the emulated Python see the wrapper as its
        executable, so the worker processes it starts run under qemu too)."""
        wrapper = self.base / "python-aarch64"
        root, python = shlex.quote(str(self.root)), shlex.quote(str(self.python))  # paths, never code
        wrapper.write_text(f'#!/bin/sh\nexec qemu-aarch64 -L {root} -0 "$0" {python} "$@"\n')
        wrapper.chmod(0o755)
        cmd = [str(wrapper), "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
               "--port-end", str(port + 1)]  # fmt: skip
        return cmd + (["--tracker", tracker, "--key", key] if tracker else [])
