"""C libraries of ops and graphs (`deploy build --bundle`): beside module.so, everything a device
without Python needs to call them from C, with deploy's own C runtime compiled in, as Halide's
generators do. Nothing of TVM's runtime, no libstdc++, no glibc version floor for the runner.

    NAME.h                   the API (C99) and the tensors it was built for, as constants
    libNAME.a, libNAME.so    the kernels, the runtime and the API in one object whose only
                             global symbols are NAME_* (two bundles link into one program)
    deploy-run               NAME on .npy files, linked statically
    include/dlpack/dlpack.h  the DLTensor definition the header uses
    SHA256SUMS               every file of the bundle

The object is TVM's kernels (`Module.write_to_file`: an op's `main`, or a graph's plan, see
`plan.py`), `deploy/compiler/runtime/runtime.c` (parallel launch, scratch, errors) and
`deploy/compiler/runtime/bundle.c` (the API: checks every tensor with `bundle_check.c`, runs the
plan on an arena), linked with `ld -r` and its symbols other than the API made local. A kernel
that needs a runtime function deploy's runtime does not define is refused by name before anything
is written.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deploy.base.ctext import (
    IDENTIFIER,
    c_identifier,
    c_string,
    c_word,
    declared_names,
    linked_names,
    why_reserved,
)
from deploy.base.errors import NO_ROOM, DeployError, UsageError, clipped, printable
from deploy.base.files import SUMS, read_sums, sha256_file, write_sums
from deploy.compiler.artifacts import bundle_writer
from deploy.compiler.constants import constants_object
from deploy.compiler.manifest import MANIFEST, PARTIAL
from deploy.compiler.options import BuildOptions
from deploy.compiler.plan import Plan
from deploy.compiler.runtime import ALIGNMENT, ERRORS, MAX_DIMS, SHARED, SOURCES
from deploy.compiler.targets import Target, all_targets
from deploy.devices.native import cached_object, ffi_include, require_tool
from deploy.devices.platforms import get_platform
from deploy.ops.graph import Constant
from deploy.ops.spec import OUTPUT, TensorType, is_symbolic, symbols_of

RUNNER = "deploy-run"
DLPACK_HEADER = "include/dlpack/dlpack.h"
DLPACK_CODES = {"float": "kDLFloat", "int": "kDLInt", "uint": "kDLUInt"}
API_SUFFIXES = (
    "", "_run", "_with_workspace", "_workspace_size", "_last_error", "_set_num_threads", "_num_threads",
    "_set_parallel_for", "_stop_threads",
)  # fmt: skip
"""The functions a bundle exports, as NAME + suffix: every other symbol of its object is local."""
NAMED_SUFFIXES = (*API_SUFFIXES, "_task", "_parallel_for", "_cl_open", "_cl_close", "_cl_enqueue")
"""What NAME.h names NAME + suffix (the CPU's and OpenCL's functions, and the hook's types)."""
MACRO_SUFFIXES = ("_H_", "_NUM_INPUTS", "_NUM_OUTPUTS", "_ALIGNMENT", *(f"_{code}" for code in ERRORS))
"""What NAME.h names NAME upper-cased + suffix (its include guard and constants)."""
API_SOURCES = (
    "abi.h", "bundle.c", "bundle.h", "bundle_check.h", "bundle_names.h", "cl_bundle.c", "runner_glue.c",
    "runtime.h",
)  # fmt: skip
"""The C that includes NAME.h and bundle_config.h (with dlpack.h): no C parameter name takes a name
they give."""
LINKED_SOURCES = ("runtime.c", "bundle_check.c")
"""The C linked into a bundle's object that does not include NAME.h, compiled once per compiler
(`cached_object`): no --name takes a name it gives other objects (`linked_names`). run.cc, the
runner's, names nothing a C object links to but main: its own are C++'s, in an anonymous
namespace."""
RUNTIME_SYMBOLS = re.compile(r"_*(TVM|tvm)")
"""Names of what a kernel may ask of a runtime: any left undefined or weak (NULL) is refused."""
CFLAGS = ("-std=c11", "-O2", "-Wall", "-fPIC", "-fvisibility=hidden")
RUNNER_FLAGS = ("-std=c++17", "-O2", "-Wall")


BundleSignature = tuple[str, list[tuple[str, TensorType]], list[tuple[str, TensorType]], Plan | None]
"""(default name, inputs (name, type) in call order, outputs likewise, arena plan or None)."""


class Bundled(Protocol):
    """What a bundle wraps (`Compiled`, `CompiledGraph`): a name, the tensors of its entry and,
    for a graph, the arena plan of its kernels."""

    @property
    def target(self) -> Target: ...

    @property
    def options(self) -> BuildOptions: ...

    @property
    def executable(self) -> Any: ...

    @property
    def constants(self) -> tuple[Constant, ...]:
        """A graph's constants, linked into the bundle's object (an op has none)."""
        ...

    def bundle_signature(self) -> BundleSignature:
        """(default name, inputs and outputs (name, type) in call order, arena plan or None)."""
        ...


@dataclass(frozen=True)
class Signature:
    """A bundle's C signature: its prefix, the C name and type of each input and each output, the
    symbolic dims in order (each a C name), and the arena of a graph's plan."""

    name: str
    params: tuple[tuple[str, str, TensorType], ...]
    """(C name, name in the op or model, type): the inputs, then the outputs."""
    num_outputs: int
    symbols: tuple[str, ...]
    plan: Plan | None

    @property
    def inputs(self) -> tuple[tuple[str, str, TensorType], ...]:
        return self.params[: len(self.params) - self.num_outputs]

    @property
    def outputs(self) -> tuple[tuple[str, str, TensorType], ...]:
        return self.params[len(self.params) - self.num_outputs :]


@functools.cache
def runtime_names(linked: tuple[str, ...] = LINKED_SOURCES) -> frozenset[str]:
    """The names the runtime's API_SOURCES and dlpack.h give (`declared_names`), the macros
    of the C library headers they include (`header_macros`), and what the `linked` sources give
    the other objects (`linked_names`)."""
    paths = [SOURCES / name for name in API_SOURCES] + [ffi_include() / "dlpack" / "dlpack.h"]
    texts = [path.read_text() for path in paths]
    macros = header_macros(tuple(sorted(set(re.findall(r"#include <([^>]+)>", "".join(texts))))))
    return declared_names(texts) | macros | linked_names((SOURCES / name).read_text() for name in linked)


@functools.cache
def header_macros(headers: tuple[str, ...]) -> frozenset[str]:
    """The macros gcc defines with `headers` included (those it has; in GNU C, as an engine may
    compile NAME.h: `linux` too): a C parameter named as one would not compile (`PRIu64`).
    None where there is no gcc (nothing can be built then)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return frozenset()
    text = "".join(f"#if __has_include(<{h}>)\n#include <{h}>\n#endif\n" for h in headers)
    proc = subprocess.run([gcc, "-dM", "-E", "-x", "c", "-"], input=text, capture_output=True, text=True)
    return frozenset(re.findall(r"^#define (\w+)", proc.stdout, re.M))


def name_problem(name: str) -> str | None:
    """Why `name` cannot prefix a bundle's C functions, as a message ends ("it is a C or C++
    keyword"); None when it can: a C identifier that is no keyword, no name of the C library or
    the runtime, and makes none (NAME_run, NAME_H_...)."""
    if not IDENTIFIER.fullmatch(name):
        return "expected letters, digits and _, not first a digit, at most 63"
    made = [name + suffix for suffix in NAMED_SUFFIXES] + [name.upper() + suffix for suffix in MACRO_SUFFIXES]
    for c_name in made:
        why = why_reserved(c_name, runtime_names())
        if why is not None:
            return f"it is {why}" if c_name == name else f"it makes {c_name}, which is {why}"
    return None


def check_name(name: str) -> str:
    """`name` (--name) as a bundle's C prefix, or a one-line UsageError saying why it cannot be."""
    problem = name_problem(name)
    if problem is not None:
        raise UsageError(f"--name {printable(repr(clipped(name)))} cannot prefix a bundle: {problem}")
    return name


def made_prefix(default: str) -> str:
    """The prefix of a bundle that names none (no --name): the op's or model's name `default`
    where it can be one, else an identifier made from it (my-model -> my_model, exp -> t_exp)."""
    made = c_identifier(default, set(), runtime_names())
    for candidate in (default, made, f"t_{made}"):  # t_: clear of what `made` would make (NAME_task)
        if name_problem(candidate) is None:
            return candidate
    raise AssertionError(f"no prefix made from {default!r}")


def prefix_note(default: str, prefix: str) -> str | None:
    """The note `deploy build --bundle` prints when the prefix is not the op's or model's own
    name `default` (None when it is): which it is, and why."""
    if prefix == default:
        return None
    why = name_problem(default)
    return (
        f"note: the bundle's C prefix is {prefix}: {printable(repr(clipped(default)))} cannot be one"
        f" ({why}); --name chooses another"
    )


def check_bundle(target: Target, name: str | None, host: str | None = None) -> None:
    """A one-line error, before anything is compiled, for what cannot become a bundle: a target
    whose artifact C cannot call, a name that cannot prefix C functions, a host architecture for
    a bundle whose host code is the target's own (a CPU's)."""
    if host is not None:
        if target.artifact.bundle_host is None:
            raise UsageError(
                f"--host-arch applies to OpenCL bundles: {target.name} bundles run on {target.arch}"
            )
        get_platform(host)
    if not target.artifact.bundles:
        able = ", ".join(t.name for t in all_targets() if t.artifact.bundles)
        raise UsageError(
            f"--bundle needs a target whose module C can call ({able}): {target.name}"
            f" writes {target.artifact.name} kernels"
        )
    if name is not None:
        check_name(name)


HEADER_PARAMS = frozenset({"workspace", "workspace_bytes", "context", "queue"})
"""The parameters NAME.h's functions name beside the tensors (NAME_with_workspace's, OpenCL's
NAME_cl_enqueue's): no tensor is named as one."""


def _c_name(name: str, taken: set[str], prefix: str) -> str:
    """`name` as a C parameter name deploy makes (`c_identifier`), clear of the names the C that
    declares it gives, of NAME.h's other parameters and of its own macros (PREFIX_..., upper
    case: `t_` goes before)."""
    word = c_word(name)
    if word == word.upper() and word.startswith(f"{prefix.upper()}_"):
        name = f"t_{name}"
    return c_identifier(name, taken, runtime_names(()) | HEADER_PARAMS)


def signature(compiled: Bundled, name: str | None) -> Signature:
    """The C signature of `compiled` under `name` (default: `made_prefix` of the op's or graph's
    own): an op's output is `out`, a graph's outputs are named as the model names them (as C
    names)."""
    default, inputs, outputs, plan = compiled.bundle_signature()
    prefix = check_name(name) if name is not None else made_prefix(default)
    single = len(outputs) == 1
    taken = {OUTPUT} if single else set()
    params = [(_c_name(n, taken, prefix), n, t) for n, t in inputs]
    params += [(OUTPUT, n, t) if single else (_c_name(n, taken, prefix), n, t) for n, t in outputs]
    if any(len(t.shape) > MAX_DIMS for _, _, t in params):
        raise UsageError(f"a bundle's tensors have at most {MAX_DIMS} dims")
    apart = set(taken)  # a symbolic dim's C name is apart from the tensors' and the other dims'
    symbols = tuple(_c_name(s, apart, prefix) for s in symbols_of([t for _, t in inputs]))
    return Signature(prefix, tuple(params), len(outputs), symbols, plan)


def dlpack_dtype(dtype: str) -> str:
    """The DLPack dtype initializer of a dtype name: float32 -> {kDLFloat, 32, 1}."""
    match = re.fullmatch(r"(float|int|uint)(\d+)", dtype)
    if match is None:
        raise UsageError(f"dtype {dtype} has no DLPack equivalent that a bundle can check")
    return f"{{{DLPACK_CODES[match.group(1)]}, {match.group(2)}, 1}}"


def c_params(sig: Signature) -> str:
    """The C parameter list of NAME(): the inputs read-only, then the outputs it writes."""
    return ", ".join(
        [*(f"const DLTensor* {c}" for c, _, _ in sig.inputs), *(f"DLTensor* {c}" for c, _, _ in sig.outputs)]
    )


def _dims(t: TensorType, names: tuple[str, ...]) -> list[str]:
    """The shape as C initializers: a symbolic dim as -(its index + 1)."""
    return [str(-(names.index(str(d.name)) + 1)) if is_symbolic(d) else str(d) for d in t.shape]


def _symbol_names(sig: Signature) -> tuple[str, ...]:
    """The symbolic dims as the model names them, in the order of `sig.symbols`."""
    return symbols_of([t for _, _, t in sig.inputs])


def shape_text(t: TensorType) -> str:
    return "[" + ", ".join(str(d.name) if is_symbolic(d) else str(d) for d in t.shape) + "]"


def row_note(c_name: str, name: str, written: bool) -> str:
    """What a header row says after a tensor's type: that the call writes it, and its model
    name where the C name differs (as a C string literal: the row is in a comment)."""
    if written:
        return "  (written)" if c_name in (name, OUTPUT) else f"  (written: model output {c_string(name)})"
    return "" if c_name == name else f"  (model input {c_string(name)})"


def tensor_rows(sig: Signature) -> str:
    """The header comment's rows: each tensor in call order with its dtype, shape and note."""
    width = max(len(c) for c, _, _ in sig.params)
    written = {c for c, _, _ in sig.outputs}
    return "\n".join(
        f" *   {c:<{width}}  {t.dtype:<8} {shape_text(t)}{row_note(c, n, c in written)}"
        for c, n, t in sig.params
    )


def header(sig: Signature, target: Target, alignment: int, what: str) -> str:
    """`NAME.h`: the API (C99, as dlpack.h is) and the tensors it was built for (their data
    `alignment`-byte aligned)."""
    name, upper = sig.name, sig.name.upper()
    rows = tensor_rows(sig)
    names = _symbol_names(sig)
    batch = (
        f" * {', '.join(names)}: read from the tensors at each call (the same in all, 1 to 2^31-1).\n"
        if names
        else ""
    )
    params = c_params(sig)
    symbol_params = ", ".join(f"int64_t {s}" for s in sig.symbols) or "void"
    constants = "\n".join(
        f"#define {upper}_{c.upper()}_NDIM {len(t.shape)}\n"
        f"#define {upper}_{c.upper()}_SHAPE {{{', '.join(_dims(t, names)) or '0'}}}"
        f"  /* {shape_text(t)} */\n"
        f"#define {upper}_{c.upper()}_DTYPE {dlpack_dtype(t.dtype)}"
        for c, _, t in sig.params
    )
    guard = f"{upper}_H_"
    at_sizes = " at these sizes" if sig.symbols else ""
    return f"""/* {name}.h: {what} for target {target.name} ({target.arch}), from a deploy bundle.
 *
 * Tensors, in call order (on the CPU, C order, data {alignment}-byte aligned):
{rows}
{batch} *
 * Link the static library (what an engine links) or the shared one (what it dlopen()s):
 *   cc -std=c99 -I DIR -I DIR/include app.c DIR/lib{name}.a -lm -lpthread
 *   cc -std=c99 -I DIR -I DIR/include app.c -L DIR -l{name} -Wl,-rpath,DIR
 * Every function returns 0, or a {upper}_ERR_* code with a one-line reason in {name}_last_error().
 * Calls from several threads at once are safe; their parallel loops then run on the calling
 * threads (the bundle's pool serves one call at a time).
 */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define {upper}_NUM_INPUTS {len(sig.inputs)}
#define {upper}_NUM_OUTPUTS {len(sig.outputs)}
#define {upper}_ALIGNMENT {alignment}  /* bytes every tensor's data (+ byte_offset) is aligned to */
{error_defines(upper, CPU_ERRORS)}

/* Each tensor's rank, shape (-1, -2, ...: the symbolic dims in the order above) and dtype. */
{constants}

/* Run {name} on the tensors (inputs, then the outputs it writes). A graph's tensors between its
 * kernels live in an arena taken from a per-thread cache (allocated once per thread and size). */
int {name}({params});
/* The same on the caller's workspace (an engine's memory): at least {name}_workspace_size()
 * bytes, {ALIGNMENT}-byte aligned; NULL and 0 for a bundle whose size is 0. */
int {name}_with_workspace({params}, void* workspace, size_t workspace_bytes);
/* The workspace {name}_with_workspace needs{at_sizes} (0 for an invalid size). */
size_t {name}_workspace_size({symbol_params});
/* {name} on an array of the inputs and the outputs, in call order. */
int {name}_run(DLTensor* const* args, int num_args);
/* This thread's last call's error: "" when it succeeded. */
const char* {name}_last_error(void);

/* The setters below may be called at any time from any thread, while calls run too: a parallel
 * loop reads the settings when it starts and runs on what it read. */

/* Threads the parallel loops run on: n >= 1, or 0 for one per online CPU (the default). Returns
 * the previous setting. */
int {name}_set_num_threads(int n);
int {name}_num_threads(void);

/* An engine that owns its threads runs the parallel loops on them: its parallel-for calls
 * task(i, context) for every i in [0, count) on any of its threads and returns when all are done
 * (0, or nonzero if a task failed). NULL goes back to the bundle's own pool. Returns the
 * previous one (NULL: the pool), which the loops that started on it still call: keep it
 * callable until the calls running when it was replaced have returned. */
typedef int (*{name}_task)(int index, void* context);
typedef int (*{name}_parallel_for)(void* user, {name}_task task, void* context, int count);
{name}_parallel_for {name}_set_parallel_for({name}_parallel_for fn, void* user);

/* Stop the bundle's pool threads, once the parallel loop in progress (if any) has ended: none
 * is left running or spinning (before a fork, or when the engine is idle). The next parallel
 * loop starts them again. Returns how many were stopped; -1 when called from inside a parallel
 * task (an engine's hook running one of ours). */
int {name}_stop_threads(void);

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""


CPU_ERRORS = {
    "ERR_ARGUMENT": "a bad tensor or argument: nothing was computed",
    "ERR_KERNEL": "a kernel failed",
    "ERR_MEMORY": "no memory for the arena",
}
"""The error codes a CPU bundle returns (values: abi.h) and what each means in its NAME.h."""


def error_defines(upper: str, meanings: dict[str, str]) -> str:
    """NAME.h's `#define UPPER_ERR_... (value)  /* meaning */` lines, one per code of `meanings`,
    each value as abi.h gives it."""
    return "\n".join(f"#define {upper}_{f'{c} ({ERRORS[c]})':<18} /* {why} */" for c, why in meanings.items())


def config_header(sig: Signature, alignment: int) -> str:
    """`bundle_config.h`: what bundle.c and run.cc are compiled for."""
    names = _symbol_names(sig)
    tensors = "\n".join(
        f"    {{{c_string(c)}, "
        f"{dlpack_dtype(t.dtype)}, {len(t.shape)}, {{{', '.join(_dims(t, names)) or '0'}}}}},"
        for c, _, t in sig.params
    )
    slots = sig.plan.slots if sig.plan is not None else ()
    slot_rows = (
        "\n".join(
            f"    {{{size.factor}u, {len(size.symbols)}, "
            f"{{{', '.join(str(names.index(s)) for s in size.symbols) or '0'}}}}},"
            for size in slots
        )
        or "    {0u, 0, {0}},"
    )
    params = c_params(sig)
    symbol_names = ", ".join(map(c_string, names)) or '""'
    return f"""/* Generated by deploy: the signature of {sig.name} that this bundle is built for. */
#define DEPLOY_PREFIX {sig.name}
#define DEPLOY_HEADER "{sig.name}.h"
#define DEPLOY_NUM_INPUTS {len(sig.inputs)}
#define DEPLOY_NUM_OUTPUTS {len(sig.outputs)}
#define DEPLOY_NUM_SYMBOLS {len(names)}
#define DEPLOY_HAS_ARENA {int(sig.plan is not None)}
#define DEPLOY_TENSOR_ALIGNMENT {alignment}
#define DEPLOY_NUM_SLOTS {len(slots)}
#define DEPLOY_PARAMS {params}
#define DEPLOY_ARGS {", ".join(c for c, _, _ in sig.params)}
#define DEPLOY_SYMBOL_PARAMS {", ".join(f"int64_t {s}" for s in sig.symbols) or "void"}
#define DEPLOY_SYMBOL_ARGS {", ".join(sig.symbols) or "0"}

static const char* const deploy_symbol_names[] = {{{symbol_names}}};
static const DeployTensorSpec deploy_tensors[] = {{  /* the inputs, then the outputs */
{tensors}
}};
static const DeploySlot deploy_slots[] = {{  /* the arena, as the plan lays it out */
{slot_rows}
}};
"""


def run_tool(command: list[str], what: str) -> str:
    """Run a compiler or binutils command; a one-line DeployError naming its first error."""
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "no output").splitlines()
        marks = ("error", "undefined reference", *NO_ROOM)  # ld's "final link failed: No space left..."
        said = [line for line in lines if any(mark in line for mark in marks)] or lines
        raise DeployError(f"{what} failed: {printable(' | '.join(said[:2]))}")
    return proc.stdout


@functools.cache
def lto_plugin(gcc: str) -> tuple[str, ...]:
    """`--plugin PATH` naming `gcc`'s own LTO plugin, for nm and ar: without it binutils loads
    every plugin in bfd-plugins, where LLVM's gold plugins take 40 ms a call (90 ms of each
    bundle's 450 here); none where gcc has no plugin file."""
    path = subprocess.run([gcc, "-print-file-name=liblto_plugin.so"], capture_output=True, text=True).stdout
    return ("--plugin", path.strip()) if Path(path.strip()).is_file() else ()


def check_symbols(listing: str, name: str) -> None:
    """Refuse an object (its `nm` listing) that needs a runtime function deploy's runtime does not
    define: left undefined, or a weak pointer (`V`) that would be NULL when called."""
    for line in listing.splitlines():
        fields = line.split()
        kind, symbol = fields[-2], fields[-1]
        if (kind == "U" and RUNTIME_SYMBOLS.match(symbol)) or kind in ("V", "v"):
            raise DeployError(
                f"bundle {name}: its kernels need {symbol}, which deploy's C runtime"
                " (deploy/compiler/runtime/runtime.c) does not define"
            )


def write_bundle(
    compiled: Bundled, staging: Path, name: str | None, host: str | None = None
) -> dict[str, str]:
    """Write the bundle's files into `staging` (the artifact being written), last SHA256SUMS;
    returns the manifest's `bundle` entry. Its intermediate files go in a directory inside
    `staging`, removed with it if the build fails or is killed. The artifact's kind writes the
    library (`write_cpu_bundle` here, `cl_bundle.py` for OpenCL: its host code for `host`)."""
    target = compiled.target
    check_bundle(target, name, host)
    entry = target.artifact.write_bundle(compiled, staging, name, host)
    files = sorted(
        path.relative_to(staging).as_posix()
        for path in staging.rglob("*")
        if path.is_file() and path.name not in (SUMS, MANIFEST, PARTIAL)
    )
    return {**entry, "sha256sums": sha256_file(write_sums(staging, files))}


@bundle_writer("shared-object")
def write_cpu_bundle(compiled: Bundled, staging: Path, name: str | None, host: str | None) -> dict[str, str]:
    """A CPU bundle's files (all but SHA256SUMS) into `staging`; the manifest's `bundle` entry."""
    target = compiled.target
    sig = signature(compiled, name)
    platform = get_platform(target.arch)
    gcc = require_tool(platform, "gcc", platform.gcc_package)
    gxx = require_tool(platform, "g++", platform.gxx_package)
    binutils = {t: require_tool(platform, t, platform.binutils_package) for t in ("nm", "objcopy", "ar")}
    prefix = sig.name
    work = staging / ".bundle-build"
    work.mkdir()
    (staging / DLPACK_HEADER).parent.mkdir(parents=True)
    shutil.copy2(ffi_include() / "dlpack" / "dlpack.h", staging / DLPACK_HEADER)
    what = f"the {'graph' if sig.plan is not None else 'op'} {c_string(compiled.bundle_signature()[0])}"
    alignment = compiled.options.alignment
    (staging / f"{prefix}.h").write_text(header(sig, target, alignment, what))
    (work / "bundle_config.h").write_text(config_header(sig, alignment))
    includes = [f"-I{work}", f"-I{staging}", f"-I{staging / 'include'}", f"-I{SOURCES}"]
    kernels = work / "kernels.o"
    compiled.executable.mod.write_to_file(str(kernels))
    api, glue = work / "bundle.o", work / "glue.o"
    for source, obj in (("bundle.c", api), ("runner_glue.c", glue)):
        run_tool([gcc, *CFLAGS, *includes, "-c", str(SOURCES / source), "-o", str(obj)], f"{gcc} on {source}")
    linked = [kernels, *(cached_object(gcc, SOURCES / source, CFLAGS) for source in LINKED_SOURCES), api]
    if compiled.constants:
        linked.append(constants_object(compiled.constants, gcc, work))
    combined = work / "combined.o"
    run_tool(
        [gcc, "-r", "-nostdlib", *map(str, linked), "-o", str(combined)],
        f"{gcc} -r (linking {prefix}.o)",
    )
    plugin = lto_plugin(gcc)
    check_symbols(run_tool([binutils["nm"], *plugin, str(combined)], "nm"), prefix)
    api = work / "api.txt"
    api.write_text("".join(f"{name}\n" for name in (*(prefix + s for s in API_SUFFIXES), *SHARED)))
    single = work / f"{prefix}.o"
    run_tool([binutils["objcopy"], f"--keep-global-symbols={api}", str(combined), str(single)], "objcopy")
    entry = libraries_and_runner(
        (gcc, gxx, binutils["ar"]), single, glue, staging, prefix, ("-lm", "-lpthread"), ("-static",)
    )
    shutil.rmtree(work)
    return entry


def libraries_and_runner(
    tools: tuple[str, str, str],
    single: Path,
    glue: Path,
    staging: Path,
    prefix: str,
    libs: tuple[str, ...],
    runner_flags: tuple[str, ...],
) -> dict[str, str]:
    """From the bundle's one object `single` (its API alone global): libPREFIX.a, libPREFIX.so
    and deploy-run (run.cc with `glue`, linked with `runner_flags`), each linked with `libs`, by
    `tools` (gcc, g++, ar) into `staging`; the manifest's `bundle` entry."""
    gcc, gxx, ar = tools
    static = staging / f"lib{prefix}.a"
    run_tool([ar, *lto_plugin(gcc), "rcs", str(static), str(single)], "ar")
    shared = staging / f"lib{prefix}.so"
    run_tool(
        [gcc, "-shared", "-static-libgcc", f"-Wl,-soname,lib{prefix}.so", str(single), "-o", str(shared),
         *libs],
        f"{gcc} -shared (lib{prefix}.so)",
    )  # fmt: skip
    runner = cached_object(gxx, SOURCES / "run.cc", RUNNER_FLAGS)
    run_tool(
        [gxx, *runner_flags, "-s", str(runner), str(glue), str(static), "-o", str(staging / RUNNER), *libs],
        f"{gxx} (deploy-run)",
    )
    return {
        "name": prefix,
        "header": f"{prefix}.h",
        "library": shared.name,
        "static_library": static.name,
        "runner": RUNNER,
    }


def bundle_files(directory: Path) -> set[str]:
    """The files of the bundle in `directory`: SHA256SUMS and those it lists (as `write_bundle`
    writes it: "SHA256  NAME" per line); SHA256SUMS alone when it is missing or a symlink."""
    return {SUMS, *read_sums(directory)}
