"""Streaming (non-temporal) stores for the large outputs of CPU kernels.

A plain store of a line not in cache first reads it (read-for-ownership): an elementwise op over
tensors past the last-level cache moves its output twice. A non-temporal store (x86 `movntps`,
AArch64 `stnp`) writes the line without reading it, and bypasses the caches, so a kernel reading
that tensor next would find it in memory: streamed are only outputs of at least the target's
`streaming_store_bytes` that no later kernel of the same call reads (an op's output, a graph's
output no later kernel takes), in kernels that never read them back.

TVM has no way to ask LLVM for such stores, so they are marked in LLVM IR: the output's buffer is
named with STREAMED (`streamed_name`), TVM names the pointer values after their buffers, and
`with_streaming_stores` adds `!nontemporal` to every store through a pointer derived from one of
those, then re-emits the module from the edited IR. A function that streams fences before each
of its returns (x86 `sfence`, elsewhere `fence seq_cst`: AArch64 `dmb ish`): non-temporal
stores are weakly ordered, and the thread that waits for a parallel task reads what it wrote.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from deploy.base.forked import FORK_LOCK

STREAMED = "deploy_nt_"
"""The prefix of a buffer name whose stores stream (`streamed_name`)."""

_VALUE = r"%[-\w.$]+"
_DEFINE = re.compile(r"^define\b")
_DERIVED = (
    re.compile(rf"^\s*({_VALUE}) = getelementptr\b[^,]*, ptr ({_VALUE})"),
    re.compile(rf"^\s*({_VALUE}) = phi ptr (.*)$"),
    re.compile(rf"^\s*({_VALUE}) = select i1 [^,]+, ptr (.*)$"),
)
_LOAD = re.compile(rf"=\s*load\b[^,]*, ptr ({_VALUE})")
_STORE = re.compile(rf"^\s*store\b[^,]*, ptr ({_VALUE})(?:,|$)")
_RET = re.compile(r"^\s*ret\b")
_NODE = re.compile(r"^!(\d+) = ", re.M)
_X86 = re.compile(r'^target triple = "x86_64', re.M)
SFENCE = "llvm.x86.sse.sfence"


def streamed_name(name: str) -> str:
    """The buffer name that makes the stores to a buffer named `name` stream."""
    return STREAMED + name


def streams(names: list[str]) -> bool:
    """Whether buffers named `names` can carry the STREAMED mark: none of them has it already
    (an op's own tensor so named would be streamed, or read as streamed, by mistake)."""
    return not any(name.startswith(STREAMED) for name in names)


def _function_streams(body: list[str]) -> set[int]:
    """The lines of one LLVM function's `body` holding stores to streamed buffers; none when it
    also loads from one (a kernel that reads its output back wants it in cache)."""
    derived = {m.group(0) for line in body for m in re.finditer(rf"%{STREAMED}[-\w.$]*", line)}
    if not derived:
        return set()
    grown = True
    while grown:  # a phi's incoming value may be defined below it: iterate to a fixed point
        grown = False
        for line in body:
            for pattern in _DERIVED:
                match = pattern.match(line)
                sources = set(re.findall(_VALUE, match.group(2))) if match else set()
                if match and match.group(1) not in derived and sources & derived:
                    derived.add(match.group(1))
                    grown = True
    if any((m := _LOAD.search(line)) and m.group(1) in derived for line in body):
        return set()
    return {i for i, line in enumerate(body) if (m := _STORE.match(line)) and m.group(1) in derived}


def stream_ir(text: str) -> str | None:
    """LLVM IR `text` with its stores to streamed buffers non-temporal and a fence before each
    return of a function that has any; None when there are none."""
    lines = text.splitlines()
    x86 = bool(_X86.search(text))
    fence = f"  call void @{SFENCE}()" if x86 else "  fence seq_cst"
    node = max((int(n) for n in _NODE.findall(text)), default=-1) + 1
    out: list[str] = []
    marked = False
    index = 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if not _DEFINE.match(line) or not line.rstrip().endswith("{"):
            continue
        end = next(i for i in range(index, len(lines)) if lines[i].startswith("}"))
        body = lines[index:end]
        stores = _function_streams(body)
        for i, instruction in enumerate(body):
            if i in stores:
                instruction += f", !nontemporal !{node}"
            elif stores and _RET.match(instruction):
                out.append(fence)
            out.append(instruction)
        marked = marked or bool(stores)
        index = end
    if not marked:
        return None
    declared = [f"declare void @{SFENCE}()"] if x86 and f"@{SFENCE}(" not in text else []
    return "\n".join([*out, *declared, f"!{node} = !{{i32 1}}", ""])


def with_streaming_stores(executable: Any) -> Any:
    """`executable` (a CPU build by `tvm.compile`) with the stores to its streamed buffers made
    non-temporal; itself when it has none."""
    import tvm

    module = executable.mod
    if module.kind != "llvm" or list(module.imports):
        return executable
    with FORK_LOCK:  # no fork mid-LLVM
        text = stream_ir(str(module.inspect_source("ll")))
        if text is None:
            return executable
        with tempfile.TemporaryDirectory(prefix="deploy-streaming-") as work:
            path = Path(work) / "module.ll"
            path.write_text(text)
            return tvm.runtime.Executable(tvm.runtime.load_module(str(path)))
