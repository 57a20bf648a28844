"""What deploy writes and reads from disk: `run -o` (atomic for files, in place for devices and
FIFOs, symlinks kept, nothing partial left), .npy inputs with forged headers, artifact manifests
naming files outside their directory, concurrent builds into one directory, and `--check`
comparing large outputs in bounded memory."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import numpy.lib.format as npy_format
import pytest

from deploy.base.errors import UsageError
from deploy.compiler.manifest import MANIFEST, Manifest
from deploy.verify import compare as compare_module
from deploy.verify.compare import compare
from tests.conftest import DEPLOY, REPO, invoke

RUN = ["run", "--op", "leaky_relu", "--target", "x86"]
BUILD = ["build", "--op", "leaky_relu", "--target", "x86"]


def one_line_error(stderr: str, fragment: str) -> bool:
    return stderr.startswith("error: ") and stderr.count("\n") == 1 and fragment in stderr


@pytest.fixture
def x(tmp_path: Path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(-4, 4, dtype="float32"))
    return path


def expected_output(x: Path) -> np.ndarray:
    data = np.load(x)
    return np.where(data >= 0, data, data * np.float32(0.01)).astype("float32")


def partial_files(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*partial*")]


# `deploy run -o`


def test_output_symlink_is_kept_and_its_file_replaced_with_its_mode(tmp_path, x):
    real = tmp_path / "real.npy"
    real.write_bytes(b"old")
    real.chmod(0o640)
    link = tmp_path / "link.npy"
    link.symlink_to("real.npy")
    result = invoke(*RUN, "-i", str(x), "-o", str(link))
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == "real.npy"
    np.testing.assert_allclose(np.load(real), expected_output(x))
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert partial_files(tmp_path) == []


def test_an_output_name_of_254_bytes_is_written(tmp_path, x):
    """Issue #37: the temporary beside it was named after it, 7 bytes longer: 'File name too long'
    after the op had run."""
    long = tmp_path / ("o" * 250 + ".npy")
    result = invoke(*RUN, "-i", str(x), "-o", str(long))
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(np.load(long), expected_output(x))
    assert partial_files(tmp_path) == []


def test_output_fifo_is_written_in_place(tmp_path, x):
    """A FIFO (like /dev/stdout in a pipe) is written to, not renamed over."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = invoke(*RUN, "-i", str(x), "-o", str(fifo))
    assert result.exit_code == 0, result.stderr
    reader.join(timeout=10)
    assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO itself was replaced"
    assert received, "nothing was written into the FIFO"
    np.testing.assert_allclose(np.load(io.BytesIO(received[0])), expected_output(x))
    assert partial_files(tmp_path) == []


def test_output_to_stdout_is_the_array_alone(x):
    """`-o /dev/stdout | ...`: the array on stdout, what deploy says on stderr."""
    ran = subprocess.run([DEPLOY, *RUN, "-i", str(x), "-o", "/dev/stdout", "--check"], capture_output=True)
    assert ran.returncode == 0, ran.stderr
    stream = io.BytesIO(ran.stdout)
    np.testing.assert_allclose(np.load(stream), expected_output(x))
    assert stream.read() == b"", "something besides the array went to stdout"
    assert b"wrote /dev/stdout" in ran.stderr and b"check passed" in ran.stderr


def test_output_to_stdout_redirected_to_a_file_appends_to_it(tmp_path, x):
    """`-o /dev/stdout >> log`: the log keeps what it held and gets the array after it (a rename
    would have replaced the log, a reopen truncated it)."""
    log = tmp_path / "log"
    log.write_bytes(b"before\n")
    with log.open("ab") as appending:
        ran = subprocess.run(
            [DEPLOY, *RUN, "-i", str(x), "-o", "/dev/stdout"], stdout=appending, stderr=subprocess.PIPE
        )
    assert ran.returncode == 0, ran.stderr
    data = log.read_bytes()
    assert data.startswith(b"before\n")
    np.testing.assert_allclose(np.load(io.BytesIO(data[len(b"before\n") :])), expected_output(x))
    assert partial_files(tmp_path) == []


