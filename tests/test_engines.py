"""deploy's kernels inside real engines (docs/engines.md): onnxruntime runs models whose
custom-domain nodes a plugin built by `deploy build --engine onnxruntime` serves, compared with
numpy; the bad inputs of issue #52 each end in one line."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from deploy.engines.onnxruntime import HEADERS_VARIABLE, headers_dir
from tests.conftest import REPO, run_deploy

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test extra: pip install -e '.[test]'")

HEADERS = headers_dir()[0]
"""Where the headers are outside the tests' own cache (read when this module is imported, before
conftest moves the cache): ci/setup.sh fetched them there."""
pytestmark = pytest.mark.skipif(
    not (HEADERS / "onnxruntime_c_api.h").is_file() or shutil.which("gcc") is None,
    reason=f"no onnxruntime C API headers in {HEADERS} (run ci/setup.sh) or no gcc",
)
ENV = {HEADERS_VARIABLE: str(HEADERS)}
EXAMPLES = ("--ops-path", str(REPO / "deploy" / "ops" / "examples"))
CUSTOM = "com.example"
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 2.5, -2.5, 1e-40], np.float32)


def saved(graph: onnx.GraphProto, path: Path) -> Path:
    """`graph` saved at `path` as a model importing ONNX opset 17 and CUSTOM's version 1."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(CUSTOM, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def hard_tanh_model(path: Path, shapes: list[tuple[int | str, ...]], attrs: list[dict[str, float]]) -> Path:
    """x -> Relu -> HardTanh (com.example, `attrs[0]`) -> ... one custom node per entry, each on
    its own input of `shapes` after a standard Abs, then Add of the first two where there are two:
    standard and custom nodes mixed, each custom node with its own shape and attributes."""
    nodes, inputs, outputs = [], [], []
    for number, (shape, given) in enumerate(zip(shapes, attrs, strict=True)):
        inputs.append(helper.make_tensor_value_info(f"x{number}", TensorProto.FLOAT, shape))
        nodes.append(helper.make_node("Relu" if number == 0 else "Abs", [f"x{number}"], [f"a{number}"]))
        custom = helper.make_node(
            "HardTanh", [f"a{number}"], [f"h{number}"], name=f"ht{number}", domain=CUSTOM
        )
        custom.attribute.extend(helper.make_attribute(key, value) for key, value in given.items())
        nodes.append(custom)
        outputs.append(helper.make_tensor_value_info(f"h{number}", TensorProto.FLOAT, shape))
    return saved(helper.make_graph(nodes, path.stem, inputs, outputs), path)


def session(model: Path, *libraries: Path) -> object:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    for library in libraries:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return run_deploy(*EXAMPLES, "build", "--target", "x86", "--engine", "onnxruntime", *args, env=ENV)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A model with two HardTanh nodes (a symbolic batch and a fixed shape, other attributes)
    and its plugin."""
    folder = tmp_path_factory.mktemp("two")
    model = hard_tanh_model(folder / "two.onnx", [("N", 3, 5), (7,)], [{}, {"min_val": -0.5, "max_val": 2.0}])
    built = build("--model", str(model), "-o", str(folder / "plugin"))
    assert built.returncode == 0, built.stderr
    assert "2 node(s) served" in built.stdout
    return model, folder / "plugin" / "libtwo.so"


def test_plugin_is_plain_c_exporting_only_register_custom_ops(two_nodes: tuple[Path, Path]) -> None:
    library = two_nodes[1]
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    assert [line.split()[-1] for line in exported.stdout.splitlines()] == ["RegisterCustomOps"]
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    libraries = sorted(line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line)
    assert all(
        not name.startswith(("libstdc++", "libonnxruntime", "libtvm", "libpython")) for name in libraries
    )


@pytest.mark.parametrize("batch", [1, 4])
def test_two_custom_nodes_match_numpy_exactly(two_nodes: tuple[Path, Path], batch: int) -> None:
    """Each node runs its own kernel (its shape, its attributes), NaN, infinities and signed zeros
    included: HardTanh is exact, so bit for bit."""
    model, library = two_nodes
    rng = np.random.default_rng(batch)
    x0 = rng.standard_normal((batch, 3, 5)).astype(np.float32) * 3
    x0.reshape(-1)[: len(SPECIALS)] = SPECIALS
    x1 = np.resize(SPECIALS, 7).astype(np.float32)
    h0, h1 = session(model, library).run(None, {"x0": x0, "x1": x1})  # type: ignore[attr-defined]
    np.testing.assert_array_equal(h0, np.clip(np.maximum(x0, 0), -1.0, 1.0))
    np.testing.assert_array_equal(h1, np.clip(np.abs(x1), -0.5, 2.0))


def test_nodes_past_a_custom_node_are_typed_and_served(tmp_path: Path) -> None:
    """x -> HardTanh -> Transpose -> HardTanh -> Abs: ONNX's shape inference knows nothing past a
    custom node, so the build infers again with the served node's output type (the Transpose's
    output, the second node's input, is known only so); onnxruntime, which knows no shape for a
    custom node's output either, creates the session, and both nodes run exactly."""
    first = helper.make_node("HardTanh", ["x"], ["h0"], name="first", domain=CUSTOM)
    second = helper.make_node(
        "HardTanh", ["t"], ["h1"], name="second", domain=CUSTOM, min_val=0.0, max_val=2.0
    )
    graph = helper.make_graph(
        [first, helper.make_node("Transpose", ["h0"], ["t"], perm=[1, 0]), second,
         helper.make_node("Abs", ["h1"], ["y"])],
        "chained", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 5))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = saved(graph, tmp_path / "chained.onnx")
    built = build("--model", str(model), "-o", str(tmp_path / "plugin"))
    assert built.returncode == 0, built.stderr
    assert "node 'second' (com.example::HardTanh): op hard_tanh 5x3 float32" in built.stdout
    x = np.resize(SPECIALS, (3, 5)).astype(np.float32) * 3
    (y,) = session(model, tmp_path / "plugin" / "libchained.so").run(None, {"x": x})  # type: ignore[attr-defined]
    np.testing.assert_array_equal(y, np.abs(np.clip(np.clip(x, -1.0, 1.0).T, 0.0, 2.0)))


