"""The deploy-cpu TIR pipeline CPU code is compiled through (`compile_cpu`): the math rewrites
schedules ask for (`requested_math`), then TVM's default pipeline plus strided vector loads made
contiguous, the schedules' software prefetches and a graph's subroutines placed on the CPU.

TVM turns a vector load with stride 2 (a stride-2 pooling window or convolution along W) into
one scalar load and insert per lane. `deinterleave_stride2` loads the elements those lanes span
as two or three contiguous vectors and picks every other lane with a shuffle, which LLVM lowers
to vector loads plus shuffles (`vshufps`/`vpermpd` on AVX2, `vpermt2ps` on AVX-512, `uzp` on
AArch64). `software_prefetch` lowers the
loops a schedule annotated with `deploy.schedules.cpu.PREFETCH` (TVM has no prefetch step for them).
"""

from __future__ import annotations

from typing import Any

from deploy.base.forked import FORK_LOCK
from deploy.schedules.cpu import CACHE_LINE, PREFETCH, PREFETCH_LEVEL, PREFETCH_NEAR
from deploy.schedules.vector_math import lower_math

PIPELINES = {False: "deploy-cpu", True: "deploy-cpu-two-vector-shuffles"}
"""The pipeline's name by the target's `two_vector_shuffles`: one registered pipeline each, so
that builds for two targets at once never run each other's."""
CONFIG = {"tirx.disable_cse_tir": True}
"""TVM's common-subexpression pass would hide a load's index behind a variable whose place in a
vector the rewrite cannot see; it runs after the rewrite instead (see `_pipeline`)."""


def _stride2_to_shuffle(load: Any, analyzer: Any, two_vector_shuffles: bool) -> Any:
    """`a[ramp(b, 2, n)]` -> a shuffle of contiguous vector loads holding its elements b, b + 2,
    ..., b + 2n - 2:
    - on a target with `two_vector_shuffles`, where b's place in a vector of n lanes is known (b
      mod n, from its modular set) and the buffer is whole such vectors: the two or three
      vectors at multiples of n that hold them. A pooling stage's row is stored as such vectors
      just before the output reads its taps, and a load straddling two of those stores waits
      until both reach the cache (store forwarding fails); read as the vectors stored, the taps
      2j - 1, 2j and 2j + 1 share their loads and LLVM keeps the row in registers. max_pool2d k3
      s2 p1, x86-avx512, 1 / 2 threads, 21 interleaved rounds: 1x16x112x112 (in L2) 0.0217 /
      0.0151 -> 0.0183 / 0.0116 ms, 32x64x112x112 9.29 / 4.75 -> 8.78 / 4.60 ms;
    - where b's parity is known and the buffer's length even (for a symbolic batch: a multiple of
      an even size): the pair from b rounded down to even;
    - else the n elements from b and the n up to b + 2n - 2 (they overlap by one), which read
      nothing the load did not, whatever b or the length (a padded stage's rows of 113: a
      depthwise 3x3 stride 2 of 1x32x112x112, x86-avx512, 1 / 2 threads, took 0.357 / 0.184 ms
      with a scalar load and insert a lane, 0.120 / 0.068 so).
    Other loads are returned unchanged."""
    from tvm import tirx

    (index,) = load.indices if len(load.indices) == 1 else (None,)
    if not isinstance(index, tirx.Ramp) or len(load.source.shape) != 1:
        return load
    stride, lanes = index.stride, index.lanes
    if not (isinstance(stride, tirx.IntImm) and int(stride) == 2 and isinstance(lanes, tirx.IntImm)):
        return load
    n, place, size = int(lanes), analyzer.modular_set(index.base), analyzer.modular_set(load.source.shape[0])
    if two_vector_shuffles and place.coeff % n == 0 and size.coeff % n == 0 and size.base % n == 0:
        offset = place.base % n
        count = (offset + 2 * n - 2) // n + 1
        starts = [index.base - offset + k * n for k in range(count)]
        return _picked(load.source, starts, n, [offset + 2 * i for i in range(n)])
    if place.coeff % 2 == 0 and size.coeff % 2 == 0 and size.base % 2 == 0:
        odd = place.base % 2
        return _picked(
            load.source, [index.base - odd, index.base - odd + n], n, [odd + 2 * i for i in range(n)]
        )
    picks = [2 * i + (2 * i >= n) for i in range(n)]  # the second vector starts at lane n - 1
    return _picked(load.source, [index.base, index.base + n - 1], n, picks)


