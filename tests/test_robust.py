"""What a build survives: graphs of dead nodes, LLVM aborting in codegen, a full disk, a read-only
cache, and a hung emulated run (issue #49, items 6, 7 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import invoke, run_deploy
from tests.test_hostile import LLVM_ABORT_OP

DEAD = 2000


def dead_graph(path: Path, dead: int) -> Path:
    """A graph file of `dead` nodes no output reads, and one that is the output."""
    nodes = [f"  - {{name: d{i}, op: leaky_relu, inputs: [x]}}" for i in range(dead)]
    text = "\n".join(
        ["inputs: {x: {shape: [4, 8]}}", "nodes:", *nodes, "  - {name: y, op: leaky_relu, inputs: [x]}"]
    )
    path.write_text(f"{text}\noutput: y\n")
    return path


def test_dead_nodes_are_dropped_with_a_note(tmp_path):
    model = dead_graph(tmp_path / "dead.yaml", DEAD)
    result = invoke(
        "build", "--target", "x86", "--cores", "1", "--model", str(model), "-o", str(tmp_path / "out")
    )
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, result.stderr
    assert (
        f"{DEAD} node(s) compute nothing its outputs read; dropped: 'd0', 'd1', 'd2', 'd3', 'd4' ..."
        in notes[0]
    )
    graph = json.loads((tmp_path / "out/manifest.json").read_text())["graph"]
    assert [n["name"] for n in graph["nodes"]] == ["y"]
    assert [k["nodes"] for k in graph["kernels"]] == [["y"]]


def test_an_llvm_abort_is_one_line_and_the_cli_survives(tmp_path):
    """LLVM aborts the process it emits code in; the CLI's build emits it in a child, and says so."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops/crc.py").write_text(LLVM_ABORT_OP)
    args = ["--ops-path", str(tmp_path / "ops"), "build", "--target", "x86", "--op", "crc32w", "--shape", "1"]
    result = run_deploy(*args, "--dtype", "int32", "--cores", "1", "-o", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    said = "compiling module.so for target x86: LLVM aborted: Cannot select: intrinsic %llvm.aarch64.crc32w"
    assert result.stderr.splitlines() == [f"error: {said}"]
    assert not (tmp_path / "out").exists()
