"""Every op x dtype x case on every registered target (x86 and arm through their bundles, in
test_bundle.py), each on its default device (NaN, infinities and repeated maxima planted in every
case), and the edges random data rarely hits: argmax over
NaN, infinities, ties and all-minimum rows (the plain reduction, the CPU's max-then-find, the GPU's
work-group reduction), NaN through max pooling at the borders (x86's bit test, ARM's
`llvm.maximum`, the GPU's if-then-else), padding that never wins, integer wrap-around, IEEE
specials through add and leaky_relu. A target that cannot run here is skipped with the reason."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from deploy.base.errors import DeployError
from deploy.compiler.cache import cached_build
from deploy.compiler.compile import Compiled, compile_scheduled, hand_schedule
from deploy.compiler.options import BuildOptions, for_device
from deploy.compiler.targets import Target, all_targets
from deploy.devices import Device, Session, get_device
from deploy.devices.platforms import get_platform
from deploy.ops import TensorType, all_ops, bind, get_op
from deploy.ops.layouts import LAYOUTS, NCHW
from deploy.ops.spec import MORE_INT_DTYPES, BoundOp
from deploy.schedules.registry import Picked, every_structure
from deploy.tune.tuners import tuner_for
from deploy.verify.compare import Comparison, random_input
from deploy.verify.matrix import PlannedCase, plan, verify_case
from deploy.verify.measure import Answers, check
from deploy.verify.run import run_artifact, verify

ONLY_DTYPES = {
    "arm-fp16": ("float16",),
    "armv7": ("float32", "float16", "float64"),
    "riscv64": ("float32", "float16", "int64"),
}
"""Targets that differ from another only for some dtypes run just those here: arm-fp16 is arm plus
fp16 arithmetic, its other dtypes build as arm's do; armv7 and riscv64 (whose whole matrix runs in
test_bundle.py) run the edge cases in the dtypes they build their own way (NEON's and RVV's max,
float16 by conversion, scalar float64 on armv7 and int64 on riscv64)."""


def unavailable(target: Target, device: Device) -> str | None:
    """Why `target` cannot run on `device` here (None: it can)."""
    if target.cross_compiler and shutil.which(target.cross_compiler) is None:
        return f"needs {target.cross_compiler} (Debian: {target.cross_package})"
    if device.emulated:
        platform = get_platform(device.arch)
        for tool, package in ((platform.qemu, platform.qemu_package), (platform.gxx, platform.gxx_package)):
            if tool is None or shutil.which(tool) is None:
                return f"needs {tool or f'an emulator for {device.arch}'} (Debian: {package})"
    if missing := device.missing_cpu_flags(target.cpu_flags):
        return f"host CPU lacks {', '.join(missing)}"
    if device.arch == "opencl":
        from deploy.devices.opencl import opencl_devices

        try:
            if not opencl_devices():
                return "no OpenCL platform (Debian: pocl-opencl-icd)"
        except DeployError as exc:  # pyopencl missing
            return str(exc)
    return None


@dataclass(frozen=True)
class OnTarget:
    """A target and an open session on its default device."""

    target: Target
    session: Session

    def check(self, op_name: str, attrs: dict[str, Any], *arrays: np.ndarray) -> Comparison:
        """Build `op_name` for these arrays, run it on them, compare with numpy."""
        comparison, _ = verify(
            self.session, self.bound(op_name, attrs, arrays), self.target, BuildOptions(), list(arrays)
        )
        return comparison

    def run(self, op_name: str, attrs: dict[str, Any], *arrays: np.ndarray) -> np.ndarray:
        """Build `op_name` for these arrays and run it on them: its output."""
        options = for_device(BuildOptions(), self.session)
        directory, manifest = cached_build(self.bound(op_name, attrs, arrays), self.target, options)
        (output,) = run_artifact(self.session, directory, manifest, list(arrays))
        return output

    @staticmethod
    def bound(op_name: str, attrs: dict[str, Any], arrays: tuple[np.ndarray, ...]) -> BoundOp:
        return bind(get_op(op_name), attrs, [TensorType(a.shape, str(a.dtype)) for a in arrays])


class Sessions:
    """One session per target, opened by its first test and kept until the module ends (one
    emulator start per target, however the tests are ordered)."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._open: dict[str, OnTarget | str] = {}

    def on(self, target: Target) -> OnTarget:
        """`target` ready to run; skips the test when it cannot run here."""
        if target.name not in self._open:
            device = get_device(target.default_device)
            reason = unavailable(target, device)
            if reason is None:
                session = self._stack.enter_context(device.open())
                self._open[target.name] = OnTarget(target, session)
            else:
                self._open[target.name] = f"{target.name}: {reason}"
        found = self._open[target.name]
        if isinstance(found, str):
            pytest.skip(found)
        return found


