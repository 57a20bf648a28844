"""exp, log, erf, tanh and sigmoid as vector code: float32 calls of `te.exp` and friends in a
scheduled function's blocks rewritten as polynomials of adds, multiplies and exponent-bit
shifts, which LLVM vectorizes. Left as calls they become a scalar libm call per lane
(`expf`, `erff`) inside loops the schedule vectorized: GELU (erf) ran at 10x onnxruntime's
time, softmax at 12x (issue #51).

Accuracy (float32, against float64): exp within 1 ulp down to 2**-125 and 0 below (+inf
above ln(FLT_MAX)); log within 1 ulp, denormals included (NaN below 0, -inf at
0); erf within 2e-7 absolute (exactly +-1 past |x| = 3.92, where float32's erf is 1); NaN
stays NaN and infinities give the limits.
float16 calls are computed so in float32; float64 ones keep their calls (they need longer
polynomials).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from deploy.schedules.loops import mentions
from deploy.schedules.registry import ScheduleContext

VECTOR_MATH = "vector math"
"""The pick (`Choices.pick`) of vector polynomials over libm calls: a schedule that wants libm's
exp, log, erf, tanh or sigmoid (the last ulp, denormals) calls `ask_vector_math` with `libm=True`."""
MATH_KEY = "deploy.vector_math"
"""Loop annotation asking the CPU build to rewrite the calls under the loop as polynomials
(`lower_math`). Schedules annotate instead of rewriting in place because an annotation is a
step of the schedule's trace: a tuning record replayed from its trace keeps it, where a rewrite
through `sch.state.replace` is not traced, and records rebuilt with libm's calls (softmax: 0.056
ms measured while tuning, 0.28 ms rebuilt). Loops, not blocks: in TVM 0.27 annotating a block
after the root block (as a search's unroll choice does) writes into the module the schedule
was made from, which every later candidate starts from."""
SHIFTED_KEY = "deploy.shifted_exp"
"""Loop annotation beside MATH_KEY naming the differences `A-B` (buffer names, `;` between)
whose exp needs no clamp from above: B is A's maximum along its last axis (`shifted_by_row_max`),
so A - B <= 0 (a NaN stays NaN). Traced, as MATH_KEY."""
RECIPROCAL_KEY = "deploy.reciprocal_divides"
"""Loop annotation asking the CPU build for `_reciprocal_divides` (traced, as MATH_KEY)."""

LANES_KEY = "deploy.lanes_in_row"
"""Loop annotation of the row rule (`deploy.schedules.cpu.generic`): only this many of the loop's
lanes (a vector's) are in the row, and the block under it runs for those alone (a masked vector).
It marks a row's last step where the row is not whole vectors: the split made that test, and
TVM's compute_at dropped it when it moved the step into the row loop (the lanes past a row of
1000 maxed the next row's floats and, on the last row, what lay past the tensor)."""
SPATIAL = 0
"""`tirx.IterVar.DataPar`: an iteration variable of a block that is not a reduction's."""

F32 = "float32"


def _c(value: float) -> Any:
    return tirx.const(value, F32)


def _let(value: Any, body: Callable[[Any], Any]) -> Any:
    """`body(v)` with `v` bound once to the float32 `value` (read by every term of a polynomial)."""
    var = tirx.Var("v", F32)
    return tirx.Let(var, value, body(var))


LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
"""ln 2 as a sum whose first part has few bits (n times it is exact for the n exp and log meet):
Cody and Waite's split."""
EXP_HI, EXP_LO = 89.0, -87.5
"""Where exp's input is clamped: past ln(FLT_MAX) = 88.72 the result overflows to +inf (89 gives
it); below about -87 (n = -126) it is 0, where the exact result is below 2**-125 (a denormal,
or FLT_MIN and a little more): flushed, as onnxruntime's MLAS and TVM's fast_exp flush it. A
denormal result would cost a scaling step more per element, and a denormal multiply a
microcode assist of about 100 cycles on Intel cores."""
EXP_POLY = (
    1.3846145011e-3,
    8.3741191775e-3,
    4.1667960584e-2,
    1.6666431725e-1,
    4.9999994040e-1,
    1.0,
    1.0,
)
"""exp(r) on [-ln2/2, ln2/2] as 1 + r + c2 r^2 + ... + c6 r^6 in one Horner chain of 6 FMAs: our
fit of the relative error (2e-9 in float64, iteratively reweighted least squares)."""
EXP_ROUND = 1.5 * 2**23 + 126
"""Added to x log2(e), rounds it to the integer n in float32's last place, as 2**23 + 2**22 +
126 + n, whose low bits shifted into the exponent field are 2**(n - 1) (the 2**22 shifts out):
n and its power of two from one add (Cody and Waite; onnxruntime's MLAS rounds so too)."""


def _bits(v: Any) -> Any:
    return tirx.reinterpret("int32", v)


def _clamp(v: Any, low: float, high: float) -> Any:
    """`v` clamped to [low, high]; NaN passes (both compares are false): two vector min/max."""
    return _let(tirx.Select(v < _c(low), _c(low), v), lambda w: tirx.Select(w > _c(high), _c(high), w))


def fast_exp(x: Any, nonpositive: bool = False) -> Any:
    """exp(x), float32: x clamped (EXP_HI, EXP_LO), x = n ln2 + r with n rounded by EXP_ROUND,
    2 exp(r) by EXP_POLY doubled, times 2**(n - 1) from the rounding's bits: n runs from -126
    (0) to 128 (+inf), so 2**(n - 1) is a normal float or 0. 14 vector operations with the
    clamp; NaN goes through as NaN (its bits shift to a scale of 0, and NaN * 0 is NaN). A
    `nonpositive` x (softmax's x - max) is clamped from below only: 13."""

    def body(v: Any) -> Any:
        return _let(v * _c(1 / math.log(2)) + _c(EXP_ROUND), lambda t: scaled(v, t))

    def scaled(v: Any, t: Any) -> Any:
        def poly(r: Any) -> Any:
            p = _c(2 * EXP_POLY[0])
            for coefficient in EXP_POLY[1:]:
                p = p * r + _c(2 * coefficient)
            return p * tirx.reinterpret(F32, tirx.shift_left(_bits(t), tirx.const(23, "int32")))

        return _let(t - _c(EXP_ROUND), lambda n: _let(v - n * _c(LN2_HI) - n * _c(LN2_LO), poly))

    clamped = tirx.Select(x < _c(EXP_LO), _c(EXP_LO), x) if nonpositive else _clamp(x, EXP_LO, EXP_HI)
    return _let(clamped, body)


ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
             -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # fmt: skip
ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
            -1.42647390514189e-02)  # fmt: skip
"""Eigen's rational approximation of erf on [-4, 4] (odd numerator, even denominator)."""
ERF_ONE = 3.92
"""Past this |x| float32's erf rounds to +-1 (1 - erf(3.92) = 4e-9 < half an ulp of 1)."""


def fast_erf(x: Any) -> Any:
    """erf(x), float32: Eigen's rational polynomial, exactly +-1 past ERF_ONE (so that
    GELU(-inf) = -inf * 0 is NaN as numpy's)."""

    def body(v: Any) -> Any:
        return tirx.Select(
            v > _c(ERF_ONE),
            _c(1.0),
            tirx.Select(v < _c(-ERF_ONE), _c(-1.0), _let(v * v, lambda x2: ratio(v, x2))),
        )

    def ratio(v: Any, x2: Any) -> Any:
        p = _c(ERF_ALPHA[0])
        for coefficient in ERF_ALPHA[1:]:
            p = p * x2 + _c(coefficient)
        q = _c(ERF_BETA[0])
        for coefficient in ERF_BETA[1:]:
            q = q * x2 + _c(coefficient)
        return v * p / q

    return _let(x, body)


def fast_sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)), float32."""
    return _c(1.0) / (_c(1.0) + fast_exp(-x))


TANH_SMALL = 0.0625
"""Below this |x| tanh is x - x^3/3 + 2x^5/15 (to float32 precision): 1 - 2 / (e^2x + 1) would
lose x's digits to cancellation there."""


