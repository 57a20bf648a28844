"""Device platforms as data: what deploy needs to build native code for an architecture and to
emulate it on this host.

Adding an architecture is one entry here once TVM publishes runtime wheels for it (armv7 and
riscv64 have none on PyPI yet).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from base.errors import UsageError


@dataclass(frozen=True)
class Platform:
    """An architecture ("aarch64", as `uname -m` and the ELF machine name it)."""

    arch: str
    wheel_tags: tuple[str, ...]
    """pip `--platform` tags of its TVM wheels, most specific first."""
    gxx: str
    """The C++ compiler that targets it from this host, and the Debian package that has it."""
    gxx_package: str
    triple: str = ""
    """The prefix of its GNU tools (`aarch64-linux-gnu`: -gcc, -nm, -objcopy, -ar), and the
    Debian packages of its C compiler and binutils."""
    gcc_package: str = ""
    binutils_package: str = ""
    qemu: str | None = None
    """qemu-user binary that runs it on this host, its package, and the `-L` library prefix
    (Debian's cross libc and libstdc++: no sysroot to provision)."""
    qemu_package: str = "qemu-user"
    qemu_prefix: str | None = None

    def tool(self, name: str) -> str:
        """The GNU tool `name` ("gcc", "nm", ...) that works on this architecture's code."""
        return f"{self.triple}-{name}"

    def native_here(self) -> bool:
        return self.arch == platform.machine()

    def emulator_command(self) -> list[str]:
        """The words that run a program of this architecture on this host."""
        if self.native_here():
            return []
        if self.qemu is None or self.qemu_prefix is None:
            raise UsageError(f"no emulator for {self.arch} on this {platform.machine()} host")
        return [self.qemu, "-L", self.qemu_prefix]


def debian_linux(arch: str, gxx_package: str, gcc_package: str, binutils_package: str) -> Platform:
    """A Linux architecture as Debian names its tools: `ARCH-linux-gnu-g++`, `qemu-ARCH`, the cross
    libc in `/usr/ARCH-linux-gnu`, and TVM's manylinux wheel tags for it."""
    return Platform(
        arch=arch,
        wheel_tags=tuple(f"{tag}_{arch}" for tag in ("manylinux_2_28", "manylinux2014", "manylinux_2_17")),
        gxx=f"{arch}-linux-gnu-g++",
        gxx_package=gxx_package,
        triple=f"{arch}-linux-gnu",
        gcc_package=gcc_package,
        binutils_package=binutils_package,
        qemu=f"qemu-{arch}",
        qemu_prefix=f"/usr/{arch}-linux-gnu",
    )


_PLATFORMS = {
    p.arch: p
    for p in (
        debian_linux(
            "aarch64", "g++-aarch64-linux-gnu", "gcc-aarch64-linux-gnu", "binutils-aarch64-linux-gnu"
        ),
        debian_linux("x86_64", "g++", "gcc", "binutils"),
    )
}


def get_platform(arch: str) -> Platform:
    """The platform of `arch`; a one-line error for one deploy cannot build for."""
    if arch not in _PLATFORMS:
        raise UsageError(
            f"no native TVM runtime for {arch}: TVM publishes runtime wheels for {', '.join(_PLATFORMS)}"
        )
    return _PLATFORMS[arch]
