"""`deploy build` (an artifact directory, optionally a C bundle) and `deploy run` (one op on .npy
files, optionally checked against numpy)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from deploy.base.errors import DeployError, UsageError, clipped, printable
from deploy.cli.options import (
    ATTR,
    CORES,
    ENGINE,
    LAYOUT,
    MODEL,
    OP_OPTIONAL,
    TARGET,
    TUNED,
    DeviceChoice,
    bind_op,
    device_options,
    load_graph,
    op_or_model,
    resolve_build,
    warn,
)
from deploy.compiler.runtime import ALIGNMENT


@click.command("build")
@OP_OPTIONAL
@MODEL
@LAYOUT
@TARGET
@TUNED
@CORES
@device_options
@ATTR
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="Input shape, e.g. 32x64x112x112; once per input (an op's; a model has its own).",
)
@click.option("--dtype", help="Dtype of every input of the op [default: float32].")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(),
    help="Artifact directory [default: ./OP-TARGET, ./MODEL-TARGET].",
)
@click.option(
    "--bundle",
    is_flag=True,
    help="Also write a C library of the op or model (NAME.h, libNAME.a, libNAME.so, deploy-run):"
    " callable from C with nothing else on the device.",
)
@click.option(
    "--alignment",
    type=click.Choice([str(n) for n in (16, 32, ALIGNMENT)]),
    help="Bytes the data of the tensors a module is called with is aligned to, which its kernels"
    f" assume: 16 for an engine whose allocator gives less than {ALIGNMENT} (unaligned vector loads)"
    f" [default: {ALIGNMENT}].",
)
@click.option(
    "--name",
    "bundle_name",
    help="The bundle's C prefix: NAME(...), NAME_last_error() ... [default: the op's or model's name].",
)
@click.option(
    "--host-arch",
    help="An OpenCL bundle's host CPU, which its library and deploy-run are compiled for:"
    " x86_64, aarch64, armv7l or riscv64 [default: x86_64].",
)
@click.option(
    "--fp16",
    type=click.Choice(["native", "storage"]),
    help="OpenCL float16: native half arithmetic (devices with cl_khr_fp16: Mali, Adreno), or storage:"
    " half in memory, computed in float32 (NVIDIA, PoCL) [default: native].",
)
@ENGINE
def build_command(
    op_name: str | None,
    model: str | None,
    layout: str | None,
    target_name: str,
    tuned: str | None,
    cores: int | None,
    where: DeviceChoice,
    attrs: tuple[str, ...],
    shapes: tuple[str, ...],
    dtype: str | None,
    out_dir: str | None,
    bundle: bool,
    alignment: str | None,
    bundle_name: str | None,
    host_arch: str | None,
    fp16: str | None,
    engine_name: str | None,
) -> None:
    """Compile an op, or a model's graph of ops (fused into kernels), for a target into a module
    and manifest.json (split for --cores, else for the cores of --device or the target's default
    device)."""
    from deploy.cli.args import parse_shape
    from deploy.compiler.bundle import check_bundle, prefix_note
    from deploy.compiler.compile import compile_graph, compile_op
    from deploy.compiler.export import check_destination, export
    from deploy.compiler.options import for_device
    from deploy.ops import TensorType

    op_or_model(op_name, model, **{"-a": attrs, "--shape": shapes, "--dtype": dtype})
    if bundle_name is not None and not bundle:
        raise UsageError("--name names a bundle: give --bundle too")
    if host_arch is not None and not bundle:
        raise UsageError("--host-arch is an OpenCL bundle's host CPU: give --bundle too")
    target, options = resolve_build(target_name, tuned, cores, layout, model)
    if alignment is not None and not target.artifact.machine_code:
        kind = target.artifact.name
        raise UsageError(f"--alignment applies to CPU targets; {target.name} writes {kind} kernels")
    options = replace(options, alignment=int(alignment)) if alignment else options
    if fp16 is not None and not target.artifact.fp16_choice:
        kind = target.artifact.name
        raise UsageError(f"--fp16 applies to OpenCL targets; {target.name} writes {kind} kernels")
    options = replace(options, fp16_storage=fp16 == "storage")
    if engine_name is not None:
        given = {"--bundle": bundle, "--alignment": alignment, "--fp16": fp16, "--host-arch": host_arch}
        if any(given.values()):
            named = ", ".join(option for option, value in given.items() if value)
            raise UsageError(f"--engine {engine_name} writes its own plugin: {named} do not apply to it")
    if bundle:
        check_bundle(target, bundle_name, host_arch)
    if engine_name is not None:
        _build_for_engine(engine_name, op_name, model, target, options, attrs, shapes, dtype, out_dir)
        return
    if model is not None:
        graph = load_graph(model)
        name, output = graph.name, ", ".join(map(str, graph.outputs))
    else:
        if not shapes:
            raise UsageError("--shape is required with --op (once per input)")
        assert op_name is not None  # op_or_model: --op where no --model
        each = "float32" if dtype is None else dtype
        bound = bind_op(op_name, attrs, [TensorType(parse_shape(s), each) for s in shapes])
        name, output = bound.op.name, bound.output
    if out_dir == "":
        raise UsageError("-o '': expected an artifact directory")
    directory = Path(out_dir or f"{Path(model).stem if model else name}-{target_name}")
    check_destination(directory)  # before the device and the build, not after them
    if options.cores is None and target.artifact.splits_for_cores:
        with where.resolve(target).open() as session:
            options = for_device(options, session)
    compiled = (
        compile_graph(graph, target, options) if model is not None else compile_op(bound, target, options)
    )
    manifest = export(compiled, directory, bundle=bundle, name=bundle_name, host=host_arch)
    if tuned is not None and manifest.graph is None and manifest.tuning_record is None:
        click.echo(_untuned(tuned, manifest.tuning, manifest.schedule, "this op and these shapes were"))
    record = f" record {manifest.tuning_record}" if manifest.tuning_record else ""
    click.echo(
        f"built {manifest.op} for {manifest.target} ({manifest.schedule} schedule{record}"
        f"{f', {manifest.cores} cores' if manifest.cores else ''}):"
        f" {output} -> {directory / manifest.module} sha256 {manifest.sha256[:12]}"
    )
    for note in manifest.notes or []:
        click.echo(f"note: {manifest.op}: {note}", err=True)
    for kernel in manifest.graph["kernels"] if manifest.graph else []:
        nodes = ", ".join(kernel["nodes"])
        laid = f" in {kernel['layout']}" if "layout" in kernel else ""
        record = f" record {kernel['tuning_record']}" if "tuning_record" in kernel else ""
        note = (
            f"; {_untuned(tuned, kernel.get('tuning'), kernel['schedule'], 'it was')}"
            if tuned is not None and "tuning_record" not in kernel
            else ""
        )
        click.echo(
            f"  kernel {kernel['name']}{laid} ({kernel['schedule']} schedule{record}): nodes {nodes}{note}"
        )
    if manifest.constants:
        shown = [printable(clipped(c["name"])) for c in manifest.constants[:4]]
        names = ", ".join(shown) + (", ..." if len(manifest.constants) > 4 else "")
        size = sum(len(c.data) for c in compiled.constants)
        click.echo(
            f"  constants: {len(manifest.constants)} ({names}), {size} bytes, stored once in the artifact"
        )
    if manifest.bundle is not None:
        from deploy.devices.platforms import get_platform

        bundled = manifest.bundle
        emulator = " ".join(get_platform(bundled.get("arch", target.arch)).emulator_command())
        inputs = " ".join(f"-i {spec['name']}.npy" for spec in manifest.inputs)
        from deploy.ops.spec import OUTPUT

        several = len(manifest.outputs) > 1
        outputs = " ".join(f"-o {name if several else OUTPUT}.npy" for name in manifest.output_names)
        bundled = manifest.bundle
        prefix = prefix_note(compiled.bundle_signature()[0], bundled["name"]) if bundle_name is None else None
        if prefix is not None:
            click.echo(prefix)
        click.echo(
            f"bundle: {directory / bundled['header']} + {bundled['static_library']} / {bundled['library']};"
            f" run it with {emulator + ' ' if emulator else ''}{directory / bundled['runner']} {directory}"
            f" {inputs} {outputs}"
        )


@click.command("run")
@CORES
@OP_OPTIONAL
@MODEL
@LAYOUT
@TARGET
@TUNED
@ATTR
@device_options
@click.option(
    "-i",
    "--input",
    "inputs",
    multiple=True,
    required=True,
    help="Input .npy, once per input in order (a model's: in the order it lists them).",
)
@click.option(
    "-o",
    "--output",
    "outputs",
    multiple=True,
    required=True,
    help="Where to write an output .npy, once per output in order (a model's: in the order it lists them).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="Build the op for these shapes, once per input (Nx64x112x112: any batch) [default: the arrays'].",
)
@click.option("--check", is_flag=True, help="Compare with the numpy reference; exit 1 on mismatch.")
def run_command(
    cores: int | None,
    op_name: str | None,
    model: str | None,
    layout: str | None,
    target_name: str,
    tuned: str | None,
    attrs: tuple[str, ...],
    where: DeviceChoice,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    shapes: tuple[str, ...],
    check: bool,
) -> None:
    """Build (cached) and run an op or a model on .npy inputs; optionally check against numpy.
    A symbolic batch (a model's, or an op's --shape Nx...) is read from the arrays."""
    from deploy.cli.args import (
        check_not_read,
        load_npy,
        output_mode,
        parse_shape,
        save_npy,
        written_in_place,
    )
    from deploy.compiler.cache import cached_build
    from deploy.compiler.options import for_device
    from deploy.ops import TensorType
    from deploy.ops.spec import sizes_of
    from deploy.verify.run import against_reference, check_device, run_artifact

    op_or_model(op_name, model, **{"-a": attrs, "--shape": shapes})
    target, options = resolve_build(target_name, tuned, cores, layout, model)
    to_stderr = any(
        written_in_place(o, output_mode(o)) for o in outputs
    )  # -o /dev/stdout: arrays alone there
    for number, output in enumerate(outputs):
        check_not_read(output, [*inputs, *([model] if model is not None else [])], list(outputs[:number]))
        if Path(output).suffix not in ("", ".npy"):
            warn(f"-o {output}: writes a .npy array, whatever its suffix ({Path(output).suffix}) says")
    if shapes and len(shapes) != len(inputs):
        raise UsageError(f"--shape: give one per -i input ({len(inputs)}), got {len(shapes)}")
    declared = [parse_shape(s) for s in shapes]
    arrays = [load_npy(path) for path in inputs]
    types = [TensorType(a.shape, str(a.dtype)) for a in arrays]
    if model is not None:
        item = load_graph(model)
        item.check_inputs(types, inputs)
        names = list(item.graph.outputs)
        if len(outputs) != len(names):
            raise UsageError(
                f"model {item.name} writes {len(names)} output(s) ({', '.join(names)}): give -o once for"
                f" each, got {len(outputs)}"
            )
    else:
        assert op_name is not None  # op_or_model: --op where no --model
        built = [TensorType(s, t.dtype) for s, t in zip(declared, types, strict=True)] if shapes else types
        item = bind_op(op_name, attrs, built)
        if len(outputs) != 1:
            raise UsageError(f"op {item.name} writes one output: give -o once, got {len(outputs)}")
        sizes_of(
            [(spec.name, t) for spec, t in zip(item.op.inputs, built, strict=True)], [t.shape for t in types]
        )
    device = where.resolve(target)
    check_device(target, device)
    with device.open() as session:
        directory, manifest = cached_build(item, target, for_device(options, session))
        results = run_artifact(session, directory, manifest, arrays)
    for output, result in zip(outputs, results, strict=True):
        save_npy(output, result)
    written = ", ".join(
        f"{output} {TensorType(result.shape, str(result.dtype))}"
        for output, result in zip(outputs, results, strict=True)
    )
    click.echo(f"{item.name} on {device.name} ({manifest.built_with}): wrote {written}", err=to_stderr)
    if check:
        comparison = against_reference(item, arrays, results)
        if not comparison.ok:
            raise DeployError(f"check failed: {comparison.detail}, max error {comparison.max_error:.3g}")
        click.echo(f"check passed: max error {comparison.max_error:.3g} vs numpy", err=to_stderr)


def _build_for_engine(
    engine_name: str,
    op_name: str | None,
    model: str | None,
    target: Any,
    options: Any,
    attrs: tuple[str, ...],
    shapes: tuple[str, ...],
    dtype: str | None,
    out_dir: str | None,
) -> None:
    """`deploy build --engine NAME`: the engine's plugin of the op or the model into -o."""
    from deploy.cli.args import parse_shape
    from deploy.engines import get_engine
    from deploy.ops import TensorType

    engine = get_engine(engine_name)
    bound = None
    if model is None:
        if not shapes:
            raise UsageError("--shape is required with --op (once per input)")
        assert op_name is not None  # op_or_model: --op where no --model
        each = "float32" if dtype is None else dtype
        bound = bind_op(op_name, attrs, [TensorType(parse_shape(s), each) for s in shapes])
    if not out_dir:
        raise UsageError(f"--engine {engine.name}: give -o DIR, the directory of the plugin")
    for line in engine.build(bound, Path(model) if model else None, target, options, Path(out_dir)):
        click.echo(line)


def _untuned(tuned: str, tuning: str | None, schedule: str, subject: str) -> str:
    """Why a `--tuned` build (an op, or a graph's kernel) uses `schedule` rather than a record:
    tuning kept the hand schedule or its record was refused (`tuning`), or it was never tuned."""
    if tuning is not None:
        return f"tuned in {tuned}: {tuning}, using the {schedule} schedule"
    return f"{subject} not tuned in {tuned}: using the {schedule} schedule"
