"""Native code for devices without Python: the TVM runtime libraries of an architecture, and
programs compiled against them with the architecture's g++ (the RPC server), or without them
(the OpenCL probe; the objects bundles link, `cached_object`).

The libraries come from TVM's PyPI wheels for the platform (fetched by this host's pip, cached;
on a host of the same architecture, from the installed wheels); the tvm-ffi headers from the
installed `tvm_ffi` package. A device then needs glibc and libstdc++, nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.base.errors import DeployError
from deploy.base.files import SUMS, fresh_directory, read_sums, remove_entry, sha256_file, write_sums
from deploy.base.locks import guarding, locked
from deploy.base.paths import cache_root, check_cache_writable
from deploy.devices.elf import elf_machine
from deploy.devices.platforms import Platform

SOURCES = Path(__file__).resolve().parent / "native"
"""The C and C++ of the programs a device runs for deploy itself (the RPC server, the OpenCL
probe); a bundle's C is the compiler's (`deploy/compiler/runtime/`)."""
SERVER_SOURCE = SOURCES / "rpc_server.cc"
SERVER = "deploy-rpc-server"
CL_PROBE = "deploy-cl-probe"
"""The program that says what a board's OpenCL device is (cl_probe.c: its name and extensions)."""
CL_INCLUDE = Path("/usr/include/CL")
CL_HEADERS = ("cl.h", "cl_platform.h", "cl_version.h")
"""Khronos' OpenCL headers (Debian's opencl-c-headers) that OpenCL host code is compiled with."""
WHEELS = {"tvm": "apache-tvm==0.27.0.post1", "tvm_ffi": "apache-tvm-ffi==0.1.14.post1"}
WHEEL_SHA256 = {
    "apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl":
        "4acfdb7653e4e1ba7a707bdf2833db72eb8fda7d04d99141f2a4e1da43171fb7",
    "apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl":
        "f503fc903b6e16fda5daacac6698ecb8bc38937f57da7aa29f6c7ab169d08657",
    "apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
        "c7a759781d4fbf2b99fa12f2741f250b882b06acc2747bb02831d491d1ac7d3c",
    "apache_tvm_ffi-0.1.14.post1-cp312-cp312-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
        "3fd2255a2e363a40c51ec1eeedb1110a2c74e443f95ae351ee5a81b5ff6808cf",
    "apache_tvm_ffi-0.1.14.post1-cp313-cp313-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
        "d6aebe30f21dcbd9e76c5aab56afe0fe228804a4ad73e413b067ae3d27e02f93",
    "apache_tvm_ffi-0.1.14.post1-cp314-cp314-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
        "8d4a0f356bbc89a648841b8a913a98478a65dc006c05017ca80f539c35974d96",
    "apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
        "4b01a5a3fa07ed3315d5ef1e05d3542dae57a119ef7e77c54bc062414e242f65",
    "apache_tvm_ffi-0.1.14.post1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
        "eb759c039866b541ec2cb07d498082f8ba6ded74d58d9196180a5932f365c077",
    "apache_tvm_ffi-0.1.14.post1-cp313-cp313-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
        "e59657d99d52f83c32ce60db4fdca95f5ca5b73425e33653862d06f7b1feffdc",
    "apache_tvm_ffi-0.1.14.post1-cp314-cp314-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
        "a22cb9637e49c67837c9705be59d3c9b9a525c12f601f894532a16260612a95a",
}  # fmt: skip
"""The sha256 of every wheel file of WHEELS deploy takes runtime libraries from (as PyPI serves
them; CPython 3.11-3.14): libraries that run on a device are checked, not trusted, whether the
wheel comes from the index or sits in the cache."""
LIBRARIES = {"tvm": "libtvm_runtime.so", "tvm_ffi": "libtvm_ffi.so"}
"""The runtime library each wheel contributes (from its `<package>/lib/`)."""
CXXFLAGS = ("-std=c++17", "-O2", "-Wall", "-fPIC")
PINNED_RPATH = ("-Wl,--disable-new-dtags,-rpath,$ORIGIN/lib",)
"""Link flags that load the runtime libraries from `lib/` beside the binary, the ones SHA256SUMS
pins: an RPATH, which the loader searches before LD_LIBRARY_PATH (a RUNPATH, the default, comes
after it: another TVM on a board's LD_LIBRARY_PATH would be loaded instead)."""