def _picked(source: Any, starts: list[Any], n: int, picks: list[int]) -> Any:
    """The lanes `picks` (indices into the vectors one after the other) of the vectors of `n`
    lanes of `source` at `starts`: a shuffle of contiguous loads."""
    from tvm import tirx

    vectors = [tirx.BufferLoad(source, [tirx.Ramp(start, 1, n)]) for start in starts]
    return tirx.Shuffle(vectors, [tirx.IntImm("int32", pick) for pick in picks])


def requested_math() -> Any:
    """A PrimFunc pass making the rewrites the schedule asked for by annotation
    (`deploy.schedules.vector_math.lower_math`: vector polynomials for libm calls, a row's
    divides as multiplies, a row's last vector masked to the lanes in the row). It runs first,
    while the annotated loops and the blocks under them are as the schedule left them."""
    import tvm

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="RequestedMath")  # type: ignore[untyped-decorator]  # tvm: no stubs
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        return lower_math(func)

    return rewrite


def deinterleave_stride2(two_vector_shuffles: bool) -> Any:
    """A PrimFunc pass applying `_stride2_to_shuffle` to every load, for a target with
    `two_vector_shuffles` or without."""
    import tvm
    import tvm.sym.analyzer
    import tvm_ffi

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="DeinterleaveStride2")  # type: ignore[untyped-decorator]  # tvm: no stubs
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        analyzer = tvm.sym.analyzer.Analyzer()
        return tvm_ffi.structural_map(
            func, [(tvm.ir.TensorLoad, lambda load: _stride2_to_shuffle(load, analyzer, two_vector_shuffles))]
        )

    return rewrite


WINDOW_STEPS = 4
"""Most steps apart two loads of one stream may be for one prefetch to serve both (a pooling
window's taps along the loop: 1 or 2 steps)."""


def _line_starts(loop: Any, local: list[Any]) -> list[tuple[Any, Any]]:
    """(buffer, flat index) where the loads in the body of `loop` of a function's inputs start (a
    vector's first element), one per stream: an index a constant less than a line from one kept
    is left out, and so is one a few whole steps of the loop from it (a sliding window's next
    tap: the kept one's prefetch reaches it that many steps later). So are buffers in `local`
    (stages the function allocates, in cache already), an index with a variable bound inside
    the body or a load in it (it would be read outside its guard), and what is only addressed
    (an inner loop's own prefetches)."""
    import tvm
    import tvm.sym.analyzer
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    analyzer = tvm.sym.analyzer.Analyzer()
    body, var = loop.body, loop.loop_var
    outside = undefined_vars(body, [])
    address_of = tvm.ir.Op.get("tirx.address_of")
    addressed: list[Any] = []
    starts: list[tuple[Any, Any]] = []

    def note_addressed(call: Any) -> Any:
        if call.op.same_as(address_of):
            addressed.append(call.args[0])
        return call

    def plain(start: Any) -> bool:
        """Only variables from outside `body`, no loads."""
        loads: list[Any] = []

        def note(inner: Any) -> Any:
            loads.append(inner)
            return inner

        tvm_ffi.structural_map(start, [(tvm.ir.TensorLoad, note)])
        free = undefined_vars(start, [])
        return not loads and all(any(v.same_as(o) for o in outside) for v in free)

    steps = loop.extent if isinstance(loop.extent, tirx.IntImm) else None

    def near(start: Any, other: Any, bits: int) -> bool:
        apart = analyzer.simplify(start - other)
        if not isinstance(apart, tirx.IntImm):
            return False
        if abs(int(apart)) * bits < CACHE_LINE * 8:
            return True
        step = _advance(start, var)
        if step is None or step <= 0 or steps is None:
            return False
        behind, rest = divmod(abs(int(apart)), step)
        return rest == 0 and behind < min(WINDOW_STEPS, int(steps))

    def same_line(buffer: Any, start: Any) -> bool:
        return any(kept.same_as(buffer) and near(start, other, buffer.dtype.bits) for kept, other in starts)

    def load(node: Any) -> Any:
        index = node.indices[0] if len(node.indices) == 1 else None
        start = index.base if isinstance(index, tirx.Ramp) else index
        if (
            start is not None
            and start.ty.dtype.lanes == 1
            and not any(node.same_as(a) for a in addressed)
            and not any(node.source.same_as(b) for b in local)
            and plain(start)
            and not same_line(node.source, start)
        ):
            starts.append((node.source, start))
        return node

    tvm_ffi.structural_map(body, [(tvm.ir.Call, note_addressed)])
    tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, load)])
    return starts


