"""onnxruntime: a custom-op library (`lib<name>.so`, exporting only `RegisterCustomOps`) serving
the nodes of a model that deploy's ops implement in a non-standard domain.

Each such node is compiled for the types and attributes the model gives it (`model_nodes`) into
a bundle with a name deploy made (`ort<i>_<op>`, docs/bundles.md), and the bundles are linked
with `onnxruntime_plugin.c` and its table (`plugin_table.h`, written here: every text from the
model in it is an escaped literal) into one shared library: plain C, deploy's runtime inside, no
libstdc++, nothing of onnxruntime linked (its API comes from the `OrtApiBase` it is given).
The C API headers are onnxruntime 1.29.0's, fetched by ci/setup.sh into deploy's cache.

`test` runs the model with the library in onnxruntime (on x86 its Python API; on arm its aarch64
library under qemu, by `onnxruntime_host.c`; on a board, that host pushed there with the
engine's library by `board.py`) and compares every output with a reference run of
the same model node by node: standard nodes in onnxruntime, the served nodes by their op's numpy
reference.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from deploy.base.ctext import c_string, c_word
from deploy.base.errors import DeployError, UsageError, printable, reason
from deploy.base.files import replacing_directory, sha256_file
from deploy.base.paths import cache_root
from deploy.compiler.bundle import CFLAGS, run_tool
from deploy.engines import Engine, engine_source, register, write_bundles
from deploy.ops.onnx_mapping import domain_key, onnx_label
from deploy.ops.spec import BoundOp, TensorType, is_symbolic

if TYPE_CHECKING:
    from deploy.devices.boards import Board

HEADERS_VERSION = "1.29.0"
HEADER = "onnxruntime_c_api.h"
PLUGIN_JSON = "plugin.json"
ENGINE_ALIGNMENT = 16
"""What the kernels assume of onnxruntime's buffers: its allocator gives 64 bytes, but a graph
input fed from numpy is used in place, and numpy's data is 16-byte aligned."""
ELEM_TYPES = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "float16": 10,
    "float64": 11, "uint32": 12, "uint64": 13,
}  # fmt: skip
"""ONNX's TensorProto element type of each deploy dtype."""
DLPACK = {"float": 2, "int": 0, "uint": 1}
"""DLPack's type code of each dtype kind (kDLFloat, kDLInt, kDLUInt)."""


HEADERS_VARIABLE = "DEPLOY_ORT_HEADERS"
"""Names a directory holding onnxruntime's C API headers (an official release's include/)."""


def headers_dir() -> tuple[Path, str]:
    """Where onnxruntime's C API headers are looked for, and why there: `$DEPLOY_ORT_HEADERS`,
    else where ci/setup.sh puts them, in deploy's cache."""
    given = os.environ.get(HEADERS_VARIABLE)
    if given:
        return Path(given), f"${HEADERS_VARIABLE}"
    return cache_root() / "onnxruntime-headers" / HEADERS_VERSION, "deploy's cache"


def require_headers() -> Path:
    """The headers' directory; a one-line DeployError naming what is missing and where."""
    found, why = headers_dir()
    if not (found / HEADER).is_file():
        raise DeployError(
            f"onnxruntime's C API header {HEADER} is missing: looked in {found} ({why}); ci/setup.sh"
            f" fetches it with npm, or set ${HEADERS_VARIABLE} to a directory holding it"
        )
    return found


@dataclass(frozen=True)
class ServedNode:
    """A node the plugin serves: its ONNX (domain, op_type), its first output's name (None: any
    node of that type, an --op build), how messages name it, the op bound to its types and
    attributes, and its ONNX attributes with whether each may be absent (ONNX's default)."""

    domain: str
    op_type: str
    output: str | None
    label: str
    bound: BoundOp
    attrs: tuple[tuple[str, Any, bool], ...]


def _custom_mapping(bound: BoundOp) -> Any:
    """The op's first non-standard-domain ONNX mapping; a UsageError when it declares none."""
    for mapping in bound.op.onnx:
        if domain_key(mapping.domain):
            return mapping
    raise UsageError(
        f"op {bound.op.name} declares no ONNX node in a non-standard domain (its `onnx`): onnxruntime runs"
        " its standard nodes itself"
    )


