"""The ``varsync`` command: list backends, inspect tables, serve Reverb, benchmark.

    varsync backends                          installed backends and their dependencies
    varsync info URL [--table T]              tables, signatures, versions, sizes
    varsync serve reverb --port P --table NAME=SPEC_FILE ...
                                              a Reverb server, until interrupted
    varsync bench URL [--size 40MB]           push / pull / poll timings

Results go to stdout; errors are one line on stderr and a non-zero exit status (1 for a
failure, 2 for a command line that does not parse). ``--traceback`` shows the whole
traceback instead. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import collections.abc
import importlib.metadata
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

import varsync
from varsync import nest as nest_lib
from varsync import signature as sig
from varsync.config import redact
from varsync.errors import ConfigurationError, SignatureError, VarsyncError

__all__ = ["main", "parse_size", "load_spec_file", "signature_tree"]

PROG = "varsync"
BENCH_TABLE = "varsync_bench"


# -- command line ----------------------------------------------------------------------


class UsageError(Exception):
    """The command line does not parse; ``str`` is the one-line reason."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.prog)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Inspect, serve and benchmark varsync tables.",
        epilog="Run 'varsync COMMAND --help' for a command's options. Docs: docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {varsync.__version__}")
    parser.add_argument(
        "--traceback", action="store_true", help="on an error, show the whole traceback"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    backends = commands.add_parser(
        "backends",
        help="list the installed backends",
        description="List every registered backend: its URL scheme, the distribution that "
        "provides it and its version, and whether its dependencies import.",
    )
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    backends.set_defaults(run=_run_backends)

    info = commands.add_parser(
        "info",
        help="show tables, signatures, versions and sizes",
        description="Show the tables at URL: each one's current version, size in bytes and "
        "signature as a tree (paths, dtypes, shapes, sizes).",
    )
    info.add_argument("url", metavar="URL", help="e.g. reverb://localhost:8000, shm://training")
    info.add_argument("--table", "-t", metavar="T", help="only this table")
    info.add_argument("--timeout", type=float, default=10.0, metavar="S",
                      help="seconds to wait for the server (default 10)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a tree")
    info.set_defaults(run=_run_info)

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
        "(varsync.signature.to_json) or a nest of {\"shape\": [...], \"dtype\": \"...\"} "
        "leaves, e.g. {\"policy\": [{\"shape\": [64, 32], \"dtype\": \"float32\"}], "
        "\"train_step\": {\"shape\": [], \"dtype\": \"int64\"}}; or a .npz file of example "
        "arrays (its keys become a dict). See docs/cli.md.",
    )
    reverb.add_argument("--port", type=int, default=0, metavar="P",
                        help="port to listen on (default 0: a free port, printed)")
    reverb.add_argument("--table", dest="tables", action="append", required=True,
                        metavar="NAME=SPEC_FILE", help="a table and its spec file; repeatable")
    reverb.add_argument("--checkpoint-dir", metavar="DIR",
                        help="restore the latest checkpoint from DIR at start and write "
                        "checkpoints there")
    reverb.set_defaults(run=_run_serve_reverb)

    bench = commands.add_parser(
        "bench",
        help="time push, pull and poll against a backend",
        description=f"Time push, pull, pull_if_newer (nothing newer) and version against "
        f"URL, with a float32 nest of --size bytes in table {BENCH_TABLE!r} (created if "
        "missing; an existing table is used with its own signature, and overwritten).",
    )
    bench.add_argument("url", metavar="URL", help="e.g. memory://bench, redis://localhost:6379/0")
    bench.add_argument("--size", type=parse_size, default=parse_size("40MB"),
                       help="bytes per push: 40MB (default), 400MB, 1GiB, 512KB, 1000, ...")
    bench.add_argument("--rounds", type=int, default=5, help="pushes and pulls to time (default 5)")
    bench.add_argument("--warmup", type=int, default=3,
                       help="untimed rounds first, so engines that reuse memory reach their "
                       "steady state (default 3)")
    bench.add_argument("--polls", type=int, default=1000,
                       help="pull_if_newer calls per round to average (default 1000)")
    bench.add_argument("--table", "-t", default=BENCH_TABLE, metavar="T",
                       help=f"the table to use (default {BENCH_TABLE}); it is overwritten")
    bench.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="seconds any one call may take (default 60)")
    bench.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="show a progress bar on stderr (default: when stderr is a terminal)")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.set_defaults(run=_run_bench)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``varsync`` command with ``argv`` (default: ``sys.argv[1:]``); return the
    exit status."""
    out, err = sys.stdout, sys.stderr
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines are noise here
    parser = _build_parser()
    args: Optional[argparse.Namespace] = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            raise UsageError("a command is required: backends, info, serve or bench", PROG)
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
            print(f"{PROG}: error: {_one_line(exc)}", file=err)
        return 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, VarsyncError):
        text = f"{type(exc).__name__}: {text}"
    return text


# -- sizes -------------------------------------------------------------------------------

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30,
}


def parse_size(text: str) -> int:
    """``"40MB"`` -> 40_000_000, ``"1GiB"`` -> 2**30, ``"512"`` -> 512 (bytes)."""
    cleaned = str(text).strip().replace("_", "").upper()
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number):].strip()
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; expected bytes like 40MB, 400MB, 1GiB, 512KB or 1000"
        )
    return int(value * _UNITS[unit])


def human_size(nbytes: int) -> str:
    """``41943040`` -> ``"40.0 MiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# -- varsync backends ------------------------------------------------------------------------


