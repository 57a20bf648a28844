"""User ops from `--ops-path` and the `deploy.ops` entry-point group, end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
from tvm import te

from deploy.base.errors import UsageError
from deploy.cli.main import hoist_group_options
from deploy.compiler.options import BuildOptions
from deploy.ops import TensorType, load_ops_path
from deploy.ops.attrs import Attr, Choice, Float, Int
from tests.conftest import DEPLOY, REPO, invoke, run_deploy

CUBE = textwrap.dedent(
    '''
    """cube: x * x * x (a user op)."""
    from tvm import te
    from deploy.ops import Case, Input, Op, register

    @register
    class Cube(Op):
        """x cubed, elementwise."""
        name = "{name}"
        inputs = (Input("x"),)
        dtypes = ("float32", "int32")
        cases = (Case(((5, 7),)), Case(((33,),)))

        def infer(self, attrs, inputs):
            return inputs[0]

        def compute(self, attrs, out, x):
            return te.compute(out.shape, lambda *i: x[i] * x[i] * x[i]{bug}, name="out")

        def reference(self, attrs, x):
            return x * x * x
    '''
)


def write_op(folder, name, bug=""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(CUBE.format(name=name, bug=bug))
    return folder


def test_dropped_in_op_is_listed_and_verified(tmp_path):
    folder = write_op(tmp_path / "myops", "cube")
    listed = run_deploy("--ops-path", str(folder), "ops", "--json")
    assert listed.returncode == 0, listed.stderr
    cube = next(op for op in json.loads(listed.stdout) if op["name"] == "cube")
    assert cube["dtypes"] == ["float32", "int32"] and cube["summary"] == "x cubed, elementwise."
    tested = run_deploy("--ops-path", str(folder), "test", "--target", "x86", "--op", "cube")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "4 cases passed, 0 failed" in tested.stdout


def test_wrong_op_fails_verification(tmp_path):
    folder = write_op(tmp_path / "buggy", "cube_bug", bug=" + x[i]")
    tested = run_deploy("--ops-path", str(folder), "test", "--target", "x86", "--op", "cube_bug")
    assert tested.returncode == 1
    assert "0 cases passed, 4 failed" in tested.stdout


def test_broken_op_file_is_one_line(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "oops.py").write_text("import no_such_module\n")
    proc = run_deploy("--ops-path", str(folder), "ops")
    assert proc.returncode == 2
    assert "oops.py failed to import: ModuleNotFoundError" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("from ops import Case, Input, Op, register", "the op framework is deploy.ops now (from deploy.ops"),
        ("import ops.spec", "the op framework is deploy.ops now"),
        ("from base.errors import UsageError", "deploy's shared helpers are deploy.base now"),
        ("from toolchain.build.targets import get_target", "toolchain.build is deploy.compiler"),
        ("import schedules.cpu", "the schedules are deploy.schedules now"),
    ],
)
def test_an_op_file_importing_the_old_packages_is_told_the_new_ones(tmp_path, line, message):
    """Before deploy was one package its op framework was the top-level `ops`: an op file written
    then gets one line naming the import to write instead."""
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "old.py").write_text(f"import numpy\n\n{line}\n")
    with pytest.raises(UsageError) as caught:
        load_ops_path(folder)
    said = str(caught.value)
    assert said.startswith(f"op file {folder / 'old.py'}:3: {line!r}: ") and message in said


def test_a_package_of_the_users_own_named_ops_is_not_taken_for_the_old_one(tmp_path, monkeypatch):
    """Only a missing old name gets the new-import line: the user's own `ops` package without the
    module asked for fails as any import does."""
    (tmp_path / "site" / "ops").mkdir(parents=True)
    (tmp_path / "site" / "ops" / "__init__.py").write_text("")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mine.py").write_text("from ops.spec import Op\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "ops", raising=False)
    try:
        with pytest.raises(UsageError, match=r"failed to import: ModuleNotFoundError: .* 'ops\.spec'"):
            load_ops_path(tmp_path / "mine")
    finally:
        sys.modules.pop("ops", None)


def test_example_op_from_the_readme():
    examples = str(REPO / "deploy" / "ops" / "examples")
    tested = run_deploy("--ops-path", examples, "test", "--target", "x86", "--op", "hard_tanh")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def install_entry_point(site, package, entry, source):
    """A package in `site` whose `deploy.ops` entry point `entry` names its module, `source`."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source)
    dist = site / f"{package}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[deploy.ops]\n{entry} = {package}\n")
    return site


