"""ARM and RISC-V: cross-compiled modules use the vector unit (NEON on aarch64 and armv7, RVV on
riscv64), and the emulator refuses x86 modules (every op on the emulators is in the matrix,
tests/test_ops_matrix.py and tests/test_bundle.py)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from deploy.base.errors import UsageError
from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import get_target
from deploy.devices.elf import elf_machine
from deploy.devices.platforms import get_platform
from deploy.ops import TensorType, bind, get_op
from deploy.verify.run import run_artifact

needs_cross = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-objdump") is None or shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="needs gcc-aarch64-linux-gnu and binutils-aarch64-linux-gnu",
)
needs_qemu = pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user (qemu-aarch64)")

# (target, op, attrs, shapes, dtype, instruction pattern that must appear)
POOL = {"kernel": 3, "stride": 2, "padding": 1}
NEON = [
    ("arm", "max_pool2d", POOL, [(1, 8, 32, 32)], "int32", r"smax\s+v\d+\.4s"),
    ("arm", "max_pool2d", POOL, [(1, 8, 32, 32)], "float32", r"fmax\s+v\d+\.4s"),
    ("arm", "add", {}, [(8, 64), (8, 64)], "float32", r"fadd\s+v\d+\.4s"),
    ("arm", "add", {}, [(8, 64), (1, 64)], "int8", r"add\s+v\d+\.16b"),
    ("arm", "leaky_relu", {}, [(8, 64)], "float32", r"fmul\s+v\d+\.4s"),
    ("arm", "argmax", {"axis": 1}, [(2, 16, 8, 32)], "float32", r"fcm\w+\s+v\d+\.[24]s"),
    ("arm-fp16", "add", {}, [(8, 64), (8, 64)], "float16", r"fadd\s+v\d+\.8h"),
    ("arm-fp16", "leaky_relu", {}, [(8, 64)], "float16", r"fmul\s+v\d+\.8h"),
    ("arm-fp16", "max_pool2d", POOL, [(1, 8, 32, 32)], "float16", r"fmax\s+v\d+\.8h"),
    # armv7: NEON's NaN-propagating max on q registers, vector loads (#38)
    ("armv7", "max_pool2d", POOL, [(1, 8, 32, 32)], "float32", r"vmax\.f32\s+q\d+, q\d+, q\d+"),
    ("armv7", "max_pool2d", POOL, [(1, 8, 32, 32)], "float32", r"vld1\.32\s+\{d\d+-d\d+\}"),
    ("armv7", "add", {}, [(8, 64), (8, 64)], "float32", r"vadd\.f32\s+q\d+"),
    # riscv64: RVV's vfmax on vector loads (not a gather of scalars), vector adds
    ("riscv64", "max_pool2d", POOL, [(1, 8, 32, 32)], "float32", r"vfmax\.vv\s+v\d+"),
    ("riscv64", "max_pool2d", POOL, [(1, 8, 32, 32)], "float32", r"vle32\.v\s+v\d+"),
    ("riscv64", "add", {}, [(8, 64), (8, 64)], "float32", r"vfadd\.vv\s+v\d+"),
    ("riscv64", "add", {}, [(8, 64), (1, 64)], "int8", r"vadd\.vv\s+v\d+"),
]


@pytest.mark.parametrize("target_name,op_name,attrs,shapes,dtype,pattern", NEON, ids=lambda v: str(v)[:24])
def test_modules_use_the_vector_unit(tmp_path, target_name, op_name, attrs, shapes, dtype, pattern):
    target = get_target(target_name)
    objdump = get_platform(target.arch).tool("objdump")
    if shutil.which(objdump) is None or shutil.which(target.cross_compiler or "") is None:
        pytest.skip(f"needs {objdump} and {target.cross_compiler} ({target.cross_package})")
    bound = bind(get_op(op_name), attrs, [TensorType(s, dtype) for s in shapes])
    kernels = tmp_path / "kernels.o"  # what module.so and the bundle link (a linked riscv64 object
    compile_op(bound, target, BuildOptions()).executable.mod.write_to_file(
        str(kernels)
    )  # loses its RVV attribute)
    assert elf_machine(kernels) == target.arch
    listing = subprocess.run([objdump, "-d", str(kernels)], capture_output=True, text=True, check=True).stdout
    assert re.search(pattern, listing), f"no {pattern} in {op_name} {dtype} for {target_name}"


@pytest.fixture(scope="module")
def emulator_session():
    from deploy.devices import get_device

    with get_device("emulator").open() as session:
        yield session


@pytest.mark.emulator
@needs_qemu
def test_x86_module_is_refused_by_the_emulator(tmp_path, emulator_session):
    bound = bind(get_op("leaky_relu"), {}, [TensorType((4,), "float32")])
    manifest = export(compile_op(bound, get_target("x86"), BuildOptions()), tmp_path / "x86")
    with pytest.raises(UsageError, match=r"built for x86_64; device emulator on port \d+ runs aarch64"):
        run_artifact(emulator_session, tmp_path / "x86", manifest, [])