def _absent_ok(mapping: Any, given: dict[str, Any]) -> tuple[tuple[str, Any, bool], ...]:
    """Each attribute of `given`, and whether leaving it out converts to the same op attributes
    (not where the conversion then refuses the node: a required attribute)."""
    converted = mapping.attrs(given)

    def same_without(name: str) -> bool:
        try:
            return bool(mapping.attrs({k: v for k, v in given.items() if k != name}) == converted)
        except UsageError:
            return False

    return tuple((name, value, same_without(name)) for name, value in sorted(given.items()))


def op_node(bound: BoundOp) -> ServedNode:
    """The node of an --op build: the op's ONNX attributes as its own (same names), any node of
    its custom type."""
    mapping = _custom_mapping(bound)
    given = {k: v for k, v in bound.attrs.items() if isinstance(v, (int, float, str, list))}
    try:
        same = mapping.attrs(given) == bound.attrs
    except UsageError:
        same = False
    if not same:
        raise UsageError(
            f"op {bound.op.name}: its attributes are not its ONNX node's: build the plugin from a model"
            " (--model) instead"
        )
    label = f"deploy op {bound.op.name} ({onnx_label(mapping.domain, mapping.op_type)})"
    return ServedNode(mapping.domain, mapping.op_type, None, label, bound, _absent_ok(mapping, given))


def model_nodes(path: Path) -> list[ServedNode]:
    """The nodes of the ONNX model at `path` that a registered op implements in a non-standard
    domain, each bound to the types ONNX's shape inference (or an earlier served node) gives its
    inputs; a UsageError when there is none, or one cannot be served."""
    from deploy.model import READERS, model_bytes
    from deploy.model.onnx_import import attribute_value, decode_onnx, node_name
    from deploy.ops.registry import op_for_onnx
    from deploy.ops.spec import bind

    if path.suffix.lower() != ".onnx":
        raise UsageError(f"model {path}: onnxruntime runs ONNX models: expected a .onnx file")
    model = decode_onnx(path, model_bytes(path, READERS[".onnx"]))
    outputs: dict[str, TensorType] = {}
    types, inferred_with = _inferred(model, outputs), 0
    served = []
    for index, node in enumerate(model.graph.node):
        op = op_for_onnx(node.domain, node.op_type) if domain_key(node.domain) else None
        if op is None:
            continue
        kind = printable(onnx_label(node.domain, node.op_type))
        label = f"node {printable(node_name(index, node))!r} ({kind})"
        for what, name in [("node", node.name), *(("tensor", t) for t in (*node.input, *node.output))]:
            if not name.isprintable() or (what == "tensor" and not name):
                raise UsageError(
                    f"model {path}: {label}: {what} name {name!r}: expected printable characters"
                )
        inputs = [types.get(name) for name in node.input]
        if None in inputs and len(outputs) > inferred_with:  # past a served node: infer again
            types, inferred_with = _inferred(model, outputs), len(outputs)
            inputs = [types.get(name) for name in node.input]
        unknown = [name for name, t in zip(node.input, inputs, strict=True) if t is None]
        if unknown:
            raise UsageError(f"model {path}: {label}: the type of input {printable(unknown[0])!r} is unknown")
        mapping = next(m for m in op.onnx if m.key() == (domain_key(node.domain), node.op_type))
        given = {a.name: attribute_value(a) for a in node.attribute}
        try:
            if mapping.chain is not None or mapping.more_outputs:
                raise UsageError(f"op {op.name} computes it as several ops: not served by a plugin yet")
            if len(node.output) != 1:
                raise UsageError(f"it has {len(node.output)} outputs: op {op.name} computes one")
            bound = bind(op, mapping.attrs(given), [t for t in inputs if t is not None])
        except UsageError as exc:
            raise UsageError(f"model {path}: {label}: {exc}") from None
        types[node.output[0]] = outputs[node.output[0]] = bound.output
        served.append(
            ServedNode(node.domain, node.op_type, node.output[0], label, bound, _absent_ok(mapping, given))
        )
    if not served:
        raise UsageError(
            f"model {path}: no node is in a non-standard domain that a registered op implements: nothing for"
            " a plugin to serve (onnxruntime runs the model alone)"
        )
    return served


