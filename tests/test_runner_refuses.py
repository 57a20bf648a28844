"""What `deploy-run` and the C API refuse (#49, items 4, 5, 8, 10, 11): inputs that are no regular
file, -o naming a file the run reads, another -o's file or the bundle's own, .npy headers that lie
or that numpy reads another way, tensors past the element cap, and OpenCL outputs the kernels
cannot write. Each is one line and a code, nothing written; on a bundle built once, from C."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from deploy.base.errors import UsageError, quoted
from deploy.cli.args import check_not_read
from deploy.compiler.options import BuildOptions
from deploy.model import load_model
from deploy.ops.graph import bind_graph
from tests.conftest import invoke
from tests.test_bundle import build_c, bundle, needs, one_line_error, runs, x86_runs_here

TWO = """name: two
inputs:
  x: {shape: [N, 4]}
nodes:
  - {name: a, op: leaky_relu, inputs: [x]}
  - {name: b, op: hard_sigmoid, inputs: [x]}
output: [a, b]
"""
"""Two outputs of one input with a symbolic batch: -o twice, and a batch past the element cap."""


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x86_runs_here()
    work = tmp_path_factory.mktemp("two")
    (work / "two.yaml").write_text(TWO)
    return bundle(bind_graph(load_model(work / "two.yaml")), "x86", work / "two")


def run(directory: Path, *args: str, target: str = "x86") -> subprocess.CompletedProcess[str]:
    """The bundle's deploy-run on `args`; 30 s: a runner that blocks on its input fails here."""
    command = [*runs(target), str(directory / "deploy-run"), str(directory), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


@pytest.fixture
def x(tmp_path: Path) -> Path:
    np.save(tmp_path / "x.npy", np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    return tmp_path / "x.npy"


def test_inputs_that_are_no_regular_file_are_refused_before_they_are_opened(two: Path, x: Path) -> None:
    """A FIFO blocked the runner forever, as a link to one did; a device was read without end."""
    tmp = x.parent
    os.mkfifo(tmp / "fifo.npy")
    (tmp / "link.npy").symlink_to("fifo.npy")
    outs = ("-o", str(tmp / "a.npy"), "-o", str(tmp / "b.npy"))
    for path, why in (
        (tmp / "fifo.npy", "not a regular file"),
        (tmp / "link.npy", "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (tmp, "it is a directory"),
    ):
        said = f"cannot read input '{path}' as a .npy array: {why}"
        one_line_error(run(two, "-i", str(path), *outs), 2, said)
    assert not (tmp / "a.npy").exists() and not (tmp / "b.npy").exists()


def test_outputs_that_would_lose_a_file_are_refused(two: Path, x: Path) -> None:
    """-o naming the input (as given, as ./, through a link or a hard link), a file of the bundle,
    the runner itself, or another -o's file (there or not yet): each was overwritten or lost."""
    tmp = x.parent
    (tmp / "link.npy").symlink_to("x.npy")
    os.link(x, tmp / "hard.npy")
    before = {p: p.read_bytes() for p in [x, *two.iterdir()] if p.is_file()}
    b = str(tmp / "b.npy")
    reads = "which this command reads; expected another file"
    for output, fragment in (
        (str(x), f"-o '{x}' is '{x}', {reads}"),
        (f"{tmp}/./x.npy", f"is '{x}', {reads}"),
        (str(tmp / "link.npy"), f"-o '{tmp}/link.npy' is '{x}', {reads}"),
        (str(tmp / "hard.npy"), reads),
        (str(two / "SHA256SUMS"), f"is '{two}/SHA256SUMS', a file of the bundle; expected another file"),
        (str(two / "libtwo.a"), f"is '{two}/libtwo.a', a file of the bundle"),
        (str(two / "libtwo.so"), "a file of the bundle"),
        (str(two / "deploy-run"), f"is '{two}/deploy-run', a file of the bundle"),
        (b, f"-o '{b}' is '{b}', which another -o writes; expected another file"),
        (f"{tmp}/./b.npy", "which another -o writes"),
    ):
        one_line_error(run(two, "-i", str(x), "-o", b, "-o", output), 2, fragment)
    np.save(tmp / "b.npy", np.zeros(1))  # there already: one file, twice
    one_line_error(run(two, "-i", str(x), "-o", b, "-o", str(tmp / "b.npy")), 2, "which another -o writes")
    shutil.copy2(two / "deploy-run", tmp / "runner")  # the runner, started from elsewhere
    itself = subprocess.run([str(tmp / "runner"), str(two), "-i", str(x), "-o", b, "-o", str(tmp / "runner")],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    one_line_error(itself, 2, f"-o '{tmp}/runner' is this deploy-run, which this command runs")
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp / "a.npy").exists()
    done = run(two, "-i", str(x), "-o", str(tmp / "a.npy"), "-o", b)
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.load(b), np.clip(np.load(x) * 0.2 + 0.5, 0, 1), rtol=1e-6)


def test_outputs_in_the_bundle_directory_are_refused(two: Path, x: Path) -> None:
    """SHA256SUMS leaves manifest.json out: -o two/manifest.json overwrote it (the artifact broken,
    exit 0); so would -o of any file added to the bundle, through a link to its directory too."""
    tmp = x.parent
    (tmp / "into").symlink_to(two)
    manifest = (two / "manifest.json").read_bytes()
    b = str(tmp / "b.npy")
    for output in (two / "manifest.json", two / "new.npy", tmp / "into" / "manifest.json", two / "." / "n"):
        said = f"-o '{output}' is in the bundle '{two}', which this command reads; expected another file"
        one_line_error(run(two, "-i", str(x), "-o", b, "-o", str(output)), 2, said)
    assert (two / "manifest.json").read_bytes() == manifest and not (two / "new.npy").exists()


def test_a_dangling_link_and_its_file_are_one_output(two: Path, x: Path) -> None:
    """-o link -o target, the link to the target not yet there: one output was lost (Python's
    realpath refused it, deploy-run did not); both orders, in both runners' words."""
    tmp = x.parent
    (tmp / "link.npy").symlink_to("target.npy")
    link, target = str(tmp / "link.npy"), str(tmp / "target.npy")
    for first, second in ((link, target), (target, link)):
        said = f"-o '{second}' is '{first}', which another -o writes; expected another file"
        one_line_error(run(two, "-i", str(x), "-o", first, "-o", second), 2, said)
        with pytest.raises(UsageError, match=re.escape(said)):
            check_not_read(second, [str(x)], [first])
    assert not (tmp / "target.npy").exists()


def test_dev_null_may_take_every_output(two: Path, x: Path) -> None:
    """-o /dev/null twice discards both outputs (as when timing): no file is lost, so neither
    runner refuses it; a regular file twice still is."""
    done = run(two, "-i", str(x), "-o", "/dev/null", "-o", "/dev/null", "--time", "1,1,0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("seconds-per-call ")
    check_not_read("/dev/null", [str(x)], ["/dev/null"])
    with pytest.raises(UsageError, match="which another -o writes"):
        check_not_read(str(x.parent / "a.npy"), [], [str(x.parent / "a.npy")])


def test_both_runners_refuse_a_bad_input_in_the_same_words(two: Path, x: Path) -> None:
    """deploy-run said "it is a directory" where deploy run said "[Errno 21] Is a directory:
    '/x'", and quoted a path holding ' as 'it\\'s' where deploy run wrote "it's"; and a path with
    control characters reached the terminal raw in deploy-run's older messages."""
    tmp = x.parent
    truncated = tmp / "tr\x1bunc'.npy"
    truncated.write_bytes(x.read_bytes()[:-4])
    outs = ["-o", str(tmp / "a.npy"), "-o", str(tmp / "b.npy")]
    for path in (tmp, tmp / "missing.npy", tmp / "it's\nnot.npy", tmp / "back\\slash.npy"):
        ours = run(two, "-i", str(path), *outs)
        cli = invoke(
            "run", "--target", "x86", "--model", str(two.parent / "two.yaml"), "-i", str(path), *outs
        )
        assert cli.exit_code == ours.returncode == 2, cli.output
        said = ours.stderr.strip().removeprefix("deploy-run: ")
        assert cli.stderr.strip() == f"error: {said}", (cli.stderr, ours.stderr)
        assert said.startswith(f"cannot read input {quoted(str(path))} as a .npy array: ")
        assert "\n" not in said and "Errno" not in said
    shown = quoted(str(truncated))
    assert "\\x1b" in shown and "\\'" in shown
    one_line_error(run(two, "-i", str(truncated), *outs), 2, f"{shown} is truncated: 44 of 48 data bytes")


def npy(path: Path, header: str, data: bytes) -> Path:
    """A .npy v1 file of `header` (padded as numpy pads it) and `data`."""
    text = header.encode()
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data)
    return path


def test_npy_headers_are_read_as_numpy_reads_them(two: Path, x: Path) -> None:
    """A huge batch over 48 bytes was allocated first ("out of memory", exit 1); a 5,000-digit
    shape was echoed whole; `fortran_order: 0` (numpy: "not a valid bool") was called
    Fortran-ordered; '=f4', '|f4' and 'f4', which numpy reads as '<f4', were refused."""
    tmp = x.parent
    data = np.load(x).tobytes()
    outs = ("-o", str(tmp / "a.npy"), "-o", str(tmp / "b.npy"))

    def refused(header: str, body: bytes, *fragments: str) -> str:
        proc = run(two, "-i", str(npy(tmp / "bad.npy", header, body)), *outs)
        one_line_error(proc, 2, *fragments)
        return proc.stderr

    huge = "{'descr': '<f4', 'fortran_order': False, 'shape': (2000000000, 4), }"
    refused(huge, data, "bad.npy' is truncated: 48 of 32000000000 data bytes")
    said = refused("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "9" * 5000 + ", 4), }", data,
                   "malformed .npy shape (9999", "... (5005 characters)")  # fmt: skip
    assert len(said) - len(str(tmp)) < 160, said
    refused("{'descr': '<f4', 'fortran_order': 0, 'shape': (3, 4), }", data,
            "malformed .npy header ('fortran_order' is 0, expected False)")  # fmt: skip
    refused("{'descr': '<f4', 'fortran_order': False, 'sha\npe\x1b': (3, 4), }", data,
            "unexpected key 'sha\\npe\\x1b'")  # fmt: skip
    refused("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", data, "is big-endian (>f4)")
    expected = np.clip(np.load(x) * 0.2 + 0.5, 0, 1)
    for descr in ("=f4", "|f4", "f4"):
        path = npy(tmp / "x2.npy", f"{{'descr': '{descr}', 'fortran_order': False, 'shape': (3, 4), }}", data)
        done = run(two, "-i", str(path), *outs)
        assert done.returncode == 0, (descr, done.stderr)
        np.testing.assert_allclose(np.load(tmp / "b.npy"), expected, rtol=1e-6)
    sparse = npy(tmp / "sparse.npy", huge.replace("2000000000", "536870912"), b"")
    os.truncate(sparse, sparse.stat().st_size + 2**31 * 4)  # 8 GiB that take no disk, past the cap
    capped = "is float32 [536870912, 4]: 2147483648 elements, more than the 2147483647 (2**31 - 1)"
    one_line_error(run(two, "-i", str(sparse), *outs), 2, capped)


