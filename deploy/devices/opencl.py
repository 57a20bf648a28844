"""OpenCL devices and the runner for `--target opencl` artifacts (pyopencl; never imports TVM).

An artifact is `launch.json` (kernels in order, their arguments by buffer index, global and local
sizes, the shape and dtype of each buffer) next to `kernels.cl`, whose sha256 the plan pins. A
board with an OpenCL driver and pyopencl runs it with this module alone. The plan and the caller's
arrays are checked before anything is launched: a kernel writes only into buffers of the sizes it
was built for, and reads its source from the artifact's directory only. The device is `opencl`
(platform 0, device 0) or `opencl:P:D` (`--cl-device P:D`); `deploy device list` shows the choices.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from deploy.base.errors import DeployError, UsageError, reason
from deploy.base.files import load_json, read_regular
from deploy.base.paths import cache_root
from deploy.devices.registry import Device, Outputs, register_device, register_device_source


def _cl() -> Any:
    """pyopencl, with PoCL's kernel cache in deploy's cache dir."""
    os.environ.setdefault("POCL_CACHE_DIR", str(cache_root() / "pocl"))
    try:
        import pyopencl
    except ImportError:
        raise DeployError("pyopencl is not installed: pip install pyopencl") from None
    return pyopencl


def opencl_devices() -> list[tuple[int, int, str, bool]]:
    """(platform, device, "platform: device", has cl_khr_fp16) for every OpenCL device."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    return [
        (p, d, f"{platform.name}: {device.name}", "cl_khr_fp16" in device.extensions)
        for p, platform in enumerate(platforms)
        for d, device in enumerate(platform.get_devices())
    ]


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(dim) is int and dim >= 0 for dim in value):
        raise ValueError(f"shape {value!r} is not a list of sizes")
    return tuple(value)


def _work_sizes(kernel: dict[str, Any]) -> None:
    """Global and local sizes of 1 to 3 dimensions, positive, the global whole work-groups."""
    sizes = [_shape(kernel["global"]), _shape(kernel["local"])]
    if not 1 <= len(sizes[0]) <= 3 or len(sizes[0]) != len(sizes[1]) or 0 in sizes[1]:
        raise ValueError(f"kernel {kernel['name']}: work sizes {sizes} are not 1 to 3 positive sizes")
    if any(g % n for g, n in zip(*sizes, strict=True)):
        raise ValueError(f"kernel {kernel['name']}: global size {sizes[0]} is not whole work-groups")


def read_plan(path: Path) -> dict[str, Any]:
    """`launch.json`, checked: its buffers' shapes and dtypes, each kernel argument naming a
    buffer that exists in its role, work sizes that OpenCL accepts, and a source file inside
    the artifact's directory. Anything else is a one-line UsageError. When the artifact's
    `manifest.json` is beside it, the plan must be the one it pins (its sha256)."""
    try:
        text = read_regular(path)
        manifest = path.with_name("manifest.json")
        if manifest.is_file():
            pinned = load_json(manifest).get("sha256")
            if pinned != hashlib.sha256(text).hexdigest():
                raise UsageError(f"{path} does not match the sha256 in {manifest}")
        plan = json.loads(text)
        if not isinstance(plan["source_sha256"], str):
            raise ValueError("source_sha256 is not a string")
        buffers = [(_shape(b["shape"]), np.dtype(b["dtype"])) for b in plan["buffers"]]
        scratch = [(_shape(b["shape"]), np.dtype(b["dtype"])) for b in plan["scratch"]]
        constants = [
            (_shape(c["shape"]), np.dtype(c["dtype"]), int(c["offset"])) for c in plan.get("constants", [])
        ]
        if constants and not isinstance(plan["constants_sha256"], str):
            raise ValueError("constants_sha256 is not a string")
        n_outputs = plan.get("outputs", 1)
        if type(n_outputs) is not int or not 1 <= n_outputs < len(buffers) + 1:
            raise ValueError(f"outputs {n_outputs!r} is not a count of its buffers")
        n_inputs = len(buffers) - n_outputs
        roles = {
            "input": range(n_inputs),
            "output": range(n_inputs, len(buffers)),
            "scratch": range(len(scratch)),
            "constant": range(len(constants)),
        }
        for kernel in plan["kernels"]:
            _work_sizes(kernel)
            for arg in kernel["args"]:
                if type(arg["index"]) is not int or arg["index"] not in roles[arg["role"]]:
                    raise ValueError(f"kernel {kernel['name']}: no {arg['role']} buffer {arg['index']}")
        files = {"source": plan["source"], **({"constants": plan["constants_file"]} if constants else {})}
        outside = [
            (kind, name)
            for kind, name in files.items()
            if not (path.parent / name).resolve().is_relative_to(path.parent.resolve())
        ]
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        detail = reason(exc)
        raise UsageError(
            f"{path}: not a launch plan of this deploy ({detail}): rebuild the artifact"
        ) from None
    if outside:
        kind, name = outside[0]
        raise UsageError(f"{path}: {kind} {name!r} is outside the artifact's directory")
    plan["buffers"], plan["scratch"], plan["constants"] = buffers, scratch, constants
    plan["outputs"] = n_outputs  # a plan of an earlier deploy says none: it writes one
    return plan


