"""``varsync serve reverb``: a Reverb server with the tables of spec files, until
interrupted; and reading those spec files (``.json`` or ``.npz``)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from varsync import _nest as nest_lib
from varsync import _signature as sig
from varsync._errors import ConfigurationError, SignatureError, VarsyncError
from varsync.cli.usage import PROG, UsageError, one_line

#: Seconds between wake-ups of ``serve``'s main thread while it waits for a signal.
_WAKE_EVERY = 0.25


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``serve`` command, and its engine ``reverb``, to the ``commands``
    subparsers."""
    serve = commands.add_parser(
        "serve",
        help="run a server for varsync tables",
        description="Run a storage server holding varsync tables until interrupted "
        "(Ctrl-C or SIGTERM).",
    )
    engines = serve.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    reverb = engines.add_parser(
        "reverb",
        help="a Reverb server (needs varsync[reverb])",
        description="Run a Reverb server with one variables table per --table, configured "
        "as varsync and TF-Agents expect, until interrupted. Prints its URL on the first "
        "line of stdout. Reverb listens on every interface and has no authentication: "
        "run it on a private network.",
        epilog="SPEC_FILE: a .json file, either varsync's signature format "
        '(varsync.signature.to_json) or a nest of {"shape": [...], "dtype": "..."} '
        'leaves, e.g. {"policy": [{"shape": [64, 32], "dtype": "float32"}], '
        '"train_step": {"shape": [], "dtype": "int64"}}; or a .npz file of example '
        "arrays (its keys become a dict). See docs/cli.md.",
    )
    reverb.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="P",
        help="port to listen on (default 0: a free port, printed)",
    )
    reverb.add_argument(
        "--table",
        dest="tables",
        action="append",
        required=True,
        metavar="NAME=SPEC_FILE",
        help="a table and its spec file; repeatable",
    )
    reverb.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="restore the latest checkpoint from DIR at start and write checkpoints there",
    )
    reverb.set_defaults(run=run_reverb)


def load_spec_file(path: str) -> Any:
    """The signature in a spec file: ``.json`` (varsync's signature format, or a nest of
    ``{"shape": [...], "dtype": "..."}`` leaves) or ``.npz`` (example arrays by key)."""
    if not os.path.isfile(path):
        raise ConfigurationError(f"spec file {path!r} does not exist")
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as data:
                example = {key: data[key] for key in data.files}
        except (OSError, ValueError) as exc:  # not a zip; object arrays (never unpickled)
            raise SignatureError(
                f"spec file {path!r} is not a .npz of numeric arrays: {exc}"
            ) from None
        if not example:
            raise SignatureError(f"spec file {path!r} holds no arrays")
        return sig.signature_of(example)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        document = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SignatureError(
            f"spec file {path!r} is not JSON ({exc}); expected .json or .npz"
        ) from None
    if isinstance(document, dict) and document.get("format") == "varsync.signature":
        return sig.from_json(text)
    return sig.signature_of(_specs_from_json(document, (), path))


def _specs_from_json(node: Any, path: nest_lib.Path, source: str) -> Any:
    where = nest_lib.format_path(path)
    if isinstance(node, dict) and set(node) == {"shape", "dtype"}:
        try:
            return sig.Spec(node["shape"], node["dtype"])
        except (SignatureError, TypeError) as exc:
            raise SignatureError(f"spec file {source!r}, leaf {where}: {exc}") from None
    if isinstance(node, dict):
        return {
            key: _specs_from_json(value, path + (("key", key),), source)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [
            _specs_from_json(value, path + (("index", i),), source) for i, value in enumerate(node)
        ]
    raise SignatureError(
        f"spec file {source!r}: {where} is {json.dumps(node)}; expected a leaf "
        '{"shape": [...], "dtype": "..."}, an object or a list'
    )


def _parse_tables(values: Sequence[str], prog: str) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--table {value!r}: expected NAME=SPEC_FILE", prog)
        if name in tables:
            raise UsageError(f"--table {name!r} is given twice", prog)
        tables[name] = load_spec_file(path)
    return tables


def run_reverb(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    tables = _parse_tables(args.tables, f"{PROG} serve reverb")
    try:
        from varsync.reverb_server import serve
    except ImportError as exc:  # MissingDependencyError is an ImportError too
        raise ConfigurationError(
            f"cannot serve Reverb: {one_line(exc)}"
            if isinstance(exc, VarsyncError)
            else f"cannot serve Reverb: varsync.reverb_server is unavailable ({exc}); install "
            'Reverb support with: pip install "varsync[reverb]"'
        ) from exc
    stop = threading.Event()
    server = None
    previous = {
        signum: signal.signal(signum, lambda *_: stop.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        server = serve(tables, port=args.port, checkpoint_dir=args.checkpoint_dir)
        print(server.url, file=out, flush=True)
        print(
            f"{PROG}: serving {len(tables)} table(s) ({', '.join(tables)}) at {server.url}; "
            "Ctrl-C or SIGTERM stops it",
            file=err,
            flush=True,
        )
        # Woken by the signal handlers above, which run in this thread only: the kernel
        # may deliver SIGINT to one of Reverb's gRPC threads, which leaves this thread
        # asleep in an untimed wait, so it wakes to let a pending handler run.
        while not stop.wait(_WAKE_EVERY):
            pass
    finally:
        if server is not None:
            server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"{PROG}: stopped {server.url}", file=err)
    return 0