def _source_of(entry: varsync.BackendEntry) -> str:
    if entry.source == "built-in":
        return f"varsync {_version_of('varsync') or varsync.__version__} (built-in)"
    return entry.source


def _version_of(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_backends(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
    _print_columns(table, out)
    return 0


def _print_columns(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        print("  ".join(cells).rstrip(), file=out)


# -- varsync info ---------------------------------------------------------------------------


def signature_tree(signature: Any) -> List[str]:
    """A signature as tree lines: one per container and per leaf, leaves with their dtype,
    shape and size in bytes."""
    if isinstance(signature, sig.Spec):
        return [f"<root>  {_leaf_text(signature)}"]
    lines: List[str] = []
    _tree(signature, "", lines)
    return lines or ["(no leaves)"]


def _leaf_text(spec: sig.Spec) -> str:
    size = _count(spec.nbytes, "byte", "bytes")
    if spec.nbytes >= 1024:
        size += f" ({human_size(spec.nbytes)})"
    return f"{spec.dtype.name}  {spec.shape}  {size}"


def _label(entry: Tuple[str, Any]) -> str:
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


def _tree(node: Any, prefix: str, lines: List[str]) -> None:
    children = nest_lib.children(node)
    for index, (entry, child) in enumerate(children):
        last = index == len(children) - 1
        branch, extension = ("└── ", "    ") if last else ("├── ", "│   ")
        if isinstance(child, sig.Spec):
            lines.append(f"{prefix}{branch}{_label(entry)}  {_leaf_text(child)}")
        else:
            lines.append(f"{prefix}{branch}{_label(entry)}  ({_kind_of(child)})")
            _tree(child, prefix + extension, lines)


def _run_info(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
        size = f"{info.nbytes} bytes" + (f" ({human_size(info.nbytes)})" if info.nbytes >= 1024 else "")
        print(f"\ntable {info.name!r}: {state}, {size}, {_count(leaves, 'leaf', 'leaves')}",
              file=out)
        for line in signature_tree(info.signature):
            print(f"  {line}", file=out)
        if info.details:
            details = ", ".join(f"{k}={_detail(v)}" for k, v in sorted(info.details.items()))
            print(f"  details: {details}", file=out)
    return 0


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _detail(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_detail(v) for v in value) + "]"
    if isinstance(value, collections.abc.Mapping):
        return "{" + " ".join(f"{k}={_detail(v)}" for k, v in value.items()) + "}"
    return str(value)


# -- varsync serve reverb -----------------------------------------------------------------------


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
            raise SignatureError(f"spec file {path!r} is not a .npz of numeric arrays: {exc}") from None
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
        return {key: _specs_from_json(value, path + (("key", key),), source)
                for key, value in node.items()}
    if isinstance(node, list):
        return [_specs_from_json(value, path + (("index", i),), source)
                for i, value in enumerate(node)]
    raise SignatureError(
        f"spec file {source!r}: {where} is {json.dumps(node)}; expected a leaf "
        '{"shape": [...], "dtype": "..."}, an object or a list'
    )


def _parse_tables(values: Sequence[str], prog: str) -> Dict[str, Any]:
    tables: Dict[str, Any] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--table {value!r}: expected NAME=SPEC_FILE", prog)
        if name in tables:
            raise UsageError(f"--table {name!r} is given twice", prog)
        tables[name] = load_spec_file(path)
    return tables


def _run_serve_reverb(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    tables = _parse_tables(args.tables, f"{PROG} serve reverb")
    try:
        from varsync.reverb import serve
    except ImportError as exc:  # MissingDependencyError is an ImportError too
        raise ConfigurationError(
            f"cannot serve Reverb: {_one_line(exc)}"
            if isinstance(exc, VarsyncError)
            else f"cannot serve Reverb: varsync.reverb is unavailable ({exc}); install "
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
        stop.wait()  # woken by the signal handlers above
    finally:
        if server is not None:
            server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"{PROG}: stopped {server.url}", file=err)
    return 0


# -- varsync bench ----------------------------------------------------------------------------


def bench_values(signature: Any, rng: np.random.Generator) -> Any:
    """Random values of ``signature``."""
    def leaf(spec: sig.Spec) -> np.ndarray:
        if spec.dtype.kind == "f":
            return rng.standard_normal(spec.shape).astype(spec.dtype)
        if spec.dtype.kind == "c":
            return (rng.standard_normal(spec.shape) + 1j).astype(spec.dtype)
        return rng.integers(0, 2, size=spec.shape).astype(spec.dtype)

    return nest_lib.map_structure(leaf, signature)


def bench_signature(nbytes: int) -> Dict[str, sig.Spec]:
    """Four float32 layers of ``nbytes`` in all (rounded down to whole floats)."""
    floats = max(nbytes // 4, 1)
    sizes = [floats // 4 + (1 if i < floats % 4 else 0) for i in range(4)]
    return {f"layer_{i}": sig.Spec((size,), "float32") for i, size in enumerate(sizes)}


class _Progress:
    """A one-line progress bar on stderr: ``bench [#####     ] 5/10 pull``."""

    def __init__(self, stream: TextIO, total: int, enabled: bool) -> None:
        self.stream, self.total, self.enabled, self.done = stream, total, enabled, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            filled = int(30 * self.done / self.total)
            bar = "#" * filled + " " * (30 - filled)
            self.stream.write(f"\rbench [{bar}] {self.done}/{self.total} {label:<14}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


def _timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _run_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.rounds < 1 or args.polls < 1 or args.warmup < 0:
        raise UsageError(
            "--rounds and --polls must be at least 1, --warmup at least 0", f"{PROG} bench"
        )
    show = err.isatty() if args.progress is None else args.progress
    with varsync.connect(args.url, timeout=args.timeout) as store:
        if args.table in store.tables():
            signature = store.signature(args.table)
            note = f"existing table {args.table!r}"
            if not sig.same_structure(signature, bench_signature(args.size)):
                note += " (its own signature: --size does not apply)"
        else:
            if not type(store.backend).supports_create_table:
                raise ConfigurationError(
                    f"{redact(args.url)} has no table {args.table!r} and its backend cannot "
                    "create tables; start a server with one (e.g. varsync serve reverb "
                    f"--table {args.table}=SPEC_FILE) or pass --table with an existing table"
                )
            signature = store.create_table(args.table, bench_signature(args.size))
            note = f"table {args.table!r} created"
        specs = nest_lib.flatten(signature)
        nbytes = sum(spec.nbytes for spec in specs)
        values = bench_values(signature, np.random.default_rng(0))
        targets = nest_lib.map_structure(lambda s: np.zeros(s.shape, s.dtype), signature)
        progress = _Progress(err, args.rounds * 4, show)
        times: Dict[str, List[float]] = {"push": [], "pull": [], "update": [],
                                         "pull_if_newer": [], "version": []}
        try:
            for _ in range(args.warmup):
                store.push(values, table=args.table)
                store.update(targets, table=args.table)
            for _ in range(args.rounds):
                times["push"].append(_timed(lambda: store.push(values, table=args.table)))
                progress.step("push")
                times["pull"].append(_timed(lambda: store.pull(args.table)))
                progress.step("pull")
                times["update"].append(_timed(lambda: store.update(targets, table=args.table)))
                progress.step("update")
                version = store.version(args.table)
                times["pull_if_newer"].append(_timed(
                    lambda: [store.pull_if_newer(version, args.table) for _ in range(args.polls)]
                ) / args.polls)
                times["version"].append(_timed(
                    lambda: [store.version(args.table) for _ in range(args.polls)]
                ) / args.polls)
                progress.step("poll")
        finally:
            progress.close()
        backend = type(store.backend).__name__
    results = {
        name: {
            "median_s": statistics.median(samples),
            "min_s": min(samples),
            "max_s": max(samples),
            "bytes_per_s": nbytes / statistics.median(samples)
            if name in ("push", "pull", "update") else None,
        }
        for name, samples in times.items()
    }
    if args.json:
        json.dump({"url": redact(args.url), "backend": backend, "table": args.table,
                   "nbytes": nbytes, "leaves": len(specs), "rounds": args.rounds,
                   "polls": args.polls, "results": results}, out, indent=2)
        out.write("\n")
        return 0
    print(f"{redact(args.url)} ({backend}): {note}; {nbytes} bytes ({human_size(nbytes)}) "
          f"in {len(specs)} leaves, {args.rounds} rounds", file=out)
    rows = [("OPERATION", "MEDIAN", "MIN", "MAX", "THROUGHPUT")]
    for name, result in results.items():
        rate = result["bytes_per_s"]
        label = name if rate is not None else f"{name} (nothing newer, mean of {args.polls})"
        if name == "version":
            label = f"version (mean of {args.polls})"
        rows.append((label, _duration(result["median_s"]), _duration(result["min_s"]),
                     _duration(result["max_s"]), f"{rate / 1e9:.2f} GB/s" if rate else ""))
    _print_columns(rows, out)
    print(f"note: table {args.table!r} stays at {redact(args.url)} "
          f"({human_size(nbytes)}); delete it with the engine's own tools", file=out)
    return 0


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
