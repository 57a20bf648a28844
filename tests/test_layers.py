"""The layering docs/how-it-works.md promises, read from the source: packages import only
the layers below them (function-level imports included), no modules import each other in a
cycle, and of the model reader and the rooms above it only the CLI prints or plots."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "deploy.base": 0,
    "deploy.devices": 1,
    "deploy.ops": 1,
    "deploy.ops.library": 1,  # the shipped ops, written against the op framework as a user's are
    "deploy.ops.examples": 1,
    "deploy.schedules": 2,
    "deploy.schedules.cpu": 2,
    "deploy.schedules.gpu": 2,
    "deploy.model": 2,
    "deploy.compiler.runtime": 2,  # the bundles' C and its constants: under the compiler that builds from it
    "deploy.compiler": 3,
    "deploy.verify": 4,
    "deploy.bench": 5,
    "deploy.tune": 5,
    "deploy.engines": 5,  # an engine's plugin: built by the compiler, checked as verify checks
    "deploy.cli": 6,
    "deploy": 7,
}
"""A package may import its own modules, its subpackages of the same number (a package split into
folders: `deploy.schedules.cpu`), and those of packages with a lower number."""
PRINTING = ("rich", "matplotlib", "click")
QUIET = ("deploy.model", "deploy.compiler", "deploy.verify", "deploy.bench", "deploy.tune", "deploy.engines")
"""The model reader and the rooms above it but the CLI: they report through return values and errors."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str | None:
    """The package of LAYERS that `module` belongs to (the longest match)."""
    found = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return max(found, key=len) if found else None


def sources() -> list[Path]:
    return sorted((ROOT / "deploy").rglob("*.py"))


def test_every_package_has_a_layer() -> None:
    """A new package must be placed in LAYERS, not fall into its parent's row unnoticed."""
    packages = {module_name(p.parent / "__init__.py") for p in sources() if p.name == "__init__.py"}
    assert packages == set(LAYERS), (
        f"place in LAYERS: {sorted(packages - set(LAYERS))}; not packages: {sorted(set(LAYERS) - packages)}"
    )


def imports(path: Path, type_checking: bool) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth; with `type_checking`
    False, those under `if TYPE_CHECKING:` are left out (they never run)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            # `from deploy.tune import records` imports the module deploy.tune.records
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def local_module(name: str) -> str | None:
    """`name` if it is one of our modules on disk, else None."""
    path = ROOT / Path(*name.split("."))
    return name if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() else None


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_only_down(path: Path) -> None:
    mine = layer(module_name(path))
    assert mine is not None
    for name, line in imports(path, type_checking=True):
        theirs = layer(name) if local_module(name) or layer(name) else None
        if theirs is None or theirs == mine or mine.startswith(theirs + "."):  # itself, or its parent
            continue
        if theirs.startswith(mine + ".") and LAYERS[theirs] == LAYERS[mine]:  # its part (schedules.cpu)
            continue
        assert LAYERS[theirs] < LAYERS[mine], f"{path.name}:{line} ({mine}) imports {name} ({theirs})"


def test_no_import_cycles() -> None:
    graph = {
        module_name(path): {m for name, _ in imports(path, type_checking=False) if (m := local_module(name))}
        for path in sources()
    }
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if dep == module or module.startswith(dep + "."):  # a package's own __init__
                continue
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*trail, module, dep])}"
            if dep not in state:
                visit(dep, [*trail, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize(
    "path", [p for p in sources() if layer(module_name(p)) in QUIET], ids=lambda p: str(p.relative_to(ROOT))
)  # fmt: skip
def test_only_the_cli_prints(path: Path) -> None:
    for name, line in imports(path, type_checking=True):
        assert name.split(".")[0] not in PRINTING, f"{path.name}:{line} imports {name}"
    calls = [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (
            getattr(node.func, "id", "") == "print"
            or getattr(getattr(node.func, "value", None), "attr", "") in ("stdout", "stderr")
        )
    ]
    assert not calls, f"{path.name} prints at lines {calls}"


def test_the_cli_starts_without_tvm() -> None:
    """`deploy --help`, `--version` and the device commands stay quick: the CLI imports TVM only
    inside the commands that compile or run."""
    import subprocess
    import sys

    code = "import sys, deploy.cli.main; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tvm'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
