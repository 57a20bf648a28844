"""Which layout a graph runs fastest in on a device: `deploy tune --model` builds the graph with
its pooling in NCHW and in the layout its target declares for the graph's dtype
(`Target.layouts`), conversions included (`deploy/ops/relayout.py`), checks both against numpy and
times them interleaved on the device. The packed layout is accepted only when it beats NCHW by
more than the spread of either (`tuner.judge`, as a tuned schedule must beat the hand one), and
`--tuned` builds then lay the graph out in it.

    DIR/<target>/graph-<name>-<key>/layout.json    the verdict: {"layout": "NCHW8c" or null, ...}

`deploy tune --model --layout L` writes L as the verdict instead of measuring, so that `--tuned`
builds lay the graph out as its kernels were tuned.

Whether packing pays depends on the shapes: packed pooling is several times faster than NCHW's
on small maps, and the conversions at the graph's boundaries cost more than it saves on large
ones (docs/layouts.md). So it is measured per graph and device, never assumed.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deploy.base.errors import UsageError
from deploy.base.files import name_part
from deploy.compiler.compile import CompiledGraph, compile_graph
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.devices import Device, Session
from deploy.ops.graph import BoundGraph
from deploy.ops.layouts import LAYOUTS, NCHW, Layout
from deploy.ops.relayout import relayout
from deploy.tune import records as db
from deploy.tune.tuner import judge_built
from deploy.verify.measure import check

LAYOUT = "layout.json"


def layout_path(root: Path, graph: BoundGraph, target_name: str) -> Path:
    """Where the layout verdict of `graph` on `target_name` lives under `root` (the graph's name
    only as far as it is a plain file name: a model file may name its graph anything)."""
    return Path(root) / target_name / f"graph-{name_part(graph.name)}-{graph.digest()[:12]}" / LAYOUT


def read_layout(root: Path, graph: BoundGraph, target_name: str) -> str | None:
    """The layout tuning accepted for the graph (None: not measured, or NCHW stays); a
    UsageError when the file is not such a verdict (records are data read from disk)."""
    path = layout_path(root, graph, target_name)
    if not path.exists():
        return None
    body = db.read_json(path)
    layout = body.get("layout", 0) if isinstance(body, dict) else 0
    if layout is not None and not (isinstance(layout, str) and layout in LAYOUTS):
        raise UsageError(
            f"{path} is not a layout verdict of deploy tune (an object whose layout is null or one of"
            f" {', '.join(LAYOUTS)})"
        )
    return None if layout == NCHW.name else layout


def write_layout(root: Path, graph: BoundGraph, target_name: str, body: dict[str, Any]) -> None:
    """Write the graph's layout verdict ({"layout": a name or None, ...}: `LayoutVerdict.body`,
    or the layout `--layout` gave)."""
    path = layout_path(root, graph, target_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    db.write_json(path, body)


@dataclass(frozen=True)
class LayoutVerdict:
    """The graph timed in NCHW and in its target's packed layout (`candidate`) on a device."""

    layout: str | None
    """The winner, which `--tuned` builds lay the graph out in; None when NCHW stays."""
    candidate: str
    nchw_ms: float
    """Median ms of the NCHW build; `nchw_spread_ms` the interquartile range of its runs."""
    nchw_spread_ms: float
    packed_ms: float | None
    """Median ms of the packed build, conversions included; None when it was rejected."""
    rejected: tuple[str, ...]
    """Why the packed build was rejected (it failed to build or its check against numpy)."""
    device: str
    standing: Path | None = None
    """The file it was read from, when it was measured by an earlier run (None: measured now)."""

    def body(self) -> dict[str, Any]:
        """The verdict as layout.json holds it."""
        return {
            "layout": self.layout, "candidate": self.candidate, "nchw_ms": self.nchw_ms,
            "nchw_spread_ms": self.nchw_spread_ms, "packed_ms": self.packed_ms,
            "rejected": list(self.rejected), "device": self.device,
        }  # fmt: skip

    @classmethod
    def read(cls, path: Path) -> LayoutVerdict | None:
        """The verdict `path` holds, if it holds one as `choose_layout` writes it (records are data
        read from disk): None when it is unreadable, was given by --layout, or does not add up (a
        time that is not one, a packed winner slower than NCHW)."""
        try:
            body = db.read_json(path)
        except UsageError:
            return None
        if not isinstance(body, dict):
            return None
        layout, candidate, device, rejected = (
            body.get(k, 0) for k in ("layout", "candidate", "device", "rejected")
        )
        nchw, packed = _ms(body.get("nchw_ms")), _ms(body.get("packed_ms"))
        if not (isinstance(candidate, str) and candidate in LAYOUTS and isinstance(device, str)):
            return None
        if (
            layout not in (candidate, None)
            or nchw is None
            or (packed is None and body.get("packed_ms") is not None)
        ):
            return None
        if not isinstance(rejected, list) or not all(isinstance(line, str) for line in rejected):
            return None
        if layout is not None and not (packed is not None and packed < nchw):  # packed, but slower
            return None
        spread = _ms(body.get("nchw_spread_ms")) or 0.0
        return cls(layout, candidate, nchw, spread, packed, tuple(rejected), device, standing=path)