def fast_tanh(x: Any) -> Any:
    """tanh(x), float32: 1 - 2 / (exp(2x) + 1), the odd series near 0; +-1 at +-inf, NaN kept."""

    def body(v: Any) -> Any:
        x2 = v * v
        series = v + v * x2 * (_c(-1 / 3) + x2 * _c(2 / 15))
        far = _c(1.0) - _c(2.0) / (fast_exp(v * _c(2.0)) + _c(1.0))
        return tirx.Select(tirx.abs(v) < _c(TANH_SMALL), series, far)

    return _let(x, body)


LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
"""Cephes' logf polynomial: log(1 + t) = t - t^2/2 + t^3 P(t) for t in [sqrt(0.5) - 1, sqrt(2) - 1]."""
FLT_MIN = 2.0**-126
"""The least normal float32."""
DENORMAL_SCALE = 23
"""A denormal input is multiplied by 2**23 (then normal) and 23 taken off its exponent."""


def fast_log(x: Any) -> Any:
    """log(x), float32: x = m 2**e with m in [sqrt(0.5), sqrt(2)) read from the bits (a denormal
    x scaled to a normal one first), log(m) by Cephes' polynomial in t = m - 1 (exact), plus
    e ln2 in two parts. NaN and x < 0 give NaN, +-0 gives -inf, +inf stays +inf."""

    def body(v: Any) -> Any:
        tiny = v < _c(FLT_MIN)
        scaled = tirx.Select(tiny, v * _c(2.0**DENORMAL_SCALE), v)
        offset = tirx.Select(tiny, _c(-DENORMAL_SCALE - 126), _c(-126))
        return _let(scaled, lambda w: split(v, w, offset))

    def split(v: Any, w: Any, offset: Any) -> Any:
        exponent = tirx.shift_right(_bits(w), tirx.const(23, "int32")).astype(F32) + offset
        half = tirx.reinterpret(
            F32, tirx.bitwise_or(tirx.bitwise_and(_bits(w), tirx.const(0x007FFFFF, "int32")),
                                 tirx.const(0x3F000000, "int32")),
        )  # fmt: skip
        small = half < _c(math.sqrt(0.5))
        m = tirx.Select(small, half + half, half)
        e = tirx.Select(small, exponent - _c(1.0), exponent)
        return _let(m - _c(1.0), lambda t: _let(e, lambda n: finish(v, t, n)))

    def finish(v: Any, t: Any, n: Any) -> Any:
        p = _c(LOG_POLY[0])
        for coefficient in LOG_POLY[1:]:
            p = p * t + _c(coefficient)
        t2 = t * t
        y = t * t2 * p + n * _c(LN2_LO) - _c(0.5) * t2
        value = t + y + n * _c(LN2_HI)
        special = tirx.Select(v == _c(0.0), _c(-math.inf), _c(math.nan))
        return tirx.Select(v > _c(0.0), tirx.Select(v < _c(math.inf), value, v), special)

    return _let(x, body)


