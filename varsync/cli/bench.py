"""``varsync bench``: push, pull, update, pull_if_newer and version timed against a
backend, with random values of a given size."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, TextIO

import numpy as np

import varsync
from varsync import _nest as nest_lib
from varsync import _signature as sig
from varsync._config import redact
from varsync._errors import ConfigurationError
from varsync.cli.formatting import duration, human_size, parse_size, print_columns
from varsync.cli.usage import PROG, UsageError

BENCH_TABLE = "varsync_bench"


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``bench`` command to the ``commands`` subparsers."""
    bench = commands.add_parser(
        "bench",
        help="time push, pull and poll against a backend",
        description=f"Time push, pull, pull_if_newer (nothing newer) and version against "
        f"URL, with a float32 nest of --size bytes in table {BENCH_TABLE!r} (created if "
        "missing; an existing table is used with its own signature, and overwritten).",
    )
    bench.add_argument("url", metavar="URL", help="e.g. memory://bench, redis://localhost:6379/0")
    bench.add_argument(
        "--size",
        type=parse_size,
        default=parse_size("40MB"),
        help="bytes per push: 40MB (default), 400MB, 1GiB, 512KB, 1000, ...",
    )
    bench.add_argument("--rounds", type=int, default=5, help="pushes and pulls to time (default 5)")
    bench.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed rounds first, so engines that reuse memory reach their "
        "steady state (default 3)",
    )
    bench.add_argument(
        "--polls",
        type=int,
        default=1000,
        help="pull_if_newer calls per round to average (default 1000)",
    )
    bench.add_argument(
        "--table",
        "-t",
        default=BENCH_TABLE,
        metavar="T",
        help=f"the table to use (default {BENCH_TABLE}); it is overwritten",
    )
    bench.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds any one call may take (default 60)",
    )
    bench.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.set_defaults(run=run)


def bench_values(signature: Any, rng: np.random.Generator) -> Any:
    """Random values of ``signature``."""

    def leaf(spec: sig.Spec) -> np.ndarray:
        if spec.dtype.kind == "f":
            return rng.standard_normal(spec.shape).astype(spec.dtype)
        if spec.dtype.kind == "c":
            return (rng.standard_normal(spec.shape) + 1j).astype(spec.dtype)
        return rng.integers(0, 2, size=spec.shape).astype(spec.dtype)

    return nest_lib.map_structure(leaf, signature)


def bench_signature(nbytes: int) -> dict[str, sig.Spec]:
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


def _time_polls(store: varsync.VariableContainer, table: str, polls: int) -> tuple[float, float]:
    """The mean time of a ``pull_if_newer`` with nothing newer, and of a ``version``."""
    version = store.version(table)
    newer = _timed(lambda: [store.pull_if_newer(version, table) for _ in range(polls)]) / polls
    return newer, _timed(lambda: [store.version(table) for _ in range(polls)]) / polls


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
        times: dict[str, list[float]] = {
            "push": [],
            "pull": [],
            "update": [],
            "pull_if_newer": [],
            "version": [],
        }
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
                newer_s, version_s = _time_polls(store, args.table, args.polls)
                times["pull_if_newer"].append(newer_s)
                times["version"].append(version_s)
                progress.step("poll")
        finally:
            progress.close()
        backend = type(store.backend).__name__
    results: dict[str, dict[str, Any]] = {
        name: {
            "median_s": statistics.median(samples),
            "min_s": min(samples),
            "max_s": max(samples),
            "bytes_per_s": nbytes / statistics.median(samples)
            if name in ("push", "pull", "update")
            else None,
        }
        for name, samples in times.items()
    }
    if args.json:
        json.dump(
            {
                "url": redact(args.url),
                "backend": backend,
                "table": args.table,
                "nbytes": nbytes,
                "leaves": len(specs),
                "rounds": args.rounds,
                "polls": args.polls,
                "results": results,
            },
            out,
            indent=2,
        )
        out.write("\n")
        return 0
    print(
        f"{redact(args.url)} ({backend}): {note}; {nbytes} bytes ({human_size(nbytes)}) "
        f"in {len(specs)} leaves, {args.rounds} rounds",
        file=out,
    )
    rows = [("OPERATION", "MEDIAN", "MIN", "MAX", "THROUGHPUT")]
    for name, result in results.items():
        rate = result["bytes_per_s"]
        label = name if rate is not None else f"{name} (nothing newer, mean of {args.polls})"
        if name == "version":
            label = f"version (mean of {args.polls})"
        rows.append(
            (
                label,
                duration(result["median_s"]),
                duration(result["min_s"]),
                duration(result["max_s"]),
                f"{rate / 1e9:.2f} GB/s" if rate else "",
            )
        )
    print_columns(rows, out)
    print(
        f"note: table {args.table!r} stays at {redact(args.url)} "
        f"({human_size(nbytes)}); delete it with the engine's own tools",
        file=out,
    )
    return 0