def _read_pinned(path: Path, sha256: str, plan_path: Path) -> bytes:
    """The bytes of a file the launch plan pins, checked against its sha256."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UsageError(f"{path} does not match the sha256 in {plan_path.name}")
    return data


def _constant_arrays(plan_path: Path, plan: dict[str, Any]) -> list[np.ndarray]:
    """The graph's constants, read from the file the plan pins, each at its offset."""
    if not plan["constants"]:
        return []
    blob_path = plan_path.parent / plan["constants_file"]
    blob = _read_pinned(blob_path, plan["constants_sha256"], plan_path)
    arrays = []
    for shape, dtype, offset in plan["constants"]:
        count = int(np.prod(shape))
        if offset < 0 or offset + count * dtype.itemsize > len(blob):
            raise UsageError(f"{blob_path}: a constant at offset {offset} lies past its {len(blob)} bytes")
        arrays.append(np.frombuffer(blob, dtype.newbyteorder("<"), count, offset).reshape(shape))
    return arrays


def _check_arrays(path: Path, plan: dict[str, Any], inputs: list[np.ndarray], outputs: Outputs) -> None:
    """The caller's arrays against the plan's buffers: as many inputs, each of the shape and dtype
    the kernels were built for, and the outputs likewise (a one-line UsageError otherwise)."""
    n_inputs = len(plan["buffers"]) - plan["outputs"]
    expected, written = plan["buffers"][:n_inputs], plan["buffers"][n_inputs:]
    if len(inputs) != len(expected):
        raise UsageError(f"{path} takes {len(expected)} input(s), got {len(inputs)}")
    for number, (array, (shape_in, dtype_in)) in enumerate(zip(inputs, expected, strict=True)):
        where = f"input {number} of {path}"
        if not isinstance(array, np.ndarray):
            raise UsageError(f"{where}: expected a numpy array, got {type(array).__name__}")
        if (array.shape, array.dtype) != (shape_in, dtype_in):
            raise UsageError(
                f"{where}: expected shape {shape_in} {dtype_in}, got shape {array.shape} {array.dtype}"
            )
    if len(outputs) != len(written):
        raise UsageError(f"{path} writes {len(written)} output(s), asked for {len(outputs)}")
    for number, ((out_shape, out_dtype), (shape, dtype)) in enumerate(zip(outputs, written, strict=True)):
        try:
            asked = (tuple(out_shape), np.dtype(out_dtype))
        except TypeError:
            asked = None
        if asked != (shape, dtype):
            raise UsageError(
                f"output {number} of {path}: its kernels write shape {shape} {dtype},"
                f" not {out_shape} {out_dtype}"
            )