@pytest.fixture(scope="module")
def sessions() -> Iterator[Sessions]:
    with ExitStack() as stack:
        yield Sessions(stack)


def ident(value: Any) -> str:
    """A parameter as it reads in a test id."""
    if isinstance(value, PlannedCase):
        return f"{value.op.name}-{value.dtype}-{value.index}"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def on_every_target(
    argnames: str, values: list[tuple[Any, ...]], targets: list[Target] | None = None
) -> pytest.MarkDecorator:
    """Parametrize `target` and `argnames` with every registered target (or those of `targets`)
    times each of `values` (a dtype or a planned case first) that the target runs (its dtypes, a
    symbolic batch where its artifact takes one); targets on the emulator are marked `emulator`."""
    params = []
    for target in all_targets() if targets is None else targets:
        marks = [pytest.mark.emulator] if get_device(target.default_device).emulated else []
        wanted = ONLY_DTYPES.get(target.name)
        for value in values:
            planned = isinstance(value[0], PlannedCase)
            dtype = value[0].dtype if planned else value[0]
            if (wanted is None or dtype in wanted) and (not planned or value[0].runs_on(target)):
                name = "-".join(ident(v) for v in (target.name, *value))
                params.append(pytest.param(target, *value, marks=marks, id=name))
    return pytest.mark.parametrize(f"target,{argnames}", params)


THROUGH_BUNDLES = ("x86", "arm", "armv7", "riscv64")
"""Targets whose matrix runs through their C bundles (`test_bundle.py`): the same kernels as their
modules, with the runtime and checks that ship; here the others run it through TVM's runtime."""
BUNDLES_ONLY = ("armv7", "riscv64")
"""Targets whose devices run bundles only (the runner protocol): here their edge cases, not the
structures a search picks nor packed layouts, which only tuning builds (it cannot measure through
the runner yet, #38)."""
TUNABLE = [t for t in all_targets() if t.name not in BUNDLES_ONLY]


MORE_INT_CASES = (2, 6, 7)
"""The cases of add that the integer dtypes only it takes (`deploy.ops.spec.MORE_INT_DTYPES`) run in the
matrices here and in test_bundle.py: broadcast both ways, an odd length (a vector's tail) and a
symbolic batch. Its other cases differ from int8's and int64's in shape only (`deploy test` runs
them all)."""
INDEX_ATTRS = ("padding_end", "dilation", "select_last")
"""Attributes whose cases test index arithmetic (asymmetric pads, dilated taps, the last index on
ties): they run in the dtypes that take another path through it, in the matrices here and in
test_bundle.py: a float max with its NaN test, float16 by conversion, an integer max, and int64
(scalar on RVV). float64, uint8 and int32 take float32's and int8's paths (`deploy test` runs
them all)."""
INDEX_DTYPES = ("float32", "float16", "int8", "int64")


FEW_DTYPES = {
    "max_pool2d_indices": ("float32", "int8"),
    "max_pool3d": ("float32", "int8"),
    "reshape": ("float16",),
    "hard_sigmoid": ("float32", "float16"),
}
"""Ops whose matrices run a few of their dtypes, and a search's structures for their first case
only: the pooling indices compare with a float max (then find a first NaN) and an integer max
(float16 converts as max_pool2d's does); max_pool3d is max_pool2d's computation and schedule with one
more window axis (max_pool2d runs every dtype); a reshape moves elements and computes nothing; hard_sigmoid
computes as leaky_relu does (float64 takes float32's path). `deploy test` runs every dtype."""


def _in_matrix(planned: PlannedCase) -> bool:
    """Whether the test matrices run `planned` (see MORE_INT_CASES, INDEX_ATTRS, FEW_DTYPES)."""
    if planned.op.name in FEW_DTYPES:
        return planned.dtype in FEW_DTYPES[planned.op.name]
    if planned.dtype in MORE_INT_DTYPES:
        return planned.index in MORE_INT_CASES
    if any(attr in planned.case.attrs for attr in INDEX_ATTRS):
        return planned.dtype in INDEX_DTYPES
    return True


