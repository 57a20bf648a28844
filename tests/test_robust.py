"""What a build survives: graphs of dead nodes, LLVM aborting in codegen, a full disk, a read-only
cache, and a hung emulated run (issue #49, items 6, 7 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import invoke

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
