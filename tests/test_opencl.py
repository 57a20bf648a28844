"""The OpenCL target on a real OpenCL runtime (PoCL here): the artifact and its launch plan, run
without TVM, and the error paths (every op against numpy is in the matrix, tests/test_ops_matrix.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from dataclasses import replace

import numpy as np
import pytest

from deploy.base.errors import DeployError
from deploy.compiler.compile import compile_op, compile_scheduled, hand_schedule
from deploy.compiler.export import export
from deploy.compiler.manifest import Manifest
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.ops import TensorType, bind, get_op
from deploy.schedules.registry import Picked, every_structure
from deploy.verify.measure import Answers, check_artifact
from tests.conftest import run_deploy


def _devices() -> list[tuple[int, int, str, bool]]:
    try:
        from deploy.devices.opencl import opencl_devices

        return opencl_devices()
    except Exception:
        return []


DEVICES = _devices()
pytestmark = pytest.mark.skipif(
    not DEVICES, reason="needs pyopencl and an OpenCL platform (Debian: pocl-opencl-icd)"
)
FP16 = bool(DEVICES) and DEVICES[0][3]
TARGET = get_target("opencl")


@pytest.fixture(scope="module")
def cl_session():
    from deploy.devices import get_device

    with get_device("opencl").open() as session:
        yield session


def test_artifact_layout_and_launch_plan(tmp_path):
    bound = bind(get_op("argmax"), {"axis": "0"}, [TensorType((3, 5), "float32")])
    manifest = export(compile_op(bound, TARGET, BuildOptions()), tmp_path / "art")
    files = sorted(p.name for p in (tmp_path / "art").iterdir())
    assert files == ["kernels.cl", "launch.json", "manifest.json"]
    assert manifest.module == "launch.json" and manifest.arch == "opencl"
    plan_ = json.loads((tmp_path / "art" / "launch.json").read_text())
    (kernel,) = plan_["kernels"]
    assert {a["role"] for a in kernel["args"]} == {"input", "output"}
    assert kernel["global"][0] % kernel["local"][0] == 0 and kernel["global"][0] >= 5
    assert "__kernel void " + kernel["name"] in (tmp_path / "art" / "kernels.cl").read_text()


def test_argmax_reduces_across_a_work_group_in_local_memory(tmp_path):
    bound = bind(get_op("argmax"), {}, [TensorType((4, 1000), "float32")])
    manifest = export(compile_op(bound, TARGET, BuildOptions()), tmp_path / "art")
    source = (tmp_path / "art" / "kernels.cl").read_text()
    assert manifest.schedule == "gpu/argmax"
    assert "__local " in source and "barrier(CLK_LOCAL_MEM_FENCE)" in source
    # each work-item's running (max, int32 position) of 4 lanes is private, is updated a float4
    # load a step and reaches local memory once, at its end
    assert "float argmax_partial_v0_local_ptr[4];" in source
    assert "int argmax_partial_v1_local_ptr[4];" in source
    assert "vload4(0, x_ptr + " in source
    assert source.count("argmax_partial_v1_shared_ptr[(((convert_int(get_local_id(0))) * 4) + ") == 1
    (kernel,) = json.loads((tmp_path / "art" / "launch.json").read_text())["kernels"]
    assert kernel["local"][0] == 64 and kernel["global"][0] == 4 * 64


@pytest.mark.parametrize(
    ("name", "shapes", "dtype", "vector"),
    [
        ("add", [(2, 8, 16, 16), (2, 1, 16, 16)], "float32", "vload4"),
        ("leaky_relu", [(3, 5, 8)], "float32", "vload4"),
        ("add", [(4, 32), (4, 32)], "int8", "vload16"),
        ("leaky_relu", [(3, 5, 7)], "float32", None),  # rows of 7: no whole vectors
    ],
)
def test_elementwise_kernels_move_whole_vectors(name, shapes, dtype, vector, cl_session, tmp_path):
    """A work-item loads and stores 16 bytes at a time along the contiguous axis where rows are
    whole vectors (the H100 went from 1.25 to 2.95 TB/s on add), one element otherwise; both
    match numpy."""
    bound = bind(get_op(name), {}, [TensorType(s, dtype) for s in shapes])
    compiled = compile_op(bound, TARGET, BuildOptions())
    source = compiled.executable.source
    if vector:
        assert vector in source and vector.replace("load", "store") in source
    else:
        assert "vload" not in source and "vstore" not in source
    export(compiled, tmp_path / "art")
    assert check_artifact(cl_session, bound, tmp_path / "art", Manifest.read(tmp_path / "art")) == 0


def test_pooling_loads_its_rows_as_vectors():
    """Where rows are whole vectors, a work-item loads the rows of its tile of outputs as vectors
    and stores its outputs as one (the H200 ran the one-output kernel at 3.1x its copy's time);
    elsewhere one output per work-item: the window max's NaN branch does not vectorize."""
    pool = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), pool, [TensorType((1, 4, 16, 16), "float32")])
    compiled = compile_op(bound, TARGET, BuildOptions())
    source = compiled.executable.source
    assert compiled.schedule == "gpu/max_pool2d"
    assert "vload4(0, x_ptr + " in source and "vstore4(" in source and "out_ptr + " in source
    assert "for (" not in source and "float row_vectors_local_ptr[108];" in source  # 9 rows of 3 vectors
    assert source.count("vstore4(vload4(0, out_local_ptr") == 4  # 4 rows of outputs
    narrow = bind(get_op("max_pool2d"), pool, [TensorType((1, 4, 14, 14), "float32")])  # 7 outputs a row
    wide = bind(get_op("max_pool2d"), {"kernel": 6, "stride": 6}, [TensorType((1, 1, 12, 48), "float32")])
    for one_each in (narrow, wide):  # a 6x6 window's rows would take 144 registers
        source = compile_op(one_each, TARGET, BuildOptions()).executable.source
        assert "for (" not in source and "vload" not in source