def _inferred(model: onnx.ModelProto, served: dict[str, TensorType]) -> dict[str, TensorType | None]:
    """Every tensor's type as ONNX's shape inference knows it, given the types of the outputs of
    the nodes served so far (`served`: ONNX cannot infer a custom node's, nor so any node after
    one) and the initializers'."""
    given = onnx.ModelProto()
    given.CopyFrom(model)
    given.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(name, ELEM_TYPES[t.dtype], t.dims()) for name, t in served.items()
    )
    try:
        inferred = onnx.shape_inference.infer_shapes(given)
    except (onnx.shape_inference.InferenceError, ValueError):
        inferred = given
    types: dict[str, TensorType | None] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        types[value.name] = _value_type(value)
    for tensor in model.graph.initializer:
        types[tensor.name] = TensorType(tuple(tensor.dims), _dtype(tensor.data_type))
    return types


def _dtype(elem: int) -> str:
    names = {number: name for name, number in ELEM_TYPES.items()}
    if elem not in names:
        raise UsageError(f"element type {elem}: expected one of {', '.join(ELEM_TYPES)}")
    return names[elem]


def _value_type(value: onnx.ValueInfoProto) -> TensorType | None:
    """A value's type as far as ONNX knows it: a dim_param as a symbolic dim, None where a dim
    or the element type is unknown."""
    tensor = value.type.tensor_type
    if value.type.WhichOneof("value") != "tensor_type" or not tensor.HasField("shape"):
        return None
    if tensor.elem_type not in ELEM_TYPES.values():
        return None
    dims: list[int | str] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            return None
    try:
        return TensorType(tuple(dims), _dtype(tensor.elem_type))
    except (UsageError, ValueError, TypeError):
        return None


def _dim_rows(tensors: list[TensorType], inputs: int) -> list[str]:
    """Each tensor as a PluginTensor initializer: a symbolic dim refers to the first input axis
    holding that symbol (an output's dims are computed from the inputs')."""
    first: dict[str, tuple[int, int]] = {}
    rows = []
    for number, tensor in enumerate(tensors):
        dims = []
        for axis, dim in enumerate(tensor.shape):
            if is_symbolic(dim):
                if str(dim.name) not in first:
                    if number >= inputs:
                        raise UsageError(f"output dim {dim.name} is not an input's: not served by a plugin")
                    first[str(dim.name)] = (number, axis)
                source = first[str(dim.name)]
                dims.append(f"{{-1, {source[0]}, {source[1]}}}")
            else:
                dims.append(f"{{{int(dim)}, 0, 0}}")
        kind = np.dtype(tensor.dtype).kind
        code = DLPACK["float" if kind == "f" else "uint" if kind == "u" else "int"]
        bits = np.dtype(tensor.dtype).itemsize * 8
        body = ", ".join(dims) or "{0, 0, 0}"
        rows.append(f"  {{{ELEM_TYPES[tensor.dtype]}, {code}, {bits}, {len(tensor.shape)}, {{{body}}}}},")
    return rows


PLUGIN_INT, PLUGIN_FLOAT, PLUGIN_INTS, PLUGIN_FLOATS, PLUGIN_STRING = range(5)
"""An attribute's kind, as onnxruntime_plugin.c's enum numbers them."""


def _float_words(values: list[float]) -> str:
    """Float32 values as the bits of their IEEE words (exactly what ONNX stored, -0.0 and NaN kept)."""
    return ", ".join(f"{{{struct.unpack('<I', struct.pack('<f', v))[0]}u}}" for v in values) or "{0u}"


