"""`deploy ops` and `deploy targets`: the registries as JSON-ready dicts and tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from deploy.cli.options import wide_console
from deploy.ops.onnx_mapping import onnx_label


def _default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def describe_ops() -> list[dict[str, Any]]:
    """Each op: name, summary, inputs, attributes, dtypes, and the schedule per target."""
    from deploy.compiler.targets import all_targets
    from deploy.ops import all_ops
    from deploy.schedules import find_schedule

    return [
        {
            "name": op.name,
            "summary": op.summary(),
            "inputs": [
                {"name": i.name, "rank": [i.min_rank, i.max_rank], "broadcasts": i.broadcasts}
                for i in op.inputs
            ],
            "attrs": [
                {
                    "name": a.name,
                    "type": a.kind.type_name(),
                    "default": _default(a.default),
                    "doc": a.doc,
                }
                for a in op.attrs
            ],
            "dtypes": list(op.dtypes),
            "targets": {
                t.name: found.label if (found := find_schedule(t.schedules, op.name)) else "default"
                for t in all_targets()
            },
        }
        for op in all_ops()
    ]


def print_ops(described: list[dict[str, Any]]) -> None:
    table = Table(title="ops", show_lines=True)
    for column in ("op", "inputs", "attributes", "dtypes", "targets (schedule)"):
        table.add_column(column)
    for op in described:
        attrs = "\n".join(
            f"{a['name']}: {a['type']} = {'(derived)' if a['default'] is None else a['default']}"
            for a in op["attrs"]
        )
        table.add_row(
            f"[bold]{op['name']}[/bold]\n{op['summary']}",
            ", ".join(i["name"] for i in op["inputs"]),
            attrs or "-",
            ", ".join(op["dtypes"]),
            "\n".join(f"{t}: {s}" for t, s in op["targets"].items()),
        )
    wide_console().print(table)


def describe_targets() -> list[dict[str, Any]]:
    from deploy.compiler.targets import all_targets

    return [
        {
            "name": t.name,
            "description": t.description,
            "arch": t.arch,
            "tvm": t.tvm,
            "vector_bits": t.vector_bits,
            "default_device": t.default_device,
            "layouts": dict(t.layouts),
            "streaming_store_bytes": t.streaming_store_bytes,
        }
        for t in all_targets()
    ]


def print_targets(described: list[dict[str, Any]]) -> None:
    table = Table(title="targets")
    columns = (
        "target",
        "arch",
        "vector bits",
        "default device",
        "layouts",
        "streaming stores",
        "description",
    )
    for column in columns:
        table.add_column(column, no_wrap=column == "target")  # a name to copy whole
    for t in described:
        layouts = ", ".join(f"{dtype} {layout}" for dtype, layout in t["layouts"].items())
        streams = t["streaming_store_bytes"]
        streaming = "-" if streams is None else f"from {streams / 2**20:g} MiB"
        row = (
            t["name"],
            t["arch"],
            str(t["vector_bits"]),
            t["default_device"],
            layouts,
            streaming,
            t["description"],
        )
        table.add_row(*row)
    wide_console().print(table)


def print_model_report(report: dict[str, Any]) -> None:
    """`model_report` as tables: every node, then what to add per missing op type, then a line."""
    nodes = Table(title=f"nodes of {report['model']}")
    for column in ("node", "ONNX op", "op", "status"):
        nodes.add_column(column)
    for node in report["nodes"]:
        status = node["status"] if node["status"] != "refused" else f"refused: {node['problem']}"
        nodes.add_row(node["name"], node["onnx"], node["op"] or "-", status)
    console = wide_console()
    console.print(nodes, markup=False)
    if report["missing"]:
        missing = Table(title="op types to add (an op file each, see docs/adding-ops.md)", show_lines=True)
        for column in ("ONNX op", "nodes", "declare", "attributes the model uses"):
            missing.add_column(column)
        for entry in report["missing"]:
            label = onnx_label(entry["domain"], entry["op_type"])
            attrs = "\n".join(
                f"{name}: {', '.join(map(str, values))}" for name, values in entry["attributes"].items()
            )
            missing.add_row(label, str(len(entry["nodes"])), entry["declaration"], attrs or "-")
        console.print(missing, markup=False)
    if report["builds"]:
        click.echo("the model builds as it is")
    else:
        click.echo(f"the model does not build: {report['problem']}")


@click.command("ops")
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Instead: report what this ONNX model needs (each node's op, every op type to add).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ops_command(model: Path | None, as_json: bool) -> None:
    """List ops with inputs, attributes, dtypes and targets; with --model, what a model needs
    (exit 1 when it does not build as it is)."""
    if model is not None:
        from deploy.model.onnx_report import model_report

        report = model_report(model)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            print_model_report(report)
        if not report["builds"]:
            raise click.exceptions.Exit(1)
        return
    described = describe_ops()
    if as_json:
        click.echo(json.dumps(described, indent=2))
    else:
        print_ops(described)


@click.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def targets_command(as_json: bool) -> None:
    """List targets."""
    described = describe_targets()
    if as_json:
        click.echo(json.dumps(described, indent=2))
    else:
        print_targets(described)