REWRITES: dict[str, Callable[[Any], Any]] = {
    "tirx.exp": fast_exp,
    "tirx.erf": fast_erf,
    "tirx.sigmoid": fast_sigmoid,
    "tirx.tanh": fast_tanh,
    "tirx.log": fast_log,
}
"""The calls rewritten, by TIR op name."""


def _rewrite(call: Any, shifted: frozenset[str] = frozenset()) -> Any:
    """A float32 call as its polynomial; a float16 one as the float32 polynomial between casts
    (LLVM has no half erf at all). An exp of a difference named in `shifted` (`A-B`) is
    nonpositive (SHIFTED_KEY)."""
    if not isinstance(call, ir.expr.Call) or not isinstance(call.op, ir.Op):
        return call
    rewrite, dtype = REWRITES.get(call.op.name), str(call.ty)
    if rewrite is None or dtype not in (F32, "float16"):
        return call
    argument = call.args[0].astype(F32)
    if rewrite is fast_exp and _difference(call.args[0]) in shifted:
        value = fast_exp(argument, nonpositive=True)
    else:
        value = rewrite(argument)
    return value if dtype == F32 else value.astype(dtype)


def _loaded(expr: Any) -> Any:
    """The BufferLoad `expr` is, under any casts; None if it is none."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr if isinstance(expr, ir.TensorLoad) else None


def _loads_subtracted(expr: Any) -> tuple[Any, Any] | None:
    """(load of A, load of B) where `expr` is A[...] - B[...] (under casts); None otherwise."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    if not isinstance(expr, tirx.Sub):
        return None
    a, b = _loaded(expr.a), _loaded(expr.b)
    return (a, b) if a is not None and b is not None else None