def _attr_row(prefix: str, name: str, value: Any, absent_ok: bool) -> tuple[str, str]:
    """(the C definition of the attribute's values or "", its PluginAttr initializer); `prefix`:
    a C name deploy made for the values."""
    head = f"{c_string(name)}, {{kind}}, {int(absent_ok)}, {{count}}"
    floats = f"static const union {{{{ uint32_t u; float f; }}}} {prefix}[] = {{{{{{words}}}}}};\n"
    if isinstance(value, int):
        row = f"{{{head.format(kind=PLUGIN_INT, count=1)}, {prefix}, NULL, NULL}}"
        return f"static const int64_t {prefix}[] = {{{value}LL}};\n", row
    if isinstance(value, float):
        row = f"{{{head.format(kind=PLUGIN_FLOAT, count=1)}, NULL, &{prefix}[0].f, NULL}}"
        return floats.format(words=_float_words([value])), row
    if isinstance(value, str):
        return "", f"{{{head.format(kind=PLUGIN_STRING, count=0)}, NULL, NULL, {c_string(value)}}}"
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        values = ", ".join(f"{int(v)}LL" for v in value) or "0"
        row = f"{{{head.format(kind=PLUGIN_INTS, count=len(value))}, {prefix}, NULL, NULL}}"
        return f"static const int64_t {prefix}[] = {{{values}}};\n", row
    if isinstance(value, list) and all(isinstance(v, float) for v in value):
        row = f"{{{head.format(kind=PLUGIN_FLOATS, count=len(value))}, NULL, &{prefix}[0].f, NULL}}"
        return floats.format(words=_float_words(value)), row
    shown = printable(repr(value))[:40]
    raise UsageError(f"attribute {printable(name)}={shown}: a plugin cannot check a value of its kind")


def _elem(types: list[TensorType]) -> int:
    """The ONNX element type all of `types` have; 0 (UNDEFINED: any, checked per node) if several."""
    return ELEM_TYPES[types[0].dtype] if len({t.dtype for t in types}) == 1 else 0


def plugin_table(nodes: list[ServedNode], prefixes: list[str]) -> str:
    """plugin_table.h: each bundle's functions, and the PluginType table grouping `nodes` by
    (domain, op_type); every name from the model as an escaped literal."""
    parts = ["/* Generated by deploy (deploy/engines/onnxruntime.py): the nodes this plugin serves. */\n"]
    rows: dict[tuple[str, str], list[str]] = {}
    for number, (node, prefix) in enumerate(zip(nodes, prefixes, strict=True)):
        parts.append(f"int {prefix}_run(DLTensor* const* args, int num_args);\n")
        parts.append(f"const char* {prefix}_last_error(void);\n")
        parts.append(f"plugin_parallel_for {prefix}_set_parallel_for(plugin_parallel_for fn, void* user);\n")
        tensors = [*node.bound.inputs, node.bound.output]
        parts.append(f"static const PluginTensor node{number}_tensors[] = {{\n")
        parts.append("\n".join(_dim_rows(tensors, len(node.bound.inputs))) + "\n};\n")
        attrs = []
        for count, (name, value, absent_ok) in enumerate(node.attrs):
            definition, row = _attr_row(f"node{number}_attr{count}", name, value, absent_ok)
            parts.append(definition)
            attrs.append(row)
        parts.append(f"static const PluginAttr node{number}_attrs[] = {{{', '.join(attrs) or '{NULL}'}}};\n")
        output = "NULL" if node.output is None else c_string(node.output)
        rows.setdefault((node.domain, node.op_type), []).append(
            f"  {{{output}, {c_string(node.label)}, {prefix}_run, {prefix}_last_error,"
            f" {prefix}_set_parallel_for, node{number}_tensors,"
            f" node{number}_attrs, {len(node.attrs)}}},"
        )
    types = []
    for number, ((domain, op_type), node_rows) in enumerate(rows.items()):
        served = [n for n in nodes if (n.domain, n.op_type) == (domain, op_type)]
        parts.append(f"static const PluginNode type{number}_nodes[] = {{\n" + "\n".join(node_rows) + "\n};\n")
        counts = {len(n.bound.inputs) for n in served}
        if len(counts) != 1:
            raise UsageError(f"{served[0].label}: nodes of one type take different input counts")
        inputs = [t for n in served for t in n.bound.inputs]
        types.append(
            f"  {{{{0}}, {c_string(domain)}, {c_string(op_type)}, {counts.pop()}, 1, {_elem(inputs)},"
            f" {_elem([n.bound.output for n in served])}, type{number}_nodes, {len(node_rows)}}},"
        )
    parts.append(f"#define PLUGIN_NUM_TYPES {len(types)}\n")
    parts.append("static PluginType plugin_types[PLUGIN_NUM_TYPES] = {\n" + "\n".join(types) + "\n};\n")
    return "".join(parts)


