"""OpenCL plans (`kernels.cl` + `launch.json`): the kernels' OpenCL C and the launch plan a runner
needs without TVM.

The launch configuration is not in TVM's compiled module, so the PrimFunc is lowered the way
`tvm.tirx.build` does (bind target, default pipeline, split host/device): each device kernel's
`thread_extent`s give its work-group size and count, its parameters name the buffers it takes,
and the host function's launches give the kernel order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import DeployError
from base.files import sha256_file
from toolchain.build.artifacts import ArtifactKind

if TYPE_CHECKING:
    from toolchain.build.targets import Target

DIMS = "xyz"
SOURCE_FILE = "kernels.cl"
PLAN_FILE = "launch.json"


@dataclass(frozen=True)
class OpenClProgram:
    """OpenCL C source and its launch plan (JSON-able)."""

    source: str
    plan: dict[str, Any]


def _thread_extents(stmt: Any, found: dict[str, int]) -> None:
    """Collect `thread_extent` attributes (tag -> extent) anywhere in a kernel body."""
    import tvm

    if isinstance(stmt, tvm.tirx.AttrStmt) and stmt.attr_key == "thread_extent":
        found[str(stmt.node.thread_tag)] = int(stmt.value)
    for field in ("body", "then_case", "else_case", "block"):
        child = getattr(stmt, field, None)
        if isinstance(child, tvm.tirx.Stmt):
            _thread_extents(child, found)
    for child in getattr(stmt, "seq", None) or []:
        _thread_extents(child, found)


def _lower(mod: Any, target: Any) -> tuple[Any, dict[Any, Any]]:
    """Host module and finalized device modules, as `tvm.tirx.build` lowers them."""
    import tvm
    from tvm.tirx.build import split_host_device_mods

    lowered = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    host, devices = split_host_device_mods(pipeline(lowered))
    return finalize_host()(host), {t: finalize_device()(m) for t, m in devices.items()}


def launch_plan(mod: Any, host: Any, devices: dict[Any, Any], n_inputs: int) -> dict[str, Any]:
    """Kernels in launch order, each with its arguments and global/local sizes. An argument is
    main's buffer `index` (role input or output: main's parameters are the inputs, then the
    output) or `scratch[index]`, an intermediate the runner allocates (role scratch). The plan
    lists main's buffers with their shapes and dtypes, which the runner checks its arrays
    against. `mod` is the scheduled module; `host` and `devices` its lowering (`_lower`)."""
    main = mod["main"]
    names = [str(param.name) for param in main.params]
    buffers = [
        {"name": str(param.name), "shape": [int(dim) for dim in param.ty.shape], "dtype": str(param.ty.dtype)}
        for param in main.params
    ]
    order = [
        name
        for name in re.findall(r'call_packed_lowered\("(\w+)"', host.script())
        if not name.startswith("__tvm")
    ]
    intermediates = {str(b.name): b for b in main.body.block.alloc_buffers}
    scratch: list[dict[str, Any]] = []
    kernels: dict[str, dict[str, Any]] = {}
    for device_mod in devices.values():
        for gvar, func in device_mod.functions.items():
            extents: dict[str, int] = {}
            _thread_extents(func.body, extents)
            local = [extents.get(f"threadIdx.{d}", 1) for d in DIMS]
            groups = [extents.get(f"blockIdx.{d}", 1) for d in DIMS]
            args = []
            for param in func.params:
                buffer = str(param.name).removesuffix("_ptr")
                if buffer in names:
                    index = names.index(buffer)
                    role = "input" if index < n_inputs else "output"
                else:
                    index, role = _scratch_index(buffer, intermediates, scratch, gvar.name_hint), "scratch"
                args.append({"buffer": buffer, "index": index, "role": role})
            kernels[gvar.name_hint] = {
                "name": gvar.name_hint,
                "args": args,
                "global": [g * item for g, item in zip(groups, local, strict=True)],
                "local": local,
            }
    return {"kernels": [kernels[name] for name in order], "buffers": buffers, "scratch": scratch}


def _scratch_index(
    name: str, intermediates: dict[str, Any], scratch: list[dict[str, Any]], kernel: str
) -> int:
    """Index of intermediate buffer `name` in the plan's scratch list (added on first use)."""
    for index, entry in enumerate(scratch):
        if entry["buffer"] == name:
            return index
    if name not in intermediates:
        raise DeployError(f"kernel {kernel} takes {name}: neither a buffer of main nor an intermediate")
    buffer = intermediates[name]
    shape = [int(dim) for dim in buffer.shape]
    scratch.append({"buffer": name, "dtype": str(buffer.dtype), "shape": shape})
    return len(scratch) - 1


def compile_opencl(mod: Any, target: Any, n_inputs: int) -> OpenClProgram:
    """OpenCL C and launch plan for a scheduled IRModule (work-items bound to threads), both from
    one lowering, so the plan describes exactly the kernels in the source."""
    import tvm
    from tvm.tirx.build import codegen_build

    with tvm.transform.PassContext(opt_level=3):
        host, devices = _lower(mod, target)
        devices = {t: m for t, m in devices.items() if len(m.functions)}
        if not devices:
            raise DeployError("the schedule bound no work-items: TVM produced no OpenCL kernel")
        source = "\n".join(str(codegen_build(m, t).inspect_source()) for t, m in devices.items())
    return OpenClProgram(source, launch_plan(mod, host, devices, n_inputs))


@dataclass(frozen=True)
class OpenClPlan(ArtifactKind):
    """OpenCL C kernels and the plan that launches them (GPU targets; no TVM on the device)."""

    def tvm_target(self, spec: dict[str, Any]) -> Any:
        import tvm

        return tvm.target.Target(spec, host={"kind": "llvm"})

    def compile(self, mod: Any, target: Target, n_inputs: int) -> OpenClProgram:
        return compile_opencl(mod, target.tvm_target(), n_inputs)

    def files(self, module: str) -> tuple[str, ...]:
        return (module, SOURCE_FILE)

    def write(self, compiled: OpenClProgram, staging: Path, target: Target) -> Path:
        """kernels.cl and launch.json, which pins the source by sha256 (the manifest pins the plan)."""
        source = staging / SOURCE_FILE
        source.write_text(compiled.source)
        plan = staging / PLAN_FILE
        body = {"source": SOURCE_FILE, "source_sha256": sha256_file(source), **compiled.plan}
        plan.write_text(json.dumps(body, indent=2) + "\n")
        return plan


OPENCL_PLAN = OpenClPlan(
    "opencl", splits_for_cores=False, builds_unscheduled=False, bundles=False, graph_entry="function"
)
