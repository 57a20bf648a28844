"""OpenCL devices and the runner for `--target opencl` artifacts (pyopencl; never imports TVM).

An artifact is `launch.json` (kernels in order, their arguments by buffer index, global and local
sizes) next to `kernels.cl`, whose sha256 the plan pins. A board with an OpenCL driver and
pyopencl runs it with this module alone. The device is `opencl` (platform 0, device 0) or
`opencl:P:D` (`--cl-device P:D`); `deploy device list` shows the choices.
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

from base.errors import DeployError, UsageError
from base.paths import cache_root
from devices.registry import Device, register_device, register_device_source


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


class OpenClSession:
    """Runs launch plans on one OpenCL device; programs are built once per artifact."""

    arch = "opencl"

    def __init__(self, device: Any, label: str) -> None:
        cl = _cl()
        self.label = label
        self._context = cl.Context([device])
        self._queue = cl.CommandQueue(self._context)
        self._fp16 = "cl_khr_fp16" in device.extensions
        self._programs: dict[Path, tuple[dict[str, Any], Any]] = {}

    def cores(self) -> None:
        """Not a CPU: kernels are spread by work-groups, not split for cores."""
        return None

    def _load(self, plan_path: Path) -> tuple[dict[str, Any], Any]:
        if plan_path not in self._programs:
            cl = _cl()
            plan = json.loads(plan_path.read_text())
            source_path = plan_path.parent / plan["source"]
            source = source_path.read_bytes()
            if hashlib.sha256(source).hexdigest() != plan["source_sha256"]:
                raise UsageError(f"{source_path} does not match the sha256 in {plan_path.name}")
            text = source.decode()
            if "half" in text and not self._fp16:
                raise DeployError(f"{self.label} does not support fp16 (no cl_khr_fp16)")
            try:
                program = cl.Program(self._context, text).build()
            except cl.RuntimeError as exc:
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                errors = [line for line in lines if "error" in line.lower() and "BUILD_PROGRAM" not in line]
                log = " | ".join((errors or lines)[:3])
                raise DeployError(f"OpenCL kernel build failed on {self.label}: {log}") from None
            self._programs[plan_path] = (plan, program)
        return self._programs[plan_path]

    def _launch(
        self, plan_path: Path, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str
    ) -> tuple[Any, np.ndarray, Any]:
        """Buffers for the inputs and the output, and a function that enqueues every kernel."""
        cl = _cl()
        plan, program = self._load(plan_path)
        flags = cl.mem_flags
        out = np.empty(out_shape, dtype=out_dtype)
        copy = flags.READ_ONLY | flags.COPY_HOST_PTR
        buffers = [
            cl.Buffer(self._context, copy, hostbuf=np.require(a, requirements="C"))
            if a.nbytes > 0
            else cl.Buffer(self._context, flags.READ_ONLY, 1)
            for a in inputs
        ]
        buffers.append(cl.Buffer(self._context, flags.READ_WRITE, max(out.nbytes, 1)))
        sizes = [int(np.prod(s["shape"])) * np.dtype(s["dtype"]).itemsize for s in plan["scratch"]]
        scratch = [cl.Buffer(self._context, flags.READ_WRITE, max(1, size)) for size in sizes]
        pools = {"input": buffers, "output": buffers, "scratch": scratch}
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

        return enqueue, out, buffers[-1]

    def run(
        self, module: Path, inputs: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str
    ) -> np.ndarray:
        cl = _cl()
        enqueue, out, out_buffer = self._launch(module, inputs, out_shape, out_dtype)
        enqueue()
        if out.nbytes:
            cl.enqueue_copy(self._queue, out, out_buffer)
        self._queue.finish()
        return out

    def time(
        self,
        module: Path,
        inputs: list[np.ndarray],
        out_shape: tuple[int, ...],
        out_dtype: str,
        number: int,
        repeat: int,
    ) -> list[float]:
        enqueue, _, _ = self._launch(module, inputs, out_shape, out_dtype)
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

    def unsupported_dtypes(self) -> dict[str, str]:
        """Dtypes this device cannot run, with the reason (fp16 needs cl_khr_fp16)."""
        for platform, device, label, fp16 in opencl_devices():
            if (platform, device) == (self.platform, self.device) and not fp16:
                return {"float16": f"{label} has no cl_khr_fp16"}
        return {}

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