def _advance(index: Any, var: Any) -> int | None:
    """How far the flat `index` moves when `var` grows by one: a constant, else None."""
    import tvm.sym.analyzer
    import tvm_ffi
    from tvm import tirx

    advanced = tvm_ffi.structural_map(index, [(tirx.Var, lambda v: v + 1 if v.same_as(var) else v)])
    moved = tvm.sym.analyzer.Analyzer().simplify(advanced - index)
    return int(moved) if isinstance(moved, tirx.IntImm) else None


def _along_stream(loop: Any, start: Any, elements: int) -> Any:
    """The flat index `elements` past `start` (where a load in `loop`'s body starts) along what
    that load reads next. Within the loop's range that is `start + elements`. Past the range's
    end, where the one loop around it (the other variable of `start`) moves the load further
    than the range is long, it is as far into the load's range of that loop's next iteration:
    the elements just past its range are another load's, or no one's. Argmax reads a long row
    as segments at once (`SCAN_STREAMS`): each segment's last 16 KiB prefetched the segment
    after it, read already, and the next row's segments started cold (256x100000 on x86-avx512,
    interleaved: 0.91-0.96x the time with the prefetches wrapped)."""
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    var = loop.loop_var
    others = [v for v in undefined_vars(start, []) if not v.same_as(var)]
    per_step = _advance(start, var)
    pitch = _advance(start, others[0]) if len(others) == 1 else None
    if not isinstance(loop.extent, tirx.IntImm) or per_step is None or pitch is None:
        return start + elements
    span = int(loop.extent) * per_step
    if not 0 < elements < span < pitch:
        return start + elements
    past = (var - loop.min) * per_step + elements >= span
    jump = tirx.Select(past, tirx.const(pitch - span, start.ty.dtype), tirx.const(0, start.ty.dtype))
    return start + elements + jump


