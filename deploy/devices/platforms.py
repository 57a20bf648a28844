"""Device platforms as data: what deploy needs to build native code for an architecture and to
emulate it on this host.

Adding an architecture is one entry here. One without TVM runtime wheels (armv7l and riscv64:
none on PyPI) runs deploy's C bundles only, through their runner (`deploy/devices/runner.py`), never
TVM's RPC server.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass

from deploy.base.errors import DeployError, UsageError


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
    qemu_args: tuple[str, ...] = ()
    """What qemu needs to run the code a target builds (`-cpu rv64,v=true`: RVV 1.0)."""

    @property
    def tvm_runtime(self) -> bool:
        """TVM publishes runtime wheels for it: its devices can run TVM's RPC server."""
        return bool(self.wheel_tags)

    def tool(self, name: str) -> str:
        """The GNU tool `name` ("gcc", "nm", ...) that works on this architecture's code."""
        return f"{self.triple}-{name}"

    def native_here(self) -> bool:
        return self.arch == platform.machine()

    def require_emulator(self) -> None:
        """A one-line DeployError naming the Debian package when its qemu is not on this host
        (nothing is needed where it is this host's own architecture)."""
        if not self.native_here() and (self.qemu is None or shutil.which(self.qemu) is None):
            raise DeployError(f"{self.qemu} not found: install the Debian package {self.qemu_package}")

    def emulator_command(self) -> list[str]:
        """The words that run a program of this architecture on this host."""
        if self.native_here():
            return []
        if self.qemu is None or self.qemu_prefix is None:
            raise UsageError(f"no emulator for {self.arch} on this {platform.machine()} host")
        return [self.qemu, *self.qemu_args, "-L", self.qemu_prefix]


def debian_linux(
    arch: str, triple: str, qemu: str, wheels: bool = True, qemu_args: tuple[str, ...] = ()
) -> Platform:
    """A Linux architecture as Debian names its tools: `TRIPLE-g++` in `g++-TRIPLE` (the host's
    own `g++` for the host), `qemu-ARCH`, the cross libc in `/usr/TRIPLE`, and TVM's manylinux
    wheel tags for it where TVM publishes wheels."""
    host = arch == "x86_64"
    tags = ("manylinux_2_28", "manylinux2014", "manylinux_2_17") if wheels else ()
    return Platform(
        arch=arch,
        wheel_tags=tuple(f"{tag}_{arch}" for tag in tags),
        gxx=f"{triple}-g++",
        gxx_package="g++" if host else f"g++-{triple}",
        triple=triple,
        gcc_package="gcc" if host else f"gcc-{triple}",
        binutils_package="binutils" if host else f"binutils-{triple}",
        qemu=f"qemu-{qemu}",
        qemu_prefix=f"/usr/{triple}",
        qemu_args=qemu_args,
    )


RVV_CPU = ("-cpu", "rv64,v=true,vlen=128,vext_spec=v1.0")
"""qemu's riscv64 CPU with RVV 1.0 (its default has no V: vector code is SIGILL) at VLEN 128,
the narrowest boards' (SpacemiT K1 has 256, Kendryte K230 128)."""

_PLATFORMS = {
    p.arch: p
    for p in (
        debian_linux("aarch64", "aarch64-linux-gnu", "aarch64"),
        debian_linux("x86_64", "x86_64-linux-gnu", "x86_64"),
        debian_linux("armv7l", "arm-linux-gnueabihf", "arm", wheels=False),
        debian_linux("riscv64", "riscv64-linux-gnu", "riscv64", wheels=False, qemu_args=RVV_CPU),
    )
}


def get_platform(arch: str) -> Platform:
    """The platform of `arch`; a one-line error for one deploy cannot build for."""
    if arch not in _PLATFORMS:
        raise UsageError(f"no platform {arch!r}: deploy builds for {', '.join(_PLATFORMS)}")
    return _PLATFORMS[arch]


def tvm_runtime_platform(arch: str) -> Platform:
    """The platform of `arch` where it has TVM's runtime (an RPC server can run there)."""
    found = get_platform(arch)
    if not found.tvm_runtime:
        wheels = ", ".join(p.arch for p in _PLATFORMS.values() if p.tvm_runtime)
        raise UsageError(
            f"no native TVM runtime for {arch}: TVM publishes runtime wheels for {wheels};"
            " its devices run deploy's C bundles through their runner"
        )
    return found
