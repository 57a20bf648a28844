"""Max pooling: the windows, output size and reference of `max_pool2d` in any layout
(`deploy/ops/layouts.py`: the window slides over the layout's H and W axes) and of `max_pool3d`
(NCDHW: over D, H and W), and the pooling ops' computations, whose building blocks (the window
max, a column stage) are explicit arguments that target families' compute variants pass.

Output size follows PyTorch: floor((H + p + p_end - k) / s) + 1, or ceil with `ceil_mode`, where
the last window must start inside the input or its left padding (p_end is p unless `padding_end`
says otherwise: ONNX's asymmetric pads). Padding never wins the max: padded taps
are -inf for floats and the type minimum for integers.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops.attrs import Attr, Bool, IntPerAxis
from deploy.ops.layouts import NCHW, Layout, layout_attr, layout_of
from deploy.ops.nan import is_nan_bits, none_nan
from deploy.ops.spec import Op, TensorType

MAX_KERNEL = 16


def pool_attrs(kernel: int, stride: int | None, padding: int, axes: str = "HW") -> tuple[Attr, ...]:
    """The attributes of a pooling op over `axes` (HW: 2-D, with a layout; DHW: 3-D) with the
    given defaults (stride None: = kernel)."""
    names = ",".join(axes)

    def per_axis(value: int) -> tuple[int, ...]:
        return (value,) * len(axes)

    return (
        Attr("kernel", IntPerAxis(1, MAX_KERNEL, fuzz_hi=3, axes=axes), per_axis(kernel), f"window {names}"),
        Attr(
            "stride",
            IntPerAxis(1, fuzz_hi=3, axes=axes),
            None if stride is None else per_axis(stride),
            f"step {names} (default: the kernel)",
            optional=stride is None,
        ),
        Attr(
            "padding",
            IntPerAxis(0, fuzz_hi=1, axes=axes),
            per_axis(padding),
            f"border {names} before each axis (and after it unless padding_end says), less than the kernel",
        ),
        Attr(
            "padding_end",
            IntPerAxis(0, fuzz_hi=1, axes=axes),
            None,
            f"border after {names} where it differs (ONNX's pads, TensorFlow's SAME), less than the kernel",
            optional=True,
        ),
        Attr("ceil_mode", Bool(), False, "round the output size up"),
        Attr(
            "dilation",
            IntPerAxis(1, MAX_KERNEL, fuzz_hi=2, axes=axes),
            per_axis(1),
            f"spacing of a window's taps {names}",
        ),
        *((layout_attr(),) if axes == "HW" else ()),
    )


WindowMax = Callable[[list[Any], str], Any]
"""(float taps, dtype) -> TE expression of their max, NaN when any is NaN."""


def nan_test_max(values: list[Any], dtype: str) -> Any:
    """The max of float `values` with an explicit NaN test, NaN when any is NaN (as numpy's max):
    a max chain, and ordered compares that vectorize everywhere (`none_nan`). The plain
    definition; a target family may pair the pooling ops with its own (the `window_max` of
    `max_pool_compute`): on x86 `llvm.maximum` becomes a compare-and-blend sequence that
    measured 2-5x slower than an integer test on the bits in bench/hand_vs_generic.py, on ARM it
    is one NEON `fmax`."""
    return tirx.Select(
        none_nan(values, dtype), functools.reduce(te.max, values), tirx.const(float("nan"), dtype)
    )


def max_of(values: list[Any], dtype: str, window_max: WindowMax) -> Any:
    """TE expression: the max of pooling taps — floats by `window_max` (NaN when any is NaN),
    integers by a max chain."""
    if not dtype.startswith("float"):
        return functools.reduce(te.max, values)
    return window_max(values, dtype)


def first_hit(hits: list[Any], flat: list[Any]) -> Any:
    """TE expression: the element of `flat` at the first of `hits` that holds, else the last
    (where a window's taps look for its max, one of them holds)."""
    found = flat[-1]
    for hit, index in zip(reversed(hits[:-1]), reversed(flat[:-1]), strict=True):
        found = tirx.Select(hit, index, found)
    return found


STAGED_MAX_TAPS = 9
"""Windows of more taps than this compute `Pool.indices` in two passes (see there)."""


@dataclass(frozen=True)
class Pool:
    """A max pool's windows over 2 spatial axes (H, W of `layout`) or 3 (D, H, W of NCDHW, where
    `layout` is NCHW: channels first, unpacked): kernel, stride and the padding before and after
    each axis as tuples with a value per axis, the rounding mode, and the layout of the input and
    output. Each axis's output size and taps depend on that axis alone."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    ceil_mode: bool
    layout: Layout = NCHW
    padding_end: tuple[int, ...] | None = None
    """None: as `padding` (symmetric)."""
    dilation: tuple[int, ...] = (1, 1)
    """Taps `dilation` apart: a window spans (kernel - 1) * dilation + 1 elements."""

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> Pool:
        """The pool of max_pool2d's (any layout) or max_pool3d's (no layout attribute: NCDHW)
        attributes."""
        return cls(
            attrs["kernel"],
            attrs["stride"] or attrs["kernel"],
            attrs["padding"],
            attrs["ceil_mode"],
            layout_of(attrs) if "layout" in attrs else NCHW,
            attrs.get("padding_end"),
            attrs.get("dilation", (1,) * len(attrs["kernel"])),
        )

    @property
    def spatial(self) -> tuple[int, ...]:
        """The tensor axes the window slides over: the layout's H and W, or NCDHW's D, H and W."""
        return self.layout.spatial if len(self.kernel) == 2 else tuple(range(2, 2 + len(self.kernel)))

    @property
    def labels(self) -> str:
        """The names of the window's axes, in order: HW or DHW."""
        return "DHW"[-len(self.kernel) :]

    def span(self, axis: int) -> int:
        """The elements a window covers along `axis`, its taps and the gaps between them."""
        return (self.kernel[axis] - 1) * self.dilation[axis] + 1

    @property
    def after(self) -> tuple[int, ...]:
        """The padding after each axis."""
        return self.padding if self.padding_end is None else self.padding_end

    def out_size(self, axis: int, size: int) -> int:
        s, p = self.stride[axis], self.padding[axis]
        span = size + p + self.after[axis] - self.span(axis)
        out = (math.ceil(span / s) if self.ceil_mode else span // s) + 1
        if self.ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        return out

    def output_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output shape, in the input's layout; checks a 2-D pool's layout (rank and pack;
        a 3-D pool's rank 5 is its input's spec), that the window (the kernel, dilated) fits the
        padded input and padding < kernel on each side (every window holds an input element, as
        ONNX requires)."""
        if len(self.kernel) == 2:
            self.layout.check(name, shape)
        out = list(shape)
        for axis, (label, position) in enumerate(zip(self.labels, self.spatial, strict=True)):
            k, p, after = self.kernel[axis], self.padding[axis], self.after[axis]
            for attr, pads in (("padding", self.padding), ("padding_end", self.after)):
                if pads[axis] >= k:
                    raise UsageError(
                        f"{attr} {list(pads)}: expected less than the kernel {list(self.kernel)}"
                    )
            if shape[position] + p + after < self.span(axis):
                raise UsageError(
                    f"input {name} has shape {list(shape)}: {label}={shape[position]} plus padding is"
                    f" smaller than the kernel {list(self.kernel)}"
                )
            out[position] = self.out_size(axis, shape[position])
            self._check_taps(axis, label, shape[position], out[position])
        return tuple(out)

    def _check_taps(self, axis: int, label: str, size: int, out: int) -> None:
        """Every window of a dilated pool has a tap inside the input (else its max would be the
        padding's)."""
        k, s, p, d = self.kernel[axis], self.stride[axis], self.padding[axis], self.dilation[axis]
        if d == 1:
            return
        for o in range(out):
            if not any(0 <= o * s - p + i * d < size for i in range(k)):
                raise UsageError(
                    f"dilation {list(self.dilation)}: the window at output {label}={o} has no tap inside"
                    f" the input ({label}={size}, padding {list(self.padding)})"
                )

    def windows(
        self, data: te.Tensor, window_max: WindowMax = nan_test_max, columns_first: bool = False
    ) -> Callable[..., Any]:
        """(output index...) -> TE expression: the max of the window at that output of `data`
        (in this pool's layout: the window slides over its H and W axes, or NCDHW's D, H and W),
        float windows maxed by `window_max`.

        Plainly every tap of the window at once: along W each tap is strided by the stride (a
        gather of every other element at stride 2 in NCHW). Where `columns_first`, a
        stage `column_max` (the output's shape with W as in the input) first maxes the kernel's
        rows (a 3-D pool's kd * kh rows of its D and H) at every input column, reading W
        contiguously, and each output then maxes its window's kw columns of that stage (a row that
        stays in L1): the same result (max is associative; NaN propagates through both stages),
        with kh * sw + kw taps per output instead of kh * kw, most of them contiguous.

        A tap in the padding reads the nearest input element instead (its index clamped): that
        element is in the same window — padding is less than the kernel and every window starts
        inside the input or its left padding — so the max, NaN included, is unchanged, and the
        taps need no condition (which would keep the loop from vectorizing). Where a schedule
        splits the interior off, the clamps simplify away and the loads are plain vector loads.
        Dilated taps skip elements, so the nearest element may lie between two taps: there a tap
        outside the input reads the window's first tap inside it instead (`output_shape` checks
        every window has one), again with no condition on a load. (A select would not do: its unread branch
        still loads, and LLVM takes an in-bounds load to mean the index is in range.)"""
        spatial = self.spatial
        sizes = [int(data.shape[position]) for position in spatial]
        dtype = str(data.dtype)

        def taps(source: te.Tensor, index: tuple[Any, ...], axes: range) -> list[Any]:
            """The elements of `source` a window at output `index` reads along the window's
            `axes` (the other axes as `index` says), in row-major order of the taps."""
            steps = itertools.product(*(range(self.kernel[axis]) for axis in axes))
            found = []
            for step in steps:
                at = list(index)
                for axis, k in zip(axes, step, strict=True):
                    at[spatial[axis]] = self.tap(axis, index[spatial[axis]], k, sizes[axis])
                found.append(source[tuple(at)])
            return found

        last = len(spatial) - 1
        if not columns_first:
            return lambda *i: max_of(taps(data, i, range(last + 1)), dtype, window_max)
        shape = list(data.shape)
        for axis, position in enumerate(spatial[:last]):
            shape[position] = self.out_size(axis, sizes[axis])
        columns = te.compute(
            tuple(shape), lambda *i: max_of(taps(data, i, range(last)), dtype, window_max), name="column_max"
        )
        return lambda *i: max_of(taps(columns, i, range(last, last + 1)), dtype, window_max)

    def tap(self, axis: int, out: Any, step: int, size: int) -> Any:
        """The index tap `step` of the window at output `out` reads along `axis` (0: H, 1: W) of
        an input `size` long: clamped into the input, a dilated tap onto the window's first tap
        inside it (`windows`), which divides an index that grows with `out` (a descending one,
        `size - 1 - start`, gave wrong lanes on arm once vectorized: ONNX's 2-D dilations case).
        A side is bounded only where some output's tap `step` crosses it, and a dilated tap past
        the end is a select of its own index: TVM's region analysis of a window's taps grew
        steeply with divisions in their bounds (a 5x5x5 window of dilation 2, each bound a min
        and a division, took 17 s to make a PrimFunc of; 0.1-0.8 s now)."""
        d, s, p = self.dilation[axis], self.stride[axis], self.padding[axis]
        start = out * s - p
        index = start + step * d
        low = step * d - p < 0  # the first window's tap is before the input
        high = (self.out_size(axis, size) - 1) * s - p + step * d > size - 1  # the last's after it
        if d == 1:
            index = te.min(index, size - 1) if high else index
            return te.max(index, 0) if low else index
        first = te.max(start, tirx.floormod(start, d)) if p > 0 else start  # the first tap inside
        if high:
            index = tirx.Select(index <= size - 1, index, first)
        return te.max(index, first) if low else index

    def indices(
        self,
        data: te.Tensor,
        shape: tuple[int | Any, ...],
        index_type: str,
        column_major: bool,
        window_max: WindowMax = nan_test_max,
    ) -> te.Tensor:
        """Where the max of each window of NCHW `data` (the outputs `shape`) is, as a flat index
        into `data` (ONNX MaxPool's Indices): (n * C + c) * H * W plus h * W + w, or w * H + h
        where `column_major`; a staged window's max (below) by `window_max`. The first in
        row-major order among equal maxima, the first NaN where the max is NaN. The taps are
        `windows`' (clamped, no condition): clamping keeps their row-major order, so the first
        tap holding the max is the first input element holding it.
        Up to `STAGED_MAX_TAPS` taps (one pass) each tap is compared with the window's plain max
        chain, and a float window's index is the first NaN's instead where not every tap is a
        number (`none_nan`). The chain copied into each comparison grows the TIR with the square
        of the taps; with the max's NaN test in each copy too, 3x3 took 4.0 s to compile and 2x3
        dilated 5.7 s (now 0.47 and 0.82 s; run time level: 1x64x112x112 3x3 s2, x86-avx512,
        0.77 / 0.41 ms at 1 / 2 threads). More taps compute the max (`window_max`) in a stage of
        its own, read by a second pass that compares each tap with it: 7x7 inline took 3.9 s to
        compile and ran 25% slower than staged. A Let binding the max broke where a schedule
        copies the body (one variable bound twice); staged, 3x3 ran 25-40% slower."""
        _, channels, height, width = data.shape
        dtype = str(data.dtype)

        def taps(oh: Any, ow: Any) -> list[tuple[Any, Any]]:
            return [
                (self.tap(0, oh, dh, int(height)), self.tap(1, ow, dw, int(width)))
                for dh in range(self.kernel[0])
                for dw in range(self.kernel[1])
            ]

        def greatest(n: Any, c: Any, oh: Any, ow: Any) -> Any:
            return max_of([data[n, c, h, w] for h, w in taps(oh, ow)], dtype, window_max)

        staged = self.kernel[0] * self.kernel[1] > STAGED_MAX_TAPS
        top = te.compute(shape, greatest, name="top") if staged else None

        def body(n: Any, c: Any, oh: Any, ow: Any) -> Any:
            at = taps(oh, ow)
            values = [data[n, c, h, w] for h, w in at]
            plane = (n.astype(index_type) * channels + c.astype(index_type)) * height * width
            flat = [
                plane + (w * height + h if column_major else h * width + w).astype(index_type) for h, w in at
            ]
            floats = dtype.startswith("float")
            if top is not None:  # the max is NaN where the window holds one: its first NaN hits
                most = top[n, c, oh, ow]
                hits = [tirx.Or(v == most, is_nan_bits(v, dtype)) if floats else v == most for v in values]
                return first_hit(hits, flat)
            most = functools.reduce(te.max, values)
            found = first_hit([v == most for v in values], flat)
            if not floats:
                return found
            nan = first_hit([is_nan_bits(v, dtype) for v in values], flat)
            return tirx.Select(none_nan(values, dtype), found, nan)

        return te.compute(shape, body, name="out")

    def interior(self, axis: int, size: int) -> tuple[int, int]:
        """Outputs [lo, hi) along `axis` (0: H, 1: W) whose windows lie inside the input."""
        s, p = self.stride[axis], self.padding[axis]
        out = self.out_size(axis, size)
        lo = min(out, -(-p // s))
        return lo, max(lo, min(out, (size - self.span(axis) + p) // s + 1))

    def reference(self, data: np.ndarray) -> np.ndarray:
        """Numpy max pooling of an array in this pool's layout (via NCHW; a packed layout's
        padding lanes pooled like channels), or of an NCDHW one."""
        if len(self.kernel) == 3:
            return self._pool_nchw(data)
        return self.layout.from_nchw(self._pool_nchw(self.layout.to_nchw(data)))

    def _pool_nchw(self, data: np.ndarray) -> np.ndarray:
        """Numpy max pooling of a channels-first array (NCHW, NCDHW)."""
        taps = self._taps_nchw(data, numpy_pad_value(data.dtype))
        return taps.max(axis=tuple(range(-len(self.kernel), 0)))

    def reference_indices(self, data: np.ndarray, column_major: bool) -> np.ndarray:
        """Numpy: `indices` of an NCHW array, int64: per window, among its taps inside the input
        in row-major order, the first NaN, else the first equal to their max."""
        flat = np.arange(data.size, dtype=np.int64).reshape(data.shape)
        if column_major:  # each plane numbered column by column
            flat = flat.reshape(*data.shape[:2], data.shape[3], data.shape[2]).swapaxes(2, 3)
        index = self._taps_nchw(flat, -1)
        inside = index >= 0
        shape = (*index.shape[:4], -1)
        index, inside = index.reshape(shape), inside.reshape(shape)
        values = self._taps_nchw(data, numpy_pad_value(data.dtype)).reshape(shape)
        with np.errstate(invalid="ignore"):
            top = np.where(inside, values, numpy_pad_value(data.dtype)).max(axis=-1, keepdims=True)
            hit = inside & (values == top)
        if np.issubdtype(data.dtype, np.floating):
            nan = inside & np.isnan(values)
            hit = np.where(nan.any(axis=-1, keepdims=True), nan, hit)
        return np.take_along_axis(index, hit.argmax(axis=-1)[..., None], axis=-1)[..., 0]

    def _taps_nchw(self, data: np.ndarray, pad: Any) -> np.ndarray:
        """The taps of every window of a channels-first array, padded with `pad`: N x C x the
        output's spatial dims x the kernel's (OH x OW x KH x KW in 2-D)."""
        axes = range(len(self.kernel))
        outs = [self.out_size(axis, data.shape[2 + axis]) for axis in axes]
        spans = tuple(self.span(axis) for axis in axes)
        extra = [
            max(0, (outs[axis] - 1) * self.stride[axis] + spans[axis] - (data.shape[2 + axis] + padded))
            for axis, padded in zip(axes, np.add(self.padding, self.after), strict=True)
        ]
        widths = ((0, 0), (0, 0), *((self.padding[axis], self.after[axis] + extra[axis]) for axis in axes))
        padded = np.pad(data, widths, constant_values=pad)
        windows = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=tuple(2 + a for a in axes))
        starts = [slice(0, (outs[axis] - 1) * self.stride[axis] + 1, self.stride[axis]) for axis in axes]
        taps = [slice(None, None, d) for d in self.dilation]  # the taps of each window
        index: tuple[Any, ...] = (slice(None), slice(None), *starts, Ellipsis, *taps)
        return windows[index]


def max_pool_compute(
    attrs: dict[str, Any],
    out: TensorType,
    x: te.Tensor,
    window_max: WindowMax = nan_test_max,
    columns_first: bool = False,
) -> te.Tensor:
    """max_pool2d's computation: each output the max of its window of `x` (`Pool.windows`),
    float windows maxed by `window_max`, each window's columns maxed in a stage of their own
    first where `columns_first`. The defaults are the plain definition; a target family's
    compute variant passes its own (`deploy/schedules/cpu/pooling.py`)."""
    windows = Pool.from_attrs(attrs).windows(x, window_max, columns_first)
    return te.compute(out.shape, windows, name="out")


def indices_pool(attrs: dict[str, Any]) -> Pool:
    """max_pool2d_indices' pool: its attributes, in NCHW (the op has no layout)."""
    return Pool.from_attrs({**attrs, "layout": "NCHW"})


def max_pool2d_indices_compute(
    attrs: dict[str, Any], out: TensorType, x: te.Tensor, window_max: WindowMax = nan_test_max
) -> te.Tensor:
    """max_pool2d_indices' computation (`Pool.indices`), the max of a window of more than
    STAGED_MAX_TAPS float taps by `window_max` (the default: the plain definition;
    `deploy/schedules/gpu/pooling.py` passes its own)."""
    return indices_pool(attrs).indices(x, out.shape, out.dtype, attrs["column_major"], window_max)


def numpy_pad_value(dtype: np.dtype) -> Any:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def pooled_type(name: str, tensor: TensorType, pool: Pool) -> TensorType:
    return TensorType(pool.output_shape(name, tensor.shape), tensor.dtype)


class MaxPooling(Op):
    """What max_pool2d and max_pool3d share (each registers its own subclass): the output type,
    computation and reference of the pool of their attributes (`Pool.from_attrs`)."""

    exact = True

    def infer(self, attrs: dict[str, Any], inputs: list[TensorType]) -> TensorType:
        return pooled_type("x", inputs[0], Pool.from_attrs(attrs))

    def compute(self, attrs: dict[str, Any], out: TensorType, x: te.Tensor) -> te.Tensor:
        return max_pool_compute(attrs, out, x)

    def reference(self, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return Pool.from_attrs(attrs).reference(x)