def _prefetched(loop: Any, local: list[Any]) -> Any:
    """`loop` (annotated PREFETCH: bytes ahead, 0: none) with its body led by one `llvm.prefetch`
    (a read, into the cache level of PREFETCH_LEVEL and those past it: locality 3 for L1, 2 for
    L2) of that many bytes past each of `_line_starts`, then, where PREFETCH_NEAR is set, one into
    L1 that many bytes past each. Near the end of a buffer the address lies past it: a prefetch
    never faults (x86 `prefetcht0`, AArch64 `prfm`), and LLVM's takes any address (its pointer
    is not `noundef`)."""
    from tvm import tirx

    ahead = int(loop.annotations[PREFETCH])
    near = int(loop.annotations.get(PREFETCH_NEAR, 0)) if ahead > 0 else 0
    starts = _line_starts(loop, local) if ahead > 0 else []
    far = 4 - int(loop.annotations.get(PREFETCH_LEVEL, 1))
    fetches = []
    for distance, locality in ((ahead, far), (near, 3)) if near > 0 else ((ahead, far),):
        for buffer, start in starts:
            elements = max(1, distance * 8 // buffer.dtype.bits)
            address = tirx.address_of(tirx.BufferLoad(buffer, [_along_stream(loop, start, elements)]))
            read, keep, data = (tirx.const(v, "int32") for v in (0, locality, 1))
            fetches.append(
                tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch", address, read, keep, data))
            )
    body = tirx.SeqStmt([*fetches, loop.body]) if fetches else loop.body
    own = (PREFETCH, PREFETCH_LEVEL, PREFETCH_NEAR)
    annotations = {k: v for k, v in loop.annotations.items() if k not in own}
    return tirx.For(
        loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations, loop.step
    )


def software_prefetch() -> Any:
    """A PrimFunc pass applying `_prefetched` to every loop annotated PREFETCH. It runs after
    the loops are vectorized (a step is then a vector or more) and before common subexpressions
    are bound (they would hide the indices behind variables bound inside the body)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="SoftwarePrefetch")  # type: ignore[untyped-decorator]  # tvm: no stubs
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        local: list[Any] = []

        def note(alloc: Any) -> Any:
            local.append(alloc.buffer)
            return alloc

        tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, note)])

        def lower(loop: Any) -> Any:
            return _prefetched(loop, local) if PREFETCH in loop.annotations else loop

        return tvm_ffi.structural_map(func, [(tirx.For, lower)])

    return rewrite


CPU_DEVICE = 1
"""DLPack's kDLCPU: the device type a graph's kernels say they run on."""


def subroutines_on_cpu() -> Any:
    """A PrimFunc pass saying that each private subroutine (a graph's kernel, `plan_module`)
    runs on the CPU, as MakePackedAPI says of an entry: a buffer of a kernel too big for the
    stack is allocated through TVMBackendAllocWorkspace, which needs the device. It runs once the
    buffers are placed: the default pipeline puts a kernel's own buffers at the top of its body,
    outside anything the body was wrapped in before (argmax's slices of 2x64x56x56 failed to
    lower with 'Unknown device id in current IR')."""
    import tvm
    from tvm import tirx

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="SubroutinesOnCpu")  # type: ignore[untyped-decorator]  # tvm: no stubs
    def rewrite(func: Any, mod: Any, ctx: Any) -> Any:
        if func.attrs is not None and "global_symbol" in func.attrs:
            return func
        body = func.body
        for key, value in (("device_type", CPU_DEVICE), ("device_id", 0)):
            body = tirx.AttrStmt(tvm.ir.StringImm("default"), key, tirx.const(value, "int32"), body)
        return func.with_body(body)

    return rewrite


def _pipeline(two_vector_shuffles: bool, **kwargs: Any) -> tuple[Any, Any, Any]:
    import tvm
    from tvm.tirx import compilation_pipeline

    default, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("default", **kwargs)
    passes = [
        requested_math(),
        default,
        deinterleave_stride2(two_vector_shuffles),
        software_prefetch(),
        tvm.tirx.transform.CommonSubexprElim(),
        subroutines_on_cpu(),
    ]
    return tvm.transform.Sequential(passes, name="deploy_cpu"), finalize_host, finalize_device


def compile_cpu(mod: Any, target: Any, two_vector_shuffles: bool) -> Any:
    """`tvm.compile` at opt level 3 through the deploy-cpu pipeline, for the TVM `target` of a
    target with `two_vector_shuffles` (`deploy.compiler.targets.Target`) or without."""
    import functools

    import tvm
    from tvm.tirx import compilation_pipeline

    name = PIPELINES[two_vector_shuffles]
    compilation_pipeline.register_tir_pipeline(name, functools.partial(_pipeline, two_vector_shuffles))
    with FORK_LOCK, tvm.transform.PassContext(opt_level=3, config=CONFIG):  # no fork mid-LLVM
        return tvm.compile(mod, target=target, tir_pipeline=name)
