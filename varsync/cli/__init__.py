"""The ``varsync`` command: list backends, inspect tables, serve Reverb, benchmark.

    varsync backends                          installed backends and their dependencies
    varsync info URL [--table T]              tables, signatures, versions, sizes
    varsync serve reverb --port P --table NAME=SPEC_FILE ...
                                              a Reverb server, until interrupted
    varsync bench URL [--size 40MB]           push / pull / poll timings
    varsync watch URL [--interval S] [--table T ...]
                                              a live view: versions, push rates, readers

Results go to stdout; errors are one line on stderr and a non-zero exit status (1 for a
failure, 2 for a command line that does not parse). ``--traceback`` shows the whole
traceback instead. See docs/cli.md.

Each command is a module of this package (``backends``, ``info``, ``serve``, ``bench``,
``watch``)
that adds its own options; ``usage`` holds the errors, ``formatting`` sizes and columns.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import varsync
from varsync.cli import backends, bench, info, serve, watch
from varsync.cli.formatting import parse_size
from varsync.cli.info import signature_tree
from varsync.cli.serve import load_spec_file
from varsync.cli.usage import PROG, Parser, UsageError, one_line

__all__ = ["main", "parse_size", "load_spec_file", "signature_tree"]


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Inspect, serve, benchmark and watch varsync tables.",
        epilog="Run 'varsync COMMAND --help' for a command's options. Docs: docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {varsync.__version__}")
    parser.add_argument(
        "--traceback", action="store_true", help="on an error, show the whole traceback"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (backends, info, serve, bench, watch):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``varsync`` command with ``argv`` (default: ``sys.argv[1:]``); return the
    exit status."""
    out, err = sys.stdout, sys.stderr
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines are noise here
    parser = _build_parser()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            raise UsageError("a command is required: backends, info, serve, bench or watch", PROG)
        return int(args.run(args, out, err) or 0)
    except UsageError as exc:
        print(f"{exc.prog}: error: {exc} (see '{exc.prog} --help')", file=err)
        return 2
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=err)
        return 130
    except Exception as exc:
        if args is not None and args.traceback:
            traceback.print_exc(file=err)
        else:
            print(f"{PROG}: error: {one_line(exc)}", file=err)
        return 1
