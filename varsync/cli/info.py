"""``varsync info``: the tables at a URL, each one's version, size and signature as a
tree."""

from __future__ import annotations

import argparse
import collections.abc
import json
from typing import Any, TextIO

import varsync
from varsync import _nest as nest_lib
from varsync import _signature as sig
from varsync._config import redact
from varsync.cli.formatting import count, human_size


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``info`` command to the ``commands`` subparsers."""
    info = commands.add_parser(
        "info",
        help="show tables, signatures, versions and sizes",
        description="Show the tables at URL: each one's current version, size in bytes and "
        "signature as a tree (paths, dtypes, shapes, sizes).",
    )
    info.add_argument("url", metavar="URL", help="e.g. reverb://localhost:8000, shm://training")
    info.add_argument("--table", "-t", metavar="T", help="only this table")
    info.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the server (default 10)",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a tree")
    info.set_defaults(run=run)


def signature_tree(signature: Any) -> list[str]:
    """A signature as tree lines: one per container and per leaf, leaves with their dtype,
    shape and size in bytes."""
    if isinstance(signature, sig.Spec):
        return [f"<root>  {_leaf_text(signature)}"]
    lines: list[str] = []
    _tree(signature, "", lines)
    return lines or ["(no leaves)"]


def _leaf_text(spec: sig.Spec) -> str:
    size = count(spec.nbytes, "byte", "bytes")
    if spec.nbytes >= 1024:
        size += f" ({human_size(spec.nbytes)})"
    return f"{spec.dtype.name}  {spec.shape}  {size}"


def _label(entry: tuple[str, Any]) -> str:
    kind, item = entry
    if kind == "index":
        return f"[{item}]"
    if kind == "field":
        return f".{item}"
    return str(item) if isinstance(item, str) and item and item.isprintable() else repr(item)


def _kind_of(node: Any) -> str:
    if isinstance(node, collections.abc.Mapping):
        return "dict"
    if nest_lib.is_namedtuple(node):
        return type(node).__name__
    return f"{type(node).__name__}[{len(node)}]"


def _tree(node: Any, prefix: str, lines: list[str]) -> None:
    children = nest_lib.children(node)
    for index, (entry, child) in enumerate(children):
        last = index == len(children) - 1
        branch, extension = ("└── ", "    ") if last else ("├── ", "│   ")
        if isinstance(child, sig.Spec):
            lines.append(f"{prefix}{branch}{_label(entry)}  {_leaf_text(child)}")
        else:
            lines.append(f"{prefix}{branch}{_label(entry)}  ({_kind_of(child)})")
            _tree(child, prefix + extension, lines)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    with varsync.connect(args.url, timeout=args.timeout) as store:
        names = [args.table] if args.table else store.tables()
        infos = [store.table_info(name) for name in names]
        backend = type(store.backend).__name__
    where = redact(args.url)
    if args.json:
        document = {
            "url": where,
            "backend": backend,
            "tables": [
                {
                    "name": info.name,
                    "version": info.version,
                    "nbytes": info.nbytes,
                    "leaves": [
                        {
                            "path": nest_lib.format_path(path),
                            "dtype": spec.dtype.name,
                            "shape": list(spec.shape),
                            "nbytes": spec.nbytes,
                        }
                        for path, spec in nest_lib.flatten_with_paths(info.signature)
                    ],
                    "signature": json.loads(sig.to_json(info.signature)),
                    "details": info.details,
                }
                for info in infos
            ],
        }
        json.dump(document, out, indent=2, default=str)
        out.write("\n")
        return 0
    print(f"{where}  ({backend}, {len(infos)} table{'s' if len(infos) != 1 else ''})", file=out)
    for info in infos:
        leaves = len(nest_lib.flatten(info.signature))
        state = "empty" if info.version == 0 else f"version {info.version}"
        size = f"{info.nbytes} bytes"
        if info.nbytes >= 1024:
            size += f" ({human_size(info.nbytes)})"
        print(
            f"\ntable {info.name!r}: {state}, {size}, {count(leaves, 'leaf', 'leaves')}", file=out
        )
        for line in signature_tree(info.signature):
            print(f"  {line}", file=out)
        if info.details:
            details = ", ".join(f"{k}={_detail(v)}" for k, v in sorted(info.details.items()))
            print(f"  details: {details}", file=out)
    return 0


def _detail(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_detail(v) for v in value) + "]"
    if isinstance(value, collections.abc.Mapping):
        return "{" + " ".join(f"{k}={_detail(v)}" for k, v in value.items()) + "}"
    return str(value)
