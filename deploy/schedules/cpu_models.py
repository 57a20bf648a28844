"""CPU models whose hand-schedule defaults differ from the ones measured on Intel Xeons: a model is
data (how /proc/cpuinfo names it, and the defaults measured on it), looked up by the name a build
carries (`BuildOptions.cpu_model`, asked from the device: `deploy.devices.local`). A CPU of no
model here, or a device that cannot say (a board, an emulator, RPC), builds the defaults the
schedules' constants hold; `deploy tune` searches both either way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuModel:
    """One CPU microarchitecture: `vendor` and `family` as /proc/cpuinfo's `vendor_id` and `cpu
    family` say, `models` the ranges of its `model` field (inclusive), and the defaults the
    hand schedules take on it."""

    name: str
    description: str
    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]
    plane_streams: int
    """Planes an NCHW pool reads at once (`deploy.schedules.cpu.pooling.PLANE_STREAMS`)."""
    near_prefetch_bytes: int
    """How far ahead the near (L1) prefetches run, 0 for none
    (`deploy.schedules.cpu.prefetch.NEAR_PREFETCH_BYTES`)."""

    def matches(self, vendor: str, family: int, model: int) -> bool:
        """Whether /proc/cpuinfo's fields so name this model."""
        known = vendor == self.vendor and family == self.family
        return known and any(lo <= model <= hi for lo, hi in self.models)


ZEN3 = CpuModel(
    name="zen3",
    description="AMD Zen 3 (EPYC 7003, Ryzen 5000)",
    vendor="AuthenticAMD",
    family=25,
    models=((0x00, 0x0F), (0x20, 0x5F)),
    plane_streams=1,
    near_prefetch_bytes=0,
)
"""On a 2-core AMD EPYC (Zen 3, family 25 model 1) VM, x86, interleaved, 1 / 2 threads:
max_pool2d 32x64x112x112 k3 s2 p1 one plane at a time without near prefetches took 0.71-0.86 /
0.78-0.85 of the Intel defaults' time (four planes, near prefetches 1 KiB ahead) on two days;
argmax 256x100000 without near prefetches 0.92-0.94 / 0.98 (docs/performance.md, the Zen 3
bullet). Zen 4 shares the family with other models, not measured: not listed."""

CPU_MODELS = {model.name: model for model in (ZEN3,)}
"""The known models by name."""


def identify(cpu: tuple[str, int, int] | None) -> str | None:
    """The name of the known model of a CPU /proc/cpuinfo describes as (vendor_id, cpu family,
    model); None: none, or no such description (a device that cannot say)."""
    return next((m.name for m in CPU_MODELS.values() if cpu and m.matches(*cpu)), None)