def build_plugin(nodes: list[ServedNode], target: Any, options: Any, directory: Path, name: str) -> Path:
    """Compile each node's kernel as a bundle, link them with the glue into `directory`/lib`name`.so
    (written whole, or not at all) with plugin.json listing the nodes; returns the library."""
    from deploy.compiler.export import check_destination
    from deploy.devices.native import ffi_include, require_tool
    from deploy.devices.platforms import get_platform

    headers = require_headers()
    platform = get_platform(target.arch)
    gcc = require_tool(platform, "gcc", platform.gcc_package)
    place = check_destination(directory)
    if place.exists() and any(p.name not in (f"lib{name}.so", PLUGIN_JSON) for p in place.iterdir()):
        raise UsageError(f"output {directory} holds other files than a plugin's: not replacing it")
    options = replace(options, alignment=ENGINE_ALIGNMENT)
    with replacing_directory(place) as staging:
        with tempfile.TemporaryDirectory(prefix="deploy-ort-") as scratch:
            work = Path(scratch)
            bundles = write_bundles([n.bound for n in nodes], "ort", target, options, work)
            prefixes = [prefix for prefix, _ in bundles]
            archives = [str(bundle / f"lib{prefix}.a") for prefix, bundle in bundles]
            (work / "plugin_table.h").write_text(plugin_table(nodes, prefixes))
            glue = work / "plugin.o"
            includes = [f"-I{work}", f"-I{headers}", f"-I{ffi_include()}"]
            source = engine_source("onnxruntime_plugin.c")
            run_tool([gcc, *CFLAGS, *includes, "-c", str(source), "-o", str(glue)], f"{gcc} on {source.name}")
            script = work / "exports.map"
            script.write_text("{ global: RegisterCustomOps; local: *; };\n")
            library = staging / f"lib{name}.so"
            run_tool(
                [gcc, "-shared", "-static-libgcc", f"-Wl,--version-script={script}",
                 f"-Wl,-soname,lib{name}.so", str(glue), *archives, "-o", str(library), "-lm", "-lpthread"],
                f"{gcc} -shared (lib{name}.so)",
            )  # fmt: skip
        listing = [
            {"node": n.label, "domain": n.domain, "op_type": n.op_type, "output": n.output,
             "op": n.bound.op.name, "inputs": [t.dims() for t in n.bound.inputs], "bundle": p}
            for n, p in zip(nodes, prefixes, strict=True)
        ]  # fmt: skip
        (staging / PLUGIN_JSON).write_text(json.dumps({"library": library.name, "nodes": listing}, indent=1))
    return place / f"lib{name}.so"


def build(bound: BoundOp | None, model: Path | None, target: Any, options: Any, directory: Path) -> list[str]:
    """`deploy build --engine onnxruntime`: the plugin of an op (`bound`) or of a model's nodes."""
    if target.arch not in ("x86_64", "aarch64"):
        raise UsageError(
            f"--engine onnxruntime: --target {target.name}: expected x86 or arm (the CPUs of its wheels)"
        )
    nodes = model_nodes(model) if model is not None else [op_node(bound)]  # type: ignore[arg-type]
    name = c_word(model.stem if model is not None else nodes[0].bound.op.name, 40)
    library = build_plugin(nodes, target, options, directory, name)
    lines = [
        f"built {directory / library.name} for onnxruntime on {target.name}: {len(nodes)} node(s) served"
    ]
    lines += [f"  {n.label}: op {n.bound.op.name} {', '.join(map(_shown, n.bound.inputs))}" for n in nodes]
    return lines


def _shown(t: TensorType) -> str:
    return "x".join(map(str, t.dims())) + f" {t.dtype}"


