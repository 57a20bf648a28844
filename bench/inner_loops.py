"""The loops of an op's compiled kernel, read from its disassembly: how many instructions each
loop body holds and which. It compares schedules where no board runs the code (NEON here).

    .venv/bin/python bench/inner_loops.py --target arm [--op max_pool2d --shape 32x64x112x112
        -a kernel=3 -a stride=2 -a padding=1]

Builds the op (by default its bench case) for the target as `deploy build` does, disassembles
its module.so with the target's objdump and prints every loop (a branch back to an earlier
address) of at least --min instructions, by address: its static instruction count and its
mnemonics, most frequent first. A loop that holds another runs the inner one many times per
step: multiply by its trip count.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from ops import TensorType, bind, get_op
from toolchain.build.compile import compile_op
from toolchain.build.export import export
from toolchain.build.targets import get_target

OBJDUMP = {"x86_64": "objdump", "aarch64": "aarch64-linux-gnu-objdump"}
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
    parser.add_argument(
        "--shape", action="append", help="one per input, e.g. 32x64x112x112 (default: the bench case)"
    )
    parser.add_argument("-a", dest="attrs", action="append", default=[], help="attribute key=value")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--min", type=int, default=8, help="leave out loops with fewer instructions")
    args = parser.parse_args()
    target, op = get_target(args.target), get_op(args.op)
    case = op.bench_case()
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shape] if args.shape else case.shapes
    attrs = dict(item.split("=", 1) for item in args.attrs) if args.attrs or args.shape else case.attrs
    types = [TensorType(shape, args.dtype) for shape in shapes]
    bound = bind(op, attrs, types)
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_op(bound, target)
        manifest = export(compiled, Path(tmp))
        tool = OBJDUMP[target.arch]
        listing = subprocess.run(
            [tool, "-d", "--no-show-raw-insn", str(Path(tmp) / manifest.module)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    print(f"{bound.name} {' '.join(map(str, types))} for {target.name} ({compiled.schedule}), {tool}:")
    for start, end, body in loops(listing):
        count = sum(body.values())
        if count >= args.min:
            mix = ", ".join(f"{m} {n}" for m, n in body.most_common())
            print(f"  loop {start:x}-{end:x}: {count} instructions: {mix}")


if __name__ == "__main__":
    main()
