"""The build cache key covers everything that shapes the emitted code (issue #13, defect 1): the
source of every build-side module, including those imported late or never by this process, and
every field of the target."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import toolchain.build.cache as cache
from ops import TensorType, bind, get_op
from toolchain.build.targets import get_target

POOL = {"kernel": 3, "stride": 2, "padding": 1}
BOUND = bind(get_op("max_pool2d"), POOL, [TensorType((1, 4, 8, 8), "float32")])
CODE_SHAPING = [
    "toolchain/build/shared_object.py",
    "toolchain/build/targets.py",
    "toolchain/build/opencl.py",
    "toolchain/build/compile.py",
    "toolchain/build/bundle.py",
    "toolchain/tune/tuners.py",
    "schedules/cpu.py",
    "ops/pooling.py",
]


@pytest.mark.parametrize("edited", CODE_SHAPING)
def test_editing_code_that_shapes_the_module_changes_the_key(edited: str, monkeypatch: pytest.MonkeyPatch):
    target = get_target("x86")
    before = cache.build_key(BOUND, target)
    real = cache._source_digest

    def edited_digest(path: str) -> str:
        return "edited" if Path(path).resolve().as_posix().endswith(edited) else real(path)

    monkeypatch.setattr(cache, "_source_digest", edited_digest)
    assert cache.build_key(BOUND, target) != before, f"editing {edited} would reuse stale modules"


@pytest.mark.parametrize(
    "change",
    [{"vector_bits": 128}, {"cores": 8}, {"tvm": {"kind": "llvm", "mcpu": "znver3"}}, {"work_group": 32}],
)
def test_every_target_field_is_in_the_key(change: dict):
    target = get_target("x86")
    assert cache.build_key(BOUND, dataclasses.replace(target, **change)) != cache.build_key(BOUND, target)


def test_the_key_does_not_depend_on_what_this_process_imported():
    import sys

    key = cache.build_key(BOUND, get_target("x86"))
    sys.modules.pop("toolchain.build.opencl", None)
    assert cache.build_key(BOUND, get_target("x86")) == key


@pytest.mark.parametrize("item", ["op", "graph"])
def test_a_tuned_key_depends_on_the_verdicts_not_on_the_records_object(item: str, tmp_path: Path):
    """`--tuned DIR` builds hit the cache from one process to the next: the key holds what the
    records say (none here), not the records object (whose warning callback is a new function
    in every process)."""
    from ops.graph import bind_graph
    from toolchain.model import load_model
    from toolchain.tune.tuners import AcceptedRecords

    built = (
        BOUND
        if item == "op"
        else bind_graph(load_model(Path(__file__).parent.parent / "examples" / "maxpool_add.yaml"))
    )
    first, second = (
        get_target("x86").with_tuning(AcceptedRecords(tmp_path, lambda line: None)) for _ in "12"
    )
    assert first.tuned is not second.tuned
    assert cache.build_key(built, first) == cache.build_key(built, second)


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "x" * 300, ".hidden"])
def test_a_graph_name_stays_inside_the_cache(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A model file names its graph anything: its build lands in builds/ under a plain name."""
    from ops.graph import Graph, Node, bind_graph

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    node = Node("act", get_op("leaky_relu"), {}, ("x",), "act")
    g = bind_graph(Graph(name, (("x", TensorType((4, 8), "float32")),), (node,), "act"))
    directory, _ = cache.cached_build(g, get_target("x86"))
    assert directory.parent == tmp_path / "cache" / "builds" and not directory.name.startswith(".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] and len(directory.name) < 128