def run_model(model: Path, library: Path | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs in onnxruntime's CPU provider, with the plugin `library` registered,
    its graph optimized short of layout transforms: `reference` runs each standard node alone,
    and on an AVX2 host without AVX-512 the NCHWc MaxPool that ORT_ENABLE_ALL swaps in treats a
    window's NaN unlike the plain one (0.79 against 1.06 in examples/pool_add_leaky_htanh_n.onnx
    on NaN inputs, onnxruntime alone): the comparison is of deploy's kernels, like for like (the
    C host, `onnxruntime_host.c`, sets the same level)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # fatal only: an error is the exception's line, not a log line too
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if library is not None:
        options.register_custom_ops_library(str(library))
    try:
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        return list(session.run(None, feeds))
    except Exception as exc:  # onnxruntime raises a class of its own per status code
        raise DeployError(f"onnxruntime: {reason(exc)}") from None


def reference(model: Path, nodes: list[ServedNode], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs node by node: the served nodes by their op's numpy reference, every
    other in onnxruntime alone (a one-node model)."""
    from deploy.model.onnx_import import initializer
    from deploy.verify.onnx_reference import OnnxruntimeError, run_node

    proto = onnx.load(str(model))
    ours = {n.output: n for n in nodes}
    values: dict[str, np.ndarray] = {t.name: initializer(t, model.parent) for t in proto.graph.initializer}
    values.update(feeds)
    for node in proto.graph.node:
        inputs = [values[t] for t in node.input]
        if node.output[0] in ours:
            bound = ours[node.output[0]].bound
            values[node.output[0]] = bound.op.reference(bound.attrs, *inputs)
            continue
        outputs = [t for t in node.output if t]
        types = {t: TensorType(a.shape, str(a.dtype)) for t, a in zip(node.input, inputs, strict=True)}
        try:
            values.update(zip(outputs, run_node(proto, node, types, inputs, outputs), strict=True))
        except OnnxruntimeError as exc:
            raise DeployError(
                f"node {printable(node.name)!r}: onnxruntime cannot run it alone: {exc}"
            ) from None
    return [values[v.name] for v in proto.graph.output]


AARCH64_VERSION = "1.32.0"
"""The onnxruntime release whose aarch64 library deploy runs (under qemu, or on an aarch64 board)."""
AARCH64_WHEEL = "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_aarch64.whl"
AARCH64_WHEEL_SHA256 = "2303372a85299b6757b0e11e1cbf13e410ddf7e10c37f4b37e99d1c90e7daf7c"
AARCH64_LIBRARY_SHA256 = "49852228a93995158b2a813d4df487d47a1b76b0eaa894507ef49e91b6d7954a"
"""The sha256 of that wheel as PyPI serves it, and of the library deploy keeps from it: both are
checked, the wheel when it is fetched and the kept library at each use."""
FETCH_MB = 23
"""About what onnxruntime's aarch64 wheel weighs."""
CPUINFO_BLOCK = """processor\t: {n}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
"""One CPU of an arm64 /proc/cpuinfo (a Neoverse N1): onnxruntime's aarch64 library parses
/proc/cpuinfo in a static initializer and crashes on an x86 one under qemu-user."""


def _check_pinned(path: Path, expected: str, remedy: str) -> None:
    """`path` holds the bytes deploy pinned: a one-line DeployError naming it and both digests."""
    found = sha256_file(path)
    if found != expected:
        raise DeployError(f"{path} has sha256 {found}, expected {expected} (pinned by deploy): {remedy}")


def aarch64_runtime(say: Callable[[str], None]) -> Path:
    """onnxruntime's aarch64 library (AARCH64_VERSION), from its PyPI wheel: fetched once by pip
    (`say`s so, with the size) into deploy's cache, the wheel's sha256 checked before the library
    alone is kept, and the kept library's at each use."""
    import sys
    import zipfile

    from deploy.base.locks import locked

    place = cache_root() / "onnxruntime" / f"{AARCH64_VERSION}-aarch64"
    library = place / "libonnxruntime.so.1"
    place.mkdir(parents=True, exist_ok=True)
    with locked(place.with_name(f"{place.name}.lock")):
        if not library.is_file():
            say(
                f"deploy: fetching onnxruntime {AARCH64_VERSION}'s aarch64 wheel once with pip (about"
                f" {FETCH_MB} MB); its library is kept in {place}"
            )
            with tempfile.TemporaryDirectory(dir=place.parent, prefix=".fetch-") as fetched:
                proc = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                     "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11", "--implementation",
                     "cp", "-d", fetched, f"onnxruntime=={AARCH64_VERSION}"],
                    capture_output=True, text=True,
                )  # fmt: skip
                wheel_path = Path(fetched) / AARCH64_WHEEL
                if proc.returncode != 0 or not wheel_path.is_file():
                    said = (proc.stderr or proc.stdout).strip().splitlines()[-2:] or [f"no {AARCH64_WHEEL}"]
                    raise DeployError(f"pip could not fetch {AARCH64_WHEEL}: {' | '.join(said)}")
                _check_pinned(wheel_path, AARCH64_WHEEL_SHA256, "the index serves other bytes: refusing it")
                with zipfile.ZipFile(wheel_path) as wheel:
                    inside = f"onnxruntime/capi/libonnxruntime.so.{AARCH64_VERSION}"
                    (Path(fetched) / "lib").write_bytes(wheel.read(inside))
                os.replace(Path(fetched) / "lib", library)
        _check_pinned(library, AARCH64_LIBRARY_SHA256, "delete it to fetch it again")
    return library