def choose_layout(
    graph: BoundGraph, target: Target, options: BuildOptions, device: Device, session: Session, root: Path
) -> LayoutVerdict | None:
    """Measure the graph in NCHW and in the target's layout for its dtype on `session`, open on
    `device`, for which `options` build (`for_device`), and write the verdict. A packed build
    that fails to build or its check against numpy is rejected, as a tuned record would be.
    A verdict measured before stands instead (`standing`).
    None when there is nothing to choose: no layout declared for the dtype, or no node of the
    graph that would move to it."""
    candidate = target.packed_layout(graph.inputs[0].dtype) if graph.inputs else None
    if candidate is None or relayout(graph, candidate) is graph:
        return None
    measured = standing(root, graph, target.name, candidate, device)
    if measured is not None:
        return measured
    with tempfile.TemporaryDirectory() as tmp:

        def built(layout: Layout) -> CompiledGraph:
            return compile_graph(graph, target, replace(options, layout=layout.name))

        nchw = check(session, built(NCHW), Path(tmp))
        judged = judge_built(session, nchw, {candidate.name: lambda: built(candidate)}, Path(tmp))
    verdict = LayoutVerdict(
        layout=judged["record"],
        candidate=candidate.name,
        nchw_ms=judged["hand_ms"],
        nchw_spread_ms=judged["hand_spread_ms"],
        packed_ms=judged["ms"] if judged["record"] else judged["best_tuned_ms"],
        rejected=tuple(judged["rejected"]),
        device=device.name,
    )
    write_layout(root, graph, target.name, verdict.body())
    return verdict


def standing(
    root: Path, graph: BoundGraph, target_name: str, candidate: Layout, device: Device
) -> LayoutVerdict | None:
    """The verdict measured before for `candidate` on `device`, so that running `deploy tune
    --model` again goes on tuning the kernels of the layout it chose instead of measuring again
    (a verdict that flipped on noise would leave their records behind). None when there is none
    such (not measured, measured elsewhere or for another layout, given by --layout, unreadable)."""
    path = layout_path(root, graph, target_name)
    verdict = LayoutVerdict.read(path)  # None when there is no such file
    if verdict is None or (verdict.candidate, verdict.device) != (candidate.name, device.name):
        return None
    return verdict


def _ms(value: Any) -> float | None:
    """A time read from a verdict, if it is one: a finite number of milliseconds above 0."""
    if type(value) not in (int, float):
        return None
    try:
        ms = float(value)
    except OverflowError:
        return None
    return ms if math.isfinite(ms) and ms > 0 else None
