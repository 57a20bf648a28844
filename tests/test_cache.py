"""The build cache key covers everything that shapes the emitted code (issue #13, defect 1): the
source of every build-side module, including those imported late or never by this process, and
every field of the target."""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import deploy.compiler.cache as cache
import deploy.compiler.fingerprint as fingerprint
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.ops import TensorType, bind, get_op
from tests.conftest import run_deploy

POOL = {"kernel": 3, "stride": 2, "padding": 1}
BOUND = bind(get_op("max_pool2d"), POOL, [TensorType((1, 4, 8, 8), "float32")])
CODE_SHAPING = [
    "deploy/compiler/shared_object.py",
    "deploy/compiler/tir_passes.py",
    "deploy/compiler/targets.py",
    "deploy/compiler/opencl.py",
    "deploy/compiler/compile.py",
    "deploy/compiler/bundle.py",
    "deploy/compiler/runtime/abi.h",
    "deploy/tune/tuners.py",
    "deploy/schedules/cpu/pooling.py",
    "deploy/ops/library/pooling.py",
]


@pytest.mark.parametrize("edited", CODE_SHAPING)
def test_editing_code_that_shapes_the_module_changes_the_key(edited: str, monkeypatch: pytest.MonkeyPatch):
    target = get_target("x86")
    before = cache.build_key(BOUND, target, BuildOptions())
    real = fingerprint.source_digest

    def edited_digest(path: str) -> str:
        return "edited" if Path(path).resolve().as_posix().endswith(edited) else real(path)

    monkeypatch.setattr(fingerprint, "source_digest", edited_digest)
    assert cache.build_key(BOUND, target, BuildOptions()) != before, (
        f"editing {edited} would reuse stale modules"
    )


@pytest.mark.parametrize(
    "change", [{"vector_bits": 128}, {"tvm": {"kind": "llvm", "mcpu": "znver3"}}, {"work_group": 32}]
)
def test_every_target_field_is_in_the_key(change: dict):
    target, options = get_target("x86"), BuildOptions()
    assert cache.build_key(BOUND, dataclasses.replace(target, **change), options) != cache.build_key(
        BOUND, target, options
    )


CHOICES: dict[str, Any] = {"cores": 8, "layout": "NCHW8c", "alignment": 16, "bundle": True,
                           "bundle_host": "aarch64", "fp16_storage": True, "cpu_model": "zen3"}  # fmt: skip
"""A value other than the default for every build option but `tuned` (keyed by its verdicts)."""


def test_every_build_option_has_a_case():
    assert set(CHOICES) == {f.name for f in dataclasses.fields(BuildOptions)} - {"tuned"}


@pytest.mark.parametrize("name", CHOICES)
def test_every_build_option_is_in_the_key(name: str):
    target, options = get_target("x86"), BuildOptions()
    changed = dataclasses.replace(options, **{name: CHOICES[name]})
    assert cache.build_key(BOUND, target, changed) != cache.build_key(BOUND, target, options)


def test_the_key_does_not_depend_on_what_this_process_imported():
    import sys

    key = cache.build_key(BOUND, get_target("x86"), BuildOptions())
    sys.modules.pop("deploy.compiler.opencl", None)
    assert cache.build_key(BOUND, get_target("x86"), BuildOptions()) == key


