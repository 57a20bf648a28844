"""The loops of an op's compiled kernel, read from its disassembly: how many instructions each
loop body holds and which. It compares schedules where no board runs the code (NEON here).

    .venv/bin/python bench/inner_loops.py --target arm [--op max_pool2d --shape 32x64x112x112
        -a kernel=3 -a stride=2 -a padding=1]

Builds the op (by default its bench case; `-a` overrides its attributes, `--shape` replaces the
case) for the target as `deploy build` does, disassembles
its module.so with the target's objdump and prints every loop (a branch back to an earlier
address) of at least --min instructions, by address: its static instruction count and its
mnemonics, most frequent first. A loop that holds another runs the inner one many times per
step: multiply by its trip count.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from harness import run

from deploy.base.errors import UsageError
from deploy.cli.args import parse_attrs, parse_shape
from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.ops import TensorType, bind, get_op

OBJDUMP = {
    "x86_64": ("objdump", "binutils"),
    "aarch64": ("aarch64-linux-gnu-objdump", "binutils-aarch64-linux-gnu"),
}
"""Machine -> the objdump that disassembles it, and its Debian package."""
INSTRUCTION = re.compile(r"\s+([0-9a-f]+):\s+(\S+)\s*(.*)")
DIRECT_TARGET = re.compile(r"([0-9a-f]+)\s")


def is_branch(mnemonic: str, operands: str) -> bool:
    """A conditional or direct branch (x86 `j*` to an address; AArch64 `b`, `b.cond`, `cb*`, `tb*`)."""
    if mnemonic.startswith("j"):
        return not operands.startswith("*")
    return mnemonic in ("b", "cbz", "cbnz", "tbz", "tbnz") or mnemonic.startswith("b.")


def loops(listing: str) -> list[tuple[int, int, Counter[str]]]:
    """(first address, branch address, mnemonic counts) of each loop in an objdump -d listing."""
    instructions = [(int(m[1], 16), m[2], m[3]) for m in map(INSTRUCTION.match, listing.splitlines()) if m]
    found = []
    for address, mnemonic, operands in instructions:
        target = DIRECT_TARGET.match(operands + " ")
        if is_branch(mnemonic, operands) and target and int(target[1], 16) < address:
            start = int(target[1], 16)
            body = Counter(m.split(".")[0] for a, m, _ in instructions if start <= a <= address)
            found.append((start, address, body))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="arm")
    parser.add_argument("--op", default="max_pool2d")
    parser.add_argument("--shape", action="append", help="one per input (default: the bench case's)")
    parser.add_argument("-a", dest="attrs", action="append", default=[], help="key=value over the case's")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--min", type=int, default=8, help="leave out loops with fewer instructions")
    args = parser.parse_args()
    listing, title = disassembled(args)  # a target this host need not run: it is only built
    print(title)
    for start, end, body in loops(listing):
        count = sum(body.values())
        if count >= args.min:
            mix = ", ".join(f"{m} {n}" for m, n in body.most_common())
            print(f"  loop {start:x}-{end:x}: {count} instructions: {mix}")


def disassembled(args: argparse.Namespace) -> tuple[str, str]:
    """The objdump listing of the op built as `args` say, and a line saying what it is."""
    target, op = get_target(args.target), get_op(args.op)
    tool, package = OBJDUMP.get(target.arch, (None, None))
    if tool is None or shutil.which(tool) is None:
        raise UsageError(
            f"target {target.name} builds {target.arch} code: needs "
            + (f"{tool} (Debian package {package})" if tool else "a CPU target (x86*, arm*)")
        )
    case = op.bench_case()
    shapes = [parse_shape(s) for s in args.shape] if args.shape else case.shapes
    attrs = {**(case.attrs if not args.shape else {}), **parse_attrs(tuple(args.attrs))}
    bound = bind(op, attrs, [TensorType(shape, args.dtype) for shape in shapes])
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_op(bound, target, BuildOptions())
        manifest = export(compiled, Path(tmp))
        command = [tool, "-d", "--no-show-raw-insn", str(Path(tmp) / manifest.module)]
        listing = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    types = " ".join(map(str, bound.inputs))
    return listing, f"{bound.name} {types} for {target.name} ({compiled.schedule}), {tool}:"


if __name__ == "__main__":
    run(main)
