"""OpenCL bundles (`deploy build --target opencl --bundle`) on a real OpenCL runtime (PoCL here),
called from C with no Python in the process: through their deploy-run and through C programs
linking their libraries, against numpy; the errors of a missing library, platform or device, a
kernel that does not build, bad tensors and bad cl_mem buffers; the aarch64 host build."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.compiler.cache import Buildable
from deploy.compiler.compile import compile_graph, compile_op
from deploy.compiler.export import export
from deploy.compiler.opencl import OpenClProgram
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.devices.elf import elf_machine
from deploy.model import load_model
from deploy.ops import TensorType, bind, get_op
from deploy.ops.graph import BoundGraph, bind_graph
from deploy.verify.compare import random_input
from tests.conftest import REPO, examples_registered, invoke
from tests.test_bundle import c_program, check_against_numpy, raw_inputs, raw_output
from tests.test_constants import graphs


def _platforms() -> int:
    try:
        from deploy.devices.opencl import opencl_devices

        return len(opencl_devices())
    except Exception:
        return 0


NEEDS_OPENCL = [
    pytest.mark.skipif(
        not _platforms(), reason="needs an OpenCL platform (Debian: pocl-opencl-icd) and pyopencl"
    ),
    pytest.mark.skipif(not Path("/usr/include/CL/cl.h").is_file(), reason="needs opencl-c-headers"),
]
"""What building and running an OpenCL bundle here needs (tests/test_opencl_board.py too)."""
pytestmark = [
    *NEEDS_OPENCL,
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc"),
]
TARGET = get_target("opencl")
NATIVE = BuildOptions()
STORAGE = BuildOptions(fp16_storage=True)  # PoCL has no cl_khr_fp16


def _op(name: str, attrs: dict[str, object], shapes: list[tuple[int, ...]], dtype: str = "float32"):
    return bind(get_op(name), {k: str(v) for k, v in attrs.items()}, [TensorType(s, dtype) for s in shapes])


def at_batch(model: Path, batch: int) -> BoundGraph:
    """The model's graph with its symbolic batch fixed (an OpenCL plan's sizes are numbers)."""
    graph = load_model(model)
    inputs = tuple((n, TensorType((batch, *t.shape[1:]), t.dtype)) for n, t in graph.inputs)
    return bind_graph(replace(graph, inputs=inputs))


def cases(tmp: Path) -> dict[str, tuple[Buildable, BuildOptions]]:
    """Bundle name -> (op or graph, build options): every op, float32 and some int32 and float16 (half
    storage), the example graphs (their symbolic batch fixed; the custom op's needs the example
    ops registered) and graphs with constants (float32, float16)."""
    made = graphs(tmp)
    examples = REPO / "examples"
    return {
        "htanh": (bind_graph(load_model(examples / "pool_add_leaky_htanh.onnx")), NATIVE),
        "bias": (at_batch(examples / "pool_bias_leaky.onnx", 2), NATIVE),
        "add_f32": (_op("add", {}, [(4, 5), (4, 5)]), NATIVE),
        "add_i32": (_op("add", {}, [(3, 7), (7,)], "int32"), NATIVE),
        "add_f16": (_op("add", {}, [(4, 5), (4, 5)], "float16"), STORAGE),
        "argmax": (_op("argmax", {"axis": 1, "out_dtype": "int32"}, [(3, 50)]), NATIVE),
        "hard_sigmoid": (_op("hard_sigmoid", {}, [(2, 33)]), NATIVE),
        "leaky_f16": (_op("leaky_relu", {}, [(2, 3, 8, 8)], "float16"), STORAGE),
        "pool": (_op("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, [(1, 4, 9, 9)]), NATIVE),
        "pool_i32": (_op("max_pool2d_indices", {"kernel": 2, "stride": 2}, [(1, 2, 6, 6)]), NATIVE),
        "reshape": (_op("reshape", {"shape": "6,4"}, [(2, 3, 4)], "int32"), NATIVE),
        "maxpool_add": (bind_graph(load_model(REPO / "examples" / "maxpool_add.yaml")), NATIVE),
        "shared": (bind_graph(load_model(made["shared"])), NATIVE),
        "half_bias": (bind_graph(load_model(made["float16"])), STORAGE),
    }


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Buildable, Path]]:
    """Every case's bundle, built once for the module."""
    tmp = tmp_path_factory.mktemp("cl-bundles")
    built = {}
    with examples_registered():  # the example model's custom op, for these builds only
        for name, (item, options) in cases(tmp / "models").items():
            compiled = (
                compile_graph(item, TARGET, options)
                if isinstance(item, BoundGraph)
                else compile_op(item, TARGET, options)
            )
            export(compiled, tmp / name, bundle=True, name=name)
            built[name] = (item, tmp / name)
    return built