@pytest.mark.parametrize(
    "make,fragment",
    [
        (lambda tmp: tmp / "adir", "is a directory"),
        (lambda tmp: tmp / "afile" / "o.npy", "afile is not a directory"),
    ],
    ids=["directory", "under-a-file"],
)
def test_output_path_that_cannot_be_a_file_is_one_line(tmp_path, x, make, fragment):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "keep.txt").write_text("keep me")
    (tmp_path / "afile").write_text("keep me")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    result = invoke(*RUN, "-i", str(x), "-o", str(make(tmp_path)))
    assert result.exit_code == 2 and one_line_error(result.stderr, fragment), result.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def _limit_file_size() -> None:
    """In the child: files may not grow past 64 KiB (writes past it fail with EFBIG, a real
    failed write like a full disk's, without root or a small filesystem)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_failed_write_leaves_no_partial_file_and_the_old_output(tmp_path):
    big = tmp_path / "big.npy"
    np.save(big, np.ones(1 << 16, dtype="float32"))  # 256 KiB of output
    assert invoke(*RUN, "-i", str(big), "-o", str(tmp_path / "warm.npy")).exit_code == 0  # cached build
    out = tmp_path / "out.npy"
    out.write_bytes(b"earlier output")
    proc = subprocess.run(
        [DEPLOY, *RUN, "-i", str(big), "-o", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
        timeout=300,
    )
    assert proc.returncode == 1 and one_line_error(proc.stderr, "File too large"), proc.stderr
    assert out.read_bytes() == b"earlier output"
    assert partial_files(tmp_path) == []


# .npy inputs


def test_npy_header_claiming_more_than_the_file_holds_is_one_line(tmp_path):
    forged = tmp_path / "forged.npy"
    with forged.open("wb") as stream:
        header = {"descr": "<f4", "fortran_order": False, "shape": (100000, 100000)}
        npy_format.write_array_header_1_0(stream, header)
        stream.write(bytes(64))
    result = invoke(*RUN, "-i", str(forged), "-o", str(tmp_path / "o.npy"))
    assert result.exit_code == 2 and one_line_error(result.stderr, "header claims"), result.stderr
    assert "100000x100000 float32" in result.stderr and "64 bytes" in result.stderr


# `deploy build -o`


def test_build_output_under_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    for out in (tmp_path / "afile" / "art", tmp_path / "afile" / "deeper" / "art"):
        result = invoke(*BUILD, "--shape", "4", "-o", str(out))
        assert result.exit_code == 2 and one_line_error(result.stderr, "afile is a file"), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# Manifests are data: their module stays inside the artifact directory


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    out = tmp_path / "art"
    assert invoke(*BUILD, "--shape", "4", "-o", str(out)).exit_code == 0
    return out


def _point_module_at(artifact: Path, module: str) -> None:
    data = json.loads((artifact / MANIFEST).read_text())
    data["module"] = module
    (artifact / MANIFEST).write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["relative", "absolute", "symlink"])
def test_manifest_module_outside_the_artifact_is_refused(artifact, how):
    module = Manifest.read(artifact).module
    outside = artifact.parent / "elsewhere.so"
    shutil.copy(artifact / module, outside)  # same bytes: the sha256 matches
    if how == "relative":
        _point_module_at(artifact, "../elsewhere.so")
    elif how == "absolute":
        _point_module_at(artifact, str(outside))
    else:
        (artifact / module).unlink()
        (artifact / module).symlink_to(outside)
    with pytest.raises(UsageError, match=r"not a file name|links outside the artifact"):
        Manifest.read(artifact).check_module(artifact)


def test_a_cached_manifest_pointing_outside_is_built_again(tmp_path, x, monkeypatch):
    """The cache is deploy's own: an entry whose manifest names a file outside is not loaded but
    replaced by a fresh build (the file outside stays as it was)."""
    monkeypatch.setenv("DEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    assert invoke(*RUN, "-i", str(x), "-o", str(tmp_path / "o.npy")).exit_code == 0
    (entry,) = (tmp_path / "cache" / "builds").iterdir()
    module = Manifest.read(entry).module
    shutil.copy(entry / module, tmp_path / "elsewhere.so")
    _point_module_at(entry, "../../elsewhere.so")
    result = invoke(*RUN, "-i", str(x), "-o", str(tmp_path / "o.npy"))
    assert result.exit_code == 0, result.stderr
    assert Manifest.read(entry).module == module and (tmp_path / "elsewhere.so").is_file()


# Concurrent builds

WRITER = """
import sys, time
from pathlib import Path
from deploy.ops import TensorType, bind, get_op
from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target

bound = bind(get_op("leaky_relu"), {}, [TensorType((4,), "float32")])
compiled = compile_op(bound, get_target("x86"), BuildOptions())
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
for _ in range(int(sys.argv[3])):
    export(compiled, Path(sys.argv[1]))
"""
READER = """
import sys
from pathlib import Path
from deploy.compiler.manifest import Manifest, artifact_lock

out, done, reads, failures = Path(sys.argv[1]), Path(sys.argv[2]), 0, []
while not done.exists():
    with artifact_lock(out, shared=True):
        if out.exists():
            try:
                Manifest.read(out).check_module(out)
                reads += 1
            except Exception as exc:
                failures.append(repr(exc))
