"""The target registry: what each `--target` name compiles for and how.

A target is data: its TVM target dict, the machine architecture its modules run on, the vector
width the schedules use, the schedule families to look up (first match wins), and how to link.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from deploy.base.errors import UsageError
from deploy.compiler.artifacts import ArtifactKind
from deploy.compiler.opencl import OPENCL_PLAN
from deploy.compiler.shared_object import SHARED_OBJECT
from deploy.ops.layouts import LAYOUTS, Layout


@dataclass(frozen=True)
class Target:
    """One `--target`, what the hardware is: a TVM target plus what the toolchain needs to build
    and run for it. Registry data: a build's choices are its `BuildOptions` (`options.py`)."""

    name: str
    description: str
    tvm: dict[str, Any]
    arch: str
    """ELF machine the modules run on: "x86_64" or "aarch64"."""
    vector_bits: int
    schedules: tuple[str, ...]
    """Schedule families to try in order (see `deploy/schedules/registry.py`)."""
    cpu_flags: tuple[str, ...] = ()
    """/proc/cpuinfo flags a CPU needs to run these modules."""
    scalar_dtypes: tuple[str, ...] = ()
    """Dtypes whose loops the schedules leave scalar, where the vector unit has none and LLVM
    aborts on such vectors: float64 on armv7's NEON (`llvm.maximum` of <2 x double>: "Cannot
    select setcc"), float16 on RVV 1.0 without Zvfhmin ("Scalarization of scalable vectors"), and
    int64 and uint64 on RVV, which TVM's vectorizer fails on ("Cannot broadcast ... is_scalable=1")."""
    predicated_vectors: bool = True
    """TVM's vectorizer builds a vector with lanes masked off (a row's ragged end) for it: not for
    RVV, where it fails on an integer max so masked ("Cannot broadcast lanes=4 is_scalable=1"),
    so the schedules leave such ends scalar."""
    streaming_store_bytes: int | None = None
    """An output of at least this many bytes that no later kernel of the call reads is written
    with streaming stores (`streaming.py`: x86 `movntps`, AArch64 `stnp`), which skip the read
    of each line a plain store makes; about the size of the target's last-level cache, below
    which a plain store leaves the tensor in cache for whatever reads it next. None: the target
    has no such stores (armv7, RVV without Zihintntl)."""
    prefetch_level: int = 1
    """The cache level a schedule's software prefetch of a streamed input fills (1: L1, 2: L2;
    `deploy.schedules.cpu.prefetch`). x86's fill L2 (`prefetcht1`): the stream's lines then wait
    in L2 instead of holding L1's few miss buffers, and the core's own loads find them there.
    AMD Zen 5, L1 and L2 builds interleaved, 1 / 2 threads, x86-avx512: max_pool2d
    32x64x112x112 k3 s2 p1 0.89 / 0.83 of L1's time, argmax 256x100000 0.89 / 0.90; x86:
    0.94 / 0.96 and 0.96 / 0.93 (L3, `prefetcht2`: 0.89 of L1's for the pool; non-temporal:
    1.74). The ARM and RISC-V targets keep L1, not measured on a device. Where it is past L1,
    the schedules also prefetch into L1 a little ahead of the loads (`PREFETCH_NEAR`)."""
    two_vector_shuffles: bool = False
    """One instruction picks any lanes of two full vectors (AVX-512's `vpermt2ps`), so a stride-2
    vector load reads the vectors at multiples of its lanes that hold it, three where it starts
    late in one (`deploy.compiler.tir_passes`): the addresses a pooling stage's row was just
    stored at, which a load straddling two stores waits on. max_pool2d k3 s2 p1 32x64x112x112,
    1 / 2 threads, interleaved: x86-avx512 0.94-0.95 / 0.94-1.02 of the pair's time; x86 (AVX2: its
    shuffles pick within 128-bit halves, and 16 registers do not hold a stage row of 14
    vectors) 1.08 / 1.03, so it keeps the pair. ARM's NEON has such a shuffle (`uzp`), not
    measured on a device."""
    cross_compiler: str | None = None
    cross_package: str | None = None
    """Debian package that provides `cross_compiler`."""
    default_device: str = "local"
    artifact: ArtifactKind = SHARED_OBJECT
    """What `deploy build` writes: a shared object (module.so), an OpenCL plan (kernels.cl + launch.json)."""
    work_group: int = 64
    """Work-items per work-group (GPU targets)."""
    layouts: tuple[tuple[str, str], ...] = ()
    """(dtype, layout): the layout this target's pooling would run packed in for a dtype (by the
    vector: PPL.NN's N4CX for NEON fp32, N8CX for fp16 and AVX2 fp32; a GPU's NHWC), which
    `deploy tune --model` measures a graph in against NCHW (`deploy/tune/layouts.py`)."""

    def packed_layout(self, dtype: str) -> Layout | None:
        """The layout `layouts` declares for `dtype` (None: none)."""
        name = dict(self.layouts).get(dtype)
        return LAYOUTS[name] if name else None

    def tvm_target(self, num_cores: int | None = None) -> Any:
        """The TVM target of its spec (`tvm`), told `num_cores` threads where given."""
        spec = dict(self.tvm)
        if num_cores is not None:
            spec["num-cores"] = num_cores
        return self.artifact.tvm_target(spec)


_TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    """Make `target` known by its name (a target is data: this and its artifact kind)."""
    _TARGETS[target.name] = target
    return target


def get_target(name: str) -> Target:
    """The target named `name`; a UsageError listing the known ones when there is none."""
    if name not in _TARGETS:
        raise UsageError(f"unknown target {name!r} (known: {', '.join(sorted(_TARGETS))})")
    return _TARGETS[name]


def all_targets() -> list[Target]:
    """Every known target, by name."""
    return [_TARGETS[name] for name in sorted(_TARGETS)]


X86 = register_target(
    Target(
        name="x86",
        description="x86-64 with AVX2 and FMA (Haswell and newer)",
        tvm={"kind": "llvm", "mcpu": "core-avx2"},
        arch="x86_64",
        vector_bits=256,
        schedules=("x86", "cpu"),
        cpu_flags=("avx2", "fma"),
        prefetch_level=2,
        layouts=(("float32", "NCHW8c"),),
        streaming_store_bytes=16 << 20,
    )
)
register_target(
    replace(
        X86,
        name="x86-avx512",
        description="x86-64 with AVX-512 (Skylake-SP and newer)",
        tvm={"kind": "llvm", "mcpu": "skylake-avx512"},
        vector_bits=512,
        cpu_flags=("avx512f", "avx512bw", "avx512vl"),
        two_vector_shuffles=True,
    )
)
ARM = register_target(
    Target(
        name="arm",
        description="aarch64 with NEON, fp32 (Cortex-A53 and newer: Raspberry Pi 3/4, RK3399)",
        tvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
        arch="aarch64",
        vector_bits=128,
        schedules=("arm", "cpu"),
        layouts=(("float32", "NCHW4c"),),
        streaming_store_bytes=4 << 20,
        cross_compiler="aarch64-linux-gnu-gcc",
        cross_package="gcc-aarch64-linux-gnu",
        default_device="emulator",
    )
)
register_target(
    replace(
        ARM,
        name="arm-fp16",
        description="armv8.2-a with fp16 arithmetic (Cortex-A55/A76: RK3588, Raspberry Pi 5)",
        tvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+v8.2a", "+neon", "+fullfp16"]},
        cpu_flags=("fphp", "asimdhp"),
        layouts=(("float32", "NCHW4c"), ("float16", "NCHW8c")),
    )
)
register_target(
    Target(
        name="opencl",
        description="OpenCL 1.2 GPUs (Mali, Adreno; PoCL on a CPU): OpenCL C + launch plan, no TVM needed",
        tvm={"kind": "opencl"},
        arch="opencl",
        vector_bits=128,
        schedules=("gpu",),
        layouts=(("float32", "NHWC"), ("float16", "NHWC")),  # MindSpore Lite's GPU kernels read NHWC
        default_device="opencl",
        artifact=OPENCL_PLAN,
    )
)
register_target(
    Target(
        name="armv7",
        description="32-bit Arm, NEON + VFPv4, hard float (Raspberry Pi OS 32-bit, i.MX6/7, STM32MP1):"
        " C bundles, run by their runner",
        tvm={
            "kind": "llvm",
            "mtriple": "armv7a-linux-gnueabihf",
            "mattr": ["+neon", "+vfp4"],
            "mfloat-abi": "hard",
        },
        arch="armv7l",
        vector_bits=128,
        schedules=("arm", "cpu"),
        cpu_flags=("neon", "vfpv4"),
        scalar_dtypes=("float64",),
        layouts=(("float32", "NCHW4c"),),
        cross_compiler="arm-linux-gnueabihf-gcc",
        cross_package="gcc-arm-linux-gnueabihf",
        default_device="emulator-armv7",
    )
)
register_target(
    Target(
        name="riscv64",
        description="RV64GC + RVV 1.0 (Kendryte K230, SpacemiT K1): C bundles, run by their runner",
        tvm={"kind": "llvm", "mtriple": "riscv64-linux-gnu", "mattr": ["+m", "+a", "+f", "+d", "+c", "+v"]},
        arch="riscv64",
        vector_bits=128,
        schedules=("riscv", "cpu"),
        cpu_flags=("v",),
        scalar_dtypes=("float16", "int64", "uint64"),
        predicated_vectors=False,
        cross_compiler="riscv64-linux-gnu-gcc",
        cross_package="gcc-riscv64-linux-gnu",
        default_device="emulator-riscv64",
    )
)
