"""Names from a model become no code (#49): whatever a graph file or an ONNX model calls a tensor,
node, output, initializer or the graph itself reaches generated C, OpenCL C and TIR only as an
escaped string literal (`deploy.base.ctext.c_string`) or an identifier deploy made; `--name` takes no
keyword and no name of the C library or of deploy's runtime.

Each model holds a payload that, compiled, is a constructor printing PWNED and a global symbol:
every bundle built from it (x86 with its module, aarch64, armv7, riscv64, OpenCL's host code) is
checked by the real tools: its header preprocessed (no name left outside a comment), `nm` (no
symbol from a name), the x86 libraries loaded and their deploy-run run (nothing printed; the
OpenCL one on PoCL), and aarch64's under qemu-user.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deploy.base.ctext import IDENTIFIER, c_string
from deploy.base.errors import UsageError
from deploy.compiler.bundle import CFLAGS, HEADER_PARAMS, LINKED_SOURCES, check_name
from deploy.compiler.compile import compile_graph
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.runtime import SOURCES
from deploy.compiler.targets import get_target
from deploy.devices.native import cached_object
from deploy.devices.platforms import get_platform
from deploy.model import load_model
from deploy.ops.graph import bind_graph
from tests.conftest import invoke

PAYLOAD = 'x */ __attribute__((constructor)) static void pwned_ctor(void) { __builtin_puts("PWNED"); } /*'
OUTPUT = 'q"uote\\back\\slash??/ */ int pwned_global = 1; /* \\'
NAMES = {
    "payload": PAYLOAD,
    "open": "1\u00e9/*b",
    "line": "c//d",
    "hash": "#include </etc/passwd>",
    "output": OUTPUT,
    "graph": "g */ int pwned_graph = 1; /*",
}
"""A graph file's names: inputs (one begins with a digit and holds a non-ASCII letter), nodes,
outputs and the graph's own."""
GRAPH = {
    "name": NAMES["graph"],
    "inputs": {PAYLOAD: {"shape": [2, 8]}, NAMES["open"]: {"shape": [2, 8]}},
    "nodes": [
        {"name": NAMES["line"], "op": "add", "inputs": [PAYLOAD, NAMES["open"]]},
        {"name": NAMES["hash"], "op": "leaky_relu", "inputs": [NAMES["line"]]},
        {"name": OUTPUT, "op": "add", "inputs": [NAMES["line"], PAYLOAD]},
    ],
    "output": [NAMES["hash"], OUTPUT],
}
ONNX_NAMES = {
    "input": 'i */ __attribute__((constructor)) static void pwned_onnx(void) { __builtin_puts("PWN"); } /*',
    "initializer": "w */ int pwned_init = 1; /* ??/",
    "node": "n */ int pwned_node = 1; /*",
    "second": "z\\ */ int pwned_second = 1; /* \u00e9",
}
PAYLOAD_TOKENS = re.compile(r"\b(pwned_\w+|constructor|__builtin_puts)\b")
"""What of a payload would be left as C tokens (C names deploy makes from a name hold its letters,
joined by _, as one identifier: no boundary inside)."""
TARGETS = {
    "x86": ("x86", None),
    "arm": ("arm", "aarch64-linux-gnu-gcc"),
    "armv7": ("armv7", "arm-linux-gnueabihf-gcc"),
    "riscv64": ("riscv64", "riscv64-linux-gnu-gcc"),
    "opencl": ("opencl", "/usr/include/CL/cl.h"),
}
"""Each bundle built here: its target, and what building it needs beyond gcc."""
ARCHES = {"arm": "aarch64", "armv7": "armv7l", "riscv64": "riscv64"}
"""The platforms of the cross-compiled bundles (their gcc and nm)."""


