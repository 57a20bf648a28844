"""How far a float result may be from numpy's reference: the rule an op declares (`Tolerance`) or
the one deploy derives from its computation, and how rules combine for a graph.

Every float comparison allows the dtype's `atol + rtol * |want|` (float32: 1e-6 + 1e-5 |want|).
A result that sums terms rounds each partial sum, so its error grows with the terms' magnitudes,
not with the result's: `per_term * eps(dtype) * magnitude` is added, where the magnitude is the
reference evaluated on |inputs| (for a sum of products, sum |a * b| per element: the magnitude of
the standard floating-point summation error bound). deploy derives it for an op whose computation
sums n terms (a `te.sum` anywhere in it): per_term = ceil(log2 n) + 1, the worst case of pairwise
summation on both sides (ours and numpy's) and far above the error of a sequential sum of terms of
mixed sign; an off-by-1e-3 kernel of a 768-term dot still fails it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    """An op's own rule (`Op.tolerance`), in units of the dtype's machine epsilon: `ulps * eps *
    |want|` in place of the dtype's relative tolerance (None: keep it), plus `per_term * eps *
    magnitude` (the reference on |inputs|: sum |terms| for a sum of products). The dtype's
    absolute tolerance stays."""

    ulps: float | None = None
    per_term: float = 0.0


def tolerance_problem(value: Any) -> str | None:
    """Why `value` is no valid `Op.tolerance` (None or a Tolerance of numbers >= 0), or None."""
    if value is None:
        return None
    if not isinstance(value, Tolerance):
        return f"tolerance {value!r}: expected Tolerance(ulps=..., per_term=...) from deploy.ops or None"
    for name in ("ulps", "per_term"):
        number = getattr(value, name)
        if number is None and name == "ulps":
            continue
        if isinstance(number, bool) or not isinstance(number, int | float):
            return f"tolerance {name}={number!r}: expected a number of eps, >= 0"
        if not math.isfinite(number) or number < 0:
            return f"tolerance {name}={number!r}: expected a finite number of eps, >= 0"
    return None


@dataclass(frozen=True)
class Rule:
    """How one computation's float outputs are compared (`deploy.verify.compare`): bit for bit
    (`exact`), or within atol + rtol * |want| + per_term * eps * magnitude, rtol the larger of
    `ulps` eps (where given) and the dtype's (where `dtype_rtol`). `why` names where the rule
    comes from, for messages."""

    exact: bool = False
    ulps: float | None = None
    per_term: float = 0.0
    why: str = ""
    dtype_rtol: bool = True


EXACT = Rule(exact=True, why="exact")
DTYPE = Rule()
"""The dtype's tolerance alone: an op that declares nothing and sums nothing."""


def summed_per_term(terms: int) -> float:
    """The derived per_term of a sum of `terms` terms (see the module)."""
    return float(math.ceil(math.log2(terms)) + 1)


def sum_length(out: Any) -> int:
    """The most terms any `te.sum` in the computation of the te.Tensor `out` adds (the product of
    its reduce axes' static extents), 0 where it sums nothing."""
    from tvm import te, tirx

    longest, seen, stack = 0, set(), [out]
    while stack:
        tensor = stack.pop()
        if tensor.op in seen or not isinstance(tensor.op, te.ComputeOp):
            continue
        seen.add(tensor.op)
        stack += list(tensor.op.input_tensors)
        for body in tensor.op.body:
            if isinstance(body, tirx.Reduce) and isinstance(body.combiner.result[0], tirx.Add):
                extents = [axis.dom.extent for axis in body.axis]
                if all(isinstance(e, tirx.IntImm) for e in extents):
                    longest = max(longest, math.prod(int(e) for e in extents))
    return longest


def op_rule(name: str, exact: bool, declared: Tolerance | None, terms: int) -> Rule:
    """The rule of op `name`: exact, its declared Tolerance, the summation bound of `terms` terms
    (`sum_length`), or the dtype's alone."""
    if exact:
        return EXACT
    if declared is not None:
        ulps = "" if declared.ulps is None else f"ulps={declared.ulps:g} "
        why = f"{name}'s tolerance {ulps}per_term={declared.per_term:g}"
        return Rule(False, declared.ulps, float(declared.per_term), why, dtype_rtol=declared.ulps is None)
    if terms > 1:
        return Rule(False, None, summed_per_term(terms), f"sum of {terms} terms")
    return DTYPE


def combined(rules: list[Rule]) -> Rule:
    """One rule for a graph of several computations: exact if all are, else the loosest of each
    part's terms (the graph's magnitude is its reference on |inputs|)."""
    if all(r.exact for r in rules):
        return EXACT
    loose = [r for r in rules if not r.exact]
    ulps = [r.ulps for r in loose if r.ulps is not None]
    whys = [r.why for r in loose if r.why]
    return Rule(
        False,
        max(ulps) if ulps else None,
        max(r.per_term for r in loose),
        "; ".join(dict.fromkeys(whys)),
        dtype_rtol=any(r.dtype_rtol for r in loose),
    )