ON_ENGINE_THREADS = """
import os, sys
import numpy as np
import onnxruntime as ort

def threads():
    return len(os.listdir("/proc/self/task"))

model, library, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = ort.SessionOptions()
options.intra_op_num_threads = count
options.inter_op_num_threads = 1
options.register_custom_ops_library(library)
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal((64, 4096)).astype(np.float32) * 3
before = threads()
(y,) = session.run(None, {"x0": x})
print(threads() - before, np.array_equal(y, np.clip(np.maximum(x, 0), -1.0, 1.0)))
"""


@pytest.mark.parametrize("count", [1, 2])
def test_the_kernels_run_on_onnxruntimes_threads(tmp_path: Path, count: int) -> None:
    """A served node's parallel loops run on the session's intra-op threads (KernelContext_ParallelFor):
    at one thread the plugin starts no thread of its own, and at two the result is the same."""
    model = hard_tanh_model(tmp_path / "big.onnx", [(64, 4096)], [{}])
    built = build("--model", str(model), "-o", str(tmp_path / "plugin"))
    assert built.returncode == 0, built.stderr
    library = tmp_path / "plugin" / "libbig.so"
    ran = subprocess.run(
        [sys.executable, "-c", ON_ENGINE_THREADS, str(model), str(library), str(count)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    started, same = ran.stdout.split()
    assert same == "True" and (count > 1 or started == "0"), ran.stdout


ON_ARM = [
    pytest.mark.emulator,
    pytest.mark.skipif(
        shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-gcc") is None,
        reason="needs qemu-user and gcc-aarch64-linux-gnu",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="needs root: onnxruntime's aarch64 library needs an arm64 /proc/cpuinfo under qemu (a mount)",
    ),
]


def leaky_hard_tanh(path: Path) -> Path:
    """x (N x 37) -> LeakyRelu -> HardTanh(min_val=-0.25, max_val=0.5): ops whose NaN handling
    agrees on every onnxruntime build, so NaN inputs compare on arm too."""
    custom = helper.make_node("HardTanh", ["l"], ["y"], name="clip", domain=CUSTOM)
    custom.attribute.extend([helper.make_attribute("min_val", -0.25), helper.make_attribute("max_val", 0.5)])
    graph = helper.make_graph(
        [helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.1), custom], path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("N", 37))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("N", 37))],
    )  # fmt: skip
    return saved(graph, path)


@pytest.mark.parametrize("model", ["leaky_hard_tanh", "pool_add_leaky_htanh_n.onnx"])
@pytest.mark.parametrize("target", ["x86", pytest.param("arm", marks=ON_ARM)])
def test_deploy_test_on_each_target(tmp_path: Path, model: str, target: str) -> None:
    """On arm, deploy's C host runs onnxruntime's aarch64 library under qemu with the aarch64
    plugin; NaN inputs compare where every standard node treats NaN alike on both builds."""
    path = (
        leaky_hard_tanh(tmp_path / "leaky.onnx") if model == "leaky_hard_tanh" else REPO / "examples" / model
    )
    tested = run_deploy(
        *EXAMPLES, "test", "--target", target, "--engine", "onnxruntime", "--model", str(path), env=ENV
    )
    assert tested.returncode == 0, tested.stderr
    assert "1 node(s) served, ok" in tested.stdout
    compared = "NaN, inf, ties inputs: ok" in tested.stdout
    assert compared == (model == "leaky_hard_tanh" or target == "x86"), tested.stdout