ROW_VECTOR_POOLS = [
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, (2, 3, 16, 16), "float32"),
    ("max_pool2d", {"kernel": 2, "stride": 2, "padding": 0}, (1, 2, 8, 16), "float32"),
    ("max_pool2d", {"kernel": 3, "stride": 1, "padding": 1}, (1, 2, 5, 8), "float32"),
    ("max_pool2d", {"kernel": [3, 5], "stride": 1, "padding": [0, 2]}, (1, 2, 6, 12), "float32"),
    ("max_pool2d", {"kernel": [2, 3], "stride": [1, 3], "padding": [1, 2]}, (1, 2, 5, 20), "float32"),
    ("max_pool2d", {"kernel": [2, 3], "stride": [3, 2], "padding": [0, 1]}, (1, 2, 9, 16), "float32"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 0, "padding_end": 2}, (1, 2, 7, 16), "float32"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 0, "ceil_mode": True}, (1, 1, 8, 16), "float32"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, (1, 3, 8, 64), "int8"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, (1, 3, 6, 16), "int32"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, (1, 2, 8, 8), "float64"),
    ("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, (1, 3, 6, 16), "float16"),
    ("max_pool3d", {"kernel": 3, "stride": 2, "padding": 1}, (1, 2, 5, 6, 16), "float32"),
]
"""Rows from the tile's first vector in the padding (padding 1) or not, the end guards (padding_end,
ceil mode: the last windows past the input), a stride past the kernel along H, integers of 1 and 4
bytes, 64-bit floats (2 lanes), float16, and a 3-D pool."""

EVERY_STRUCTURE = {0, 7, 8, 12}
"""The ROW_VECTOR_POOLS checked in each structure a search may pick (the one-output form and each
count of output rows a work-item that fits), not only the hand's."""


