"""Which onnxruntime deploy's plugin runs in, and which it fetches: an onnxruntime older than the
C API the plugin asks for (16: onnxruntime 1.16) refuses it in one line naming both versions, no
crash; the aarch64 library deploy keeps is checked against its pinned sha256 at each use."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.base.errors import DeployError
from deploy.base.files import sha256_file
from deploy.base.paths import cache_root
from deploy.engines.onnxruntime import AARCH64_LIBRARY_SHA256, AARCH64_VERSION, headers_dir
from tests.conftest import REPO, run_deploy

HEADERS = headers_dir()[0]
OLD = cache_root() / "onnxruntime" / "1.15.1-x86_64" / "site"
"""onnxruntime 1.15.1 and numpy 1.26.4 as ci/setup.sh unpacked them (read before conftest moves
the cache)."""

LOAD = """
import sys
import onnxruntime as ort

print(ort.__version__)
options = ort.SessionOptions()
try:
    options.register_custom_ops_library(sys.argv[1])
    ort.InferenceSession(sys.argv[2], options, providers=["CPUExecutionProvider"])
except Exception as exc:
    print(exc)
"""


@pytest.mark.skipif(
    not (OLD / "onnxruntime").is_dir() or sys.version_info[:2] != (3, 11),
    reason=f"needs onnxruntime 1.15.1 (cp311) unpacked in {OLD} (ci/setup.sh) and Python 3.11",
)
@pytest.mark.skipif(
    not (HEADERS / "onnxruntime_c_api.h").is_file() or shutil.which("gcc") is None,
    reason=f"no onnxruntime C API headers in {HEADERS} (run ci/setup.sh) or no gcc",
)
def test_an_onnxruntime_older_than_the_plugin_needs_is_one_line(tmp_path: Path) -> None:
    """onnxruntime 1.15.1 (API 15) loads the plugin of a model's node in a process of its own and
    gets the plugin's status: one line naming the 1.16 it needs and the 1.15.1 it found."""
    built = run_deploy(
        "--ops-path", str(REPO / "deploy" / "ops" / "examples"), "build", "--target", "x86", "--engine",
        "onnxruntime", "--model", str(REPO / "examples" / "pool_add_leaky_htanh_n.onnx"), "-o",
        str(tmp_path / "plugin"), env={"DEPLOY_ORT_HEADERS": str(HEADERS)},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    library = tmp_path / "plugin" / "libpool_add_leaky_htanh_n.so"
    model = REPO / "examples" / "pool_add_leaky_htanh_n.onnx"
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD, str(library), str(model)],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(OLD), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines() == [
        "1.15.1",
        "[ONNXRuntimeError] : 1 : FAIL : deploy plugin: onnxruntime 1.15.1 is older than the 1.16 it needs",
    ]


def test_a_kept_aarch64_library_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library in deploy's cache changed since it was checked is named with both digests, and
    not run."""
    from deploy.engines.onnxruntime import aarch64_runtime

    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path))
    kept = tmp_path / "onnxruntime" / f"{AARCH64_VERSION}-aarch64" / "libonnxruntime.so.1"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"not onnxruntime")
    with pytest.raises(DeployError) as raised:
        aarch64_runtime(lambda _: None)
    assert str(raised.value) == (
        f"{kept} has sha256 {sha256_file(kept)}, expected {AARCH64_LIBRARY_SHA256} (pinned by deploy):"
        " delete it to fetch it again"
    )