def _difference(expr: Any) -> str:
    """`A-B` where `expr` is a load of A minus a load of B (under casts); "" otherwise."""
    loads = _loads_subtracted(expr)
    return _named(*loads) if loads else ""


def _named(a: Any, b: Any) -> str:
    """The name SHIFTED_KEY gives the difference of the loads `a` and `b`: `A-B`."""
    return f"{a.source.name}-{b.source.name}"


def _same_row(longer: Any, shorter: Any) -> bool:
    """`longer` indexes one more axis than `shorter`, after the very same index variables."""
    return len(longer.indices) == len(shorter.indices) + 1 and all(
        i.same_as(j) for i, j in zip(longer.indices[:-1], shorter.indices, strict=True)
    )


def _row_max_source(block: Any) -> tuple[str, str] | None:
    """(B, A) where `block` is B[s...] = max(B[s...], A[s..., k]), k over all of A's last axis."""
    store, reduced = block.body, [iv for iv in block.iter_vars if int(iv.iter_type) != SPATIAL]
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Max) or len(reduced) != 1:
        return None
    for own, read in ((store.value.a, store.value.b), (store.value.b, store.value.a)):
        own, read = _loaded(own), _loaded(read)
        if own is None or read is None or not own.source.same_as(store.buffer):
            continue
        k = reduced[0]
        whole = int(k.dom.min) == 0 and tvm_ffi.structural_equal(k.dom.extent, read.source.shape[-1])
        if (
            whole
            and read.indices[-1].same_as(k.var)
            and _same_row(read, store)
            and all(i.same_as(j) for i, j in zip(own.indices, store.indices, strict=True))
        ):
            return store.buffer.name, read.source.name
    return None


def shifted_by_row_max(func: Any) -> list[str]:
    """The differences `A-B` (buffer names) of `func`'s exp calls that are never positive: B is
    written by a max reduction of A along A's last axis (`_row_max_source`), and every exp of
    A - B in `func` reads A[s..., j] - B[s...], the same row (softmax's exp(x - max(x))).
    Looked for in the function as computed, before a schedule rewrites its blocks; none where
    two buffers share a name, or one's name holds the `-` or `;` of SHIFTED_KEY's names (`a-b`
    and `c` would read as `a` and `b-c`)."""
    blocks: list[Any] = []
    buffers: list[Any] = []

    def on_access(node: Any, visitor: Any) -> Any:
        buffer = node.source if isinstance(node, ir.TensorLoad) else node.buffer
        if not any(buffer.same_as(b) for b in buffers):
            buffers.append(buffer)
        return visitor.default_visit(node)

    def on_block(block: Any, visitor: Any) -> Any:
        blocks.append(block)
        return visitor.default_visit(block)

    tvm_ffi.structural_visit(
        func.body, [(SBlock, on_block), (ir.TensorLoad, on_access), (tirx.BufferStore, on_access)]
    )
    names = {b.name for b in buffers}
    if len(names) != len(buffers) or any("-" in name or ";" in name for name in names):
        return []
    row_max = dict(filter(None, map(_row_max_source, blocks)))
    rows: dict[str, bool] = {}

    def on_call(call: Any, visitor: Any) -> Any:
        loads = _loads_subtracted(call.args[0]) if call.op.same_as(ir.Op.get("tirx.exp")) else None
        if loads and row_max.get(loads[1].source.name) == loads[0].source.name:
            rows[_named(*loads)] = rows.get(_named(*loads), True) and _same_row(*loads)
        return visitor.default_visit(call)

    tvm_ffi.structural_visit(func.body, [(ir.expr.Call, on_call)])
    return sorted(name for name, same in rows.items() if same)