def test_entry_point_group_loads_installed_ops(tmp_path):
    site = install_entry_point(tmp_path / "site", "cube_pkg", "cube", CUBE.format(name="cube_ep", bug=""))
    listed = run_deploy("ops", "--json", env={"PYTHONPATH": str(site)})
    assert listed.returncode == 0, listed.stderr
    assert "cube_ep" in {op["name"] for op in json.loads(listed.stdout)}


def test_entry_point_that_exits_is_one_line(tmp_path):
    """An entry point's module calling sys.exit() is an error, not a silent exit 0."""
    site = install_entry_point(tmp_path / "site", "quits_pkg", "quits", "import sys\nsys.exit(0)\n")
    proc = run_deploy("ops", env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "error: entry point quits (quits_pkg) called exit(0) while being imported"


def _cube_class(**changes):
    """The CUBE op's class (unregistered) with class attributes replaced or, as None, removed."""
    from tvm import te

    from deploy.ops import Case, Input, Op

    body = {
        "name": "cube",
        "inputs": (Input("x"),),
        "dtypes": ("float32",),
        "cases": (Case(((5, 7),)),),
        "infer": lambda self, attrs, inputs: inputs[0],
        "compute": lambda self, attrs, out, x: te.compute(out.shape, lambda *i: x[i] * x[i] * x[i]),
        "reference": lambda self, attrs, x: x * x * x,
    }
    body.update(changes)
    return type("Cube", (Op,), {k: v for k, v in body.items() if v is not None})


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"name": "../escape"}, "name '../escape': expected letters, digits and _"),
        ({"name": "my op"}, "name 'my op'"),
        ({"name": 42}, "name 42"),
        ({"name": None}, "name None"),
        ({"compute": None}, "test_user_ops.py) defines no compute()"),
        ({"reference": None}, "defines no reference()"),
        ({"inputs": None}, "inputs None: expected a tuple of Input"),
        ({"dtypes": "float32"}, "dtypes 'float32': expected a tuple of some of float32"),
        ({"dtypes": ("complex64",)}, "dtypes ('complex64',)"),
        ({"cases": ()}, "cases (): expected at least one Case"),
        ({"attrs": "alpha"}, "attrs 'alpha': expected a tuple of Attr"),
    ],
)
def test_an_op_definition_is_checked_when_registered(changes, message):
    """A user's op class is data: a name that would leave the artifact's directory or not be a C
    function's, a missing method, a dtype list that is a string are one line at registration,
    not a traceback (or a directory outside) at build time."""
    from deploy.base.errors import UsageError
    from deploy.ops.registry import check_definition

    with pytest.raises(UsageError, match=re.escape(message)):
        check_definition(_cube_class(**changes))


def test_twice_named_inputs_and_attributes_are_refused():
    from deploy.base.errors import UsageError
    from deploy.ops import Input
    from deploy.ops.attrs import Attr, Float
    from deploy.ops.registry import check_definition

    with pytest.raises(UsageError, match="inputs: 'x' is named twice"):
        check_definition(_cube_class(inputs=(Input("x"), Input("x"))))
    alpha = Attr("alpha", Float(), 1.0)
    with pytest.raises(UsageError, match="attrs: 'alpha' is named twice"):
        check_definition(_cube_class(attrs=(alpha, alpha)))
    with pytest.raises(UsageError, match="attrs: kind <class 'float'>: expected an attribute kind"):
        check_definition(_cube_class(attrs=(Attr("alpha", float, 1.0),)))  # type: ignore[arg-type]  # the bad kind under test


@pytest.mark.parametrize(
    "kind,default,message",
    [
        (Float(0.0, 1.0), 2.0, "attribute alpha=2.0: expected a finite float in [0.0, 1.0]"),
        (Int(1, 8), "two", "attribute alpha='two': expected an integer in [1, 8]"),
        (Choice(("max", "avg")), "min", "attribute alpha='min': expected one of max, avg"),
    ],
)
def test_attribute_defaults_are_checked_when_registered(kind, default, message):
    """A default outside its own kind was found only by a build that used it, as if the user's
    `-a` were wrong."""
    from deploy.base.errors import UsageError
    from deploy.ops.registry import check_definition

    with pytest.raises(UsageError, match=re.escape(f"test_user_ops.py): attrs: the default of {message}")):
        check_definition(_cube_class(attrs=(Attr("alpha", kind, default),)))