@pytest.mark.parametrize("item", ["op", "graph"])
def test_a_tuned_key_depends_on_the_verdicts_not_on_the_records_object(item: str, tmp_path: Path):
    """`--tuned DIR` builds hit the cache from one process to the next: the key holds what the
    records say (none here), not the records object (whose warning callback is a new function
    in every process)."""
    from deploy.model import load_model
    from deploy.ops.graph import bind_graph
    from deploy.tune.tuners import AcceptedRecords

    built = (
        BOUND
        if item == "op"
        else bind_graph(load_model(Path(__file__).parent.parent / "examples" / "maxpool_add.yaml"))
    )
    first, second = (BuildOptions(tuned=AcceptedRecords(tmp_path, lambda line: None)) for _ in "12")
    assert first.tuned is not second.tuned
    x86 = get_target("x86")
    assert cache.build_key(built, x86, first) == cache.build_key(built, x86, second)


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "x" * 300, ".hidden"])
def test_a_graph_name_stays_inside_the_cache(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A model file names its graph anything: its build lands in builds/ under a plain name."""
    from deploy.ops.graph import Graph, Node, bind_graph

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    node = Node("act", get_op("leaky_relu"), {}, ("x",), "act")
    g = bind_graph(Graph(name, (("x", TensorType((4, 8), "float32")),), (node,), ("act",)))
    directory, _ = cache.cached_build(g, get_target("x86"), BuildOptions())
    assert directory.parent == tmp_path / "cache" / "builds" and not directory.name.startswith(".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] and len(directory.name) < 128


SCALED = textwrap.dedent(
    """
    from tvm import te
    from deploy.ops import Case, Input, Op, register
    from scalecfg import SCALE

    @register
    class Scaled(Op):
        \"\"\"x times the helper's SCALE.\"\"\"
        name = "scaled"
        inputs = (Input("x"),)
        dtypes = ("float32",)
        cases = (Case(((4,),)),)

        def infer(self, attrs, inputs):
            return inputs[0]

        def compute(self, attrs, out, x):
            import lazyhelper  # noqa: F401 (found on sys.path, never imported by the key)
            return te.compute(out.shape, lambda i: x[i] * SCALE, name="out")

        def reference(self, attrs, x):
            return x * SCALE
    """
)


def _scaled_op(tmp_path: Path, scale: int) -> tuple[Path, Path]:
    """An op folder whose op file takes SCALE from a helper module in another folder."""
    (tmp_path / "ops").mkdir(exist_ok=True)
    (tmp_path / "ops" / "scaled.py").write_text(SCALED)
    (tmp_path / "helpers").mkdir(exist_ok=True)
    (tmp_path / "helpers" / "scalecfg.py").write_text(f"SCALE = {scale}\n")
    (tmp_path / "helpers" / "lazyhelper.py").write_text("")
    return tmp_path / "ops", tmp_path / "helpers"


def test_editing_a_helper_module_a_user_op_imports_rebuilds_it(tmp_path: Path):
    """The key hashed the op file alone: after SCALE = 2 became 3 in the helper, `deploy run`
    kept answering x * 2 from the cache."""
    folder, helpers = _scaled_op(tmp_path, 2)
    np.save(tmp_path / "x.npy", np.arange(4, dtype="float32"))
    for scale in (2, 3):
        (helpers / "scalecfg.py").write_text(f"SCALE = {scale}\n")
        ran = run_deploy("--ops-path", str(folder), "run", "--op", "scaled", "--target", "x86",
                         "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                         env={"PYTHONPATH": str(helpers)})  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert np.load(tmp_path / "y.npy").tolist() == [0.0, scale, 2.0 * scale, 3.0 * scale]


def test_editing_a_schedule_file_beside_a_user_op_rebuilds_it(tmp_path: Path):
    """A schedule (here with a compute variant) registered in a file of its own beside the op
    file decides the module too: the key hashed the op's modules alone, so an edit of that file
    kept the cached module."""
    folder, helpers = _scaled_op(tmp_path, 2)
    np.save(tmp_path / "x.npy", np.arange(4, dtype="float32"))
    for factor in (5, 7):
        (folder / "scaled_cpu.py").write_text(
            "from tvm import te\n"
            "from deploy.schedules.cpu.generic import generic_cpu\n"
            "from deploy.schedules.registry import register_schedule\n\n\n"
            "def times(ctx, x):\n"
            f"    return te.compute(ctx.bound.output.shape, lambda i: x[i] * {factor}.0, name='out')\n\n\n"
            "register_schedule('cpu', 'scaled', compute=times)(generic_cpu)\n"
        )
        ran = run_deploy("--ops-path", str(folder), "run", "--op", "scaled", "--target", "x86",
                         "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                         env={"PYTHONPATH": str(helpers)})  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert np.load(tmp_path / "y.npy").tolist() == [0.0, factor, 2.0 * factor, 3.0 * factor]


def test_a_user_ops_helpers_are_found_without_importing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_registry: None
):
    """Imports are read from the files and found on sys.path: a helper imported only inside
    compute() is in the key before compute ever ran, so the key is the same before and after."""
    import sys

    from deploy.ops.registry import find_op, load_ops_path

    folder, helpers = _scaled_op(tmp_path, 2)
    monkeypatch.syspath_prepend(str(helpers))
    load_ops_path(folder)
    module = type(find_op("scaled")).__module__
    assert "lazyhelper" not in sys.modules
    found = {Path(f).name for f in fingerprint.imported_sources(module)}
    assert found == {"scaled.py", "scalecfg.py", "lazyhelper.py"}, "numpy, tvm and deploy are not followed"


def _truncate_module(entry: Path, other: Path) -> None:
    module = next(entry.glob("*.so"))
    module.write_bytes(module.read_bytes()[:100])


def _drop_manifest(entry: Path, other: Path) -> None:
    (entry / "manifest.json").unlink()


def _copy_other_build(entry: Path, other: Path) -> None:
    shutil.rmtree(entry)
    shutil.copytree(other, entry)


def _link_to_other_build(entry: Path, other: Path) -> None:
    shutil.rmtree(entry)
    entry.symlink_to(other)


DAMAGES = [_truncate_module, _drop_manifest, _copy_other_build, _link_to_other_build]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_entry_is_built_again(damage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A hit read the entry as it was: a module cut short was an exit-2 error on every run, and
    another build's entry (kernel 2 copied over kernel 3, both 4x4 outputs) was a wrong answer."""
    from deploy.compiler.manifest import Manifest

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    target = get_target("x86")
    other = bind(get_op("max_pool2d"), {"kernel": 2, "stride": 2}, [TensorType((1, 4, 8, 8), "float32")])
    other_entry, _ = cache.cached_build(other, target, BuildOptions())
    entry, built = cache.cached_build(BOUND, target, BuildOptions())
    damage(entry, other_entry)
    again, rebuilt = cache.cached_build(BOUND, target, BuildOptions())
    assert again == entry and not entry.is_symlink()
    assert (rebuilt.attrs, rebuilt.sha256, rebuilt.build_key) == (built.attrs, built.sha256, built.build_key)
    key = str(built.build_key)
    assert Manifest.cached(entry, key, target.artifact) == rebuilt
    assert Manifest.cached(other_entry, key, target.artifact) is None, (
        "the other build's entry is not this key's"
    )


def test_a_cut_short_opencl_source_in_the_cache_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The manifest pins launch.json, which pins kernels.cl: a hit that checked the first alone
    kept failing at load (`kernels.cl does not match the sha256 in launch.json`)."""
    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))
    target = get_target("opencl")
    entry, built = cache.cached_build(BOUND, target, BuildOptions())
    source = entry / "kernels.cl"
    whole = source.read_text()
    source.write_text(whole[: len(whole) // 2])
    assert cache.cached_build(BOUND, target, BuildOptions()) == (entry, built) and source.read_text() == whole


def test_a_zipped_helper_is_not_read_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_registry: None
):
    """PathFinder names a zipped module by a path inside the zip: reading it as a file raised
    NotADirectoryError on every build of the op."""
    import zipfile

    from deploy.ops.registry import find_op, load_ops_path

    with zipfile.ZipFile(tmp_path / "helpers.zip", "w") as archive:
        archive.writestr("zipcfg.py", "SCALE = 2\n")
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "zipped.py").write_text(
        SCALED.replace('"scaled"', '"zipped"').replace("from scalecfg import", "from zipcfg import")
    )
    monkeypatch.syspath_prepend(str(tmp_path / "helpers.zip"))
    load_ops_path(tmp_path / "ops")
    module = type(find_op("zipped")).__module__
    assert {Path(f).name for f in fingerprint.imported_sources(module)} == {"zipped.py"}


OFFSET_OP = textwrap.dedent(
    """
    from pathlib import Path
    from tvm import te
    from deploy.ops import Case, Input, Op, register

    OFFSET = float((Path(__file__).parent / "offset.txt").read_text())

    @register
    class Offset(Op):
        \"\"\"x plus a number read from a data file beside the op.\"\"\"
        name = "offset"
        inputs = (Input("x"),)
        dtypes = ("float32",)
        cases = (Case(((4,),)),)

        def infer(self, attrs, inputs):
            return inputs[0]

        def compute(self, attrs, out, x):
            return te.compute(out.shape, lambda i: x[i] + OFFSET, name="out")

        def reference(self, attrs, x):
            return x + OFFSET
    """
)


def test_a_user_op_reading_a_data_file_is_rebuilt_when_the_file_changes(tmp_path: Path):
    """Issue #37: the key hashed the op's source, not the data file it reads: after offset.txt
    changed, `deploy run` answered from the cached module (exit 0). A user op's computation (its
    TIR) is in the key now."""
    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / "offset.py").write_text(OFFSET_OP)
    np.save(tmp_path / "x.npy", np.zeros(4, dtype="float32"))
    for offset in (1, 5):
        (folder / "offset.txt").write_text(f"{offset}\n")
        ran = run_deploy("--ops-path", str(folder), "run", "--op", "offset", "--target", "x86",
                         "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"))  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert np.load(tmp_path / "y.npy").tolist() == [offset] * 4
