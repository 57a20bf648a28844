"""The code half of a build's cache key: a hash of every source file that decides the module.

Those are deploy's own packages that shape a module (found on disk, whatever this process
imported), each op's file, and the user's modules an op file imports, directly or through each
other (a helper holding a constant or a compute function decides the module as much as the op
file itself). Imports are read from the files' `import` statements and found on `sys.path` as
Python would find them, without importing anything, so the key is the same in every process.
"""

from __future__ import annotations

import ast
import hashlib
import site
import sys
import sysconfig
from functools import cache
from importlib.machinery import PathFinder
from importlib.util import resolve_name
from pathlib import Path

import deploy
from deploy.compiler.runtime import ABI_HEADER

DEPLOY_PACKAGES = frozenset({"deploy"})
"""Deploy's own top-level package, never followed: the parts that shape a module are hashed whole
(`_package_sources`); `base` and `devices` do not shape one."""
UNSHAPING = ("base", "devices")
"""Sub-packages of deploy left out of the hash: editing them changes no module."""


@cache
def source_digest(path: str) -> str:
    """The sha256 of a source file, read once per process."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@cache
def _package_sources() -> tuple[str, ...]:
    """Every source file of the packages that shape a module (the op definitions, the schedules,
    the toolchain that lowers and links), found on disk: the key must not depend on what this
    process happened to import. With them the runtime's abi.h, which Python reads (its alignment
    lays out a graph's arena)."""
    roots = [Path(directory) for directory in deploy.__path__]
    sources = [
        str(path)
        for root in roots
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] not in UNSHAPING
    ]
    return tuple(sorted([*sources, str(ABI_HEADER)]))


@cache
def _installed() -> tuple[Path, ...]:
    """The standard library's and the installed packages' directories: modules there are not the
    user's to follow (whole prefixes would be too much: Debian's is /usr, a venv may be the
    project's own directory)."""
    paths = sysconfig.get_paths()
    places = [paths[kind] for kind in ("stdlib", "platstdlib", "purelib", "platlib")]
    places += [*site.getsitepackages(), site.getusersitepackages()]
    places += [entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]
    return tuple({Path(place).resolve() for place in places})


def _module_file(name: str) -> str | None:
    """The source file `import name` would load from `sys.path` as it is now (None: a built-in
    module, a compiled one, one inside a zip, or none), found without importing anything."""
    return _found(name, tuple(sys.path))


@cache
def _found(name: str, path: tuple[str, ...]) -> str | None:
    """`_module_file` of `name` with `sys.path` equal to `path` (the key of its cache)."""
    parts = name.split(".")
    search: list[str] | None = None
    origin = None
    for depth in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), search)
        if spec is None:
            return None
        search, origin = spec.submodule_search_locations, spec.origin
        if search is None and depth < len(parts) - 1:
            return None
    return origin if origin and origin.endswith(".py") and Path(origin).is_file() else None


@cache
def _imports(path: str, package: str) -> tuple[str, ...]:
    """The module names the `import` statements of the file at `path` name (those inside
    functions too); `package` resolves relative ones ("" where the file has none)."""
    try:
        tree = ast.parse(Path(path).read_bytes(), path)
    except (OSError, SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            try:
                base = resolve_name(relative, package) if node.level else node.module
            except (ImportError, ValueError):
                continue
            if base:  # `from X import a` may import the submodule X.a
                names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    parts = [name.split(".") for name in names]  # importing a.b runs a/__init__.py first
    return tuple(sorted({".".join(p[:n]) for p in parts for n in range(1, len(p) + 1)}))


def _users(name: str, path: str, own_package: str) -> bool:
    """Whether the module `name` at `path` (not deploy's) is the user's to follow: not in the
    Python installation unless it belongs to the op's own package (an entry point's helpers)."""
    top = name.partition(".")[0]
    return top == own_package or not any(Path(path).resolve().is_relative_to(p) for p in _installed())


def imported_sources(module: str) -> set[str]:
    """The op module `module`'s file and the files of the user's modules it imports, followed
    through their own imports."""
    loaded = sys.modules[module]
    own = loaded.__file__
    if not own:
        return set()
    own_package = module.partition(".")[0]
    found = {own}
    todo = list(_imports(own, loaded.__package__ or ""))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name.partition(".")[0] in DEPLOY_PACKAGES:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None or path in found or not _users(name, path, own_package):
            continue
        found.add(path)
        package = name if Path(path).name == "__init__.py" else name.rpartition(".")[0]
        todo += _imports(path, package)
    return found


def code_fingerprint(op_modules: set[str]) -> str:
    """Hash of the source that decides a module made of the ops defined in `op_modules` (module
    names): deploy's packages, each op's file and the user's modules it imports."""
    files = set(_package_sources())
    for module in op_modules:
        files |= imported_sources(module)
    return hashlib.sha256("".join(source_digest(f) for f in sorted(files)).encode()).hexdigest()