CAPPED = """#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "two.h"

static void report(const char* what, int status) { printf("%s %d %s\\n", what, status, two_last_error()); }

int main(void) {
  float *x, *a, *b;
  int64_t shape[2] = {3, 4}, huge[2] = {536870912, 4};
  if (posix_memalign((void**)&x, 64, 64) || posix_memalign((void**)&a, 64, 64) ||
      posix_memalign((void**)&b, 64, 64)) {
    return 3;
  }
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0}, ta = tx, tb = tx;
  ta.data = a;
  tb.data = b;
  report("good", two(&tx, &ta, &tb));
  tx.shape = ta.shape = tb.shape = huge;  /* 2^31 elements in 48 bytes: read and written past them */
  report("capped", two(&tx, &ta, &tb));
  return 0;
}
"""


def test_the_element_cap_is_checked_at_call_time(two: Path, tmp_path: Path) -> None:
    """A symbolic batch past 2^31-1 elements ran the kernels over the caller's small buffers."""
    program = build_c(CAPPED, two, tmp_path / "capped")
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "good 0 ",
        "capped -1 two: x has shape [536870912, 4]: 2147483648 elements, more than the 2147483647 (2**31 - 1)"
        " one tensor may hold",
    ]


@pytest.mark.emulator
@needs("arm")
def test_an_aarch64_runner_refuses_a_fifo_and_its_input_as_output(tmp_path: Path) -> None:
    from deploy.ops import TensorType, bind, get_op

    directory = bundle(bind(get_op("leaky_relu"), {}, [TensorType((4,), "float32")]), "arm", tmp_path / "lr")
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    os.mkfifo(tmp_path / "fifo.npy")
    x, fifo = str(tmp_path / "x.npy"), str(tmp_path / "fifo.npy")
    one_line_error(run(directory, "-i", fifo, "-o", str(tmp_path / "o.npy"), target="arm"), 2,
                   f"cannot read input '{fifo}' as a .npy array: not a regular file")  # fmt: skip
    again = run(directory, "-i", x, "-o", x, target="arm")
    one_line_error(again, 2, f"-o '{x}' is '{x}', which this command reads")
    assert not (tmp_path / "o.npy").exists()


