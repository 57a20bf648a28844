"""Write a compiled op into an artifact directory with its manifest, atomically (all or nothing)."""

from __future__ import annotations

import errno
import os
import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from deploy.base.errors import NO_ROOM, DeployError, UsageError, printable, reason
from deploy.base.files import SUMS, check_writable, fresh_directory, remove_entry, sha256_file
from deploy.compiler import cl_bundle  # noqa: F401  (registers the OpenCL kind's bundle writer)
from deploy.compiler.bundle import bundle_files, write_bundle
from deploy.compiler.compile import Compiled, CompiledGraph
from deploy.compiler.manifest import MANIFEST, PARTIAL, Manifest, artifact_lock
from deploy.compiler.targets import get_target


def deploy_version() -> str:
    try:
        return version("deploy-toolchain")
    except PackageNotFoundError:
        return "0+unknown"


def tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def export(
    compiled: Compiled | CompiledGraph,
    directory: Path,
    bundle: bool = False,
    cache_key: str | None = None,
    name: str | None = None,
    host: str | None = None,
) -> Manifest:
    """Write `directory` with the artifact and manifest.json, atomically (all or nothing); with
    `bundle`, also the C library of the op or graph, its functions prefixed `name` (default: the
    op's or graph's name, or one made from it: `made_prefix`), an OpenCL bundle's host code for
    `host` (default x86_64). Concurrent exports
    into one directory take turns (`artifact_lock`). With `cache_key`, `directory` is the build
    cache's entry for that key: the manifest records it, an export that finds the entry built
    whole (by a concurrent build) keeps it, and a damaged entry (`Manifest.cached`) is replaced,
    whatever it became: the cache's directory is deploy's own, where `-o` is checked (`_place`)."""
    directory = _place(Path(directory)) if cache_key is None else Path(directory)
    with artifact_lock(directory):
        _remove_abandoned(directory.parent)
        if cache_key is None:
            _check_replaceable(directory)
        else:
            kept = Manifest.cached(directory, cache_key, compiled.target.artifact)
            if kept is not None:
                return kept
            remove_entry(directory)
        staging = _set_aside(directory.parent, f".{directory.name}.")
        try:
            manifest = _write_artifact(compiled, staging, bundle, cache_key, name, host)
            _replace_dir(staging, directory)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            full = _no_room(exc, (staging, directory))
            if full is not None:
                raise DeployError(f"writing the artifact {directory}: {full}") from None
            raise
        (directory / PARTIAL).unlink()  # kept through the swap: a kill mid-way leaves it marked
    return manifest


def _write_artifact(
    compiled: Compiled | CompiledGraph,
    staging: Path,
    bundle: bool,
    cache_key: str | None,
    name: str | None,
    host: str | None = None,
) -> Manifest:
    """The artifact's files and, last, its manifest, into `staging`."""
    target, options = compiled.target, compiled.options
    module = target.artifact.write(compiled.executable, staging, target, compiled.constants)
    host = host or options.bundle_host
    bundled = write_bundle(compiled, staging, name, host) if bundle or options.bundle else None
    manifest = Manifest(
        **compiled.describe(),
        target=target.name,
        tvm_target=dict(target.tvm),
        arch=target.arch,
        cores=options.build_cores() if target.artifact.splits_for_cores else None,
        cpu_model=options.cpu_model,
        alignment=options.alignment,
        bundle=bundled,
        module=module.name,
        sha256=sha256_file(module),
        tvm_version=tvm_version(),
        deploy_version=deploy_version(),
        build_key=cache_key,
    )
    manifest.write(staging)
    return manifest


ELSEWHERE = "there, or in $TMPDIR or the cache"
"""Where a write that found no room may have been, when it does not say: the artifact's
directory, TVM's temporary files, or the cache of the runtime's objects (`devices/native.py`)."""


def _no_room(exc: BaseException, ours: tuple[Path, ...]) -> str | None:
    """What to say of `exc` if it is a write that found the disk (or the quota) full, else None:
    an OSError, named with its file unless that is in one of `ours`, or a compiler's or
    linker's failure that says so (`run_tool`, `export_module` keep that line; their own
    messages named only the driver's `ld returned 1`)."""
    if isinstance(exc, OSError):
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return None
        said, place = os.strerror(exc.errno), exc.filename2 or exc.filename  # a copy's: its target
        if place is None:
            return f"{said} ({ELSEWHERE})"
        path = Path(os.fsdecode(place))
        return (
            said if any(path.is_relative_to(p) for p in ours) else f"{said} (writing {printable(str(path))})"
        )
    known = next((text for text in NO_ROOM if text in str(exc)), None)
    return f"{known} ({ELSEWHERE})" if isinstance(exc, DeployError) and known else None


ABANDONED = re.compile(r"\.(?P<name>.+?)\.(?P<old>old\.)?[0-9a-f]{8}")
"""The names of the directories an export sets aside beside the artifact directory NAME:
`.NAME.XXXXXXXX` (the artifact being written) and `.NAME.old.XXXXXXXX` (the earlier one)."""


def _set_aside(parent: Path, prefix: str) -> Path:
    """A fresh directory in `parent` named `prefix` and 8 hex digits, marked as being written."""
    directory = fresh_directory(parent, prefix)
    (directory / PARTIAL).touch()
    return directory