def ask_vector_math(
    sch: Any, ctx: ScheduleContext, libm: bool = False, shifted: list[str] | None = None
) -> bool:
    """Have the CPU build rewrite the float32 and float16 exp, log, erf, sigmoid and tanh calls
    of `sch` as vector polynomials (`lower_math`), unless `libm` or the pick VECTOR_MATH says to
    keep libm's: MATH_KEY on each outermost loop (a schedule's last step: the loops are final),
    and SHIFTED_KEY with the `shifted` differences (`shifted_by_row_max` of the function before
    it was scheduled). Whether it asked."""
    if libm or not ctx.choices.pick(VECTOR_MATH, (True, False), True):
        return False
    for loop in _outermost_loops(sch, sch.get_sblock("root")):
        sch.annotate(loop, MATH_KEY, 1)
        if shifted:
            sch.annotate(loop, SHIFTED_KEY, ";".join(shifted))
    return True


def _outermost_loops(sch: Any, parent: Any) -> list[Any]:
    """The outermost loops under the block `parent`, each once (stages computed at a loop share
    it), looked for inside the blocks without loops of their own (a loop partition's)."""
    found: list[Any] = []
    for block in sch.get_child_blocks(parent):
        loops = sch.get_loops(block)
        for loop in loops[:1] or _outermost_loops(sch, block):
            if not any(sch.get(loop).same_as(sch.get(seen)) for seen in found):
                found.append(loop)
    return found


def ask_reciprocal_divides(sch: Any, loop: Any) -> None:
    """Have the CPU build compute the float32 `a / b` of the elementwise blocks under `loop` whose
    `b` is the same across the block's innermost axis (a row's sum) as `a * (1 / b)`
    (`_reciprocal_divides`)."""
    sch.annotate(loop, RECIPROCAL_KEY, 1)


def _reciprocal_divides(block: Any) -> Any:
    """`block`, when elementwise (no reduction axis), with its float32 `a / b` as `a * (1 / b)`
    where `b` does not vary along its last axis: one divide a row and a multiply an element,
    where a vector divide costs several multiplies (layer_norm 1x128x768, AVX2, 1 thread: 0.036
    -> 0.032 ms), within 2 ulp of the divide. The store branches on the row's divisors: where
    one is below FLT_MIN (whose reciprocal may overflow: 1 / b is +inf for |b| < 2**-128) the
    row keeps its divides (a branch per vector that is the same all along the row). Schedules
    ask for it on row reductions of inexact ops, and not on RVV: TVM's vectorizer fails on
    softmax's multiply there ("Cannot match type float32xvscalex4 vs float32xvscalex16")."""
    if not block.iter_vars or any(int(iv.iter_type) != SPATIAL for iv in block.iter_vars):
        return block
    inner = block.iter_vars[-1].var
    divisors: list[Any] = []

    def multiply(div: Any) -> Any:
        if str(div.ty) != F32 or mentions(div.b, inner):
            return div
        divisors.append(div.b)
        return div.a * (_c(1.0) / div.b)

    def store(value: Any) -> Any:
        divisors.clear()
        fast = tvm_ffi.structural_map(value, [(tirx.Div, multiply)])
        if not divisors:
            return value
        tiny = [tirx.abs(b) < _c(FLT_MIN) for b in divisors]
        return tirx.IfThenElse(functools.reduce(tirx.Or, tiny[1:], tiny[0]), value, fast)

    return tvm_ffi.structural_map(block, [(tirx.BufferStore, store)])