def installed_runtime() -> Path:
    """The x86_64 library of the onnxruntime installed here (its wheel's `capi/`), which a board
    runs; a one-line DeployError where the package has none."""
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so.1.*"))
    if not found:
        raise DeployError(f"onnxruntime {onnxruntime.__version__} has no libonnxruntime.so.1.* in {capi}")
    return found[0]


HOST_SECONDS = 600
"""The longest the C host may run a model, under the emulator or on a board."""


def run_hosted(
    model: Path,
    library: Path,
    feeds: dict[str, np.ndarray],
    target: Any,
    say: Callable[[str], None],
    board: Board | None = None,
) -> list[np.ndarray]:
    """The model's outputs from deploy's C host (onnxruntime_host.c, no Python) with the plugin
    `library`: on `board`, pushed there with onnxruntime's library for its CPU and the model;
    else onnxruntime's aarch64 library under qemu-user, which sees an arm64 /proc/cpuinfo
    (bind-mounted in a mount namespace of its own: needs root)."""
    from deploy.devices.native import require_tool
    from deploy.devices.platforms import get_platform

    if board is None and os.geteuid() != 0:
        raise DeployError(
            "deploy test --engine onnxruntime --target arm needs root: onnxruntime's aarch64 library"
            " crashes on the host's x86 /proc/cpuinfo under qemu, and showing it an arm64 one takes a mount"
        )
    platform = get_platform(target.arch)
    gcc = require_tool(platform, "gcc", platform.gcc_package)
    runtime = aarch64_runtime(say) if target.arch == "aarch64" else installed_runtime()
    with tempfile.TemporaryDirectory(prefix="deploy-ort-host-") as scratch:
        work = Path(scratch)
        host = work / "deploy-ort-host"
        source = engine_source("onnxruntime_host.c")
        run_tool(
            [gcc, "-std=c11", "-O2", "-Wall", f"-I{require_headers()}", str(source), "-o", str(host), "-ldl"],
            f"{gcc} on {source.name}",
        )
        specs, inputs = [], []  # the input files are named relative to `work`, where the host runs
        for number, (name, array) in enumerate(feeds.items()):
            inputs.append(work / f"input{number}.bin")
            np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tofile(inputs[-1])
            dims = "x".join(map(str, array.shape))
            specs.append(f"{name}={ELEM_TYPES[str(array.dtype)]}:{dims}:{inputs[-1].name}")
        (work / "out").mkdir()
        if board is None:
            cpus = os.cpu_count() or 1
            (work / "cpuinfo").write_text("\n".join(CPUINFO_BLOCK.format(n=n) for n in range(cpus)) + "\n")
            emulated = [*platform.emulator_command(), str(host), str(runtime), str(model.resolve()),
                        str(library.resolve()), "out", *specs]  # fmt: skip
            script = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
            proc = subprocess.run(
                ["unshare", "-m", "sh", "-c", script, str(work / "cpuinfo"), *emulated],
                capture_output=True, text=True, timeout=HOST_SECONDS, cwd=work,
            )  # fmt: skip
            where = f"under {platform.emulator_command()[0]}"
        else:
            from deploy.engines.board import run_on_board

            pushed = {
                host.name: host,
                "libonnxruntime.so.1": runtime,
                "model.onnx": model,
                library.name: library,
            }

            def args(remote: str) -> list[str]:
                files = [f"{remote}/{name}" for name in ("libonnxruntime.so.1", "model.onnx", library.name)]
                return [f"{remote}/{host.name}", *files, ".", *specs]

            proc = run_on_board(board, pushed, host.name, args, inputs, work / "out", HOST_SECONDS)
            where = f"on {board.name}"
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
            raise DeployError(f"onnxruntime {where}: {said[-1]}")
        outputs, listing = [], proc.stdout  # a line per output: "INDEX ELEM D0xD1x..."
        for line in listing.splitlines():
            index, elem, dims = [*line.split(), ""][:3]
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
            data = np.fromfile(
                work / "out" / f"{index}.bin", dtype=np.dtype(_dtype(int(elem))).newbyteorder("<")
            )
            outputs.append(data.reshape(shape))
        return outputs