MATRIX = [c for c in plan(all_ops()) if _in_matrix(c)]


@on_every_target(
    "planned", [(c,) for c in MATRIX], [t for t in all_targets() if t.name not in THROUGH_BUNDLES]
)
def test_op_matches_reference(target, planned, sessions):
    on = sessions.on(target)
    result = verify_case(on.session, planned, target, BuildOptions(), specials=True)
    assert result.ok, f"{result.case}: {result.detail} (max error {result.max_error})"
    assert result.schedule != "-"


ARGMAX_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int64")


@on_every_target("dtype,axis", [(d, a) for d in ARGMAX_DTYPES for a in (0, -1)])
def test_argmax_nan_infinities_ties_and_minimum_like_numpy(target, dtype, axis, sessions):
    """Short axes: the plain reduction on CPUs, a few lanes of the GPU work-group reduction.
    (Axis 1 of these 2-D arrays is axis -1.)"""
    if np.issubdtype(np.dtype(dtype), np.floating):
        rows = [[1, 3, 3, np.nan], [np.nan, 2, np.nan, 2], [-np.inf] * 4, [np.inf, 0, np.inf, np.nan]]
    else:
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        rows = [[low] * 4, [1, 3, 3, 0], [high, low, high, 2], [low, low, 0, low]]
    comparison = sessions.on(target).check("argmax", {"axis": axis}, np.array(rows, dtype=dtype))
    assert comparison.ok, comparison.detail


LONG_ROW = 65547
"""A row of at least 64 KiB in every dtype, not a whole number of vectors: the CPU reads it as
several streams (`SCAN_STREAMS`), the last one overlapping the one before."""

WIDE = [
    (dtype, extent, attrs)
    for dtype in ARGMAX_DTYPES
    for extent, attrs in (
        (32, {"axis": -1}),
        (50, {"axis": -1}),
        (50, {"axis": 1, "keepdims": True, "out_dtype": "int32"}),
        (1000, {"axis": -1}),
        (LONG_ROW, {"axis": -1}),
    )
] + [(dtype, LONG_ROW, {"axis": -1, "select_last": True}) for dtype in ("float32", "int8")]