class OpenClSession:
    """Runs launch plans on one OpenCL device; programs are built once per artifact."""

    arch = "opencl"
    bundles = False
    bundle_host: str | None = None

    def __init__(self, device: Any, label: str) -> None:
        cl = _cl()
        self.label = label
        self._context = cl.Context([device])
        self._queue = cl.CommandQueue(self._context)
        self._fp16 = "cl_khr_fp16" in device.extensions
        self._programs: dict[Path, tuple[dict[str, Any], Any, list[Any]]] = {}
        """Per launch plan: the plan, its program and its constants' buffers, made once."""

    def cores(self) -> None:
        """Not a CPU: kernels are spread by work-groups, not split for cores."""
        return None

    def fp16_arithmetic(self) -> bool:
        """Half arithmetic needs cl_khr_fp16; without it, builds store float16 as half and compute
        in float32 (`BuildOptions.fp16_storage`)."""
        return self._fp16

    def cpu_id(self) -> None:
        """Not a CPU."""
        return None

    def _load(self, plan_path: Path) -> tuple[dict[str, Any], Any, list[Any]]:
        if plan_path not in self._programs:
            cl = _cl()
            plan = read_plan(plan_path)
            source_path = plan_path.parent / plan["source"]
            source = _read_pinned(source_path, plan["source_sha256"], plan_path)
            constants = [self._read_only(a) for a in _constant_arrays(plan_path, plan)]
            try:
                text = source.decode()
            except UnicodeDecodeError:
                raise UsageError(f"{source_path} is not OpenCL C text") from None
            if plan.get("float16") == "native" and not self._fp16:
                raise DeployError(
                    f"{source_path} computes in half, which needs cl_khr_fp16 and {self.label} has none:"
                    " deploy run, test and bench build float16 for this device as half storage"
                )
            try:
                program = cl.Program(self._context, text).build()
            except cl.RuntimeError as exc:
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                errors = [line for line in lines if "error" in line.lower() and "BUILD_PROGRAM" not in line]
                log = " | ".join((errors or lines)[:3])
                raise DeployError(f"OpenCL kernel build failed on {self.label}: {log}") from None
            self._programs[plan_path] = (plan, program, constants)
        return self._programs[plan_path]

    def _read_only(self, array: np.ndarray) -> Any:
        """A device buffer holding `array` (C order), which kernels only read; an empty array's
        is one byte (OpenCL has no empty buffer)."""
        cl = _cl()
        flags = cl.mem_flags
        if not array.nbytes:
            return cl.Buffer(self._context, flags.READ_ONLY, 1)
        return cl.Buffer(
            self._context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=np.require(array, requirements="C")
        )

    def _launch(
        self, plan_path: Path, inputs: list[np.ndarray], outputs: Outputs
    ) -> tuple[Any, list[np.ndarray], list[Any]]:
        """Buffers for the inputs and the outputs, and a function that enqueues every kernel."""
        cl = _cl()
        plan, program, constants = self._load(plan_path)
        _check_arrays(plan_path, plan, inputs, outputs)
        flags = cl.mem_flags
        outs = [np.empty(shape, dtype=dtype) for shape, dtype in outputs]
        buffers = [self._read_only(a) for a in inputs]
        buffers += [cl.Buffer(self._context, flags.READ_WRITE, max(out.nbytes, 1)) for out in outs]
        sizes = [int(np.prod(shape)) * dtype.itemsize for shape, dtype in plan["scratch"]]
        scratch = [cl.Buffer(self._context, flags.READ_WRITE, max(1, size)) for size in sizes]
        pools = {"input": buffers, "output": buffers, "scratch": scratch, "constant": constants}
        kernels = [
            (
                cl.Kernel(program, k["name"]),
                [pools[a["role"]][a["index"]] for a in k["args"]],
                k["global"],
                k["local"],
            )
            for k in plan["kernels"]
        ]

        def enqueue() -> Any:
            event = None
            for kernel, args, global_size, local_size in kernels:
                kernel.set_args(*args)
                event = cl.enqueue_nd_range_kernel(self._queue, kernel, global_size, local_size)
            return event

        return enqueue, outs, buffers[len(inputs) :]

    def run(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[np.ndarray]:
        """Launch the plan's kernels in order (an op's or a graph's alike: `entry` is not used,
        and its scratch buffers are the plan's own, not a `workspace`)."""
        cl = _cl()
        enqueue, outs, out_buffers = self._launch(module, inputs, outputs)
        enqueue()
        for out, out_buffer in zip(outs, out_buffers, strict=True):
            if out.nbytes:
                cl.enqueue_copy(self._queue, out, out_buffer)
        self._queue.finish()
        return outs

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        outputs: Outputs,
        number: int,
        repeat: int,
        entry: str = "function",
        workspace: int = 0,
    ) -> list[float]:
        enqueue, _, _ = self._launch(module, inputs, outputs)
        enqueue()
        self._queue.finish()
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                enqueue()
            self._queue.finish()
            results.append((time.perf_counter() - start) / number)
        return results


class OpenClDevice(Device):
    """One OpenCL device, by platform and device index."""

    arch = "opencl"

    def __init__(self, platform: int = 0, device: int = 0) -> None:
        self.platform, self.device = platform, device
        self.name = "opencl" if (platform, device) == (0, 0) else f"opencl:{platform}:{device}"

    @contextmanager
    def open(self) -> Iterator[OpenClSession]:
        cl = _cl()
        found = opencl_devices()
        if not found:
            raise DeployError("no OpenCL platform: install an OpenCL driver (on Debian: pocl-opencl-icd)")
        try:
            device = cl.get_platforms()[self.platform].get_devices()[self.device]
        except IndexError:
            choices = ", ".join(f"{p}:{d} ({label})" for p, d, label, _ in found)
            raise UsageError(f"no OpenCL device {self.platform}:{self.device} (have: {choices})") from None
        yield OpenClSession(device, f"OpenCL {device.name.strip()}")


def _by_name(name: str) -> OpenClDevice | None:
    """`opencl:P:D` names an OpenCL device."""
    parts = name.split(":")
    if parts[0] != "opencl" or len(parts) != 3:
        return None
    if not (parts[1].isdigit() and parts[2].isdigit()):
        raise UsageError(f"device {name!r}: expected opencl:PLATFORM:DEVICE with indices, e.g. opencl:0:0")
    return OpenClDevice(int(parts[1]), int(parts[2]))


register_device("opencl")(OpenClDevice)
register_device_source(_by_name)