def _remove_abandoned(parent: Path) -> None:
    """Remove what exports killed mid-way left in `parent`: the directories they set aside
    (`ABANDONED` names holding `PARTIAL`), an earlier artifact put back first where the kill
    fell between the two renames of the swap and left its place empty. Called under the
    parent's exclusive lock (`artifact_lock`), which every export into `parent` holds while
    it writes: none is being written."""
    try:
        entries = [(entry, found) for entry in parent.iterdir() if (found := ABANDONED.fullmatch(entry.name))]
    except OSError:  # a parent that can be written but not listed: nothing to tidy, the build goes on
        return
    for entry, found in entries:
        marker, previous, place = entry / PARTIAL, entry / "previous", parent / found["name"]
        try:  # tidying never fails a build: an entry it cannot look into is someone else's
            if entry.is_symlink() or marker.is_symlink() or not marker.is_file():
                continue
            moved_aside = found["old"] and previous.is_dir() and not previous.is_symlink()
            if moved_aside and not os.path.lexists(place):
                os.replace(previous, place)
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)


MAX_NAME = 255 - len("..old.") - 8
"""The longest artifact directory name: its staging and old names (`_replace_dir`) are 6 bytes
and 8 random characters longer, and a name has at most 255 bytes."""


def check_destination(given: Path) -> Path:
    """`given` resolved, if an artifact directory can be written there; refused as bad input
    otherwise: a file or symlink where the artifact directory or one above it must be, the
    current directory or one above it, a directory deploy cannot write in. Checked before a
    build starts, and again when it is exported."""
    try:
        if given.is_symlink() or (given.exists() and not given.is_dir()):
            raise UsageError(f"output {given} exists and is not a directory: not replacing it")
        directory = given.resolve()
    except OSError as exc:  # a name past NAME_MAX
        raise UsageError(f"output {given}: {exc.strerror or reason(exc)}") from None
    except RuntimeError as exc:  # a symlink loop
        raise UsageError(f"output {given}: {reason(exc)}") from None
    if len(os.fsencode(directory.name)) > MAX_NAME:
        raise UsageError(
            f"output {given}: its name is over {MAX_NAME} bytes (it is written beside itself first,"
            " under a longer name)"
        )
    if Path.cwd().resolve().is_relative_to(directory):
        raise UsageError(f"output directory {given} holds the current directory: give a directory below it")
    existing = next(parent for parent in directory.parents if parent.exists())
    if not existing.is_dir():
        raise UsageError(f"output {given}: {existing} is a file, not a directory")
    try:
        check_writable(directory.parent)
    except OSError as exc:
        raise UsageError(f"cannot write output directory {given}: {exc.strerror or exc}") from None
    return directory


def _place(given: Path) -> Path:
    """`given` resolved (`check_destination`), once the directory it goes in exists."""
    directory = check_destination(given)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {directory.parent}: {exc.strerror}") from None
    return directory


def _check_replaceable(directory: Path) -> None:
    """Refuse an output directory deploy may not replace: one holding anything but an earlier
    artifact's own files (the manifest, the files its artifact kind wrote, a bundle's files as
    SHA256SUMS lists them)."""
    if not directory.exists():
        return
    found = {p.relative_to(directory) for p in directory.rglob("*")}
    if not found:
        return
    owned = artifact_files(directory)
    if owned is None:
        raise UsageError(f"output directory {directory} is not an artifact: not replacing it")
    owned |= {parent for path in owned for parent in path.parents if parent != Path(".")}
    stray = sorted(str(p) for p in found - owned)
    if stray:
        raise UsageError(
            f"output directory {directory} holds {stray[0]}, which no deploy build wrote: not replacing it"
        )


def artifact_files(directory: Path) -> set[Path] | None:
    """The files (relative paths) of the artifact in `directory` as its manifest names them;
    None when its manifest does not parse or names an unknown target. A bundle's are those its
    SHA256SUMS lists, refused (UsageError) unless it is the one the manifest pins: a file a user
    listed there is no file of deploy's to delete."""
    try:
        manifest = Manifest.read(directory)
        artifact = get_target(str(manifest.target)).artifact
        manifest.module_path(directory)  # a plain file name inside, or it names nothing of ours
    except UsageError:
        return None
    names = {MANIFEST, PARTIAL, *artifact.files(manifest.module)}  # PARTIAL: a kill after the swap
    if manifest.bundle is not None and not isinstance(manifest.bundle, dict):
        return None
    if manifest.bundle:
        sums = directory / SUMS
        if not sums.is_file() or sums.is_symlink() or sha256_file(sums) != manifest.bundle.get("sha256sums"):
            raise UsageError(
                f"output directory {directory}: its {SUMS} is not the one its build wrote (the files it"
                " lists may be anyone's): not replacing it"
            )
        names |= bundle_files(directory)
    paths = {Path(name) for name in names}
    if any(path.is_absolute() or ".." in path.parts for path in paths):
        return None
    return paths


def _replace_dir(staging: Path, directory: Path) -> None:
    """Put `staging` where `directory` is; an earlier `directory` is removed only once the new
    one is in place (and put back if that fails)."""
    if not directory.exists():
        os.replace(staging, directory)
        return
    old = _set_aside(directory.parent, f".{directory.name}.old.")
    try:
        os.replace(directory, old / "previous")
        try:
            os.replace(staging, directory)
        except BaseException:
            os.replace(old / "previous", directory)
            raise
    finally:  # the mark goes last: a kill mid-way leaves what is left marked
        shutil.rmtree(old / "previous", ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
