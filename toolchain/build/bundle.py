"""Op bundles callable from C (`deploy build --bundle`): beside module.so, everything a device
without Python needs to call the op from C — a header `OP.h`, the shim `libOP.so` that implements
it over the TVM FFI, the target's TVM runtime libraries in `lib/`, dlpack's header, the native
runner `deploy-run` and `SHA256SUMS`.

The C++ sources are generic (`devices/native/bundle.cc`, `run.cc`); what is per bundle goes into
generated headers compiled with them: the op's signature and module.so's sha256 (both), and the
sha256 of each file the runner loads (the runner only, built last).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from base.errors import UsageError
from base.files import SUMS, read_sums, sha256_file, write_sums
from devices.native import LIBRARIES, PINNED_RPATH, SOURCES, compile_native, ffi_include, runtime_libraries
from devices.platforms import get_platform
from ops.registry import IDENTIFIER
from ops.spec import BoundOp, TensorType, require_static
from toolchain.build.manifest import MANIFEST, PARTIAL
from toolchain.build.targets import Target, all_targets

RUNNER = "deploy-run"
LIB_DIR = "lib"
RUNTIME_PATHS = tuple(f"{LIB_DIR}/{name}" for name in sorted(LIBRARIES.values()))
"""The TVM runtime libraries in a bundle, relative to it."""
DLPACK_HEADER = "include/dlpack/dlpack.h"
OUTPUT_PARAM = "out"
DLPACK_CODES = {"float": "kDLFloat", "int": "kDLInt", "uint": "kDLUInt"}
C_KEYWORDS = frozenset(
    {
        "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
        "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
        "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
        "volatile", "while", "bool", "true", "false",
    }
)  # fmt: skip
"""C99 keywords (and C23's bool/true/false): not usable as parameter names."""


def check_bundle(bound: BoundOp, target: Target) -> None:
    """A one-line error, before anything is compiled, for what cannot become a bundle: a target
    whose artifact is not a shared object (OpenCL kernels have no TVM module to call), names that
    cannot be C identifiers."""
    if not target.artifact.bundles:
        able = ", ".join(t.name for t in all_targets() if t.artifact.bundles)
        raise UsageError(
            f"--bundle needs a target whose module C can call ({able}): {target.name}"
            f" writes {target.artifact.name} kernels"
        )
    require_static(bound.inputs, "--bundle", "a bundle's C signature checks exact shapes")
    _identifier(bound.op.name, "op name")
    param_names(bound)


def _identifier(name: str, what: str) -> str:
    if not IDENTIFIER.fullmatch(name) or name in C_KEYWORDS:
        raise UsageError(f"{what} {name!r} is not a C identifier: it cannot name the bundle's C function")
    return name


def param_names(bound: BoundOp) -> list[str]:
    """The C parameter names of `deploy_OP`: the op's input names, then `out`."""
    names = [_identifier(spec.name, f"input of {bound.op.name}") for spec in bound.op.inputs]
    if OUTPUT_PARAM in names:
        raise UsageError(
            f"op {bound.op.name} has an input named {OUTPUT_PARAM!r}, the output parameter's name"
        )
    return [*names, OUTPUT_PARAM]


def _parameters(params: list[str]) -> str:
    """The C parameter list: inputs are read-only, the output is written."""
    return ", ".join(
        f"DLTensor* {name}" if name == OUTPUT_PARAM else f"const DLTensor* {name}" for name in params
    )


def _dlpack_dtype(dtype: str) -> str:
    """The DLPack dtype initializer of a dtype name: float32 -> {kDLFloat, 32, 1}."""
    match = re.fullmatch(r"(float|int|uint)(\d+)", dtype)
    if match is None:
        raise UsageError(f"dtype {dtype} has no DLPack equivalent that a bundle can check")
    return f"{{{DLPACK_CODES[match.group(1)]}, {match.group(2)}, 1}}"


def header(bound: BoundOp, target: Target, module_sha256: str) -> str:
    """`OP.h`: the C declarations (C99, as dlpack.h is) and the exact tensors they were built for."""
    op = bound.op.name
    params = param_names(bound)
    types = [*bound.inputs, bound.output]
    width = max(map(len, params))
    rows = "\n".join(
        f" *   {name:<{width}}  {t.dtype:<8} {list(t.shape)}{'  (written)' if name == OUTPUT_PARAM else ''}"
        for name, t in zip(params, types, strict=True)
    )
    attrs = " ".join(f"{k}={v}" for k, v in bound.key()["attrs"].items()) or "none"
    guard = f"DEPLOY_{op.upper()}_H_"
    return f"""/* {op}.h: the op {op} for target {target.name} ({target.arch}), from a deploy bundle.
 *
 * Built for exactly these tensors (on the CPU, C order, data 64-byte aligned):
{rows}
 * Attributes: {attrs}
 * module.so sha256: {module_sha256}
 *
 * deploy_{op} returns 0, or -1 with the reason in deploy_{op}_last_error() (the last failed call
 * on this thread). deploy_{op}_run takes the same tensors as an array: inputs, then the output.
 * Build: cc -std=c99 -I DIR -I DIR/include app.c -L DIR -l{op} -Wl,-rpath,DIR
 */
#ifndef {guard}
#define {guard}

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {{
#endif

int deploy_{op}({_parameters(params)});
int deploy_{op}_run(DLTensor* const* args, int num_args);
const char* deploy_{op}_last_error(void);

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""


def signature_header(bound: BoundOp, module_sha256: str) -> str:
    """`bundle_signature.h`: what bundle.cc and run.cc are compiled for."""
    op = bound.op.name
    params = param_names(bound)
    types: list[TensorType] = [*bound.inputs, bound.output]
    specs = "\n".join(
        f'    {{"{name}", {_dlpack_dtype(t.dtype)}, {{{", ".join(map(str, t.shape))}}}}},'
        for name, t in zip(params, types, strict=True)
    )
    return f"""// Generated by deploy: the signature of {op} that this bundle is built for.
#pragma once
#define DEPLOY_HEADER "{op}.h"
#define DEPLOY_FUNCTION deploy_{op}
#define DEPLOY_RUN deploy_{op}_run
#define DEPLOY_LAST_ERROR deploy_{op}_last_error
#define DEPLOY_PARAMS {_parameters(params)}
#define DEPLOY_ARGS {", ".join(params)}

namespace deploy {{
inline constexpr char kOp[] = "{op}";
inline constexpr char kLibrary[] = "lib{op}.so";
inline constexpr char kModuleSha256[] = "{module_sha256}";
inline constexpr const char* kRuntimeLibraries[] = {{{", ".join(f'"{path}"' for path in RUNTIME_PATHS)}}};
inline const TensorSpec kTensors[] = {{  // the inputs, then the output
{specs}
}};
inline constexpr int kNumTensors = {len(params)};
}}  // namespace deploy
"""


def pins_header(staging: Path, paths: list[str]) -> str:
    """`bundle_pins.h`: the sha256 of each file deploy-run loads, relative to the bundle."""
    pins = "\n".join(f'    {{"{path}", "{sha256_file(staging / path)}"}},' for path in paths)
    return f"""// Generated by deploy: the files deploy-run loads, as SHA256SUMS must list them.
#pragma once
namespace deploy {{
inline constexpr PinnedFile kPins[] = {{
{pins}
}};
}}  // namespace deploy
"""


def write_bundle(bound: BoundOp, target: Target, staging: Path, module: Path) -> dict[str, str]:
    """Write the bundle's files into `staging` (beside `module`), last SHA256SUMS; returns the
    manifest's `bundle` entry."""
    check_bundle(bound, target)
    platform = get_platform(target.arch)
    op = bound.op.name
    module_sha256 = sha256_file(module)
    libraries = runtime_libraries(platform)
    (staging / LIB_DIR).mkdir()
    for name in LIBRARIES.values():
        shutil.copy2(libraries / name, staging / LIB_DIR / name)
    (staging / DLPACK_HEADER).parent.mkdir(parents=True)
    shutil.copy2(ffi_include() / "dlpack" / "dlpack.h", staging / DLPACK_HEADER)
    (staging / f"{op}.h").write_text(header(bound, target, module_sha256))
    library = f"lib{op}.so"
    with tempfile.TemporaryDirectory(prefix="deploy-bundle-") as generated:
        (Path(generated) / "bundle_signature.h").write_text(signature_header(bound, module_sha256))
        compile_native(
            platform,
            [SOURCES / "bundle.cc"],
            staging / library,
            libraries,
            ("-shared", f"-I{staging}", f"-I{generated}", *PINNED_RPATH),
        )
        loaded = [library, module.name, *RUNTIME_PATHS]
        (Path(generated) / "bundle_pins.h").write_text(pins_header(staging, loaded))
        compile_native(platform, [SOURCES / "run.cc"], staging / RUNNER, None, (f"-I{generated}",))
    files = sorted(
        path.relative_to(staging).as_posix()
        for path in staging.rglob("*")
        if path.is_file() and path.name not in (SUMS, MANIFEST, PARTIAL)
    )
    sums = write_sums(staging, files)
    return {"header": f"{op}.h", "library": library, "runner": RUNNER, "sha256sums": sha256_file(sums)}


def bundle_files(directory: Path) -> set[str]:
    """The files of the bundle in `directory`: SHA256SUMS and those it lists (as `write_bundle`
    writes it: "SHA256  NAME" per line); SHA256SUMS alone when it is missing or a symlink."""
    return {SUMS, *read_sums(directory)}
