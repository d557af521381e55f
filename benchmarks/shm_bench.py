"""shm:// push and pull of 40 MB and 400 MB float32 nests, against np.copyto of the same
bytes in the same run (the baseline: a plain in-memory copy into existing arrays).

    .venv/bin/python benchmarks/shm_bench.py [--sizes 40MB,400MB] [--repeats 9] [--json FILE]

Needs varsync-shm installed (pip install -e plugins/varsync-shm). Each repeat runs every
operation once, in turn, so that drift on a noisy machine hits them alike; medians are
printed with their spread (interquartile range) and their ratio to the copy.

Steady state (one writer, readers that do not hold on to pulled arrays; the current
segment and the spare alternate, and both processes keep them mapped):

- copy            np.copyto of every leaf into existing arrays (the baseline)
- push            container.push (refills the spare)
- pull            container.pull: read-only views of the segment (no copy)
- pull + read     pull, then np.copyto of every pulled leaf into existing arrays
- update          container.update: pull and assign into existing arrays
- poll            pull_if_newer(current) when nothing changed (one readlink)

Cold paths (readers hold the two latest versions, so no spare is free):

- push, new segment         allocates, then fills, a new segment
- pull + read, new segment  first pull of that segment: its pages fault in as read
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
import uuid
from typing import Callable, Dict, List

import numpy as np

import varsync

LEAVES = 4


def parse_size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    upper = text.strip().upper()
    for unit, factor in sorted(units.items(), key=lambda item: -len(item[0])):
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


def nest_of(nbytes: int) -> Dict[str, List[np.ndarray]]:
    """A float32 nest of ``nbytes`` bytes: ``LEAVES`` equal layers, random values."""
    rng = np.random.default_rng(0)
    per_leaf = nbytes // 4 // LEAVES
    return {"policy": [rng.standard_normal(per_leaf, dtype=np.float32) for _ in range(LEAVES)]}


def timed(operation: Callable[[], object]) -> float:
    started = time.perf_counter()
    operation()
    return time.perf_counter() - started


def bench(nbytes: int, repeats: int) -> Dict[str, List[float]]:
    values = nest_of(nbytes)
    sources = varsync.flatten(values)
    targets = varsync.unflatten(values, [np.zeros_like(a) for a in sources])
    target_leaves = varsync.flatten(targets)
    store = f"bench-{uuid.uuid4().hex}"
    times: Dict[str, List[float]] = {k: [] for k in (
        "copy", "push", "pull", "pull + read", "update", "poll",
        "push, new segment", "pull + read, new segment")}

    def copy_leaves(src: List[np.ndarray]) -> None:
        for s, d in zip(src, target_leaves):
            np.copyto(d, s)

    with varsync.connect(f"shm://{store}") as container:
        try:
            container.create_table("variables", values)
            for _ in range(3):  # warm up: segments and a spare exist and are mapped
                container.push(values)
                copy_leaves(varsync.flatten(container.pull()))
            for _ in range(repeats):
                gc.collect()
                times["copy"].append(timed(lambda: copy_leaves(sources)))
                times["push"].append(timed(lambda: container.push(values)))
                times["pull"].append(timed(container.pull))
                times["pull + read"].append(
                    timed(lambda: copy_leaves(varsync.flatten(container.pull())))
                )
                times["update"].append(timed(lambda: container.update(targets)))
                version = container.version()
                polls = 1000
                times["poll"].append(
                    timed(lambda: [container.pull_if_newer(version) for _ in range(polls)]) / polls
                )
            for _ in range(repeats):
                held = [container.pull()]
                container.push(values)  # refills the spare
                held.append(container.pull())  # now both segments are held
                times["push, new segment"].append(timed(lambda: container.push(values)))
                times["pull + read, new segment"].append(
                    timed(lambda: copy_leaves(varsync.flatten(container.pull())))
                )
                del held
                gc.collect()
                for _ in range(3):  # back to a steady state before the next repeat
                    container.push(values)
                    copy_leaves(varsync.flatten(container.pull()))
        finally:
            import varsync_shm

            varsync_shm.remove_store(store)
    return times


def quartiles(samples: List[float]) -> List[float]:
    if len(samples) < 2:
        return [samples[0], samples[0]]
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return [q1, q3]


def shown(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="40MB,400MB", help="comma-separated nest sizes")
    parser.add_argument("--repeats", type=int, default=9, help="runs of each operation")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args()
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    print(f"# shm:// vs np.copyto, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{os.cpu_count()} cores, {memory:.0f} GiB, {platform.machine()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}, median of {args.repeats}")
    print()
    print("| nest | operation | median | spread (IQR) | ratio to copy | GB/s |")
    print("|---|---|---|---|---|---|")
    figures: Dict[str, Dict[str, Dict[str, object]]] = {}
    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        samples = bench(nbytes, args.repeats)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        copy = medians["copy"]
        figures[text] = {name: {"median": seconds, "iqr": quartiles(samples[name]), "ratio_to_copy": seconds / copy}
                         for name, seconds in medians.items()}
        for name, seconds in medians.items():
            rate = "" if name == "poll" else f"{nbytes / seconds / 1e9:.2f}"
            q1, q3 = quartiles(samples[name])
            print(f"| {text} | {name} | {shown(seconds)} | {shown(q1)}–{shown(q3)} | "
                  f"{seconds / copy:.2f}x | {rate} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"repeats": args.repeats, "sizes": figures}, out, indent=1)


if __name__ == "__main__":
    main()