print(reads, len(failures), failures[:1])
"""


def python(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_concurrent_builds_into_one_new_directory_and_a_reader(tmp_path):
    """Two processes build into one new directory at the same moment, again and again, while a
    third reads it as the build cache does: every build succeeds, the reader never sees it
    mid-swap, and what is left is one complete artifact."""
    out, done = tmp_path / "out", tmp_path / "done"
    start = time.time() + 8  # both writers have compiled by then
    writers = [python(WRITER, out, start, 10) for _ in range(2)]
    reader = python(READER, out, done)
    for proc in writers:
        assert proc.wait(timeout=240) == 0, proc.stdout.read() if proc.stdout else ""
    done.touch()
    assert reader.wait(timeout=60) == 0
    reads, failures, first = reader.stdout.read().split(maxsplit=2) if reader.stdout else ("0", "?", "")
    assert failures == "0", first
    assert int(reads) > 0
    manifest = Manifest.read(out)
    manifest.check_module(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, manifest.module])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "out"]


def test_concurrent_runs_share_one_cache_entry(tmp_path, x):
    """Processes that miss the same cache entry at once all succeed; the entry is one artifact."""
    env = {**os.environ, "DEPLOY_CACHE_DIR": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen(
            [DEPLOY, *RUN, "-i", str(x), "-o", str(tmp_path / f"o{i}.npy")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
    for i in range(3):
        np.testing.assert_allclose(np.load(tmp_path / f"o{i}.npy"), expected_output(x))
    (entry,) = (tmp_path / "cache" / "builds").iterdir()  # no staging left beside it
    Manifest.read(entry).check_module(entry)


# --check compares in bounded memory, with the same results


def test_compare_of_a_large_output_stays_small():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(8 << 20).astype("float32")  # 32 MB
    actual = expected.copy()
    actual[-1] += 1
    tracemalloc.start()
    try:
        result = compare(expected, actual, exact=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not result.ok and result.max_error > 0.5
    assert peak < expected.nbytes // 2, f"compare allocated {peak >> 20} MB for a 32 MB output"


def _cases() -> list[tuple[np.ndarray, np.ndarray, bool]]:
    rng = np.random.default_rng(1)
    cases = []
    for dtype in ("float16", "float32", "float64", "int8", "int32"):
        for exact in (False, True):
            for change in ("none", "tiny", "big", "nan", "nan-moved", "inf", "inf-sign"):
                if dtype.startswith("int"):
                    a = rng.integers(-100, 100, size=(5, 9)).astype(dtype)
                else:
                    a = rng.standard_normal((5, 9)).astype(dtype)
                    a.flat[[3, 30]] = [np.nan, np.inf]
                b = a.copy()
                if change == "tiny" and a.dtype.kind == "f":
                    b.flat[40] = a.flat[40] * (1 + np.finfo(dtype).eps)
                elif change == "big":
                    b.flat[2] += 3
                elif change == "nan" and a.dtype.kind == "f":
                    b.flat[44] = np.nan
                elif change == "nan-moved" and a.dtype.kind == "f":
                    b.flat[1] += 5  # a large error in an early chunk, then NaN moved in a late one
                    b.flat[3], b.flat[43] = a.flat[43], np.nan
                elif change == "inf-sign" and a.dtype.kind == "f":
                    b.flat[30] = -np.inf
                elif change == "inf" and a.dtype.kind == "f":
                    b.flat[12] = np.inf
                cases.append((a, b, exact))
    return cases


def test_compare_in_chunks_matches_one_chunk(monkeypatch):
    whole = [compare(a, b, exact) for a, b, exact in _cases()]
    monkeypatch.setattr(compare_module, "CHUNK", 7)
    assert [compare(a, b, exact) for a, b, exact in _cases()] == whole
    kinds = {(c.ok, c.detail.split(" ")[0]) for c in whole}
    assert {(True, ""), (False, "NaN"), (False, "not"), (False, "|got-want|")} <= kinds


@pytest.mark.parametrize(
    "layout,error",
    [
        ("dir", None),  # in it
        ("dir/new/deeper", None),  # made later: checked in dir
        ("relative", None),  # a relative path, from the current directory
        ("link-to-dir/new", None),  # through a symlink to a directory
        ("afile/new", NotADirectoryError),
        ("dangling/new", FileNotFoundError),
        ("/sys/deploy-probe", OSError),  # nothing can be created there, even by root
    ],
)
def test_check_writable_probes_where_files_would_be_made(layout, error, tmp_path, monkeypatch):
    """deploy.base.files.check_writable: a file made and removed in the nearest directory that exists,
    leaving nothing behind; an OSError where files cannot be made."""
    from deploy.base.files import check_writable

    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "link-to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    if error is None:
        check_writable(Path(layout))
    else:
        with pytest.raises(error):
            check_writable(Path(layout))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("umask,mode", [(0o022, 0o755), (0o077, 0o700)])
def test_an_artifact_directory_gets_the_umasks_permissions(tmp_path, umask, mode):
    """The directory was renamed from mkdtemp's, so it was 0700 whatever the umask: an artifact
    built to share (a team's board, a CI cache) could be read by its owner alone."""
    old = os.umask(umask)
    try:
        done = invoke("build", "--op", "add", "--target", "x86", "--shape", "4", "--shape", "4",
                      "-o", str(tmp_path / "art"))  # fmt: skip
    finally:
        os.umask(old)
    assert done.exit_code == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "art").stat().st_mode) == mode