@pytest.fixture(scope="module")
def op_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin of `--op hard_tanh --shape 2x3 -a max_val=0.5`."""
    folder = tmp_path_factory.mktemp("op")
    built = build("--op", "hard_tanh", "--shape", "2x3", "-a", "max_val=0.5", "-o", str(folder / "op"))
    assert built.returncode == 0, built.stderr
    return folder / "op" / "libhard_tanh.so"


def test_an_op_build_serves_any_node_of_its_shape(tmp_path: Path, op_plugin: Path) -> None:
    same = hard_tanh_model(tmp_path / "same.onnx", [(2, 3)], [{"max_val": 0.5}])
    x = np.resize(SPECIALS, (2, 3)).astype(np.float32)
    (got,) = session(same, op_plugin).run(None, {"x0": x})  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got, np.clip(np.maximum(x, 0), -1.0, 0.5))


@pytest.mark.parametrize(
    ("shapes", "attrs", "said"),
    [
        ([(2, 4)], [{"max_val": 0.5}], "the shape of input 0 is not what"),
        ([(2, 3)], [{"max_val": 0.75}], "attribute max_val has another value"),
        ([(2, 3)], [{}], "attribute max_val is absent"),
    ],
    ids=["shape", "attribute", "absent-attribute"],
)  # fmt: skip
def test_a_node_not_built_for_fails_session_creation(
    tmp_path: Path,
    op_plugin: Path,
    shapes: list[tuple[int | str, ...]],
    attrs: list[dict[str, float]],
    said: str,
) -> None:
    other = hard_tanh_model(tmp_path / "other.onnx", shapes, attrs)
    with pytest.raises(Exception, match="rebuild it with this model") as raised:
        session(other, op_plugin)
    message = str(raised.value)
    assert f"node 'ht0' (com.example::HardTanh): {said}" in message and "\n" not in message.strip()


def test_a_node_of_another_model_fails_session_creation(tmp_path: Path, two_nodes: tuple[Path, Path]) -> None:
    """The plugin of two.onnx loaded for a model with a third HardTanh: that node is named."""
    three = hard_tanh_model(
        tmp_path / "three.onnx", [("N", 3, 5), (7,), (7,)], [{}, {"min_val": -0.5, "max_val": 2.0}, {}]
    )
    with pytest.raises(
        Exception, match=re.escape("node 'ht2' (com.example::HardTanh): this deploy plugin was not built")
    ):
        session(three, two_nodes[1])


def test_a_default_attribute_may_be_left_out(tmp_path: Path) -> None:
    """Built with min_val=-1 (ONNX's default), a node without min_val is the same node."""
    built = build("--op", "hard_tanh", "--shape", "5", "-o", str(tmp_path / "op"))
    assert built.returncode == 0, built.stderr
    model = hard_tanh_model(tmp_path / "m.onnx", [(5,)], [{}])
    (got,) = session(model, tmp_path / "op" / "libhard_tanh.so").run(None, {"x0": SPECIALS[:5]})  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got, np.clip(np.maximum(SPECIALS[:5], 0), -1.0, 1.0))


def test_the_plugin_registered_twice_is_one_error(two_nodes: tuple[Path, Path]) -> None:
    model, library = two_nodes
    with pytest.raises(Exception, match="Domain already set in registry"):
        session(model, library, library)


