"""The README and docs/ stay honest (issue #36): every relative link names a file of the
repository, every `deploy` command in a shell block parses (its command and options exist: the
`--help` level), and the op with a schedule of its own in docs/adding-ops.md passes its test."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from deploy.cli.main import hoist_group_options, main
from tests.conftest import REPO, run_deploy

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SHELL_BLOCK = re.compile(r"```(?:sh|bash|shell)\n(.*?)```", re.S)
ENDS = {"|", ">", ">>", "&&", "||", ";", "2>&1", "<"}


def links() -> list[tuple[str, str]]:
    return [
        (page.name, target)
        for page in PAGES
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "#", "mailto:"))
    ]


@pytest.mark.parametrize(("page", "target"), links())
def test_relative_links_name_files(page: str, target: str) -> None:
    base = REPO if page == "README.md" else REPO / "docs"
    assert (base / target.split("#")[0]).exists(), f"{page} links to {target}, which is not there"


def commands() -> list[tuple[str, str]]:
    """(page, command line) of each `deploy ...` line in the pages' shell blocks, continuation
    lines joined, comments dropped."""
    found = []
    for page in PAGES:
        for block in SHELL_BLOCK.findall(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words and words[0] == "deploy":
                    found.append((page.name, line.strip()))
    return found


def command_of(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command `words` (after `deploy`) run, and the words left for it."""
    words = hoist_group_options(words)
    while words and words[0].startswith("-"):  # deploy's own options
        words = words[2:] if words[0] == "--ops-path" else words[1:]
    command: click.Command = main
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


@pytest.mark.parametrize(("page", "line"), commands())
def test_deploy_commands_parse(page: str, line: str) -> None:
    words = shlex.split(line, comments=True)[1:]
    cut = next((i for i, w in enumerate(words) if w in ENDS), len(words))
    command, rest = command_of(words[:cut])
    assert not isinstance(command, click.Group), f"{page}: {line!r} names no command of deploy"
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    options = [w.split("=", 1)[0] for w in rest if w.startswith("-") and w != "-" and not w[1:2].isdigit()]
    unknown = [o for o in options if o not in known]
    assert not unknown, f"{page}: {line!r}: {command.name} has no option {unknown}"


def test_the_op_with_its_own_schedule_passes(tmp_path: Path) -> None:
    """The op and its schedule, each written to the file its block's first line names."""
    page = (REPO / "docs" / "adding-ops.md").read_text()
    section = page[page.index("## An op's own schedule") :]
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", section, re.S)
    assert [name for name, _ in blocks] == ["myops/hard_swish.py", "myops/hard_swish_cpu.py"]
    (tmp_path / "myops").mkdir()
    for name, source in blocks:
        (tmp_path / name).write_text(source)
    folder = str(tmp_path / "myops")
    tested = run_deploy("--ops-path", folder, "test", "--target", "x86", "--op", "hard_swish")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "cpu/hard_swish" in tested.stdout and " 0 failed" in tested.stdout


MAP = REPO / "docs" / "how-it-works.md"
SOURCE_PATH = re.compile(r"`(deploy/[\w/]+\.(?:py|c|cc|h))`")


def mapped(path: Path, text: str) -> bool:
    """`path` is named in the map: in full, or by its file name in a line that names a sibling in
    full (`deploy/ops/library/add.py`, `leaky_relu.py`, ...)."""
    relative = path.relative_to(REPO).as_posix()
    if f"`{relative}`" in text:
        return True
    folder = relative.rsplit("/", 1)[0] + "/"
    return any(f"`{path.name}`" in line and f"`{folder}" in line for line in text.splitlines())


def modules() -> list[Path]:
    """Every module and C source of the package; a package's `__init__.py` only where it holds
    more than re-exports and registration (it is then named in the map like any module)."""
    found = []
    for path in sorted((REPO / "deploy").rglob("*")):
        if path.suffix not in (".py", ".c", ".cc", ".h") or "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py" and f"`{path.relative_to(REPO).as_posix()}`" not in MAP.read_text():
            continue
        found.append(path)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_map_names_every_module(path: Path) -> None:
    """docs/how-it-works.md is a map of the whole pipeline: a line per module."""
    assert mapped(path, MAP.read_text()), f"docs/how-it-works.md has no line for {path.relative_to(REPO)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_source_paths_in_the_docs_exist(page: Path) -> None:
    """A source file the docs name in full is there (a move updates the docs); `OP.py`, `KIND.py`:
    placeholders."""
    named = [p for p in SOURCE_PATH.findall(page.read_text()) if not Path(p).stem.isupper()]
    missing = [p for p in named if not (REPO / p).exists()]
    assert not missing, f"{page.name} names {', '.join(sorted(set(missing)))}, which are not there"