@on_every_target("dtype,extent,attrs", WIDE)
def test_wide_argmax_rows_like_numpy(target, dtype, extent, attrs, sessions):
    """Rows wide enough for the CPU's max-then-find form (16 lanes dividing the row, 16 not, 8;
    a long row in streams) and several steps of the GPU's strided work-items: the max tied
    across lanes, NaN anywhere (first wins), rows all NaN, all minimum, all -inf but a last
    +inf, a max tied at three quarters of the row and at its end (where streams meet)."""
    rng = np.random.default_rng(extent)
    floating = np.issubdtype(np.dtype(dtype), np.floating)
    x = rng.integers(0, 5, size=(8, extent)).astype(dtype)  # many ties of the max
    x[1] = -np.inf if floating else np.iinfo(dtype).min
    x[6] = 1
    x[6, [extent * 3 // 4 - 1, extent * 3 // 4, extent - 1]] = 6
    if floating:
        x[2, [extent - 1, 7]] = np.nan
        x[3] = np.nan
        x[4, 17] = np.nan
        x[5, :] = -np.inf
        x[5, extent - 1] = np.inf
    comparison = sessions.on(target).check("argmax", attrs, x)
    assert comparison.ok, f"{attrs}: {comparison.detail}"


@on_every_target("dtype", [("float32",), ("int8",), ("uint8",), ("int32",)])
def test_max_pool_padding_never_wins(target, dtype, sessions):
    low = np.iinfo(dtype).min if dtype != "float32" else -1e30
    x = np.full((1, 1, 5, 5), low, dtype=dtype)
    comparison = sessions.on(target).check("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, x)
    assert comparison.ok, comparison.detail


@on_every_target("dtype", [("float32",), ("float16",)])
def test_max_pool_propagates_nan_like_numpy(target, dtype, sessions):
    """NaN in corner, interior and border windows; +inf and -inf beside them."""
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(dtype)
    x[0, 0, 0, 0] = x[0, 1, 3, 4] = x[0, 1, 5, 5] = np.nan
    x[0, 0, 2, 2], x[0, 0, 5, 0], x[0, 1, 0, 5] = np.inf, -np.inf, -np.inf
    comparison = sessions.on(target).check("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, x)
    assert comparison.ok, comparison.detail


@on_every_target("dtype", [("int8",), ("uint8",), ("int32",), ("int64",)])
def test_integer_add_wraps_like_numpy(target, dtype, sessions):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, 0], dtype=dtype)
    b = np.array([1, -1 if info.min < 0 else info.max, info.max, info.min], dtype=dtype)
    comparison = sessions.on(target).check("add", {}, a, b)
    assert comparison.ok, comparison.detail


@on_every_target("dtype", [("float32",), ("float16",)])
def test_ieee_specials_through_add_and_leaky_relu(target, dtype, sessions):
    """inf + -inf is NaN, NaN stays NaN; leaky_relu with alpha 0 turns NaN and -inf into NaN
    (TVM folds x * 0.0 to 0.0), a negative alpha turns -inf into +inf."""
    on = sessions.on(target)
    a = np.array([np.inf, -np.inf, np.nan, np.inf, 1, -np.inf, 0, -2], dtype=dtype)
    b = np.array([-np.inf, -np.inf, 1, np.inf, np.nan, 1, -0.0, 2], dtype=dtype)
    comparison = on.check("add", {}, a, b)
    assert comparison.ok, f"add: {comparison.detail}"
    for alpha in (0.0, -1.5):
        comparison = on.check("leaky_relu", {"alpha": alpha}, a)
        assert comparison.ok, f"leaky_relu alpha={alpha}: {comparison.detail}"


LAYOUT_CHANNELS = (1, 2, 3, 4, 7, 8, 15, 16)
"""Channel counts straddling every packing, as ncnn sweeps its layers' channels across elempack 4
and 8: packed layouts pad 1-3 or 1-7 lanes, or none."""
OTHER_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout is not NCHW)
LAYOUT_SWEEP = [("float32", layout, c) for layout in OTHER_LAYOUTS for c in LAYOUT_CHANNELS] + [
    (dtype, layout, 7) for dtype in ("float16", "int8") for layout in OTHER_LAYOUTS
]
POOL = {"kernel": 3, "stride": 2, "padding": 1}


def nchw_input(dtype: str, channels: int) -> np.ndarray:
    """A [2, channels, 9, 9] NCHW input with NaN, infinities and repeated maxima planted."""
    return random_input(
        TensorType((2, channels, 9, 9), dtype), np.random.default_rng(channels), specials=True
    )


@on_every_target("dtype,layout,channels", LAYOUT_SWEEP, TUNABLE)
def test_pooling_in_a_layout_is_the_nchw_reference_transformed(target, dtype, layout, channels, sessions):
    """max_pool2d in `layout` on an NCHW input packed by numpy (padding lanes 0) is numpy's NCHW
    pooling transformed the same way, bit for bit; `layout_transform` back to NCHW (dropping the
    padding) is numpy's NCHW pooling itself."""
    on, into = sessions.on(target), LAYOUTS[layout]
    x = nchw_input(dtype, channels)
    expected = OnTarget.bound("max_pool2d", POOL, (x,)).reference(x)
    pooled = on.run("max_pool2d", {**POOL, "layout": layout}, into.from_nchw(x))
    np.testing.assert_array_equal(pooled, into.from_nchw(expected))
    unpacked = on.run("layout_transform", {"src": layout, "dst": "NCHW", "channels": channels}, pooled)
    np.testing.assert_array_equal(unpacked, expected)


@on_every_target("layout,channels", [(layout, c) for layout in OTHER_LAYOUTS for c in (3, 8, 15)], TUNABLE)
def test_argmax_and_add_in_a_layout_are_the_nchw_reference_transformed(target, layout, channels, sessions):
    """Argmax over the channels of a packed input skips its padding lanes (0 there would win over
    the negative values of real channels); add broadcasts a one-channel operand over them."""
    on, into = sessions.on(target), LAYOUTS[layout]
    x = nchw_input("float32", channels)
    x[:, :, :4] = -np.abs(x[:, :, :4]) - 1  # rows where every real channel is below the padding's 0
    indices = on.run("argmax", {"axis": 1, "layout": layout, "channels": channels}, into.from_nchw(x))
    np.testing.assert_array_equal(indices, np.argmax(x, axis=1))
    bias = np.random.default_rng(1).standard_normal((2, 1, 9, 9)).astype("float32")
    operand = bias.transpose(0, 2, 3, 1) if not into.packed else bias  # NHWC broadcasts as NHWC
    summed = on.run("add", {"layout": layout}, into.from_nchw(x), np.ascontiguousarray(operand))
    np.testing.assert_array_equal(into.to_nchw(summed, channels), x + bias)


STRUCTURE_DTYPES = ("float32", "float16", "int8")
STRUCTURE_CASE_MOST = 1 << 20
"""Input elements of the largest case checked in every structure: a bigger case is a smaller
one's structure with more rows, and takes a minute per op on the emulator."""
STRUCTURE_CASES = [
    (c,)
    for c in plan(all_ops(), STRUCTURE_DTYPES)
    if not c.symbolic
    and sum(math.prod(int(d) for d in shape) for shape in c.case.shapes) <= STRUCTURE_CASE_MOST
    and _in_matrix(c)
    and (c.op.name not in FEW_DTYPES or c.index == 0)
]
"""Static cases only: tuning takes static shapes, so a symbolic batch is only ever built by hand."""


@pytest.mark.slow
@on_every_target("planned", STRUCTURE_CASES, [t for t in TUNABLE if tuner_for(t).searches_structures])
def test_every_structure_a_search_may_pick_matches_numpy(target, planned, sessions, tmp_path):
    """The case built as each combination of the structural picks its target's strategy makes
    (pooling: the column stage per row or per plane, vector width, border splits; generic: rows
    fused; the hand's alone where it picks nothing), against numpy on random data, ties, NaN and
    infinities (a tuner's acceptance check), on every target whose tuner searches them."""
    on, bound = sessions.on(target), planned.bind()
    answers = Answers(bound)
    for picks, compiled in distinct_structures(bound, target, BuildOptions()):
        try:
            check(on.session, compiled, tmp_path, answers)
        except DeployError as exc:
            pytest.fail(f"{picks}: {exc}")


CPU_TARGETS = [t for t in TUNABLE if t.default_device != "opencl"]


@on_every_target("dtype", [("float32",), ("int8",)], CPU_TARGETS)
def test_argmax_over_few_outputs_scans_in_slices(target, dtype, sessions, tmp_path, monkeypatch):
    """Argmax over the channels of 1xCx3x9 has too few outputs to keep 4 cores busy: the channels
    split into ordered slices, one a core, combined after (`sliced_argmax`), checked in every
    structure a search may pick (tasks a core) with ties, NaN and infinities, in a dtype of 4 and
    one of 1 byte (arm-fp16 builds those as arm does). SLICE_WORK is
    lowered so that 251 channels split (at its value they would need 1x4999x3x9)."""
    import deploy.schedules.cpu.argmax
    from deploy.compiler.compile import context

    monkeypatch.setattr(deploy.schedules.cpu.argmax, "SLICE_WORK", 1024)
    four = BuildOptions(cores=4)
    bound = bind(get_op("argmax"), {"axis": 1}, [TensorType((1, 251, 3, 9), dtype)])
    assert deploy.schedules.cpu.argmax.argmax_slices(context(bound, target, four)) == 4
    on, answers = sessions.on(target), Answers(bound)
    for picks, compiled in distinct_structures(bound, target, four):
        try:
            check(on.session, compiled, tmp_path, answers)
        except DeployError as exc:
            pytest.fail(f"{picks}: {exc}")


def distinct_structures(
    bound: BoundOp, target: Target, options: BuildOptions
) -> Iterator[tuple[dict[str, Any], Compiled]]:
    """`bound` scheduled by `target`'s strategy (with `options`) as each combination of the
    structural picks a search may make (`every_structure`), compiled once per distinct scheduled
    module: picks that leave the schedule as it was (a stage's placement where there is no stage,
    border splits of a row with no interior) build the same code, which one check covers (on
    x86 387 of the 570 structures of STRUCTURE_CASES are distinct)."""
    import tvm_ffi

    def scheduled(picks: dict[str, Any]) -> tuple[Picked, tuple[Any, str]]:
        choices = Picked(picks)
        return choices, hand_schedule(bound, target, options, choices)

    built: list[Any] = []
    for picks, (mod, label) in every_structure(scheduled):
        if not any(tvm_ffi.structural_equal(mod, other) for other in built):
            built.append(mod)
            yield picks, compile_scheduled(bound, target, options, mod, label)
