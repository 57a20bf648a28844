"""`deploy bench`: median time per op on a device against the device's memory roofline, with
numpy and (when installed) PyTorch on the host as baselines, all measured in the same run."""

from __future__ import annotations

from typing import Any

import numpy as np

from devices import Device
from ops.spec import Op, TensorType, bind
from toolchain.bench.roofline import bytes_moved, copy_gbps, roofline_ms
from toolchain.bench.torch_baseline import torch_ms
from toolchain.build.cache import cached_build
from toolchain.build.targets import Target
from toolchain.verify.compare import random_input
from toolchain.verify.measure import artifact_ms, host_ms
from toolchain.verify.run import check_device, for_device


def bench_ops(
    ops: list[Op], dtype: str, target: Target, device: Device, repeat: int, fresh_roofline: bool = False
) -> list[dict[str, Any]]:
    """One row per op (its first case, in `dtype`): median ms; MB moved (inputs read once, output
    written once); GB/s; the roofline time (MB at the device's copy bandwidth) and how far from
    it; numpy and PyTorch ms on this host and our speed-up over each."""
    check_device(target, device)
    rows = []
    with device.open() as session:
        bandwidth = copy_gbps(session, target, device, fresh_roofline)
        for op in ops:
            case = op.cases[0]
            bound = bind(op, case.attrs, [TensorType(s, dtype) for s in case.shapes])
            inputs = [random_input(t, np.random.default_rng(0)) for t in bound.inputs]
            directory, manifest = cached_build(bound, for_device(target, session))
            median_ms = artifact_ms(session, directory, manifest, inputs, repeat)
            moved = bytes_moved(inputs, bound.output)
            best_ms = roofline_ms(moved, bandwidth)
            numpy = host_ms(
                lambda op=op, bound=bound, inputs=inputs: op.reference(bound.attrs, *inputs), repeat
            )
            torch = torch_ms(op.name, bound.attrs, inputs, repeat)
            rows.append(
                {
                    "op": op.name,
                    "shapes": case.label(),
                    "dtype": dtype,
                    "schedule": manifest.schedule,
                    "median_ms": median_ms,
                    "mb_moved": moved / 1e6,
                    "gb_per_s": moved / (median_ms / 1e3) / 1e9,
                    "roofline_gb_per_s": bandwidth,
                    "roofline_ms": best_ms,
                    "x_roofline": median_ms / best_ms,
                    "numpy_ms": numpy,
                    "speedup_vs_numpy": numpy / median_ms,
                    "torch_ms": torch,
                    "speedup_vs_torch": torch / median_ms if torch is not None else None,
                    "emulated": device.emulated,
                }
            )
    return rows
