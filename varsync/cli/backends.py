"""``varsync backends``: every registered backend, where it comes from, and whether its
dependencies import."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from typing import Any, TextIO

import varsync
from varsync.cli.formatting import print_columns


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``backends`` command to the ``commands`` subparsers."""
    backends = commands.add_parser(
        "backends",
        help="list the installed backends",
        description="List every registered backend: its URL scheme, the distribution that "
        "provides it and its version, and whether its dependencies import.",
    )
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    backends.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    entries = varsync.available_backends()
    rows = [
        {
            "scheme": entry.scheme,
            "source": _source_of(entry),
            "target": entry.target,
            "dependencies": "ok" if entry.installed else "missing " + ", ".join(entry.missing),
            "install": "" if entry.installed else entry.install_hint,
            "description": entry.description,
        }
        for entry in entries
    ]
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    if not rows:
        print("no backends registered", file=out)
        return 0
    table = [("SCHEME", "FROM", "DEPENDENCIES", "DESCRIPTION")]
    for row in rows:
        deps = row["dependencies"] + (f" ({row['install']})" if row["install"] else "")
        table.append((row["scheme"] + "://", row["source"], deps, row["description"]))
    print_columns(table, out)
    return 0


def _source_of(entry: varsync.BackendEntry) -> str:
    if entry.source == "built-in":
        return f"varsync {_version_of('varsync') or varsync.__version__} (built-in)"
    return entry.source


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