ENGINE = r"""#include <stdio.h>
#include "add.h"

#define REPORT(what, call) printf("%s %d %s\n", what, (int)(call), add_last_error())

int main(void) {
  cl_platform_id platform;
  cl_device_id device;
  cl_int err, image_err;
  cl_image_format format = {CL_RGBA, CL_FLOAT};
  cl_image_desc desc = {.image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = 8, .image_height = 8};
  clGetPlatformIDs(1, &platform, NULL);
  clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
  cl_mem a = clCreateBuffer(context, CL_MEM_READ_ONLY, 4096, NULL, &err);
  cl_mem out = clCreateBuffer(context, CL_MEM_WRITE_ONLY, 4096, NULL, &err);
  cl_mem read_only = clCreateBuffer(context, CL_MEM_READ_ONLY, 4096, NULL, &err);
  cl_mem image = clCreateImage(context, CL_MEM_READ_WRITE, &format, &desc, NULL, &image_err);
  REPORT("good", add_cl_enqueue(context, queue, a, a, out));
  REPORT("read-only", add_cl_enqueue(context, queue, a, a, read_only));
  if (image_err == CL_SUCCESS) {
    REPORT("image", add_cl_enqueue(context, queue, a, a, image));
    REPORT("image-input", add_cl_enqueue(context, queue, image, a, out));
  }
  clFinish(queue);
  return 0;
}
"""


