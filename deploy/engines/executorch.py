"""ExecuTorch (`--engine executorch`): deploy build writes the kernel library of an op, or of
the deploy ops a `torch.export` program (`.pt2`) calls (`executorch_library.py`); deploy test
lowers the program to a `.pte` (to_edge, to_executorch), runs it in the plugin's host and
compares every output with the same program run eagerly by torch, in which each deploy op runs
its numpy reference (`executorch_ops.py` defines them in torch).
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deploy.base.ctext import c_word
from deploy.base.errors import DeployError, UsageError, printable, reason
from deploy.engines import Engine, register
from deploy.engines.executorch_library import (
    ARCHES,
    HOST,
    NAMESPACE,
    build_library,
    library_name,
    run_host,
    shown_call,
    shown_types,
    torch_name,
)
from deploy.ops.spec import BoundOp, TensorType
from deploy.ops.tolerance import Rule, combined, op_rule

if TYPE_CHECKING:
    from deploy.devices.boards import Board

SUMMING = ("aten::linear", "aten::mm", "aten::matmul", "aten::bmm", "aten::addmm")
"""ATen ops of an exported program that sum over their first matrix's last dim (addmm's second
argument: its first is the bias)."""
CONVOLUTIONS = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution")
"""ATen convolutions: each sums over its weight's in-channels x kernel."""
EXACT_ATEN = ("aten::flatten", "aten::view", "aten::reshape", "aten::permute", "aten::relu", "aten::clone")
"""ATen ops that compute nothing to round (they move or select values): a program of these and
exact deploy ops is compared bit for bit; any other op gets the tolerance."""

NOISY_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers that warn on every import of ExecuTorch's exporter, about nothing deploy uses (torchao's
CUDA extensions, which a CPU build of torch cannot load; a deprecation inside torchao): set to
errors only, so that deploy's output is its own lines."""
NOISY_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
"""The FutureWarning to_executorch's copies of torch's pytree specs raise on every lowering."""


class _Kept(logging.Handler):
    """Keeps the records of a logger, tracebacks included (torch.export's: why a load failed),
    in place of its handlers, which print them."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(self.format(record))


UNKNOWN_OP = re.compile(rf"failed to resolve torch\.ops\.{NAMESPACE}\.(\w+)")
"""What torch.export says of a node whose operator is not defined: a deploy op not registered."""


def load_program(model: Path) -> Any:
    """The torch.export program saved in `model` (.pt2), deploy's ops defined first; one-line
    errors for a missing torch, a file that is none, or a call of a deploy op not registered."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", NOISY_WARNING, FutureWarning)
    try:
        import torch

        import deploy.engines.executorch_ops  # noqa: F401  (defines deploy::<op> for loading)
    except ImportError as exc:
        raise DeployError(f"--engine executorch needs torch for a model: {reason(exc)}") from None
    if not model.is_file():
        raise UsageError(f"--model {printable(str(model))}: no such file")
    logger, kept = logging.getLogger("torch.export"), _Kept()
    handlers, logger.handlers = logger.handlers, [kept]
    try:
        return torch.export.load(str(model))
    except Exception as exc:
        unknown = next((m.group(1) for m in map(UNKNOWN_OP.search, kept.messages) if m), None)
        if unknown is not None:
            raise UsageError(
                f"--model {printable(str(model))}: it calls {NAMESPACE}::{unknown}, which is no registered"
                " op (an op of your own files: deploy --ops-path DIR)"
            ) from None
        raise UsageError(
            f"--model {printable(str(model))}: expected a torch.export program (.pt2): {reason(exc)}"
        ) from None
    finally:
        logger.handlers = handlers


def model_ops(program: Any, model: Path) -> dict[str, BoundOp]:
    """Each deploy op the program calls, by torch name, bound to the shapes it is called with
    (one kernel per op: a second shape of the same op is refused in one line)."""
    from deploy.engines.executorch_ops import bound_call

    served: dict[str, BoundOp] = {}
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or getattr(target, "namespace", None) != NAMESPACE:
            continue
        name = target._schema.name.split("::", 1)[1]
        bound = bound_call(name, tuple(arg.meta["val"] for arg in node.args), dict(node.kwargs))
        if name in served and (served[name].inputs, served[name].attrs) != (bound.inputs, bound.attrs):
            raise UsageError(
                f"model {printable(str(model))}: {NAMESPACE}::{name} is called with"
                f" {shown_call(served[name])} and with {shown_call(bound)}: one kernel per op"
            )
        served[name] = bound
    if not served:
        raise UsageError(f"model {printable(str(model))}: it calls no {NAMESPACE}:: op: nothing to serve")
    return served


def build(bound: BoundOp | None, model: Path | None, target: Any, options: Any, directory: Path) -> list[str]:
    """`deploy build --engine executorch`: the kernel library of an op (`bound`) or of the deploy
    ops a `.pt2` program calls."""
    _check_arch(target)
    if model is not None:
        served = model_ops(load_program(model), model)
    else:
        assert bound is not None
        served = {torch_name(bound.op.name): bound}
    name = library_name(model.stem if model is not None else next(iter(served)))
    place = build_library(served, target, options, directory, name)
    lines = [f"built {place / f'lib{name}.so'} for ExecuTorch on {target.name}: {len(served)} kernel(s)"]
    lines += [f"  {NAMESPACE}::{op}.out: op {b.op.name} {shown_types(b)}" for op, b in served.items()]
    lines.append(f"  run a .pte with it: {place / HOST} MODEL.pte -i INPUT.bin ... -o OUTPUT.bin ...")
    return lines