def test_ops_path_must_name_a_directory(tmp_path):
    """An empty --ops-path (an unset shell variable) would be the working directory: its *.py
    would run as op files."""
    (tmp_path / "setup_like.py").write_text("open('ran', 'w')\n")
    proc = subprocess.run([DEPLOY, "--ops-path", "", "targets"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --ops-path '' is not a directory"
    assert not (tmp_path / "ran").exists()


def test_an_op_file_raising_a_base_exception_is_one_line(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "odd.py").write_text("class Odd(BaseException):\n    pass\n\nraise Odd('odd')\n")
    proc = run_deploy("--ops-path", str(tmp_path / "ops"), "ops")
    assert proc.returncode == 2 and "odd.py failed to import: Odd: odd" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"compute": lambda self, attrs, out, x: None},
            "op cube: compute returned NoneType: expected a te.Tensor",
        ),
        ({"compute": lambda self, attrs, out, x: x}, "op cube: compute returned its input 'x'"),
        (
            {"compute": lambda self, attrs, out, x: te.compute((2, 2), lambda i, j: x[i, j])},
            "op cube: compute gives 2x2:float32, but infer said 5x7:float32",
        ),
        (
            {"compute": lambda self, attrs, out, x: te.compute(out.shape, lambda *i: x[i].astype("float64"))},
            "op cube: compute gives 5x7:float64, but infer said 5x7:float32",
        ),
        (
            {"infer": lambda self, attrs, inputs: None},
            "op cube: infer returned NoneType: expected a TensorType",
        ),
        (
            {"infer": lambda self, attrs, inputs: TensorType((5, 7), "complex64")},
            "op cube: infer gives dtype 'complex64': expected one of float32",
        ),
        (
            {"infer": lambda self, attrs, inputs: TensorType((0, 7), "float32")},
            "has shape [0, 7]: dims must be >= 1",
        ),
    ],
)
def test_a_compute_that_is_not_what_infer_said_is_refused_at_build(changes, message):
    """An artifact whose kernel writes another shape or dtype than its manifest says could never be
    called: the build refuses it in one line naming the op."""
    from deploy.base.errors import UsageError
    from deploy.compiler.compile import prim_module
    from deploy.compiler.targets import get_target
    from deploy.ops import bind

    with pytest.raises(UsageError, match=re.escape(message)):
        prim_module(
            bind(_cube_class(**changes)(), {}, [TensorType((5, 7), "float32")]),
            get_target("x86"),
            BuildOptions(),
        )


@pytest.mark.parametrize("code", ["0", "3", "'bye'"])
def test_an_op_calling_exit_is_one_line_and_a_failure(tmp_path, code):
    """`sys.exit(0)` in a reference ended `deploy test` with exit 0 and nothing checked; `sys.exit(3)`
    ended it with exit 3 and no line at all."""
    folder = tmp_path / "exits"
    folder.mkdir()
    (folder / "cube_exits.py").write_text(
        CUBE.format(name="cube_exits", bug="").replace("return x * x * x", f"import sys; sys.exit({code})")
    )
    tested = run_deploy("--ops-path", str(folder), "test", "--target", "x86", "--op", "cube_exits")
    assert tested.returncode == 1
    assert tested.stderr.strip() == (
        f"error: exit({code}) was called before the command finished (in an op's code?)"
    )
    debugged = run_deploy(
        "--debug", "--ops-path", str(folder), "test", "--target", "x86", "--op", "cube_exits"
    )
    assert debugged.returncode == 1 and 'cube_exits.py", line' in debugged.stderr, "--debug shows where"


@pytest.mark.parametrize("form", ["spaced", "joined"])
def test_ops_path_after_the_command(tmp_path, form):
    """Where users put it (issue #36): after the command, as `--ops-path DIR` or `--ops-path=DIR`."""
    folder = str(write_op(tmp_path / "myops", "cube"))
    given = ["--ops-path", folder] if form == "spaced" else [f"--ops-path={folder}"]
    tested = run_deploy("test", "--target", "x86", "--op", "cube", *given)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "4 cases passed, 0 failed" in tested.stdout