def onnx_model() -> bytes:
    """Add(input, initializer) -> first output, LeakyRelu of it -> the second output."""
    from onnx import TensorProto, helper, numpy_helper

    n = ONNX_NAMES
    nodes = [
        helper.make_node("Add", [n["input"], n["initializer"]], ["y"], n["node"]),
        helper.make_node("LeakyRelu", ["y"], [n["second"]], n["node"] + " 2"),
    ]
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8]) for name in ("y", n["second"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n["input"], TensorProto.FLOAT, [2, 8])],
        values,
        [numpy_helper.from_array(np.full((2, 8), 0.5, np.float32), n["initializer"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("names")
    (root / "names.yaml").write_text(json.dumps(GRAPH))  # JSON is YAML: every character as written
    (root / "names.json").write_text(json.dumps({**GRAPH, "name": "j"}))
    (root / "names.onnx").write_bytes(onnx_model())
    return {"yaml": root / "names.yaml", "onnx": root / "names.onnx", "json": root / "names.json"}


def available(kind: str) -> None:
    need = TARGETS[kind][1]
    if shutil.which("gcc") is None or (need is not None and not (shutil.which(need) or Path(need).exists())):
        pytest.skip(f"needs gcc and {need}")


@pytest.fixture(scope="module")
def bundles(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Each model built for each target whose tools are here, as a bundle named `names`."""
    root = tmp_path_factory.mktemp("built")
    built = {}
    for model in ("yaml", "onnx"):
        graph = bind_graph(load_model(models[model]))
        for kind, (target, need) in TARGETS.items():
            if need is not None and not (shutil.which(need) or Path(need).exists()):
                continue
            compiled = compile_graph(graph, get_target(target), BuildOptions(cores=2))
            export(compiled, root / f"{model}-{kind}", bundle=True, name="names")
            built[model, kind] = root / f"{model}-{kind}"
    return built


def model_names(model: str) -> list[str]:
    return list(NAMES.values()) if model == "yaml" else list(ONNX_NAMES.values())


def tool(kind: str, name: str) -> str:
    """`name` (gcc, nm) for the CPU of `kind`'s bundle."""
    return get_platform(ARCHES[kind]).tool(name) if kind in ARCHES else name


@pytest.mark.parametrize("kind", list(TARGETS))
@pytest.mark.parametrize("model", ["yaml", "onnx"])
def test_names_are_inert_in_every_generated_file(model, kind, bundles, tmp_path):
    """The header holds each name only as a C string literal, in a comment: preprocessed, nothing
    of any name is left; no library or program of the bundle has a symbol from a name; kernels.cl
    is ASCII and names none of them."""
    available(kind)
    directory = bundles[model, kind]
    header = (directory / "names.h").read_text()
    for name in model_names(model):
        if "*/" in name:
            assert name not in header
    for name in (PAYLOAD, OUTPUT) if model == "yaml" else (ONNX_NAMES["input"],):
        assert c_string(name) in header, name
    gcc = tool(kind, "gcc")
    proc = subprocess.run(
        [gcc, "-E", "-P", "-I", str(directory), "-I", str(directory / "include"), str(directory / "names.h")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert PAYLOAD_TOKENS.findall(proc.stdout) == []
    libraries = ["libnames.a", "libnames.so"] + (["module.so"] if kind != "opencl" else [])
    for library, dynamic in [(name, flag) for name in libraries for flag in ([], ["-D"])]:
        symbols = subprocess.run(
            [tool(kind, "nm"), *dynamic, str(directory / library)], capture_output=True, text=True, check=True
        ).stdout
        assert PAYLOAD_TOKENS.findall(symbols) == [], library
    if kind == "opencl":
        source = (directory / "kernels.cl").read_text()
        assert source.isascii() and "pwned" not in source.lower()


def test_the_x86_bundles_run_and_print_nothing(bundles, tmp_path):
    """The payload's constructor would print on dlopen and in deploy-run: neither prints, for the
    CPU bundle and the OpenCL one (its host code x86's; run where PoCL is), and both compute."""
    available("x86")
    kinds = ["x86"] + (["opencl"] if opencl_here() and ("yaml", "opencl") in bundles else [])
    for model, kind in [(model, kind) for model in ("yaml", "onnx") for kind in kinds]:
        directory = bundles[model, kind]
        loaded = subprocess.run(
            [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(directory / 'libnames.so')!r})"],
            capture_output=True,
            text=True,
        )
        assert loaded.returncode == 0 and "PWN" not in loaded.stdout, loaded.stderr
        command = [str(directory / "deploy-run"), str(directory)]
        for index in range(2 if model == "yaml" else 1):
            np.save(tmp_path / f"{model}{index}.npy", np.ones((2, 8), np.float32))
            command += ["-i", str(tmp_path / f"{model}{index}.npy")]
        outputs = [tmp_path / f"{model}-{kind}-out{index}.npy" for index in range(2)]
        ran = subprocess.run(
            [*command, "-o", str(outputs[0]), "-o", str(outputs[1])],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
        assert "PWN" not in ran.stdout + ran.stderr
        assert np.allclose(np.load(outputs[0]), 2.0 if model == "yaml" else 1.5)


@pytest.mark.emulator
def test_the_aarch64_bundle_runs_under_qemu_and_prints_nothing(bundles, tmp_path):
    """deploy-run of the aarch64 bundle (static) under qemu-user: the payload is not in it."""
    available("arm")
    qemu = get_platform("aarch64").emulator_command()
    if shutil.which(qemu[0]) is None:
        pytest.skip(f"needs {qemu[0]}")
    directory = bundles["onnx", "arm"]
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    command = [*qemu, str(directory / "deploy-run"), str(directory), "-i", str(tmp_path / "x.npy")]
    command += ["-o", str(tmp_path / "y.npy"), "-o", str(tmp_path / "z.npy")]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "PWN" not in ran.stdout + ran.stderr
    assert np.allclose(np.load(tmp_path / "y.npy"), 1.5)


def test_a_graph_name_no_prefix_may_be_gets_a_made_prefix_and_a_note(models, tmp_path):
    """Without --name the graph's own name would prefix the C functions: where it cannot (no
    identifier), the bundle's prefix is made from it, and one line says so; --name still refuses."""
    result = invoke(
        "build", "--target", "x86", "--model", str(models["yaml"]), "--bundle", "-o", str(tmp_path / "b")
    )
    assert result.exit_code == 0, result.output
    note = "note: the bundle's C prefix is g____int_pwned_graph___1____: 'g */ int pwned_graph = 1; /*'"
    assert f"{note} cannot be one (expected letters," in result.stdout
    assert (tmp_path / "b" / "g____int_pwned_graph___1____.h").is_file()
    with pytest.raises(UsageError, match="--name 'g \\*/ int pwned_graph = 1; /\\*' cannot prefix a bundle"):
        check_name(NAMES["graph"])


@pytest.mark.parametrize("kind", ["json", "onnx"])
@pytest.mark.parametrize(
    "name,shown",
    [("a\nb", "a\\nb"), ("a\x00b", "a\\x00b"), ("a\u2028b", "a\\u2028b"), ("a\rb", "a\\rb")],
)
def test_names_no_file_may_hold_are_refused_in_one_line(kind, name, shown, tmp_path):
    """Line breaks, NUL and U+2028 in a graph file's or an ONNX model's input name: refused
    before anything is built."""
    if kind == "json":
        graph = {"name": "g", "inputs": {name: {"shape": [4]}}, "output": "act"}
        graph["nodes"] = [{"name": "act", "op": "leaky_relu", "inputs": [name]}]
        (tmp_path / "m.json").write_text(json.dumps(graph))
    else:
        from onnx import TensorProto, helper

        values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in (name, "y")]
        nodes = [helper.make_node("LeakyRelu", [name], ["y"])]
        model = helper.make_model(
            helper.make_graph(nodes, "g", values[:1], values[1:]), opset_imports=[helper.make_opsetid("", 17)]
        )
        (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    result = invoke(
        "build",
        "--target",
        "x86",
        "--model",
        str(tmp_path / f"m.{kind}"),
        "--bundle",
        "-o",
        str(tmp_path / "b"),
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"name '{shown}': expected printable characters" in lines[0]
    assert not (tmp_path / "b").exists()


def test_a_symbolic_dim_that_is_no_name_is_refused_in_one_line(tmp_path):
    """An ONNX `dim_param` names a C parameter of NAME_workspace_size: only a plain name."""
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N */ int pwned; /*", 4])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N */ int pwned; /*", 4])
    graph = helper.make_graph([helper.make_node("LeakyRelu", ["x"], ["y"])], "g", [value], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    result = invoke(
        "build", "--target", "x86", "--model", str(tmp_path / "m.onnx"), "--bundle", "-o", str(tmp_path / "b")
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "dim 0 is symbolic ('N */ int pwned; /*'): expected a name like N" in lines[0]


def test_c_string_is_the_same_bytes_in_code_and_comment(tmp_path):
    """Every hostile name as `c_string` writes it, in a comment and as a string a C program
    prints (gcc with trigraphs on, warnings as errors): the program prints each name's UTF-8."""
    names = [
        *NAMES.values(),
        *ONNX_NAMES.values(),
        "a\nb",
        "a\x00b",
        "\u2028",
        "??=??/??'",
        "\\",
        "*/",
        "/*",
        "//",
    ]
    rows = "\n".join(f"/* {c_string(n)} */ {c_string(n)}," for n in names)
    sizes = ", ".join(str(len(n.encode())) for n in names)
    program = tmp_path / "p.c"
    program.write_text(
        "#include <stdio.h>\n"
        f"static const char* names[] = {{\n{rows}\n}};\nstatic const int sizes[] = {{{sizes}}};\n"
        "int main(void) {\n"
        "  for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; ++i)\n"
        "    fwrite(names[i], 1, sizes[i], stdout);\n"
        "  return 0;\n}\n"
    )
    subprocess.run(
        ["gcc", "-std=c99", "-trigraphs", "-Wall", "-Werror", str(program), "-o", str(tmp_path / "p")],
        check=True,
    )
    printed = subprocess.run([str(tmp_path / "p")], capture_output=True, check=True).stdout
    assert printed == "".join(names).encode()


TAKEN = {
    "name": "taken",
    "inputs": {
        name: {"shape": ["errno" if name == "args" else "t_errno", 4]}
        for name in ("args", "workspace", "PRIu64", "linux", "TAKEN_ERR_KERNEL")
    },
    "nodes": [
        {"name": "errno", "op": "add", "inputs": ["args", "args"]},
        {"name": "both", "op": "add", "inputs": ["PRIu64", "linux"]},
        {"name": "three", "op": "add", "inputs": ["both", "TAKEN_ERR_KERNEL"]},
        {"name": "NULL", "op": "add", "inputs": ["workspace", "three"]},
    ],
    "output": ["errno", "NULL"],
}
"""Names C already gives: the API's own locals and parameters (args, workspace), the C library's
(errno, NULL: a tensor's and a symbolic dim's, beside a dim named as errno's C name becomes), its
headers' macros (PRIu64; linux in GNU C), and NAME.h's own (TAKEN_ERR_KERNEL)."""


def test_names_c_gives_become_other_parameters(tmp_path):
    """Tensors and a symbolic dim named as bundle.c's locals and parameters, the C library's
    names or its macros: the bundle builds (its C had redeclared them), its header compiles
    in GNU C beside <errno.h> and <inttypes.h>, and deploy-run runs it."""
    (tmp_path / "taken.yaml").write_text(json.dumps(TAKEN))
    graph = bind_graph(load_model(tmp_path / "taken.yaml"))
    export(compile_graph(graph, get_target("x86"), BuildOptions(cores=2)), tmp_path / "b", bundle=True)
    header = (tmp_path / "b" / "taken.h").read_text()
    names = ("args", "workspace", "PRIu64", "linux", "TAKEN_ERR_KERNEL")
    params = ", ".join(f"const DLTensor* t_{name}" for name in names)
    assert f"int taken({params}, DLTensor* t_errno, DLTensor* t_NULL);" in header
    assert "size_t taken_workspace_size(int64_t t_errno_2, int64_t t_errno_3);" in header
    program = tmp_path / "p.c"
    program.write_text(
        '#include <errno.h>\n#include <inttypes.h>\n#include "taken.h"\nint main(void) { return 0; }\n'
    )
    include = ["-I", str(tmp_path / "b"), "-I", str(tmp_path / "b" / "include")]
    subprocess.run(
        ["gcc", "-std=gnu99", "-Wall", "-Werror", "-fsyntax-only", *include, str(program)], check=True
    )
    command = [str(tmp_path / "b" / "deploy-run"), str(tmp_path / "b")]
    for index in range(5):
        np.save(tmp_path / f"i{index}.npy", np.ones((3 if index == 0 else 2, 4), np.float32))
        command += ["-i", str(tmp_path / f"i{index}.npy")]
    command += ["-o", str(tmp_path / "o0.npy"), "-o", str(tmp_path / "o1.npy")]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert np.allclose(np.load(tmp_path / "o0.npy"), 2.0) and np.allclose(np.load(tmp_path / "o1.npy"), 4.0)


PARAMS = {
    "name": "params",
    "inputs": {name: {"shape": [4]} for name in ("context", "queue", "workspace_bytes", "num_args")},
    "nodes": [
        {"name": "s", "op": "add", "inputs": ["context", "queue"]},
        {"name": "t", "op": "add", "inputs": ["workspace_bytes", "num_args"]},
        {"name": "u", "op": "add", "inputs": ["s", "t"]},
    ],
    "output": "u",
}
"""Inputs named as the parameters NAME.h's functions take beside the tensors."""


@pytest.mark.parametrize("kind", ["x86", "opencl"])
def test_tensors_named_as_the_headers_parameters_build_and_run(kind, tmp_path):
    """An input named `context` or `queue` was a second `cl_mem context` of NAME_cl_enqueue (no
    OpenCL bundle built): every parameter the header's functions name beside the tensors is
    one no tensor takes, the header compiles, and deploy-run runs it (OpenCL's where PoCL is)."""
    available(kind)
    (tmp_path / "params.yaml").write_text(json.dumps(PARAMS))
    graph = bind_graph(load_model(tmp_path / "params.yaml"))
    export(compile_graph(graph, get_target(kind), BuildOptions(cores=2)), tmp_path / "b", bundle=True)
    header = (tmp_path / "b" / "params.h").read_text()
    prototypes = re.findall(r"^\w[^;(]* params\w*\(([^)]*)\);", header, re.M)
    with_tensors = [p for p in prototypes if "t_context" in p]  # NAME, NAME_with_workspace or _cl_enqueue
    assert len(with_tensors) == 2, prototypes
    tensors = {"t_context", "t_queue", "t_workspace_bytes", "num_args", "out"}
    for params in with_tensors:  # what else they name is what no tensor takes
        names = re.findall(r"(\w+)(?:,|$)", params)
        assert len(set(names)) == len(names) and set(names) - tensors <= HEADER_PARAMS, params
    program = tmp_path / "p.c"
    program.write_text('#include "params.h"\nint main(void) { return 0; }\n')
    include = ["-I", str(tmp_path / "b"), "-I", str(tmp_path / "b" / "include")]
    subprocess.run(
        ["gcc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", *include, str(program)], check=True
    )
    if kind == "opencl" and not opencl_here():
        return
    command = [str(tmp_path / "b" / "deploy-run"), str(tmp_path / "b")]
    for index in range(4):
        np.save(tmp_path / f"i{index}.npy", np.full(4, index + 1, np.float32))
        command += ["-i", str(tmp_path / f"i{index}.npy")]
    ran = subprocess.run(
        [*command, "-o", str(tmp_path / "o.npy")], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert np.allclose(np.load(tmp_path / "o.npy"), 10.0)


@pytest.mark.parametrize("kind", list(TARGETS))
def test_no_symbol_of_a_bundle_may_be_its_name(kind, bundles):
    """Every name the built library's symbol table holds (its functions and data, local or not,
    and the C library's it calls) but its own API is refused as --name, but for the statics of
    the sources compiled once (`LINKED_SOURCES`: runtime.c's `pool`, bundle_check.c's
    `check_tensor`; they include no NAME.h, and stay local to their object through `ld -r`): what
    `check_name` reads from the sources and lists covers what the linker sees."""
    available(kind)
    listing = subprocess.run(
        [tool(kind, "nm"), str(bundles["yaml", kind] / "libnames.a")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    linked = ("bundle_check.c",) if kind == "opencl" else LINKED_SOURCES
    local: set[str] = set()
    for source in linked:
        built = cached_object(tool(kind, "gcc"), SOURCES / source, CFLAGS)
        statics = subprocess.run(
            [tool(kind, "nm"), str(built)], capture_output=True, text=True, check=True
        ).stdout
        local |= {f[-1] for f in map(str.split, statics.splitlines()) if len(f) >= 2 and f[-2].islower()}
    symbols = {f[-1] for f in map(str.split, listing.splitlines()) if len(f) >= 2}
    others = {s for s in symbols if IDENTIFIER.fullmatch(s) and s != "names" and not s.startswith("names_")}
    assert "pthread_create" in others or kind == "opencl"
    assert {"check_tensor"} <= local and ({"pool", "hooked_task"} <= local or kind == "opencl")
    for symbol in sorted(others - local):
        with pytest.raises(UsageError, match="cannot prefix a bundle"):
            check_name(symbol)
    for symbol in sorted(local - {"names"}):  # the runtime's statics, wherever they are: a prefix
        if IDENTIFIER.fullmatch(symbol) and not symbol.startswith(("_", "deploy_")):
            assert check_name(symbol) == symbol


def opencl_here() -> bool:
    try:
        from deploy.devices.opencl import opencl_devices

        return bool(opencl_devices())
    except Exception:
        return False


@pytest.mark.skipif(
    not opencl_here(), reason="needs an OpenCL platform (Debian: pocl-opencl-icd) and pyopencl"
)
def test_two_names_alike_in_c_stay_two_arguments_of_an_opencl_kernel(tmp_path, monkeypatch):
    """Inputs `a.b` and `a_b`, read by one fused kernel: its OpenCL arguments are named apart
    (both were `a_b`, and the plan, which finds arguments by name, passed `a_b` twice: 6, not 4)."""
    monkeypatch.chdir(tmp_path)
    graph = {
        "inputs": {"a.b": {"shape": [8]}, "a_b": {"shape": [8]}},
        "nodes": [
            {"name": "s", "op": "add", "inputs": ["a.b", "a_b"]},
            {"name": "t", "op": "leaky_relu", "inputs": ["s"]},
        ],
        "output": "t",
    }
    (tmp_path / "m.yaml").write_text(json.dumps(graph))
    np.save(tmp_path / "a.npy", np.ones(8, np.float32))
    np.save(tmp_path / "b.npy", np.full(8, 3, np.float32))
    result = invoke(
        "run", "--target", "opencl", "--model", "m.yaml", "-i", "a.npy", "-i", "b.npy", "-o", "out.npy"
    )
    assert result.exit_code == 0, result.output
    assert np.array_equal(np.load(tmp_path / "out.npy"), np.full(8, 4, np.float32))


@pytest.mark.skipif(shutil.which("arm-linux-gnueabihf-gcc") is None, reason="needs gcc-arm-linux-gnueabihf")
@pytest.mark.parametrize(
    "name,prefix",
    [("pool", "pool"), ("my-model", "my_model"), ("exp", "t_exp"), ("run", "t_run"), ("mpa", "mpa")],
)
def test_a_bundle_deploy_builds_for_itself_makes_its_prefix(name, prefix, tmp_path):
    """armv7 runs bundles (`deploy run` builds one, and takes no --name): a model named as no
    prefix may be gets one made from its name, as `deploy build --bundle` without --name does;
    runtime.c's statics (pool) are no reason to."""
    graph = {"name": name, "inputs": {"x": {"shape": [4]}}, "output": "y"}
    graph["nodes"] = [{"name": "y", "op": "leaky_relu", "inputs": ["x"]}]
    (tmp_path / "m.json").write_text(json.dumps(graph))
    compiled = compile_graph(
        bind_graph(load_model(tmp_path / "m.json")), get_target("armv7"), BuildOptions(bundle=True)
    )
    assert export(compiled, tmp_path / "b").bundle["name"] == prefix
    assert (tmp_path / "b" / f"{prefix}.h").is_file()
