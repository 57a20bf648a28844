"""The CLI's main paths: ops listing, build artifacts, run with --check, test over the matrix."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tvm

from deploy.base.errors import UsageError
from deploy.base.files import sha256_file
from deploy.compiler.manifest import Manifest
from deploy.ops import all_ops, get_op
from tests.conftest import invoke, run_deploy
from tests.test_arm import needs_cross, needs_qemu

BUILTIN = {"add", "argmax", "hard_sigmoid", "layout_transform", "leaky_relu", "max_pool2d"}
POOL = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1), "ceil_mode": False, "layout": "NCHW"}


def test_ops_json_lists_every_builtin_op():
    result = invoke("ops", "--json")
    assert result.exit_code == 0
    ops = {op["name"]: op for op in json.loads(result.stdout)}
    assert set(ops) >= BUILTIN
    pool = ops["max_pool2d"]
    assert [i["name"] for i in pool["inputs"]] == ["x"]
    attrs = {a["name"]: a for a in pool["attrs"]}
    assert attrs["kernel"] == {"name": "kernel", "type": "int,int", "default": [2, 2], "doc": "window H,W"}
    assert attrs["ceil_mode"]["default"] is False
    assert ops["leaky_relu"]["dtypes"] == ["float32", "float16", "float64"]
    assert ops["argmax"]["targets"]["x86"] == "cpu/argmax"
    assert ops["add"]["targets"]["x86"] == "cpu/generic"


def test_python_m_deploy_is_deploy():
    """From a checkout without the console script (a bench script's subprocess, a device)."""
    done = subprocess.run([sys.executable, "-m", "deploy", "ops", "--json"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {op["name"] for op in json.loads(done.stdout)} >= {"add", "argmax"}


def test_ops_table_and_targets():
    assert "max_pool2d" in invoke("ops").stdout
    targets = {t["name"]: t for t in json.loads(invoke("targets", "--json").stdout)}
    assert targets["x86"]["tvm"] == {"kind": "llvm", "mcpu": "core-avx2"}
    assert targets["arm-fp16"]["layouts"] == {"float32": "NCHW4c", "float16": "NCHW8c"}
    assert (
        targets["x86"]["streaming_store_bytes"] == 16 << 20
        and targets["armv7"]["streaming_store_bytes"] is None
    )
    table = invoke("targets").stdout
    assert "layouts" in table and "NCHW8c" in table


def test_build_writes_module_and_manifest(tmp_path):
    out = tmp_path / "mp"
    result = invoke(
        "build", "--op", "max_pool2d", "--target", "x86", "--shape", "2x4x16x16",
        "-a", "kernel=3", "-a", "stride=2", "-a", "padding=1", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out)
    assert manifest.op == "max_pool2d" and manifest.target == "x86"
    pool = {
        "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "padding_end": None, "ceil_mode": False,
        "dilation": [1, 1], "layout": "NCHW",
    }  # fmt: skip
    assert manifest.attrs == pool
    assert manifest.inputs == [{"name": "x", "shape": [2, 4, 16, 16], "dtype": "float32"}]
    assert manifest.outputs == [{"name": "out", "shape": [2, 4, 8, 8], "dtype": "float32"}]
    assert manifest.schedule == "cpu/max_pool2d"
    assert manifest.tvm_version == tvm.__version__
    assert manifest.sha256 == sha256_file(out / manifest.module)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mp"], "no staging leftovers"

    module = tvm.runtime.load_module(str(out / manifest.module))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 16, 16)).astype("float32")
    dst = tvm.runtime.empty((2, 4, 8, 8), "float32", tvm.cpu())
    module["main"](tvm.runtime.tensor(x), dst)
    np.testing.assert_array_equal(dst.numpy(), get_op("max_pool2d").reference(POOL, x))


def test_rebuild_replaces_artifact(tmp_path):
    out = tmp_path / "lr"
    for alpha in ("0.1", "0.2"):
        args = ["--op", "leaky_relu", "--target", "x86", "--shape", "8", "-a", f"alpha={alpha}"]
        result = invoke("build", *args, "-o", str(out))
        assert result.exit_code == 0, result.output
    assert Manifest.read(out).attrs == {"alpha": 0.2}


def test_tampered_module_is_rejected(tmp_path):
    out = tmp_path / "lr"
    assert (
        invoke("build", "--op", "leaky_relu", "--target", "x86", "--shape", "8", "-o", str(out)).exit_code
        == 0
    )
    manifest = Manifest.read(out)
    with (out / manifest.module).open("ab") as stream:
        stream.write(b"\0")
    with pytest.raises(UsageError, match="sha256"):
        manifest.check_module(out)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_run_writes_output_and_checks(tmp_path, dtype):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 3, 9, 9)) * 50).astype(dtype)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npy"
    result = invoke(
        "run", "--op", "max_pool2d", "--target", "x86", "-a", "kernel=3", "-a", "stride=2", "-a", "padding=1",
        "-i", str(tmp_path / "x.npy"), "-o", str(out), "--check",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "check passed" in result.stdout
    np.testing.assert_array_equal(np.load(out), get_op("max_pool2d").reference(POOL, x))


@pytest.mark.parametrize(
    "target", ["x86", pytest.param("arm", marks=[pytest.mark.emulator, needs_qemu, needs_cross])]
)
def test_run_pools_a_packed_input(tmp_path, target):
    """`deploy run -a layout=NCHW4c` on [1, 2, 9, 9, 4] (8 channels packed by 4) matches numpy's
    NCHW pooling of the same channels, packed."""
    from deploy.ops.layouts import LAYOUTS

    nchw = np.random.default_rng(4).standard_normal((1, 8, 9, 9)).astype("float32")
    np.save(tmp_path / "x.npy", LAYOUTS["NCHW4c"].from_nchw(nchw))
    out = tmp_path / "out.npy"
    result = invoke(
        "run", "--op", "max_pool2d", "--target", target, "-a", "kernel=3", "-a", "stride=2",
        "-a", "padding=1", "-a", "layout=NCHW4c", "-i", str(tmp_path / "x.npy"), "-o", str(out), "--check",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "check passed: max error 0" in result.stdout
    expected = get_op("max_pool2d").reference(POOL, nchw)
    np.testing.assert_array_equal(np.load(out), LAYOUTS["NCHW4c"].from_nchw(expected))


def test_test_command_subset_passes():
    result = invoke("test", "--target", "x86", "--op", "argmax", "--dtype", "int8", "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert f"{2 * len(get_op('argmax').cases)} cases passed, 0 failed" in result.stdout


def test_test_with_ops_path_and_no_op_tests_only_that_paths_ops(example_ops, tmp_path):
    """Issue #51: `deploy test --ops-path myops` without --op re-verified all 397 shipped cases
    (3-6 min on the emulator) when the user wanted theirs."""
    from tests.conftest import REPO

    examples = str(REPO / "deploy" / "ops" / "examples")
    result = invoke("--ops-path", examples, "test", "--target", "x86", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    cases = len(get_op("hard_tanh").cases)
    assert f"{cases} cases passed, 0 failed" in result.stdout
    assert "hard_tanh" in result.stdout and "max_pool2d" not in result.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = invoke("--ops-path", str(empty), "test", "--target", "x86")
    assert nothing.exit_code == 2 and "no op file there registers an op; pass --op" in nothing.stderr


def test_test_command_rejects_empty_selection():
    result = invoke("test", "--target", "x86", "--op", "leaky_relu", "--dtype", "int8")
    assert result.exit_code == 2 and "no cases" in result.stderr


def test_every_op_declares_cases_and_a_docstring():
    for op in all_ops():
        assert op.cases and op.summary(), op.name


@pytest.mark.parametrize("columns", ["0", "5"])
def test_a_tiny_columns_still_prints_the_tables_and_the_verdict(columns):
    """COLUMNS=0 made rich print nothing: `deploy test` failed (exit 1) with empty stdout and
    stderr; COLUMNS=5 cut every cell to a few characters."""
    tested = run_deploy("test", "--target", "x86", "--op", "add", "--dtype", "int8", env={"COLUMNS": columns})
    assert tested.returncode == 0 and "cases passed, 0 failed" in tested.stdout, tested.stdout
    listed = run_deploy("targets", env={"COLUMNS": columns})
    assert "x86-avx512" in listed.stdout


@pytest.mark.parametrize("command", [["device", "list"], ["targets"]], ids=["click.echo", "rich"])
def test_a_reader_that_stops_reading_ends_deploy_quietly(tmp_path, command) -> None:
    """`deploy device list | head -2` printed `error: BrokenPipeError` (exit 1), and what rich
    prints `error: exit(1) was called ... (in an op's code?)`; now both end as a command SIGPIPE
    ends: nothing on stderr, exit 141."""
    import os

    from tests.conftest import DEPLOY

    boards = {f"b{i}": {"name": f"b{i}", "host": "h", "user": "u", "arch": "aarch64"} for i in range(5000)}
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "devices.json").write_text(json.dumps(boards))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    printing = subprocess.Popen(
        [DEPLOY, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    printing.stdout.close()
    assert (printing.wait(timeout=120), printing.stderr.read()) == (141, "")


def test_deploy_test_builds_the_next_cases_while_the_device_runs_one(tmp_path, monkeypatch) -> None:
    """#53: a case's build goes on while the device runs the case before it: while the first
    case runs, the next ones are built (found in the cache) without the worker asking."""
    import threading

    import deploy.verify.matrix as matrix
    from deploy.compiler.cache import build_key
    from deploy.compiler.manifest import Manifest
    from deploy.compiler.options import BuildOptions, for_device
    from deploy.compiler.targets import get_target
    from deploy.devices import get_device
    from deploy.ops import get_op

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))
    target, device = get_target("x86"), get_device("local")
    planned = matrix.plan([get_op("leaky_relu")], ["float32"])[:3]
    seen: list[bool] = []
    verify_case = matrix.verify_case

    def built(index: int, options: BuildOptions) -> bool:
        bound = planned[index].bind()
        key = build_key(bound, target, options)
        entries = list((tmp_path / "builds").glob(f"*-{key}"))
        return any(Manifest.cached(e, key, target.artifact) is not None for e in entries)

    def first_waits_for_the_next(session, case, *args):
        if case is planned[0]:
            options = for_device(BuildOptions(), session)
            ready = threading.Event()
            for _ in range(600):  # up to a minute: a build takes a second or two
                if built(1, options) and built(2, options):
                    ready.set()
                    break
                ready.wait(0.1)
            seen.append(ready.is_set())
        return verify_case(session, case, *args)

    monkeypatch.setattr(matrix, "verify_case", first_waits_for_the_next)
    results = matrix.run_matrix(planned, target, BuildOptions(), device)
    assert [r.ok for r in results] == [True] * 3
    assert seen == [True], "the next cases were not built while the first ran"
