"""2-D max pooling: `max_pool2d`'s windows, output size and reference in any layout
(`deploy/ops/layouts.py`: the window slides over the layout's H and W axes), and the pooling ops'
computations, whose building blocks (the window max, a column stage) are explicit arguments
that target families' compute variants pass.

Output size follows PyTorch: floor((H + p + p_end - k) / s) + 1, or ceil with `ceil_mode`, where
the last window must start inside the input or its left padding (p_end is p unless `padding_end`
says otherwise: ONNX's asymmetric pads). Padding never wins the max: padded taps
are -inf for floats and the type minimum for integers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import te, tirx

from deploy.base.errors import UsageError
from deploy.ops.attrs import Attr, Bool, IntPair
from deploy.ops.layouts import NCHW, Layout, layout_attr, layout_of
from deploy.ops.nan import any_nan_bits, is_nan_bits
from deploy.ops.spec import TensorType

MAX_KERNEL = 16


def pool_attrs(kernel: int, stride: int | None, padding: int) -> tuple[Attr, ...]:
    """The attributes of a 2-D pooling op with the given defaults (stride None: = kernel)."""
    return (
        Attr("kernel", IntPair(1, MAX_KERNEL, fuzz_hi=3), (kernel, kernel), "window H,W"),
        Attr(
            "stride",
            IntPair(1, fuzz_hi=3),
            None if stride is None else (stride, stride),
            "step H,W (default: the kernel)",
            optional=stride is None,
        ),
        Attr(
            "padding",
            IntPair(0, fuzz_hi=1),
            (padding, padding),
            "border H,W before each axis (and after it unless padding_end says), less than the kernel",
        ),
        Attr(
            "padding_end",
            IntPair(0, fuzz_hi=1),
            None,
            "border after H,W where it differs (ONNX's pads, TensorFlow's SAME), less than the kernel",
            optional=True,
        ),
        Attr("ceil_mode", Bool(), False, "round the output size up"),
        Attr("dilation", IntPair(1, MAX_KERNEL, fuzz_hi=2), (1, 1), "spacing of a window's taps H,W"),
        layout_attr(),
    )


WindowMax = Callable[[list[Any], str], Any]
"""(float taps, dtype) -> TE expression of their max, NaN when any is NaN."""


def nan_test_max(values: list[Any], dtype: str) -> Any:
    """The max of float `values` with an explicit NaN test, NaN when any is NaN (as numpy's max):
    a max chain, and one integer test on the bits (`deploy/ops/nan.py`) that vectorizes everywhere. The
    plain definition; a target family may pair the pooling ops with its own (the `window_max` of
    `max_pool2d_compute`): on x86 `llvm.maximum` becomes a compare-and-blend sequence that
    measured 2-5x slower than this test in bench/hand_vs_generic.py, on ARM it is one NEON `fmax`."""
    return tirx.Select(
        any_nan_bits(values, dtype), tirx.const(float("nan"), dtype), functools.reduce(te.max, values)
    )


def max_of(values: list[Any], dtype: str, window_max: WindowMax) -> Any:
    """TE expression: the max of pooling taps — floats by `window_max` (NaN when any is NaN),
    integers by a max chain."""
    if not dtype.startswith("float"):
        return functools.reduce(te.max, values)
    return window_max(values, dtype)


STAGED_MAX_TAPS = 9
"""Windows of more taps than this compute `Pool2d.indices` in two passes (see there)."""


@dataclass(frozen=True)
class Pool2d:
    """Kernel, stride and the padding before and after each axis as (h, w) pairs, the rounding
    mode, and the layout of the input and output."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    ceil_mode: bool
    layout: Layout = NCHW
    padding_end: tuple[int, int] | None = None
    """None: as `padding` (symmetric)."""
    dilation: tuple[int, int] = (1, 1)
    """Taps `dilation` apart: a window spans (kernel - 1) * dilation + 1 elements."""

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> Pool2d:
        return cls(
            attrs["kernel"],
            attrs["stride"] or attrs["kernel"],
            attrs["padding"],
            attrs["ceil_mode"],
            layout_of(attrs),
            attrs.get("padding_end"),
            attrs.get("dilation", (1, 1)),
        )

    def span(self, axis: int) -> int:
        """The elements a window covers along `axis`, its taps and the gaps between them."""
        return (self.kernel[axis] - 1) * self.dilation[axis] + 1

    @property
    def after(self) -> tuple[int, int]:
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
        """The output shape, in the input's layout; checks the layout's rank and pack, that the
        window (the kernel, dilated) fits the padded input and padding < kernel on each side
        (every window holds an input element, as ONNX requires)."""
        self.layout.check(name, shape)
        out = list(shape)
        for axis, (label, position) in enumerate(zip("HW", self.layout.spatial, strict=True)):
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
        (in this pool's layout: the window slides over its H and W axes), float windows maxed by
        `window_max`.

        Plainly every tap of the window at once: along W each tap is strided by the stride (a
        gather of every other element at stride 2 in NCHW). Where `columns_first`, a
        stage `column_max` (the output's shape with W as in the input) first maxes the kernel's
        rows at every input column, reading W contiguously, and each output then maxes its
        window's kw columns of that stage (a row that stays in L1): the same result (max is
        associative; NaN propagates through both stages), with kh * sw + kw taps per output
        instead of kh * kw, most of them contiguous.

        A tap in the padding reads the nearest input element instead (its index clamped): that
        element is in the same window — padding is less than the kernel and every window starts
        inside the input or its left padding — so the max, NaN included, is unchanged, and the
        taps need no condition (which would keep the loop from vectorizing). Where a schedule
        splits the interior off, the clamps simplify away and the loads are plain vector loads.
        Dilated taps skip elements, so the nearest element may lie between two taps: there a tap
        outside the input reads the window's nearest tap inside it instead (`output_shape` checks
        every window has one), again with no condition. (A select would not do: its unread branch
        still loads, and LLVM takes an in-bounds load to mean the index is in range.)"""
        h_axis, w_axis = self.layout.spatial
        height, width = int(data.shape[h_axis]), int(data.shape[w_axis])
        dtype = str(data.dtype)

        def at(index: tuple[Any, ...], axis: int, value: Any) -> tuple[Any, ...]:
            return (*index[:axis], value, *index[axis + 1 :])

        def row(oh: Any, dh: int) -> Any:
            return self.tap(0, oh, dh, height)

        def col(ow: Any, dw: int) -> Any:
            return self.tap(1, ow, dw, width)

        rows, cols = range(self.kernel[0]), range(self.kernel[1])
        if not columns_first:
            return lambda *i: max_of(
                [
                    data[at(at(i, h_axis, row(i[h_axis], dh)), w_axis, col(i[w_axis], dw))]
                    for dh in rows
                    for dw in cols
                ],
                dtype,
                window_max,
            )
        shape = at(tuple(data.shape), h_axis, self.out_size(0, height))
        columns = te.compute(
            shape,
            lambda *i: max_of([data[at(i, h_axis, row(i[h_axis], dh))] for dh in rows], dtype, window_max),
            name="column_max",
        )
        return lambda *i: max_of(
            [columns[at(i, w_axis, col(i[w_axis], dw))] for dw in cols], dtype, window_max
        )

    def tap(self, axis: int, out: Any, step: int, size: int) -> Any:
        """The index tap `step` of the window at output `out` reads along `axis` (0: H, 1: W) of
        an input `size` long: clamped into the input, a dilated tap onto the window's nearest tap
        inside it (`windows`). Each bound divides an index that grows with `out` (a descending one,
        `size - 1 - start`, gave wrong lanes on arm once vectorized: ONNX's 2-D dilations case)."""
        d, start = self.dilation[axis], out * self.stride[axis] - self.padding[axis]
        index = start + step * d
        if d == 1:
            return clamp(index, size)
        first = start - te.min(0, tirx.floordiv(start, d)) * d  # its first tap inside
        last = start + te.min(self.kernel[axis] - 1, -tirx.floordiv(start - size + d, d)) * d
        return te.max(te.min(index, last), first)

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
        where `column_major`; float windows maxed by `window_max`. The first in row-major order
        among equal maxima, the first NaN where the max is NaN. The taps are `windows`' (clamped,
        no condition): clamping keeps their row-major order, so the first tap holding the max is
        the first input element holding it.
        The taps are compared with the window's max: an expression in each comparison up to
        `STAGED_MAX_TAPS` taps (one pass), else a stage of its own, read by a second pass. As an
        expression the TIR grows with the square of the taps (a 7x7 window took 90 s to compile,
        3x3 1.9 s; staged 0.7 s and 0.3 s, but 3x3 ran 25-40% slower); a Let binding it broke
        where a schedule copies the body (one variable bound twice)."""
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
            most = top[n, c, oh, ow] if top is not None else max_of(values, dtype, window_max)
            plane = (n.astype(index_type) * channels + c.astype(index_type)) * height * width
            flat = [
                plane + (w * height + h if column_major else h * width + w).astype(index_type) for h, w in at
            ]
            found = flat[-1]
            for value, index in zip(reversed(values[:-1]), reversed(flat[:-1]), strict=True):
                hit = value == most
                if dtype.startswith("float"):
                    hit = tirx.Or(hit, is_nan_bits(value, dtype))
                found = tirx.Select(hit, index, found)
            return found

        return te.compute(shape, body, name="out")

    def interior(self, axis: int, size: int) -> tuple[int, int]:
        """Outputs [lo, hi) along `axis` (0: H, 1: W) whose windows lie inside the input."""
        s, p = self.stride[axis], self.padding[axis]
        out = self.out_size(axis, size)
        lo = min(out, -(-p // s))
        return lo, max(lo, min(out, (size - self.span(axis) + p) // s + 1))

    def reference(self, data: np.ndarray) -> np.ndarray:
        """Numpy max pooling of an array in this pool's layout (via NCHW; a packed layout's
        padding lanes pooled like channels)."""
        return self.layout.from_nchw(self._pool_nchw(self.layout.to_nchw(data)))

    def _pool_nchw(self, data: np.ndarray) -> np.ndarray:
        """Numpy max pooling of an NCHW array."""
        return self._taps_nchw(data, numpy_pad_value(data.dtype)).max(axis=(4, 5))

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
        """The taps of every window of an NCHW array, padded with `pad`: N x C x OH x OW x KH x KW."""
        oh, ow = self.out_size(0, data.shape[2]), self.out_size(1, data.shape[3])
        spans = (self.span(0), self.span(1))
        extra = [
            max(0, (o - 1) * s + k - (size + p + after))
            for o, s, k, size, p, after in zip(
                (oh, ow), self.stride, spans, data.shape[2:], self.padding, self.after, strict=True
            )
        ]
        widths = (
            (0, 0),
            (0, 0),
            (self.padding[0], self.after[0] + extra[0]),
            (self.padding[1], self.after[1] + extra[1]),
        )
        padded = np.pad(data, widths, constant_values=pad)
        windows = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=(2, 3))
        windows = windows[:, :, :: self.stride[0], :: self.stride[1]][:, :, :oh, :ow]
        return windows[..., :: self.dilation[0], :: self.dilation[1]]  # the taps of each window


def max_pool2d_compute(
    attrs: dict[str, Any],
    out: TensorType,
    x: te.Tensor,
    window_max: WindowMax = nan_test_max,
    columns_first: bool = False,
) -> te.Tensor:
    """max_pool2d's computation: each output the max of its window of `x` (`Pool2d.windows`),
    float windows maxed by `window_max`, each window's columns maxed in a stage of their own
    first where `columns_first`. The defaults are the plain definition; a target family's
    compute variant passes its own (`deploy/schedules/cpu/pooling.py`)."""
    windows = Pool2d.from_attrs(attrs).windows(x, window_max, columns_first)
    return te.compute(out.shape, windows, name="out")


def indices_pool(attrs: dict[str, Any]) -> Pool2d:
    """max_pool2d_indices' pool: its attributes, in NCHW (the op has no layout)."""
    return Pool2d.from_attrs({**attrs, "layout": "NCHW"})


def max_pool2d_indices_compute(
    attrs: dict[str, Any], out: TensorType, x: te.Tensor, window_max: WindowMax = nan_test_max
) -> te.Tensor:
    """max_pool2d_indices' computation (`Pool2d.indices`), float windows maxed by `window_max`
    (the default: the plain definition; `deploy/schedules/gpu/pooling.py` passes its own)."""
    return indices_pool(attrs).indices(x, out.shape, out.dtype, attrs["column_major"], window_max)


def clamp(index: Any, size: int) -> Any:
    """`index` clamped into [0, size)."""
    return te.max(te.min(index, size - 1), 0)


def numpy_pad_value(dtype: np.dtype) -> Any:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def pooled_type(name: str, tensor: TensorType, pool: Pool2d) -> TensorType:
    return TensorType(pool.output_shape(name, tensor.shape), tensor.dtype)