@pytest.mark.parametrize(
    ("index", "name", "attrs", "shape", "dtype"), [(i, *c) for i, c in enumerate(ROW_VECTOR_POOLS)]
)
def test_row_vector_pools_match_numpy(index, name, attrs, shape, dtype, cl_session, tmp_path):
    """ROW_VECTOR_POOLS on random inputs, ties, NaN and infinities (check_artifact); float16 is
    stored as half where the device lacks it. Some in every structure (EVERY_STRUCTURE)."""
    options = BuildOptions(fp16_storage=dtype == "float16" and not FP16)
    bound = bind(get_op(name), attrs, [TensorType(shape, dtype)])

    def scheduled(picks):
        choices = Picked(picks)
        return choices, hand_schedule(bound, TARGET, options, choices)

    structures = every_structure(scheduled) if index in EVERY_STRUCTURE else [({}, scheduled({})[1])]
    assert "row_vectors" in structures[0][1][0].script()  # the hand's takes the row vectors
    answers = Answers(bound)
    for number, (picks, (mod, label)) in enumerate(structures):
        compiled = compile_scheduled(bound, TARGET, options, mod, label)
        export(compiled, tmp_path / str(number))
        manifest = Manifest.read(tmp_path / str(number))
        assert check_artifact(cl_session, bound, tmp_path / str(number), manifest, answers) == 0, picks


RUN_WITHOUT_TVM = """
import sys, numpy as np
from pathlib import Path
from deploy.devices.opencl import OpenClDevice
art = Path(sys.argv[1])
x = np.load(art / "x.npy")
with OpenClDevice().open() as session:
    (out,) = session.run(art / "launch.json", [x], [((1, 4, 8, 8), "float32")])
np.save(art / "out.npy", out)
assert not [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")], "tvm was imported"
print("ran without tvm")
"""