def test(
    model: Path,
    directory: Path,
    target: Any,
    options: Any,
    say: Callable[[str], None],
    board: Board | None = None,
) -> list[str]:
    """`deploy test --model M --engine onnxruntime`: build the plugin into `directory`, run the
    model with it on random inputs (plain, ties, and with NaN and infinities planted) in
    onnxruntime (on x86 its Python API; on arm its aarch64 library under the emulator, by a C
    host; on `board`, the C host pushed there) and compare each output with `reference` (bit for
    bit where every served op is exact)."""
    from deploy.verify.compare import INPUT_SETS, compare, random_input
    from deploy.verify.onnx_reference import agrees_on_nan, installed

    if target.arch not in ("x86_64", "aarch64"):
        raise UsageError(f"--engine onnxruntime: --target {target.name}: expected x86 or arm")
    if not installed():
        raise DeployError(
            "deploy test --engine onnxruntime needs onnxruntime's Python package: pip install onnxruntime"
        )
    nodes = model_nodes(model)
    library = build_plugin(nodes, target, options, directory, c_word(model.stem, 40))
    proto = onnx.load(str(model))
    given = {t.name for t in proto.graph.initializer}
    inputs = [(v.name, _value_type(v)) for v in proto.graph.input if v.name not in given]
    exact = all(n.bound.exact for n in nodes)
    rule = next((n.bound.rule() for n in nodes if not n.bound.exact), None)
    lines = []
    rng = np.random.default_rng(0)
    aarch64 = target.arch != "x86_64"
    for inputs_set in INPUT_SETS:
        if aarch64 and inputs_set.specials and not agrees_on_nan(model):
            lines.append(
                f"  {inputs_set.label} inputs: not compared (the reference runs standard nodes in x86"
                " onnxruntime, whose NaN handling differs from its aarch64 build in some ops:"
                " deploy/verify/onnx_reference.py)"
            )
            continue
        feeds = {}
        for name, t in inputs:
            if t is None:
                raise UsageError(f"model {model}: input {printable(name)!r} has no known type")
            static = TensorType(tuple(2 if is_symbolic(d) else d for d in t.shape), t.dtype)
            feeds[name] = random_input(static, rng, inputs_set.ties, inputs_set.specials)
        hosted = aarch64 or board is not None
        got = (
            run_hosted(model, library, feeds, target, say, board)
            if hosted
            else run_model(model, library, feeds)
        )
        want = reference(model, nodes, feeds)
        for output, g, w in zip(proto.graph.output, got, want, strict=True):
            result = compare(w, g, exact, *((rule,) if rule is not None else ()))
            what = f"{printable(output.name)!r} on {inputs_set.label} inputs"
            if not result.ok:
                raise DeployError(f"onnxruntime with the plugin: output {what} differs: {result.detail}")
            lines.append(f"  output {what}: ok (max error {result.max_error:.3g})")
    where = "x86" if target.arch == "x86_64" else f"{target.name}, emulated"
    where = where if board is None else f"{target.name}, board {board.name}"
    lines.insert(0, f"{model} in onnxruntime ({where}) with deploy's plugin: {len(nodes)} node(s) served, ok")
    return lines


ENGINE = register(Engine("onnxruntime", "a custom-op library (RegisterCustomOps)", build, test))