def bad_models(folder: Path) -> None:
    """plain.onnx (no custom node), undeclared.onnx (a HardTanh with an attribute it lacks) and
    newline.onnx (its output named with a line break)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "plain.onnx")
    hard_tanh_model(folder / "undeclared.onnx", [(4,)], [{"slope": 2.0}])
    newline = onnx.load(hard_tanh_model(folder / "newline.onnx", [(4,)], [{}]))
    newline.graph.node[1].output[0] = newline.graph.output[0].name = "h0\n"
    onnx.save(newline, folder / "newline.onnx")


NO_HEADERS = "no-headers"
"""A directory name that holds no headers: $DEPLOY_ORT_HEADERS for the missing-headers case."""


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--model", "plain.onnx"], 2, "no node is in a non-standard domain that a registered op implements"),
        (
            ["--model", "undeclared.onnx"], 2,
            "node 'ht0' (com.example::HardTanh): ONNX attribute slope=2.0 is not supported",
        ),
        (["--op", "hard_tanh", "--shape", "4", "--headers"], 1, "onnxruntime_c_api.h is missing: looked in"),
        (["--op", "add", "--shape", "4", "--shape", "4"], 2, "declares no ONNX node in a non-standard"),
        (["--op", "hard_tanh", "--shape", "4", "--bundle"], 2, "--bundle do not apply"),
        (["--model", "missing.onnx"], 2, "missing.onnx: cannot read it: No such file or directory"),
        (["--model", "newline.onnx"], 2, "node 'ht0' (com.example::HardTanh): tensor name 'h0\\n'"),
        (["--model", str(REPO / "examples" / "maxpool_add.yaml")], 2, "onnxruntime runs ONNX models"),
    ],
    ids=[
        "no-node-served", "undeclared-attribute", "no-headers", "standard-op", "bundle-option", "no-model",
        "graph-file", "line-break",
    ],
)  # fmt: skip
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], code: int, said: str) -> None:
    """Each one line on stderr with its exit code, and no plugin directory written."""
    bad_models(tmp_path)
    env = {**ENV, HEADERS_VARIABLE: str(tmp_path / NO_HEADERS)} if "--headers" in args else ENV
    given = [
        str(tmp_path / a) if a.endswith(".onnx") and "/" not in a else a for a in args if a != "--headers"
    ]
    result = run_deploy(
        *EXAMPLES, "build", "--target", "x86", "--engine", "onnxruntime", *given, "-o", str(tmp_path / "out"),
        env=env,
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def doc_steps() -> list[tuple[str, str, list[str]]]:
    """docs/engines.md's steps in order: (kind "sh" or "python", command or program, the output its
    comment lines promise)."""
    page = (REPO / "docs" / "engines.md").read_text()
    page = page[
        page.index("## Step by step (onnxruntime)") : page.index("## What the onnxruntime library is")
    ]
    steps: list[tuple[str, str, list[str]]] = []
    for kind, body in re.findall(r"^ *```(sh|python)\n(.*?)^ *```", page, re.M | re.S):
        text = textwrap.dedent(body)
        if kind == "python":
            said = re.findall(r"# (.*)$", text, re.M)
            steps.append((kind, text, said))
            continue
        for line in text.splitlines():
            if line.startswith("deploy "):
                steps.append((kind, line, []))
            elif line.startswith("# ") and steps:
                steps[-1][2].append(line[2:].strip())
    return steps


def test_the_engines_page_runs_as_written(tmp_path: Path) -> None:
    """Each x86 step of docs/engines.md, in order, in a directory holding the repository's examples:
    every command succeeds and prints what its comments say (the arm test is above)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    steps = [step for step in doc_steps() if "--target arm" not in step[1]]
    assert [kind for kind, _, _ in steps] == ["sh", "sh", "python", "sh"]
    for kind, text, said in steps:
        if kind == "sh":
            args = shlex.split(text)[1:]
            done = subprocess.run(
                [str(Path(sys.executable).with_name("deploy")), *args], cwd=tmp_path, capture_output=True,
                text=True, env={**os.environ, **ENV}, timeout=600,
            )  # fmt: skip
        else:
            done = subprocess.run(
                [sys.executable, "-c", text], cwd=tmp_path, capture_output=True, text=True, timeout=600
            )
        assert done.returncode == 0, done.stderr
        printed = [line.strip() for line in done.stdout.splitlines()]
        if kind == "python":  # the program's comment is its one line of output
            said = [said[-1]]
        assert all(line in printed for line in said), (said, printed)


HOSTILE = 'y"*/ #include <x> \\ ??/ \u00e9'
"""A tensor and node name that would end a C string or comment, splice a line (a trigraph) or
bring a byte that is not ASCII into the generated C if it reached it other than as an escaped
literal."""


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_names_from_the_model_stay_literals(tmp_path: Path, dtype: str) -> None:
    """The model's names and attribute values enter the plugin's C escaped: the library builds,
    and serves the node named so, in each float dtype, bit for bit."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    custom = helper.make_node("HardTanh", ["x"], [HOSTILE], name=HOSTILE, domain=CUSTOM, max_val=0.25)
    graph = helper.make_graph(
        [custom], "hostile",
        [helper.make_tensor_value_info("x", elem, (3, 5))],
        [helper.make_tensor_value_info(HOSTILE, elem, (3, 5))],
    )  # fmt: skip
    model = saved(graph, tmp_path / "hostile.onnx")
    built = build("--model", str(model), "-o", str(tmp_path / "plugin"))
    assert built.returncode == 0, built.stderr
    x = np.resize(SPECIALS, (3, 5)).astype(dtype)
    (got,) = session(model, tmp_path / "plugin" / "libhostile.so").run(None, {"x": x})  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got, np.clip(x, np.array(-1.0, dtype), np.array(0.25, dtype)))
    assert got.dtype == np.dtype(dtype)