@pytest.mark.parametrize(
    ("args", "hoisted"),
    [
        (["test", "--op", "x", "--ops-path", "a"], ["--ops-path", "a", "test", "--op", "x"]),
        (["--ops-path", "a", "ops", "--ops-path=b"], ["--ops-path", "a", "--ops-path=b", "ops"]),
        (["run", "--", "--ops-path", "a"], ["run", "--", "--ops-path", "a"]),
        (["test", "--ops-path"], ["test", "--ops-path"]),
    ],
)
def test_group_options_are_moved_before_the_command(args, hoisted):
    assert hoist_group_options(args) == hoisted


def test_an_unknown_op_suggests_close_names_and_ops_path():
    result = invoke("build", "--target", "x86", "--op", "leaky_rel", "--shape", "4")
    assert result.exit_code == 2
    assert "unknown op 'leaky_rel': did you mean 'leaky_relu'?" in result.output
    assert "deploy --ops-path DIR" in result.output and len(result.output.strip().splitlines()) == 1


def test_an_error_in_an_ops_code_names_its_file_and_line(tmp_path):
    """Issue #36: Python's min on TVM expressions inside `compute` fails in TVM; the one-line
    error says where in the op's file, for build and for test alike."""
    folder = write_op(tmp_path / "myops", "cube", bug=" + min(x[i], 1)")
    line = next(
        n for n, text in enumerate((folder / "cube.py").read_text().splitlines(), 1) if "min(" in text
    )
    where = f"at {(folder / 'cube.py').resolve()}:{line}"
    out = str(tmp_path / "a")
    built = run_deploy(
        "--ops-path", str(folder), "build", "--target", "x86", "--op", "cube", "--shape", "4", "-o", out
    )
    assert built.returncode == 1 and where in built.stderr and "Traceback" not in built.stderr
    wide = {"COLUMNS": "400"}  # the failure line unwrapped
    tested = run_deploy("--ops-path", str(folder), "test", "--target", "x86", "--op", "cube", env=wide)
    assert tested.returncode == 1 and where in tested.stdout


MYOPS = REPO / "bench" / "myops"
"""User ops as a user writes them, no schedule of their own (bench/user_ops.py times them)."""


@pytest.mark.parametrize(
    ("op_name", "attrs", "shape", "loops"),
    [
        # rows of 28 fused into planes of 784: whole vectors, no predicated last one; a plane a task
        ("hard_swish", {}, (1, 116, 28, 28), ["T.parallel(116", "range(98)", "T.vectorized(8)"]),
        # the channel order changes: planes of 49 stay planes, 6 vectors and one element each
        ("channel_shuffle", {"groups": 2}, (1, 116, 7, 7), ["T.parallel(116", "range(6)", "range(48, 49)"]),
        # scale and bias are one value a plane: fused along it, not across channels
        ("scale_bias", {}, (1, 116, 28, 28), ["T.parallel(116", "range(98)", "T.vectorized(8)"]),
    ],
)
def test_the_generic_schedule_makes_whole_vectors(op_name, attrs, shape, loops) -> None:
    """Issue #36: an op without a schedule is fast by default at batch 1 in cache. The generic CPU
    schedule split rows of 28 into vectors of 8 and a predicated half vector, which LLVM does not
    vectorize; it now fuses rows until they make whole vectors, as far as the inputs are read
    along them (bench/user_ops.py measures it against numpy and a tuned schedule)."""
    from deploy.compiler.compile import hand_schedule
    from deploy.compiler.targets import get_target
    from deploy.ops import bind, get_op, load_ops_path

    load_ops_path(MYOPS)
    shapes = [shape, (shape[1],), (shape[1],)] if op_name == "scale_bias" else [shape]
    bound = bind(get_op(op_name), attrs, [TensorType(s, "float32") for s in shapes])
    script = hand_schedule(bound, get_target("x86"), BuildOptions())[0].script()
    found = [loop for loop in loops if loop in script]  # T.parallel(116, annotations=...) too
    assert found == loops and "T.where" not in script, script


def test_the_bench_user_ops_pass_on_x86() -> None:
    """Their odd shapes (7x13, 2x12x5x7) take the scalar rest after the vectors."""
    ran = run_deploy("--ops-path", str(MYOPS), "test", "--target", "x86", "--dtype", "float32")
    assert ran.returncode == 0 and " 0 failed" in ran.stdout, ran.stdout + ran.stderr