def lower_math(func: Any) -> Any:
    """The PrimFunc `func` with the rewrites its schedule asked for made, and their annotations
    dropped: under a loop annotated LANES_KEY its block runs for the lanes in the row; under a
    loop annotated RECIPROCAL_KEY each elementwise block's divides by a row
    constant as multiplies (`_reciprocal_divides`: first, so that the polynomials' own divides
    are left alone), and under one annotated MATH_KEY every float32 and float16 call of
    REWRITES as its polynomial. The first step of the CPU build (`deploy.compiler.tir_passes`)."""

    def rewrite_calls(loop: Any) -> Any:
        shifted = frozenset(filter(None, str(loop.annotations.get(SHIFTED_KEY, "")).split(";")))
        return tvm_ffi.structural_map(
            loop.body, [(ir.expr.Call, functools.partial(_rewrite, shifted=shifted))]
        )

    def reciprocals(loop: Any) -> Any:
        return tvm_ffi.structural_map(loop.body, [(SBlock, _reciprocal_divides)])

    def lanes_in_row(loop: Any) -> Any:
        inside = loop.loop_var < int(loop.annotations[LANES_KEY])

        def masked(realize: Any) -> Any:
            return SBlockRealize(realize.iter_values, tirx.And(realize.predicate, inside), realize.block)

        return tvm_ffi.structural_map(loop.body, [(SBlockRealize, masked)])

    rewrites = (
        ((LANES_KEY,), lanes_in_row),
        ((RECIPROCAL_KEY,), reciprocals),
        ((MATH_KEY, SHIFTED_KEY), rewrite_calls),
    )
    for keys, rewrite in rewrites:

        def lowered(loop: Any, keys: tuple[str, ...] = keys, rewrite: Callable[[Any], Any] = rewrite) -> Any:
            if keys[0] not in loop.annotations:
                return loop
            kept = {k: v for k, v in loop.annotations.items() if k not in keys}
            return tirx.For(
                loop.loop_var, loop.min, loop.extent, loop.kind, rewrite(loop), loop.thread_binding,
                kept, loop.step,
            )  # fmt: skip

        func = tvm_ffi.structural_map(func, [(tirx.For, lowered)])
    return func


LIBM_OPS = (
    "tirx.exp",
    "tirx.erf",
    "tirx.tanh",
    "tirx.sigmoid",
    "tirx.log",
    "tirx.pow",
    "tirx.exp2",
    "tirx.log2",
)
"""Calls LLVM lowers to a scalar libm call per lane (`expf`, `erff`, `logf`, ...)."""
VECTORIZED = 2
"""`tirx.ForKind.VECTORIZED`."""


def libm_in_vector_loops(func: Any) -> list[str]:
    """The libm functions (`LIBM_OPS`, by name: exp, erf) a scheduled PrimFunc still calls inside
    a vectorized loop: each becomes a scalar call per lane there, the loop vectorized in name
    only. Sorted, each once."""
    found: set[str] = set()
    depth = [0]

    def on_for(loop: Any, visitor: Any) -> Any:
        vector = int(loop.kind) == VECTORIZED
        depth[0] += vector
        result = visitor.default_visit(loop)
        depth[0] -= vector
        return result

    def on_call(call: Any, visitor: Any) -> Any:
        if depth[0] and isinstance(call.op, ir.Op) and call.op.name in LIBM_OPS:
            found.add(call.op.name.removeprefix("tirx."))
        return visitor.default_visit(call)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_for), (ir.expr.Call, on_call)])
    return sorted(found)
