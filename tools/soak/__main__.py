"""``python -m tools.soak``: the command, and the table it prints (see the package's
docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import fault_figures, faulty
from .clean import BACKENDS, soak, summary

COLUMNS = (
    "| backend | pushes | pushes/s | values pulled and checked | unchanged polls | "
    "inconsistent | errors | writer RSS (growth) | max reader RSS growth | "
    "server memory (growth) |"
)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description="Soak: a writer and several readers per "
        "backend, for a bounded time, every pulled value checked (tools/soak/__init__.py).",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="per backend (default 60)")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"comma-separated, from {', '.join(BACKENDS)}",
    )
    parser.add_argument("--readers", type=int, default=3, help="reader processes (default 3)")
    parser.add_argument("--megabytes", type=float, default=4.0, help="size of the nest (default 4)")
    parser.add_argument(
        "--faults",
        choices=("none", "on", "both"),
        default="both",
        help="none: the clean soak; on: with interrupts and lost replies "
        "(see tools/soak/faulty.py); both (default): clean, then faulty",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the faults (default 0)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    args.chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.chosen) - set(BACKENDS))
    if unknown or args.seconds <= 0 or args.readers < 1:
        parser.error(
            f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}"
            if unknown
            else "expected --seconds > 0 and --readers >= 1"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    print(
        f"soak: {args.seconds:g} s per backend, 1 writer and {args.readers} readers, "
        f"{args.megabytes:g} MB nest; {os.cpu_count()} CPUs",
        flush=True,
    )
    rows = []
    for backend in args.chosen:
        if args.faults != "on":
            print(f"  {backend} ...", flush=True)
            rows.append(summary(soak(backend, args.seconds, args.readers, args.megabytes)))
        if args.faults != "none":
            print(f"  {backend} with faults ...", flush=True)
            result = faulty.soak_with_faults(
                backend, args.seconds, args.readers, args.megabytes, args.seed
            )
            rows.append(summary(result))
            fault_figures.summarise(result, rows[-1])
    print_table(rows, with_faults=args.faults != "none")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    failed = any(
        r["inconsistent"] or r["errors"] or not r["caught_up"] or r.get("leaks") for r in rows
    )
    return 1 if failed else 0


def print_table(rows: list[dict[str, Any]], with_faults: bool) -> None:
    print()
    print(COLUMNS + (fault_figures.HEADER if with_faults else ""))
    print(
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
        + ("---:|---:|---:|---|---|---|" if with_faults else "")
    )
    for r in rows:
        in_process = r["backend"] == "memory"  # writer and readers are threads of this process
        print(
            f"| {r['backend']}{' + faults' if r.get('faults') else ''} | {r['pushes']} | "
            f"{r['pushes_per_s']:.0f} | {r['pulls']} | "
            f"{r['polls']} | {r['inconsistent']} | {r['errors']} | "
            f"{r['writer_rss_mib'][0]:.0f} MiB ({r['writer_rss_mib'][1]:+.1f}) | "
            + (
                "(same process) | – |"
                if in_process
                else f"{r['reader_rss_growth_mib']:+.1f} MiB | "
                f"{r['server']}: {r['server_mib'][0]:.0f} MiB ({r['server_mib'][1]:+.1f}) |"
            )
            + (fault_figures.columns(r) if with_faults else "")
        )
    if with_faults:
        print(f"faults: {fault_figures.NOTE}")
    for r in rows:
        name = r["backend"] + (" (faults)" if r.get("faults") else "")
        if not r["caught_up"]:
            print(f"{name}: a reader did not reach the last version")
        if r["ahead_of_label"]:
            print(
                f"{name}: {r['ahead_of_label']} pulls got a value newer than their "
                "version number (a push landed between reading the count and sampling)"
            )
        if r.get("faults"):
            for line in fault_figures.notes(r):
                print(line)
        for problem in r["problems"]:
            print(f"{name}: {problem}")


if __name__ == "__main__":
    sys.exit(main())
