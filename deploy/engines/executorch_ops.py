"""deploy's ops as PyTorch operators `deploy::<op>` and `deploy::<op>.out`, for a model that
ExecuTorch runs with deploy's kernel library (docs/engines.md).

    import deploy.engines.executorch_ops  # before torch.export, to_edge or torch.export.load

defines, for every registered op, the functional schema `deploy::<op>(Tensor x0, ..., *,
float? alpha=None, ...) -> Tensor` (its number and flag attributes keyword-only, None: the op's
default; `executorch_library.schema_attrs`) and the out variant ExecuTorch's kernels implement
(`to_executorch` turns calls into it), a fake kernel that gives export the output's shape and
dtype (the op's own shape inference) and an eager CPU kernel that runs the op's numpy
reference: an exported program run eagerly is the honest reference `deploy test --engine
executorch` compares ExecuTorch with.
Importing it needs torch; the names are made by deploy (`executorch_library.torch_name`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from deploy.engines import executorch_library
from deploy.engines.executorch_library import ATTR_KINDS, NAMESPACE, schema_attrs, torch_name
from deploy.ops import BoundOp, Op, all_ops

_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
"""Holds the definitions: they last as long as this module (torch drops a collected library's)."""
_OPS: dict[str, Op] = {}
"""The deploy op of each defined torch name."""


def bound_call(name: str, tensors: tuple[Any, ...], attrs: dict[str, Any]) -> BoundOp:
    """The deploy op behind the defined `deploy::name` bound to the tensors and attributes it is
    called with (`executorch_library.bound_call`)."""
    return executorch_library.bound_call(_OPS[name], name, tensors, attrs)


def _fake(name: str) -> Any:
    def fake(*tensors: Any, **attrs: Any) -> Any:
        out = bound_call(name, tensors, attrs).output
        return tensors[0].new_empty(out.shape, dtype=getattr(torch, out.dtype))

    return fake


def _fake_out(name: str) -> Any:
    def fake_out(*tensors: Any, out: Any, **attrs: Any) -> Any:
        bound_call(name, tensors, attrs)
        return out

    return fake_out


def _eager(name: str) -> Any:
    def eager(*tensors: Any, **attrs: Any) -> Any:
        bound = bound_call(name, tensors, attrs)
        arrays = [t.detach().cpu().numpy() for t in tensors]
        result = bound.op.reference(bound.attrs, *arrays)
        return torch.from_numpy(np.ascontiguousarray(result, dtype=bound.output.dtype))

    return eager


def _eager_out(name: str) -> Any:
    def eager_out(*tensors: Any, out: Any, **attrs: Any) -> Any:
        return out.copy_(_eager(name)(*tensors, **attrs))

    return eager_out


def define(op: Op) -> str:
    """Define `deploy::<op>` and its `.out` variant for `op` (once); returns the torch name."""
    name = torch_name(op.name)
    if name in _OPS:
        return name
    _OPS[name] = op
    tensors = [f"Tensor x{i}" for i in range(len(op.inputs))]
    attrs = [f"{ATTR_KINDS[type(a.kind)][0]}? {a.name}=None" for a in schema_attrs(op)]
    args = ", ".join([*tensors, "*", *attrs]) if attrs else ", ".join(tensors)
    _LIBRARY.define(f"{name}({args}) -> Tensor")
    _LIBRARY.define(f"{name}.out({', '.join([*tensors, '*', *attrs])}, Tensor(a!) out) -> Tensor(a!)")
    _LIBRARY.impl(name, _eager(name), "CPU")
    _LIBRARY.impl(f"{name}.out", _eager_out(name), "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", _fake(name), lib=_LIBRARY)
    torch.library.register_fake(f"{NAMESPACE}::{name}.out", _fake_out(name), lib=_LIBRARY)
    return name


for _op in all_ops():
    define(_op)