def _package_dir(package: str) -> Path:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DeployError(f"Python package {package} is not installed (run ci/setup.sh)")
    return Path(next(iter(spec.submodule_search_locations)))


def ffi_include() -> Path:
    """The tvm-ffi C++ headers (dlpack is under them, as `dlpack/dlpack.h`)."""
    return _package_dir("tvm_ffi") / "include"


def _whole(directory: Path, names: tuple[str, ...]) -> bool:
    """Whether `directory` holds the files `names` as its SHA256SUMS (written last when it was
    staged) pins them: a directory cut short or modified in the cache is staged again."""
    pinned = read_sums(directory)
    try:
        return all(pinned.get(name) == sha256_file(directory / name) for name in names)
    except OSError:
        return False


@contextmanager
def _staged(final: Path, names: tuple[str, ...]) -> Iterator[Path]:
    """A fresh directory beside `final` to write the files `names` into; when the block succeeds,
    it is pinned (SHA256SUMS) and becomes `final` in one rename, under `final`'s lock: a
    concurrent writer's whole `final` wins (ours is dropped); a damaged one (`_whole`) is
    replaced."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = fresh_directory(final.parent, f".{final.name}.")
    except OSError:
        check_cache_writable(final.parent)
        raise
    try:
        yield staging
        write_sums(staging, names)
        with guarding(final):
            if not _whole(final, names):
                remove_entry(final)
                os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def runtime_libraries(target: Platform) -> Path:
    """A directory with libtvm_runtime.so and libtvm_ffi.so for `target` (cached)."""
    versions = "-".join(spec.split("==")[1] for spec in WHEELS.values())
    directory = cache_root() / "runtime-libs" / f"{target.arch}-{versions}"
    names = tuple(sorted(LIBRARIES.values()))
    if _whole(directory, names):
        return directory
    with _staged(directory, names) as staging:
        if target.native_here():
            for package, name in LIBRARIES.items():
                shutil.copy2(_package_dir(package) / "lib" / name, staging / name)
        else:
            _extract_from_wheels(target, staging)
        for name in LIBRARIES.values():
            machine = elf_machine(staging / name)
            if machine != target.arch:
                raise DeployError(f"{name} from the {target.arch} wheels is built for {machine}")
    return directory


def _extract_from_wheels(target: Platform, staging: Path) -> None:
    for package, path in _pinned_wheels(target).items():
        name = LIBRARIES[package]
        with (
            zipfile.ZipFile(path) as wheel,
            wheel.open(f"{package}/lib/{name}") as src,
            (staging / name).open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
        (staging / name).chmod(0o755)


def _wheel_name(package: str, target: Platform) -> str:
    """The pinned wheel file of `package` for `target` and this Python."""
    dist, version = WHEELS[package].replace("-", "_").split("==")
    python = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    for name in WHEEL_SHA256:
        _, _, python_tag, _, platforms = name.removesuffix(".whl").split("-")
        if (
            name.startswith(f"{dist}-{version}-")
            and python_tag in (python, "py3")
            and all(tag.endswith(f"_{target.arch}") for tag in platforms.split("."))
        ):
            return name
    raise DeployError(
        f"no {target.arch} wheel of {WHEELS[package]} for {python} is pinned"
        " (deploy/devices/native.py WHEEL_SHA256)"
    )


FETCH_MB = 95
"""About what apache-tvm's wheel for a platform weighs (tvm-ffi's is a few MB)."""


def _pinned_wheels(target: Platform) -> dict[str, Path]:
    """The wheel of each package of WHEELS for `target`, fetched by pip unless cached (said on
    stderr with the size, and where to copy the files instead on a machine without internet),
    each checked against its pinned sha256 before anything is taken from it. pip fetches into a
    temporary directory, one fetch at a time, and a wheel enters the cache only once checked: a
    fetch killed midway leaves nothing there."""
    wheels = cache_root() / "wheels" / target.arch
    wheels.mkdir(parents=True, exist_ok=True)
    paths = {package: wheels / _wheel_name(package, target) for package in WHEELS}
    with locked(wheels.with_name(f"{target.arch}.lock")):
        missing = {package: path for package, path in paths.items() if not path.is_file()}
        if missing:
            names = ", ".join(path.name for path in missing.values())
            size = f"about {FETCH_MB} MB" if "tvm" in missing else "a few MB"
            sys.stderr.write(
                f"deploy: fetching the {target.arch} TVM runtime wheels once with pip ({names},"
                f" {size}); without internet, copy those files into {wheels}\n"
            )
            with tempfile.TemporaryDirectory(dir=wheels.parent, prefix=".fetch-") as fetched:
                _pip_download(target, [WHEELS[package] for package in missing], Path(fetched))
                for path in missing.values():
                    _check_wheel(Path(fetched) / path.name)
                    os.replace(Path(fetched) / path.name, path)
    for path in paths.values():
        _check_wheel(path, "delete it to fetch it again")
    return paths


def _pip_download(target: Platform, specs: list[str], into: Path) -> None:
    platforms = [arg for tag in target.wheel_tags for arg in ("--platform", tag)]
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *platforms,
        "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}", "--implementation", "cp",
        "-d", str(into), *specs,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        raise DeployError(f"pip could not fetch the {target.arch} TVM wheels: {tail}")


def _check_wheel(path: Path, remedy: str = "the index serves other bytes than were pinned") -> None:
    """`path` holds exactly the pinned bytes of its wheel (a one-line DeployError otherwise)."""
    if not path.is_file():
        raise DeployError(f"pip fetched no {path.name} into {path.parent}")
    actual = sha256_file(path)
    if actual != WHEEL_SHA256[path.name]:
        raise DeployError(
            f"wheel {path} has sha256 {actual[:16]}…, pinned {WHEEL_SHA256[path.name][:16]}…: refusing it"
            f" ({remedy})"
        )


def require_compiler(target: Platform) -> None:
    """A one-line error naming the Debian package when `target`'s g++ is missing."""
    if shutil.which(target.gxx) is None:
        raise DeployError(
            f"C++ compiler {target.gxx} for {target.arch} not found: install the Debian package"
            f" {target.gxx_package}"
        )


