"""`deploy ops` and `deploy targets`: the registries as JSON-ready dicts and tables."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from toolchain.cli.options import wide_console


def _default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def describe_ops() -> list[dict[str, Any]]:
    """Each op: name, summary, inputs, attributes, dtypes, and the schedule per target."""
    from ops import all_ops
    from schedules import find_schedule
    from toolchain.build.targets import all_targets

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
    from toolchain.build.targets import all_targets

    return [
        {
            "name": t.name,
            "description": t.description,
            "arch": t.arch,
            "tvm": t.tvm,
            "vector_bits": t.vector_bits,
            "default_device": t.default_device,
            "layouts": dict(t.layouts),
        }
        for t in all_targets()
    ]


def print_targets(described: list[dict[str, Any]]) -> None:
    table = Table(title="targets")
    for column in ("target", "arch", "vector bits", "default device", "layouts", "description"):
        table.add_column(column)
    for t in described:
        layouts = ", ".join(f"{dtype} {layout}" for dtype, layout in t["layouts"].items())
        row = (t["name"], t["arch"], str(t["vector_bits"]), t["default_device"], layouts, t["description"])
        table.add_row(*row)
    wide_console().print(table)


@click.command("ops")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ops_command(as_json: bool) -> None:
    """List ops with inputs, attributes, dtypes and targets."""
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