def inputs_of(item: Buildable, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_input(t, rng, ties=True) for t in item.inputs]


def deploy_run(directory: Path, arrays: list[np.ndarray], work: Path, *extra: str, **kw: Any):
    work.mkdir(parents=True, exist_ok=True)
    args = []
    for index, array in enumerate(arrays):
        np.save(work / f"in{index}.npy", array)
        args += ["-i", str(work / f"in{index}.npy")]
    command = [str(directory / "deploy-run"), str(directory), *args, "-o", str(work / "out.npy"), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, **kw)


def test_every_case_through_deploy_run(bundles, tmp_path: Path) -> None:
    for name, (item, directory) in bundles.items():
        arrays = inputs_of(item, 1)
        proc = deploy_run(directory, arrays, tmp_path / name)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        check_against_numpy(item, arrays, np.load(tmp_path / name / "out.npy"))


def test_every_case_from_one_c_program(bundles, tmp_path: Path) -> None:
    """All the bundles linked into one C program (each keeps its symbols but NAME_* local), each
    called by NAME() and NAME_run() on its own inputs; glibc shared, as the driver is dlopened."""
    calls, work, checks = [], [], []
    for name, (item, directory) in bundles.items():
        inputs, (out,) = list(item.inputs), list(item.outputs)
        calls.append((name, directory, inputs, out))
        arrays = inputs_of(item, 2)
        work.append(raw_inputs(arrays, tmp_path / name))
        checks.append((item, arrays, out))
    program = c_program(calls, tmp_path / "all", "x86", via_run=True, libs=("-ldl", "-lpthread"))
    proc = subprocess.run([str(program), *map(str, work)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for (item, arrays, out), directory in zip(checks, work, strict=True):
        check_against_numpy(item, arrays, raw_output(directory, out))


ENGINE = r"""/* An engine's own context, queue and buffers through add_f32_cl_enqueue; then the checks. */
#include <stdio.h>
#include <string.h>
#include "add_f32.h"

#define REPORT(what, call) printf("%s %d %s\n", what, (int)(call), add_f32_last_error())

int main(void) {
  float a[20], b[20], out[20] = {0};
  int64_t shape[2] = {4, 5};
  cl_platform_id platform;
  cl_device_id device;
  cl_int err;
  for (int i = 0; i < 20; ++i) a[i] = (float)i, b[i] = 100.0f * (float)i;
  clGetPlatformIDs(1, &platform, NULL);
  clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
  cl_command_queue other_queue = clCreateCommandQueue(other, device, 0, &err);
  cl_mem ma = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(a), a, &err);
  cl_mem mb = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(b), b, &err);
  cl_mem mout = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof(out), NULL, &err);
  cl_mem small = clCreateBuffer(context, CL_MEM_READ_WRITE, 16, NULL, &err);
  cl_mem elsewhere = clCreateBuffer(other, CL_MEM_READ_WRITE, sizeof(out), NULL, &err);
  for (int call = 0; call < 2; ++call) {  /* the second call finds its program built */
    REPORT("enqueue", add_f32_cl_enqueue(context, queue, ma, mb, mout));
  }
  clEnqueueReadBuffer(queue, mout, CL_TRUE, 0, sizeof(out), out, 0, NULL, NULL);
  printf("values %g %g %g\n", out[0], out[1], out[19]);
  REPORT("small", add_f32_cl_enqueue(context, queue, ma, mb, small));
  REPORT("elsewhere", add_f32_cl_enqueue(context, queue, elsewhere, mb, mout));
  REPORT("queue", add_f32_cl_enqueue(context, other_queue, ma, mb, mout));
  REPORT("null", add_f32_cl_enqueue(context, queue, ma, NULL, mout));
  REPORT("platform", add_f32_cl_open(7, 0));
  REPORT("device", add_f32_cl_open(0, 9));
  DLTensor ta = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0}, tb = ta, tout = ta;
  tb.data = b;
  tout.data = out;
  DLTensor wrong = ta;
  wrong.dtype.code = kDLInt;
  REPORT("dtype", add_f32(&wrong, &tb, &tout));
  wrong = ta;
  wrong.device.device_type = kDLOpenCL;
  REPORT("memory", add_f32(&wrong, &tb, &tout));
  wrong = ta;
  wrong.ndim = 1;
  REPORT("rank", add_f32(&wrong, &tb, &tout));
  memset(out, 0, sizeof(out));
  REPORT("open", add_f32_cl_open(0, 0));
  REPORT("host", add_f32(&ta, &tb, &tout));
  printf("values %g %g %g\n", out[0], out[1], out[19]);
  add_f32_cl_close();
  REPORT("reopened", add_f32(&ta, &tb, &tout));
  return 0;
}
"""


def run_engine(source: str, directory: Path, library: str, work: Path) -> list[str]:
    """The lines a C program of an engine's calls (`source`) prints, built in `work` against the
    bundle in `directory` (its static `library`) and run; it must build and exit 0."""
    (work / "engine.c").write_text(source)
    cc = ["gcc", "-std=c11", "-Wall", "-Werror", f"-I{directory}", f"-I{directory / 'include'}",
          str(work / "engine.c"), str(directory / library), "-lOpenCL", "-ldl", "-lpthread",
          "-o", str(work / "engine")]  # fmt: skip
    compiled = subprocess.run(cc, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[:3000]
    proc = subprocess.run([str(work / "engine")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_an_engines_context_and_every_check(bundles, tmp_path: Path) -> None:
    directory = bundles["add_f32"][1]
    assert run_engine(ENGINE, directory, "libadd_f32.a", tmp_path) == [
        "enqueue 0 ",
        "enqueue 0 ",
        "values 0 101 1919",
        "small -1 add_f32: out has 16 bytes, expected at least 80 (float32 [4, 5])",
        "elsewhere -1 add_f32: a belongs to another cl_context than the one given",
        "queue -1 add_f32: the cl_command_queue belongs to another cl_context than the one given",
        "null -1 add_f32: b is NULL",
        "platform -1 add_f32: no OpenCL platform 7: expected 0 to 0",
        "device -1 add_f32: no OpenCL device 0:9: platform 0 has 1 device",
        "dtype -1 add_f32: a is int32, expected float32",
        "memory -1 add_f32: a is on device (type 4, id 0): this call takes host memory"
        " (add_f32_cl_enqueue takes cl_mem) (kDLCPU, id 0)",
        "rank -1 add_f32: a has 1 dim, expected [4, 5]",
        "open 0 ",
        "host 0 ",
        "values 0 101 1919",
        "reopened 0 ",
    ]


def one_line(proc: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.splitlines() == [f"deploy-run: {message}"]


def test_deploy_run_errors(bundles, tmp_path: Path) -> None:
    item, directory = bundles["add_f32"]
    arrays = inputs_of(item, 3)
    one_line(deploy_run(directory, arrays, tmp_path, "--cl-device", "3:0"), 2,
             "add_f32: no OpenCL platform 3: expected 0 to 0")  # fmt: skip
    one_line(deploy_run(directory, arrays, tmp_path, "--cl-device", "0"), 2,
             "--cl-device 0: expected PLATFORM:DEVICE, e.g. 0:0")  # fmt: skip
    one_line(deploy_run(directory, arrays, tmp_path, "--threads", "2"), 2,
             "--threads applies to CPU bundles: this one runs on OpenCL")  # fmt: skip
    assert deploy_run(directory, arrays, tmp_path, "--cl-device", "0:0").returncode == 0
    one_line(deploy_run(directory, [arrays[0].astype(np.float64), arrays[1]], tmp_path), 2,
             f"input a ('{tmp_path}/in0.npy') is float64 [4, 5], expected float32 [4, 5]")  # fmt: skip


def _isolated(script: str) -> list[str]:
    """`script` in a user and mount namespace (to hide the OpenCL library or its drivers)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare -rm (user namespaces) to hide the OpenCL library")
    return ["unshare", "-rm", "sh", "-c", script]


def test_no_opencl_library_or_platform(bundles, tmp_path: Path) -> None:
    item, directory = bundles["add_f32"]
    arrays = inputs_of(item, 4)
    found = "readlink -f $(ldconfig -p | grep -m1 'libOpenCL.so.1 ' | sed 's/.*=> //')"
    library = subprocess.run(["sh", "-c", found], capture_output=True, text=True).stdout.strip()
    runner = (
        f"{directory}/deploy-run {directory} -i {tmp_path}/in0.npy -i {tmp_path}/in1.npy -o {tmp_path}/o.npy"
    )
    deploy_run(directory, arrays, tmp_path)  # writes the inputs
    proc = subprocess.run(_isolated(f"mount --bind /dev/null {library} && {runner}"), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("deploy-run: add_f32: no OpenCL library (libOpenCL.so.1, libOpenCL.so: ")
    assert proc.stderr.endswith("(on Debian: ocl-icd-libopencl1 and pocl-opencl-icd)\n")
    vendors = subprocess.run(_isolated(f"mount -t tmpfs none /etc/OpenCL/vendors && {runner}"),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    one_line(vendors, 1, "add_f32: no OpenCL platform: install an OpenCL driver (on Debian: pocl-opencl-icd)")


def test_kernels_that_cannot_build_or_need_fp16(tmp_path: Path) -> None:
    """A source the device's compiler refuses (its log's first lines), and half arithmetic on a
    device without cl_khr_fp16 (PoCL here), each a one-line failure."""
    add = _op("add", {}, [(4, 5), (4, 5)])
    compiled = compile_op(add, TARGET, BuildOptions())
    broken = OpenClProgram(compiled.executable.source.replace("__kernel void", "__kernel vod", 1),
                           compiled.executable.plan)  # fmt: skip
    export(replace(compiled, executable=broken), tmp_path / "broken", bundle=True)
    proc = deploy_run(tmp_path / "broken", inputs_of(add, 5), tmp_path / "w")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.splitlines()[-1]  # PoCL's compiler also writes "1 error generated." there
    assert line.startswith("deploy-run: add: the kernels failed to build (OpenCL error -11): ")
    assert "error" in line and "vod" in line
    half = _op("add", {}, [(4, 5), (4, 5)], "float16")
    export(compile_op(half, TARGET, BuildOptions()), tmp_path / "native", bundle=True)
    assert "float16 is computed in half" in (tmp_path / "native" / "add.h").read_text()
    proc = deploy_run(tmp_path / "native", inputs_of(half, 6), tmp_path / "w")
    assert proc.returncode == 1
    assert "the kernels compute in half, which needs cl_khr_fp16 and" in proc.stderr


def test_layout_header_and_the_cli(tmp_path: Path) -> None:
    result = invoke("build", "--op", "add", "--target", "opencl", "--shape", "4", "--shape", "4", "--bundle",
                    "-o", str(tmp_path / "b"))  # fmt: skip
    assert result.exit_code == 0, result.output
    files = sorted(
        p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*") if p.is_file()
    )
    assert files == [
        "SHA256SUMS", "add.h", "deploy-run", "include/CL/cl.h", "include/CL/cl_platform.h",
        "include/CL/cl_version.h", "include/dlpack/dlpack.h", "kernels.cl", "launch.json", "libadd.a",
        "libadd.so", "manifest.json",
    ]  # fmt: skip
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(tmp_path / "b" / "libadd.so")],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert sorted(line.split()[-1] for line in symbols.splitlines()) == [
        "add", "add_cl_close", "add_cl_enqueue", "add_cl_open", "add_last_error", "add_run",
    ]  # fmt: skip
    needed = subprocess.run(["objdump", "-p", str(tmp_path / "b" / "libadd.so")], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    assert "libOpenCL" not in needed  # loaded at run time
    refused = invoke("build", "--op", "add", "--target", "opencl", "--shape", "4", "--shape", "4", "--bundle",
                     "--host-arch", "sparc", "-o", str(tmp_path / "c"))  # fmt: skip
    assert refused.exit_code == 2 and "no platform 'sparc'" in refused.output
    assert not (tmp_path / "c").exists()
    cpu = invoke("build", "--op", "add", "--target", "x86", "--shape", "4", "--shape", "4", "--fp16",
                 "storage", "-o", str(tmp_path / "d"))  # fmt: skip
    assert cpu.exit_code == 2 and "--fp16 applies to OpenCL targets; x86 writes" in cpu.output


def test_half_storage_from_the_cli_runs_where_half_arithmetic_is_refused(tmp_path: Path) -> None:
    """`deploy build --fp16 storage`: float16 computed in float32, on PoCL (no cl_khr_fp16)."""
    built = invoke("build", "--op", "add", "--target", "opencl", "--shape", "3x5", "--shape", "5", "--dtype",
                   "float16", "--fp16", "storage", "--bundle", "-o", str(tmp_path / "b"))  # fmt: skip
    assert built.exit_code == 0, built.output
    assert json.loads((tmp_path / "b" / "launch.json").read_text())["float16"] == "storage"
    half = _op("add", {}, [(3, 5), (5,)], "float16")
    arrays = inputs_of(half, 7)
    proc = deploy_run(tmp_path / "b", arrays, tmp_path / "w")
    assert proc.returncode == 0, proc.stderr
    check_against_numpy(half, arrays, np.load(tmp_path / "w" / "out.npy"))


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs gcc-aarch64-linux-gnu")
def test_aarch64_host_build(tmp_path: Path) -> None:
    """The host code for an aarch64 board compiles and links (no aarch64 OpenCL driver here: under
    qemu its runner says there is no OpenCL library)."""
    add = _op("add", {}, [(4,), (4,)])
    export(compile_op(add, TARGET, BuildOptions()), tmp_path / "a", bundle=True, host="aarch64")
    for name in ("libadd.so", "deploy-run"):
        assert elf_machine(tmp_path / "a" / name) == "aarch64"
    if shutil.which("qemu-aarch64") is None:
        return
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    x, runner = str(tmp_path / "x.npy"), str(tmp_path / "a" / "deploy-run")
    command = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", runner, str(tmp_path / "a"), "-i", x, "-i", x,
               "-o", str(tmp_path / "o.npy")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no OpenCL library" in proc.stderr, proc.stderr
