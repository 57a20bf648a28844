"""Data layouts of 4-D image tensors: NCHW, NHWC, and channels packed by 4 or 8 (NCHW4c, NCHW8c).

A packed tensor is 5-D `[N, ceil(C/p), H, W, p]`: channel c sits at block c // p, lane c % p, so
a vector of p lanes holds p channels of one pixel (PPL.NN's N4CX/N8CX, ncnn's elempack). When C
is not a multiple of p, the lanes past the last channel are **padding**: `layout_transform` writes
them as 0, every op leaves them don't-care (pooling and elementwise ops compute them like any
channel, never mixing them into a real one; argmax over channels skips them), and the numpy
references treat them as channels, so results match bit for bit there too.

Ops take `-a layout=...` (default NCHW); each layout is data here: its name, the positions of the
logical N, C, H, W axes in a tensor of it, and the pack width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy.base.errors import UsageError
from deploy.ops.attrs import Attr, Choice, Int
from deploy.ops.spec import MAX_ELEMENTS

LOGICAL = "NCHW"


@dataclass(frozen=True)
class Layout:
    """One layout: `axes` gives, for N, C, H, W in turn, the axis of a tensor in this layout that
    holds it (for a packed layout, C's block axis; its lane axis is the last); `pack` is the
    lanes per channel block (1: unpacked)."""

    name: str
    axes: tuple[int, int, int, int]
    pack: int = 1

    @property
    def rank(self) -> int:
        return 5 if self.packed else 4

    @property
    def packed(self) -> bool:
        return self.pack > 1

    @property
    def spatial(self) -> tuple[int, int]:
        """The axes of H and W."""
        return self.axes[2], self.axes[3]

    @property
    def channels_inner(self) -> bool:
        """Whether channels are the innermost axis (NHWC, packed lanes): a vector along it holds
        one pixel's channels, where NCHW's holds a row of pixels."""
        return self.packed or self.axes[1] == 3

    @property
    def channel(self) -> int:
        """The axis of C (for a packed layout: its blocks)."""
        return self.axes[1]

    def check(self, name: str, shape: tuple[Any, ...], what: str = "input") -> None:
        """A one-line error unless `shape` is a tensor in this layout (rank; the pack axis = p)."""
        if len(shape) != self.rank:
            dims = "N, C/p, H, W, p" if self.packed else ", ".join(LOGICAL[axis] for axis in self.order())
            raise UsageError(
                f"{what} {name} has shape {list(shape)}: expected {self.name} (rank {self.rank}: {dims})"
            )
        if self.packed and shape[-1] != self.pack:
            raise UsageError(
                f"{what} {name} has shape {list(shape)}: expected {self.name}, whose last dim is"
                f" {self.pack} (channels packed by {self.pack})"
            )

    def order(self) -> list[int]:
        """The logical axes (0..3 of NCHW) in the order this layout stores them (unpacked)."""
        return sorted(range(4), key=lambda logical: self.axes[logical])

    def channels(self, shape: tuple[Any, ...]) -> int:
        """The channels a tensor of `shape` in this layout holds, padding lanes included."""
        return shape[self.channel] * self.pack

    def shape(self, logical: tuple[Any, ...]) -> tuple[Any, ...]:
        """The shape in this layout of a tensor of NCHW shape `logical` (C padded up to p)."""
        n, c, h, w = logical
        if self.packed:
            return (n, -(-c // self.pack), h, w, self.pack)
        return tuple(logical[axis] for axis in self.order())

    def from_nchw(self, array: np.ndarray) -> np.ndarray:
        """An NCHW array in this layout; padding lanes are 0."""
        if not self.packed:
            return np.ascontiguousarray(array.transpose(self.order()))
        n, c, h, w = array.shape
        blocks = -(-c // self.pack)
        padded = np.zeros((n, blocks * self.pack, h, w), array.dtype)
        padded[:, :c] = array
        return np.ascontiguousarray(padded.reshape(n, blocks, self.pack, h, w).transpose(0, 1, 3, 4, 2))

    def to_nchw(self, array: np.ndarray, channels: int | None = None) -> np.ndarray:
        """An array in this layout as NCHW with its first `channels` channels (None: all, the
        padding lanes of a packed layout included)."""
        if not self.packed:
            nchw = array.transpose(np.argsort(self.order()))
        else:
            n, blocks, h, w, pack = array.shape
            nchw = array.transpose(0, 1, 4, 2, 3).reshape(n, blocks * pack, h, w)
        return np.ascontiguousarray(nchw[:, :channels] if channels is not None else nchw)

    def index(self, n: Any, c: Any, h: Any, w: Any) -> tuple[Any, ...]:
        """The index in a tensor of this layout of logical element (n, c, h, w) (TE expressions)."""
        logical = (n, c // self.pack if self.packed else c, h, w)
        index: list[Any] = [None] * 4
        for axis, value in zip(self.axes, logical, strict=True):
            index[axis] = value
        return (*index, c % self.pack) if self.packed else tuple(index)

    def logical(self, index: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
        """(n, c, h, w) of the element at `index` in a tensor of this layout (TE expressions)."""
        n, c, h, w = (index[axis] for axis in self.axes)
        return (n, c * self.pack + index[-1], h, w) if self.packed else (n, c, h, w)


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("NCHW", (0, 1, 2, 3)),
        Layout("NHWC", (0, 3, 1, 2)),
        Layout("NCHW4c", (0, 1, 2, 3), pack=4),
        Layout("NCHW8c", (0, 1, 2, 3), pack=8),
    )
}


NCHW = LAYOUTS[LOGICAL]


@dataclass(frozen=True)
class Relayout:
    """How one node of an NCHW graph runs in another layout (`Op.relayout`, the graph pass in
    `deploy/ops/relayout.py`): its attributes there, the layout each input must arrive in and the
    layout its output leaves in. `starts`: the node is one a layout is chosen for (it slides a
    window over H and W), which moves to the layout on its own; the others join the layout an
    input of theirs already arrives in."""

    attrs: dict[str, Any]
    inputs: tuple[Layout, ...]
    output: Layout
    starts: bool = False


def layout_attr(name: str = "layout", doc: str = "data layout of the input and output") -> Attr:
    """The attribute naming a layout (default NCHW)."""
    return Attr(name, Choice(tuple(LAYOUTS)), LOGICAL, doc)


def channels_attr() -> Attr:
    """The attribute giving a packed input's real channel count (default: every lane)."""
    return Attr(
        "channels",
        Int(1, MAX_ELEMENTS, fuzz_hi=16),
        None,
        "real channels of a packed input (default: every lane)",
        optional=True,
    )


def layout_of(attrs: dict[str, Any], name: str = "layout") -> Layout:
    """The layout an op's attributes name."""
    return LAYOUTS[attrs[name]]


def static_shape(tensor: Any) -> tuple[Any, ...]:
    """A te.Tensor's shape with its static dims as ints (a symbolic batch stays a variable)."""
    from tvm import tirx

    return tuple(int(d) if isinstance(d, tirx.IntImm) else d for d in tensor.shape)


def real_channels(layout: Layout, shape: tuple[Any, ...], channels: int | None, what: str) -> int:
    """The real channels of a tensor of `shape` in `layout`: `channels` (an attribute, None: all
    of them), checked to leave fewer than a pack of padding lanes."""
    held = layout.channels(shape)
    if channels is None:
        return held
    lowest = held - layout.pack + 1
    if not lowest <= channels <= held:
        expected = f"{lowest}..{held}" if lowest < held else str(held)
        raise UsageError(
            f"attribute channels={channels}: {what} of shape {list(shape)} in {layout.name} holds"
            f" {expected} channels"
        )
    return channels