def _check_arch(target: Any) -> None:
    if target.arch not in ARCHES:
        raise UsageError(
            f"--engine executorch: --target {target.name}: expected {' or '.join(ARCHES.values())}"
            " (the CPUs of ExecuTorch's wheels)"
        )


def lower(program: Any, model: Path) -> bytes:
    """The program as a .pte: to_edge (deploy's ops are not core ATen: no IR check), to_executorch."""
    from executorch.exir import EdgeCompileConfig, to_edge

    try:
        edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        return bytes(edge.to_executorch().buffer)
    except Exception as exc:
        shown = printable(str(model))
        raise UsageError(f"model {shown}: ExecuTorch cannot lower it: {reason(exc)}") from None


def _tensor_type(value: Any) -> TensorType:
    """A fake tensor's shape and dtype, as deploy types a tensor."""
    return TensorType(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))


def summed_terms(program: Any) -> int:
    """The most terms a sum of the program's ATen ops adds (a linear's or matmul's inner dim, a
    convolution's weight's in-channels x kernel): the summation part of its tolerance."""
    most = 0
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        if schema.name in SUMMING:
            first = node.args[1] if schema.name == "aten::addmm" else node.args[0]
            most = max(most, int(first.meta["val"].shape[-1]))
        elif schema.name in CONVOLUTIONS:
            most = max(most, math.prod(int(d) for d in node.args[1].meta["val"].shape[1:]))
    return most


def eager(program: Any, arrays: list[np.ndarray], magnitude: bool = False) -> list[np.ndarray]:
    """The program run by torch (deploy's ops by their numpy reference); with `magnitude`, on
    |inputs| with |parameters| (the per-term part of the tolerance: sum |terms| of every sum)."""
    import torch

    module = program.module()
    tensors = [torch.from_numpy(np.abs(a) if magnitude else a) for a in arrays]
    with torch.no_grad():
        if magnitude:  # the module's own values untouched: |each| passed in their place
            values = {**dict(module.named_parameters()), **dict(module.named_buffers())}
            absolute = {name: value.abs() for name, value in values.items()}
            result = torch.func.functional_call(module, absolute, tuple(tensors))
        else:
            result = module(*tensors)
    results = result if isinstance(result, tuple | list) else [result]
    return [r.detach().numpy() for r in results]


def test(
    model: Path,
    directory: Path,
    target: Any,
    options: Any,
    say: Callable[[str], None],
    board: Board | None = None,
) -> list[str]:
    """`deploy test --model M.pt2 --engine executorch`: build the kernel library of the deploy ops
    the program calls into `directory`, lower the program to a .pte beside it, run it in the host
    (here, under the emulator, or pushed to `board`) on random inputs (plain, ties, and with NaN
    and infinities planted) and compare every output with the program run eagerly (`eager`)
    under the ops' rules and the program's sums'."""
    from deploy.verify.compare import INPUT_SETS, compare_all, random_input

    _check_arch(target)
    program = load_program(model)
    served = model_ops(program, model)
    say(f"building the kernels of {', '.join(f'{NAMESPACE}::{op}' for op in served)} for {target.name}")
    place = build_library(served, target, options, directory, library_name(model.stem))
    pte = place / f"{c_word(model.stem, 40)}.pte"
    pte.write_bytes(lower(program, model))
    users = set(program.graph_signature.user_inputs)
    inputs = [
        _tensor_type(n.meta["val"]) for n in program.graph.nodes if n.op == "placeholder" and n.name in users
    ]
    terms = summed_terms(program)
    rule: Rule = combined([b.rule() for b in served.values()] + [op_rule("the model", False, None, terms)])
    exact = all(b.exact for b in served.values()) and all(
        getattr(n.target, "namespace", None) == NAMESPACE or n.target._schema.name in EXACT_ATEN
        for n in program.graph.nodes
        if n.op == "call_function"
    )
    rng = np.random.default_rng(0)
    lines = []
    for inputs_set in INPUT_SETS:
        arrays = [random_input(t, rng, inputs_set.ties, inputs_set.specials) for t in inputs]
        want = eager(program, arrays)
        got = run_host(place, pte, arrays, len(want), target.arch, board)
        names = [f"output{i}" for i in range(len(want))]
        result = compare_all(want, got, exact, names, rule, eager(program, arrays, magnitude=True))
        if not result.ok:
            raise DeployError(f"ExecuTorch with deploy's kernels: {inputs_set.label} inputs: {result.detail}")
        error = f"max error {result.max_error:.3g}"
        lines.append(f"  {len(want)} output(s) on {inputs_set.label} inputs: ok ({error})")
    kernels = ", ".join(f"{NAMESPACE}::{op}.out" for op in served)
    where = target.name if board is None else f"{target.name}, board {board.name}"
    lines.insert(0, f"{model} in ExecuTorch on {where} with {kernels} from deploy: ok")
    return lines


ENGINE = register(Engine("executorch", "a kernel library (deploy::<op>.out kernels)", build, test))
