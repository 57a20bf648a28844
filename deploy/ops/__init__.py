"""Op definitions: one file per op, registered with `@register` (see `deploy/ops/spec.py`)."""

from deploy.ops.onnx_mapping import OnnxOp
from deploy.ops.registry import (
    all_ops,
    failure_line,
    get_op,
    load_entry_points,
    load_ops_path,
    ops_in,
    register,
)
from deploy.ops.spec import BoundOp, Case, Input, Op, TensorType, bind
from deploy.ops.tolerance import Tolerance

__all__ = [
    "BoundOp",
    "Case",
    "Input",
    "OnnxOp",
    "Op",
    "TensorType",
    "Tolerance",
    "all_ops",
    "bind",
    "failure_line",
    "get_op",
    "load_entry_points",
    "load_ops_path",
    "ops_in",
    "register",
]