def compile_native(
    target: Platform, sources: list[Path], output: Path, libraries: Path | None, extra: tuple[str, ...] = ()
) -> None:
    """Compile C++ `sources` for `target` into `output`, linked against the runtime libraries in
    `libraries` (always loaded: they register the module loaders and `rpc.ServerLoop`); None links
    no TVM (a program that dlopens what needs it, such as a bundle's runner)."""
    require_compiler(target)
    runtime = (
        [f"-L{libraries}", "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed"]
        if libraries is not None
        else []
    )
    cmd = [
        target.gxx, *CXXFLAGS, f"-I{ffi_include()}", *map(str, sources), "-o", str(output), *extra,
        *runtime, "-ldl",
    ]  # fmt: skip
    _compile(cmd, target.gxx, sources[0])


def _compile(cmd: list[str], compiler: str, source: Path) -> None:
    """Run a compiler command; a one-line DeployError naming its first errors when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if ": error:" in line] or proc.stderr.splitlines()
        raise DeployError(f"{compiler} failed on {source.name}: {' | '.join(errors[:3])}")


@functools.cache
def _fingerprint(target: Platform, libraries: Path, sources: tuple[Path, ...]) -> str:
    """What the compiled output depends on: sources, flags, compiler and libraries (worked out
    once per process: every emulator start asks for the runtime)."""
    digest = hashlib.sha256(" ".join((target.arch, target.gxx, *CXXFLAGS, *PINNED_RPATH)).encode())
    version = subprocess.run([target.gxx, "--version"], capture_output=True, text=True).stdout
    digest.update(version.encode())
    for path in [*sources, *(libraries / name for name in sorted(LIBRARIES.values()))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def native_runtime(target: Platform) -> Path:
    """The device runtime for `target`: a directory with `deploy-rpc-server` and `lib/` (the TVM
    runtime libraries it finds through its rpath), about 5 MB, built once per content hash."""
    libraries = runtime_libraries(target)
    require_compiler(target)
    directory = cache_root() / "native" / f"{target.arch}-{_fingerprint(target, libraries, (SERVER_SOURCE,))}"
    if _whole(directory, RUNTIME_FILES):
        return directory
    with _staged(directory, RUNTIME_FILES) as staging:
        shutil.copytree(libraries, staging / "lib", ignore=shutil.ignore_patterns(SUMS))
        compile_native(target, [SERVER_SOURCE], staging / SERVER, libraries, PINNED_RPATH)
    return directory


RUNTIME_FILES = (SERVER, *(f"lib/{name}" for name in sorted(LIBRARIES.values())))
"""The files of a native runtime directory, relative to it: the server, then its libraries."""


@functools.cache
def _compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout


def cached_object(compiler: str, source: Path, flags: tuple[str, ...]) -> Path:
    """`source` (including only the headers beside it and system ones) compiled with `compiler -c`
    and `flags` into an object, built once per content hash of the sources, the compiler and the
    flags: what every bundle of an architecture links the same (the runtime, the runner)."""
    digest = hashlib.sha256(" ".join((compiler, *flags)).encode())
    digest.update(_compiler_version(compiler).encode())
    for path in [source, *sorted(source.parent.glob("*.h"))]:
        digest.update(path.read_bytes())
    directory = cache_root() / "objects" / f"{source.name}-{digest.hexdigest()[:16]}"
    name = (source.stem + ".o",)
    if not _whole(directory, name):
        with _staged(directory, name) as staging:
            output = staging / name[0]
            cmd = [
                compiler,
                *flags,
                f"-I{source.parent}",
                f"-I{ffi_include()}",
                "-c",
                str(source),
                "-o",
                str(output),
            ]
            _compile(cmd, compiler, source)
    return directory / name[0]


def cl_include(into: Path) -> Path:
    """`into` with a copy of the OpenCL headers in `into/CL` (a cross compiler does not search
    /usr/include), for `-I`; a one-line DeployError naming the package when they are missing."""
    missing = [h for h in CL_HEADERS if not (CL_INCLUDE / h).is_file()]
    if missing:
        raise DeployError(f"{CL_INCLUDE / missing[0]} not found: install the Debian package opencl-c-headers")
    (into / "CL").mkdir(parents=True, exist_ok=True)
    for name in CL_HEADERS:
        shutil.copy2(CL_INCLUDE / name, into / "CL" / name)
    return into


def require_tool(platform: Platform, tool: str, package: str) -> str:
    """`platform`'s `tool` (gcc, objcopy ...), or a one-line DeployError naming its package."""
    program = platform.tool(tool)
    if shutil.which(program) is None:
        raise DeployError(f"{program} for {platform.arch} not found: install the Debian package {package}")
    return program


def cl_probe(target: Platform) -> Path:
    """A directory with `deploy-cl-probe` for `target` and its SHA256SUMS (cl_probe.c, linked
    with glibc dynamically: it dlopens the OpenCL library), built once per content hash."""
    gcc = require_tool(target, "gcc", target.gcc_package)
    source = SOURCES / "cl_probe.c"
    flags = ("-std=gnu99", "-O2", "-Wall", "-s")
    digest = hashlib.sha256(" ".join((gcc, *flags, _compiler_version(gcc))).encode())
    digest.update(source.read_bytes())
    directory = cache_root() / "cl-probe" / f"{target.arch}-{digest.hexdigest()[:16]}"
    if not _whole(directory, (CL_PROBE,)):
        with _staged(directory, (CL_PROBE,)) as staging, tempfile.TemporaryDirectory() as headers:
            include = cl_include(Path(headers))
            cmd = [gcc, *flags, f"-I{include}", str(source), "-o", str(staging / CL_PROBE), "-ldl"]
            _compile(cmd, gcc, source)
    return directory
