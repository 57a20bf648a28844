"""Reading the machine of an ELF shared object, to refuse artifacts built for another CPU."""

from __future__ import annotations

from pathlib import Path

from ops.errors import UsageError

MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}


def elf_machine(path: Path) -> str:
    """The e_machine of `path` as a name like "x86_64" or "aarch64"."""
    with path.open("rb") as stream:
        header = stream.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise UsageError(f"module {path} is not an ELF shared object")
    order = "little" if header[5] == 1 else "big"
    number = int.from_bytes(header[18:20], order)
    return MACHINES.get(number, f"machine {number}")


def check_machine(path: Path, arch: str, device: str) -> None:
    machine = elf_machine(path)
    if machine != arch:
        raise UsageError(f"module {path} is built for {machine}; device {device} runs {arch}")