def test_artifact_runs_in_a_process_without_tvm(tmp_path):
    pool = {"kernel": 3, "stride": 2, "padding": 1}
    bound = bind(get_op("max_pool2d"), pool, [TensorType((1, 4, 16, 16), "float32")])
    art = tmp_path / "art"
    export(compile_op(bound, TARGET, BuildOptions()), art)
    rng = np.random.default_rng(zlib.crc32(b"opencl"))
    x = rng.standard_normal((1, 4, 16, 16)).astype("float32")
    np.save(art / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT_TVM, str(art)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ran without tvm" in done.stdout
    np.testing.assert_array_equal(np.load(art / "out.npy"), bound.op.reference(bound.attrs, x))


def test_kernel_build_failure_and_tampered_source(tmp_path, cl_session):
    from deploy.base.errors import DeployError, UsageError

    bound = bind(get_op("add"), {}, [TensorType((4, 4), "float32")] * 2)
    art = tmp_path / "art"
    export(compile_op(bound, TARGET, BuildOptions()), art)
    x = np.ones((4, 4), "float32")
    source = art / "kernels.cl"
    source.write_text(source.read_text() + "\nthis is not OpenCL;\n")
    with pytest.raises(UsageError, match="does not match the sha256"):
        cl_session.run(art / "launch.json", [x, x], [((4, 4), "float32")])
    import hashlib

    plan_ = json.loads((art / "launch.json").read_text())
    plan_["source_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    (art / "launch.json").write_text(json.dumps(plan_))
    with pytest.raises(UsageError, match=r"launch\.json does not match the sha256 in .*manifest\.json"):
        cl_session.run(art / "launch.json", [x, x], [((4, 4), "float32")])
    (art / "manifest.json").unlink()  # a runner that holds the plan alone builds what it says
    with pytest.raises(DeployError, match=r"OpenCL kernel build failed on .*error"):
        cl_session.run(art / "launch.json", [x, x], [((4, 4), "float32")])


def test_fp16_is_stored_as_half_where_the_device_has_no_half_arithmetic(cl_session, tmp_path):
    """A device without half arithmetic (PoCL here, NVIDIA's driver) still runs float16: builds for
    it load and store half with vload_half/vstore_half (OpenCL 1.2 core, so any device runs them)
    and compute in float32; a kernel that computes in half is refused there in one line."""
    result = run_deploy("test", "--target", "opencl", "--dtype", "float16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout

    bound = bind(get_op("add"), {}, [TensorType((2, 4, 8), "float16"), TensorType((2, 1, 8), "float16")])
    stored = compile_op(bound, TARGET, BuildOptions(fp16_storage=True))
    source, plan_ = stored.executable.source, stored.executable.plan
    assert "vload_half4" in source and "vstore_half4" in source and "cl_khr_fp16" not in source
    assert [b["dtype"] for b in plan_["buffers"]] == ["float16"] * 3 and plan_["float16"] == "storage"
    export(stored, tmp_path / "stored")
    assert check_artifact(cl_session, bound, tmp_path / "stored", Manifest.read(tmp_path / "stored")) == 0

    native = compile_op(bound, TARGET, BuildOptions())
    assert native.executable.plan["float16"] == "native" and "cl_khr_fp16" in native.executable.source
    if not FP16:
        export(native, tmp_path / "native")
        a, b = (np.ones(t.shape, "float16") for t in bound.inputs)
        with pytest.raises(DeployError, match=r"kernels\.cl computes in half, which needs cl_khr_fp16"):
            cl_session.run(tmp_path / "native" / "launch.json", [a, b], [((2, 4, 8), "float16")])


@pytest.mark.skipif(FP16, reason="this device has half arithmetic: float16 kernels stay float16")
def test_a_float16_model_is_tuned_as_the_device_computes_it(tmp_path):
    """Without half arithmetic a float16 graph's kernels compute in float32: `deploy tune --model`
    tunes those (the float32 model's task, whose records run, test and bench use), instead of
    recording every candidate as refused."""
    tasks = []
    for dtype in ("float16", "float32"):
        model = tmp_path / f"{dtype}.yaml"
        model.write_text(
            f"inputs: {{a: {{shape: [1, 8, 16, 16], dtype: {dtype}}},"
            f" b: {{shape: [1, 1, 8, 8], dtype: {dtype}}}}}\n"
            "nodes:\n"
            "  - {name: pool, op: max_pool2d, attrs: {kernel: 3, stride: 2, padding: 1}, inputs: [a]}\n"
            "  - {name: sum, op: add, inputs: [pool, b]}\n"
            "output: sum\n"
        )
        db = tmp_path / f"db-{dtype}"
        tuned = run_deploy(
            "tune", "--model", str(model), "--target", "opencl", "--trials", "2", "--db", str(db)
        )
        assert tuned.returncode == 0 and "(2 new, 2 valid)" in tuned.stdout, tuned.stdout + tuned.stderr
        tasks.append(sorted(p.name for p in (db / "opencl").glob("fused_*")))
    assert tasks[0] == tasks[1] and len(tasks[0]) == 1


def test_no_platform_and_bad_device(tmp_path):
    empty = tmp_path / "vendors"
    empty.mkdir()
    env = {"OCL_ICD_VENDORS": str(empty), "OPENCL_VENDOR_PATH": str(empty)}
    result = run_deploy("test", "--target", "opencl", "--op", "add", env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("error: no OpenCL platform")
    bad = run_deploy("test", "--target", "opencl", "--op", "add", "--cl-device", "7:0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: no OpenCL device 7:0 (have: 0:0")


ROW_CENTER = '''
"""row_center: x - max(x along the last axis), two stages (a user op)."""
from tvm import te
from deploy.ops import Case, Input, Op, register

@register
class RowCenter(Op):
    """Each row minus its maximum."""
    name = "row_center"
    inputs = (Input("x", min_rank=2, max_rank=2),)
    dtypes = ("float32",)
    cases = (Case(((37, 300),)), Case(((3, 5),)))

    def infer(self, attrs, inputs):
        return inputs[0]

    def compute(self, attrs, out, x):
        k = te.reduce_axis((0, x.shape[1]), name="k")
        peak = te.compute((x.shape[0],), lambda i: te.max(x[i, k], axis=k), name="peak")
        return te.compute(out.shape, lambda i, j: x[i, j] - peak[i], name="out")

    def reference(self, attrs, x):
        return x - x.max(axis=1, keepdims=True)
'''


def test_multi_kernel_op_with_a_scratch_buffer(tmp_path):
    """A user op whose second stage reads the first stage's result across work-items: two kernels
    and a scratch buffer the runner allocates."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "row_center.py").write_text(ROW_CENTER)
    folder = str(tmp_path / "ops")
    tested = run_deploy("--ops-path", folder, "test", "--target", "opencl", "--op", "row_center")
    assert tested.returncode == 0, tested.stdout[-1500:] + tested.stderr
    assert "2 cases passed, 0 failed" in tested.stdout
    built = run_deploy("--ops-path", folder, "build", "--target", "opencl", "--op", "row_center",
                       "--shape", "4x9", "-o", str(tmp_path / "art"))  # fmt: skip
    assert built.returncode == 0, built.stderr
    plan_ = json.loads((tmp_path / "art" / "launch.json").read_text())
    assert len(plan_["kernels"]) == 2
    assert plan_["scratch"] == [{"buffer": "peak", "dtype": "float32", "shape": [4]}]
    assert [a["role"] for a in plan_["kernels"][1]["args"]].count("scratch") == 1


def test_opencl_artifact_is_refused_by_a_cpu_device(tmp_path, local_session):
    from deploy.base.errors import UsageError
    from deploy.verify.run import run_artifact

    bound = bind(get_op("add"), {}, [TensorType((4,), "float32")] * 2)
    manifest = export(compile_op(bound, TARGET, BuildOptions()), tmp_path / "art")
    x = np.ones(4, "float32")
    with pytest.raises(UsageError, match=r"is for opencl; local runs x86_64"):
        run_artifact(local_session, tmp_path / "art", manifest, [x, x])


@pytest.mark.parametrize("work_group", [16, 32, 128])
def test_argmax_kernel_follows_the_work_group_size(work_group, cl_session, tmp_path):
    """The size `deploy tune --target opencl` searches reaches the argmax kernel (issue #13, defect
    2: it used a fixed 64 work-items whatever the size), and each size still matches numpy."""
    bound = bind(get_op("argmax"), {"axis": 1}, [TensorType((4, 1200), "float32")])
    target = replace(get_target("opencl"), work_group=work_group)
    compiled = compile_op(bound, target, BuildOptions())
    assert [k["local"] for k in compiled.executable.plan["kernels"]] == [[work_group, 1, 1]]
    assert f"argmax_partial_v1_shared_ptr[{work_group * 4}];" in compiled.executable.source  # float4 each

    export(compiled, tmp_path / "argmax")
    assert check_artifact(cl_session, bound, tmp_path / "argmax", Manifest.read(tmp_path / "argmax")) == 0


CL_TYPE = re.compile(r"(?:u?(?:char|short|int|long)|float|double|half)(?:2|3|4|8|16)?")
ELEMENT_BITS = {"char": 8, "short": 16, "half": 16, "int": 32, "float": 32, "long": 64, "double": 64}


def _declared(source: str) -> dict[str, str]:
    """Name -> OpenCL type of every variable, array and pointer the kernels declare."""
    found = re.findall(rf"\b({CL_TYPE.pattern})\s*\*?\s*(?:restrict\s+)?(\w+)\s*(?:=|;|\[|,|\))", source)
    return {name: kind for kind, name in found}


def _call_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose "(" is at `start`, and the end."""
    args: list[str] = []
    depth, begin = 0, start + 1
    for at in range(start, len(text)):
        if text[at] == "(":
            depth += 1
        elif text[at] == ")":
            depth -= 1
            if depth == 0:
                return [*args, text[begin:at].strip()], at
        elif text[at] == "," and depth == 1:
            args.append(text[begin:at].strip())
            begin = at + 1
    raise AssertionError(f"unbalanced call at {text[start : start + 80]!r}")


def _cl_type(expr: str, declared: dict[str, str]) -> str | None:
    """The OpenCL type of expression `expr` where its outermost form says it (a cast, convert_T,
    a vector literal, vloadN, a nested select, a declared variable, an integer literal), else None."""
    while expr.startswith("("):  # outer parentheses around the whole expression
        inner, end = _call_args(expr, 0)
        if end != len(expr) - 1 or len(inner) != 1:
            break
        expr = inner[0]
    if match := re.match(rf"\(({CL_TYPE.pattern})\)", expr):
        return match.group(1)
    if match := re.match(rf"convert_({CL_TYPE.pattern})(?:_sat)?\(", expr):
        return match.group(1)
    if match := re.match(r"vload_half(\d*)\(", expr):
        return "float" + match.group(1)
    if match := re.match(r"vload(\d+)\(0, (\w+)", expr):
        return declared[match.group(2)] + match.group(1)
    if expr.startswith("select("):
        a, b, _ = _call_args(expr, len("select"))[0]
        return _cl_type(a, declared) or _cl_type(b, declared)
    if match := re.fullmatch(r"(\w+)(?:\[.*\])?", expr):
        name = match.group(1)
        return "int" if name.isdigit() else declared.get(name)
    return None


def _width(kind: str) -> tuple[int, int]:
    """(element bits, lanes) of an OpenCL type."""
    base, lanes = re.fullmatch(r"u?([a-z]+)(\d*)", kind).groups()
    return ELEMENT_BITS[base], int(lanes or 1)


def select_mask_mismatches(source: str) -> list[str]:
    """Every `select(a, b, mask)` in `source` whose mask is not as wide as its operands (OpenCL
    leaves that undefined: NVIDIA's driver gave wrong argmax answers for long4 operands under an
    int4 mask), whose types cannot be told, or whose vector mask is built from scalar tests (0/1
    lanes, where a vector select reads each lane's top bit)."""
    declared = _declared(source)
    bad = []
    for found in re.finditer(r"\bselect\(", source):
        (a, b, mask), _ = _call_args(source, found.end() - 1)
        operand = _cl_type(a, declared) or _cl_type(b, declared)
        test = _cl_type(mask, declared)
        call = f"select({a[:60]}, ..., {mask[:60]})"
        if operand is None or test is None:
            bad.append(f"types unknown: {call}")
        elif _width(operand) != _width(test):
            bad.append(f"{operand} operands, {test} mask: {call}")
        elif _width(test)[1] > 1 and re.match(r"\(*convert_\w+\(\(*\(u?int\d+\)\(", mask):
            bad.append(f"mask of scalar tests: {call}")
    return bad


ARGMAX_BUILDS = [
    ("float32", False, {}, "vload4"),
    ("float32", False, {"select_last": True}, "vload4"),
    ("float16", True, {}, "vload_half4"),
    ("float16", False, {}, None),  # half4 compares give short4 masks: one element a step
    ("int32", False, {"keepdims": True}, "vload4"),
    ("float64", False, {}, None),
    ("int64", False, {}, None),
    ("int8", False, {}, None),
]


@pytest.mark.parametrize(("dtype", "storage", "attrs", "loads"), ARGMAX_BUILDS)
def test_argmax_selects_have_masks_as_wide_as_their_operands(dtype, storage, attrs, loads):
    """Every OpenCL select in an argmax kernel (rows of 1000: vectors a step where the dtype
    allows, with a ragged last step) has a mask of its operands' element width and lanes:
    `select(long4, long4, int4)` passed on PoCL and gave wrong answers on NVIDIA's driver."""
    bound = bind(get_op("argmax"), attrs, [TensorType((3, 1000), dtype)])
    source = compile_op(bound, TARGET, BuildOptions(fp16_storage=storage)).executable.source
    assert (loads in source) if loads else ("vload" not in source)
    assert select_mask_mismatches(source) == []


def test_the_select_check_sees_a_narrow_mask():
    """The check above finds the source NVIDIA's driver got wrong, and masks of scalar tests."""
    source = """__kernel void k(__global long* restrict o) {
  long4 a = ((long4)(1, 2, 3, 4));
  float4 v = vload4(0, f + 0);
  long4 p = select(a, ((long4)(5, 6, 7, 8)), (convert_int4((v < v))));
  int2 q = select(((int2)(0, 0)), ((int2)(1, 1)), (convert_int2(((uint2)((i < 3), (i < 3))))));
  int4 r = select(((int4)(0, 0, 0, 0)), ((int4)(1, 1, 1, 1)), (convert_int4((v < v))));
}"""
    bad = select_mask_mismatches(source)
    assert len(bad) == 2
    assert bad[0].startswith("long4 operands, int4 mask") and bad[1].startswith("mask of scalar")


@pytest.mark.parametrize(
    ("dtype", "storage", "extent", "attrs"),
    [
        ("float32", False, 1000, {}),
        ("float32", False, 1024, {"select_last": True}),
        ("float32", False, 1000, {"select_last": True, "keepdims": True}),
        ("float16", True, 1000, {}),
        ("float16", True, 1000, {"select_last": True}),
        ("int32", False, 1000, {"select_last": True, "out_dtype": "int32"}),
    ],
)
def test_vector_argmax_specials_like_numpy(dtype, storage, extent, attrs, cl_session, tmp_path):
    """The vector-a-step argmax (whole and ragged last steps, first and last index) on the edges:
    ties of the max across lanes and vectors, NaN anywhere (first or last wins), rows all NaN,
    all minimum, all -inf but one +inf, the max in the last vector only."""
    rng = np.random.default_rng(extent)
    floating = np.issubdtype(np.dtype(dtype), np.floating)
    x = rng.integers(0, 5, size=(9, extent)).astype(dtype)
    x[1] = -np.inf if floating else np.iinfo(dtype).min
    x[6, extent - 3] = 9
    x[7, [2, extent - 1]] = 9
    if floating:
        x[2, [extent - 1, 7, 300]] = np.nan
        x[3] = np.nan
        x[4, 17] = np.nan
        x[5, :] = -np.inf
        x[5, extent - 2] = np.inf
        x[8, [5, 6]] = np.inf
    bound = bind(get_op("argmax"), attrs, [TensorType(x.shape, dtype)])
    compiled = compile_op(bound, TARGET, BuildOptions(fp16_storage=storage))
    assert ("vload_half4" if storage else "vload4") in compiled.executable.source
    export(compiled, tmp_path / "art")
    (out,) = cl_session.run(tmp_path / "art" / "launch.json", [x], [(bound.output.shape, bound.output.dtype)])
    np.testing.assert_array_equal(out, bound.op.reference(bound.attrs, x))


@pytest.fixture(scope="module")
def add_artifact(tmp_path_factory):
    """`add` of a 4x4 and a 4 float32 array, built for OpenCL."""
    art = tmp_path_factory.mktemp("add") / "art"
    export(compile_op(bind(get_op("add"), {}, [TensorType((4, 4), "float32"), TensorType((4,), "float32")]),
                      TARGET, BuildOptions()), art)  # fmt: skip
    return art


def test_the_runner_checks_arrays_against_the_plan(add_artifact, cl_session):
    """The API docs/devices.md shows trusts no caller (issue #15, item 11): float64 inputs, an input
    too many or too few, or an output of another shape or dtype are refused before any launch
    (they gave garbage, or kernels writing past the output buffer)."""
    from deploy.base.errors import UsageError

    plan_path = add_artifact / "launch.json"
    a, b = np.arange(16, dtype="float32").reshape(4, 4), np.ones(4, "float32")
    np.testing.assert_array_equal(cl_session.run(plan_path, [a, b], [((4, 4), "float32")])[0], a + b)
    bad = {
        r"input 0 of .*: expected shape \(4, 4\) float32, got shape \(4, 4\) float64": (
            [a.astype("float64"), b], (4, 4), "float32"),
        r"input 1 of .*: expected shape \(4,\) float32, got shape \(4, 4\) float32": (
            [a, a], (4, 4), "float32"),
        r"input 0 of .*: expected a numpy array, got list": ([a.tolist(), b], (4, 4), "float32"),
        r"takes 2 input\(s\), got 3": ([a, b, b], (4, 4), "float32"),
        r"takes 2 input\(s\), got 1": ([a], (4, 4), "float32"),
        r"its kernels write shape \(4, 4\) float32, not \(2, 2\) float32": ([a, b], (2, 2), "float32"),
        r"its kernels write shape \(4, 4\) float32, not \(4, 4\) float64": ([a, b], (4, 4), "float64"),
        r"its kernels write shape \(4, 4\) float32, not \(4, 4\) nonsense": ([a, b], (4, 4), "nonsense"),
    }  # fmt: skip
    for message, (inputs, shape, dtype) in bad.items():
        with pytest.raises(UsageError, match=message):
            cl_session.run(plan_path, inputs, [(shape, dtype)])
        with pytest.raises(UsageError, match=message):
            cl_session.time(plan_path, inputs, [(shape, dtype)], 1, 1)


def _edited_plan(original, tmp_path, edit, keep_manifest=False):
    """A copy of the artifact whose launch.json `edit` changed (alone, as a runner may hold just
    the plan and its source, unless `keep_manifest`)."""
    import shutil

    art = tmp_path / "edited"
    shutil.copytree(original, art)
    if not keep_manifest:
        (art / "manifest.json").unlink()
    plan_ = json.loads((art / "launch.json").read_text())
    edit(plan_)
    (art / "launch.json").write_text(json.dumps(plan_))
    return art / "launch.json"


def test_a_plan_source_outside_the_artifact_is_refused(add_artifact, cl_session, tmp_path):
    """`source` naming ../x.cl or an absolute path was followed (issue #15, item 12): refused."""
    from deploy.base.errors import UsageError

    outside = tmp_path / "x.cl"
    outside.write_bytes((add_artifact / "kernels.cl").read_bytes())
    x = np.ones((4, 4), "float32")
    for source in ("../x.cl", str(outside)):

        def point(plan_, source=source):
            plan_["source"] = source

        plan_path = _edited_plan(add_artifact, tmp_path / source.replace("/", "_"), point)
        with pytest.raises(UsageError, match=r"source '.*x\.cl' is outside the artifact's directory"):
            cl_session.run(plan_path, [x, x[0]], [((4, 4), "float32")])


def test_a_plan_edited_beside_its_manifest_is_refused(add_artifact, cl_session, tmp_path):
    """The manifest pins launch.json: a plan edited next to it (a bigger global size, say) is
    refused before anything is launched."""
    from deploy.base.errors import UsageError

    def wider(plan_):
        plan_["kernels"][0]["global"] = [4096, 1, 1]

    x = np.ones((4, 4), "float32")
    plan_path = _edited_plan(add_artifact, tmp_path, wider, keep_manifest=True)
    with pytest.raises(UsageError, match="does not match the sha256 in"):
        cl_session.run(plan_path, [x, x[0]], [((4, 4), "float32")])


def test_a_malformed_plan_is_one_line(add_artifact, cl_session, tmp_path):
    from deploy.base.errors import UsageError

    def old_format(plan_):
        plan_["buffers"] = [b["name"] for b in plan_["buffers"]]

    def index_past_the_inputs(plan_):
        plan_["kernels"][0]["args"][1]["index"] = 5

    def partial_work_group(plan_):
        plan_["kernels"][0]["global"] = [65, 1, 1]

    x = np.ones((4, 4), "float32")
    cases = {
        "string indices": old_format,
        "no input buffer 5": index_past_the_inputs,
        r"global size \(65, 1, 1\) is not whole work-groups": partial_work_group,
    }
    for number, (message, edit) in enumerate(cases.items()):
        plan_path = _edited_plan(add_artifact, tmp_path / str(number), edit)
        with pytest.raises(UsageError, match=f"not a launch plan of this deploy .*{message}.*: rebuild"):
            cl_session.run(plan_path, [x, x[0]], [((4, 4), "float32")])