def test_an_opencl_output_must_be_a_buffer_the_kernels_may_write(tmp_path: Path) -> None:
    """NAME_cl_enqueue took a read-only buffer or an image as its output (what the kernels wrote
    there is undefined; an image's layout is the driver's). The bundle's runner, run.cc as a CPU
    bundle's, refuses a FIFO input too."""
    from tests.test_opencl_bundle import NEEDS_OPENCL, TARGET, _op, run_engine

    for mark in NEEDS_OPENCL:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    from deploy.compiler.compile import compile_op
    from deploy.compiler.export import export

    directory = tmp_path / "add"
    export(compile_op(_op("add", {}, [(4, 5), (4, 5)]), TARGET, BuildOptions()), directory, bundle=True)
    lines = run_engine(ENGINE, directory, "libadd.a", tmp_path)
    assert lines[:2] == [
        "good 0 ",
        "read-only -1 add: out is an output and its buffer is CL_MEM_READ_ONLY: expected one the kernels"
        " may write",
    ]
    os.mkfifo(tmp_path / "fifo.npy")
    fifo = str(tmp_path / "fifo.npy")
    one_line_error(run(directory, "-i", fifo, "-i", fifo, "-o", str(tmp_path / "o.npy")), 2,
                   f"cannot read input '{fifo}' as a .npy array: not a regular file")  # fmt: skip
    assert lines[2:] in ([], [
        "image -1 add: out is an image or a pipe (cl_mem type 0x10f1): expected a buffer",
        "image-input -1 add: a is an image or a pipe (cl_mem type 0x10f1): expected a buffer",
    ]), lines  # fmt: skip
