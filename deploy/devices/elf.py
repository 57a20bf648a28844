"""Reading ELF files: the machine an object is built for (to refuse artifacts built for another CPU)
and the glibc/libstdc++ symbol versions it needs or a library provides (to refuse a board whose
libraries are too old before anything is pushed to it)."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Literal, Protocol

from deploy.base.errors import UsageError

MACHINES = {3: "i386", 40: "armv7l", 62: "x86_64", 183: "aarch64", 243: "riscv64"}
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
VERSION = re.compile(r"^(GLIBC|GLIBCXX)_(\d+(?:\.\d+)*)$")

Version = tuple[int, ...]


class Readable(Protocol):
    """What the section readers use of a file: a local one, or a board's read through a cap."""

    def seek(self, offset: int, /) -> object: ...

    def read(self, size: int, /) -> bytes: ...


def elf_machine(path: Path) -> str:
    """The e_machine of `path` as a name like "x86_64" or "aarch64"."""
    with path.open("rb") as stream:
        header = stream.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise UsageError(f"module {path} is not an ELF shared object")
    order: Literal["little", "big"] = "little" if header[5] == 1 else "big"
    number = int.from_bytes(header[18:20], order)
    return MACHINES.get(number, f"machine {number}")


def check_machine(path: Path, arch: str, device: str) -> None:
    machine = elf_machine(path)
    if machine != arch:
        raise UsageError(f"module {path} is built for {machine}; device {device} runs {arch}")


def _sections(stream: Readable, name: str) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, size, link, info) of every section of a 64-bit little-endian ELF."""
    stream.seek(0)
    header = stream.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise UsageError(f"{name} is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    stream.seek(shoff)
    table = stream.read(shentsize * shnum)
    sections = []
    for index in range(shnum):
        _, kind, _, _, offset, size, link, info = struct.unpack_from("<IIQQQQII", table, index * shentsize)
        sections.append((kind, offset, size, link, info))
    return sections


def _names(stream: Readable, name: str, kind: int) -> set[str]:
    """Version names in the verneed (needed) or verdef (defined) section."""
    sections = _sections(stream, name)
    found: set[str] = set()
    for section_kind, offset, size, link, count in sections:
        if section_kind != kind:
            continue
        stream.seek(offset)
        data = stream.read(size)
        _, str_offset, str_size, _, _ = sections[link]
        stream.seek(str_offset)
        strings = stream.read(str_size)
        entry = 0
        for _ in range(count):
            if kind == SHT_GNU_VERNEED:  # Elf64_Verneed: version, cnt, file, aux, next
                _, aux_count, _, aux, step = struct.unpack_from("<HHIII", data, entry)
            else:  # Elf64_Verdef: version, flags, ndx, cnt, hash, aux, next
                _, _, _, aux_count, _, aux, step = struct.unpack_from("<HHHHIII", data, entry)
            at = entry + aux
            for _ in range(aux_count if kind == SHT_GNU_VERNEED else min(aux_count, 1)):
                if kind == SHT_GNU_VERNEED:  # Elf64_Vernaux: hash, flags, other, name, next
                    _, _, _, name_at, aux_step = struct.unpack_from("<IHHII", data, at)
                else:  # Elf64_Verdaux: name, next
                    name_at, aux_step = struct.unpack_from("<II", data, at)
                found.add(strings[name_at : strings.index(b"\0", name_at)].decode(errors="replace"))
                at += aux_step
            entry += step
            if not step:
                break
    return found


def _newest(names: set[str]) -> dict[str, Version]:
    """The newest GLIBC_ and GLIBCXX_ version among `names`."""
    newest: dict[str, Version] = {}
    for name in names:
        match = VERSION.match(name)
        if match:
            version = tuple(int(part) for part in match.group(2).split("."))
            newest[match.group(1)] = max(newest.get(match.group(1), ()), version)
    return newest


def required_versions(paths: list[Path]) -> dict[str, Version]:
    """The newest GLIBC and GLIBCXX symbol versions that these objects need, together."""
    names: set[str] = set()
    for path in paths:
        with path.open("rb") as stream:
            names |= _names(stream, str(path), SHT_GNU_VERNEED)
    return _newest(names)


def provided_versions(stream: Readable, name: str) -> dict[str, Version]:
    """The newest GLIBC or GLIBCXX version a library (libc.so.6, libstdc++.so.6) defines; `stream`
    may be a remote file (SFTP): only the section table and two sections are read."""
    return _newest(_names(stream, name, SHT_GNU_VERDEF))


def version_text(version: Version) -> str:
    return ".".join(map(str, version))
