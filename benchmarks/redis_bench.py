"""varsync's redis backend against what a user writes by hand, on one redis-server.

For float32 nests of 40 MB and 400 MB (four leaves), on the same fresh redis-server:

- push: ``container.push(nest)`` vs ``r.set(key, leaf.tobytes())`` per leaf with a default
  ``redis.Redis`` (the hand-written way);
- pull: ``container.pull()`` vs ``np.frombuffer(r.get(key), np.float32)`` per leaf;
- the floor: ``np.copyto`` of the same bytes into preallocated arrays, and into fresh ones
  (``np.empty`` + ``np.copyto``: the page faults any pull into new arrays pays);
- ``pull_if_newer`` and ``version`` when nothing changed (median of many calls);
- client peak memory during one 400 MB pull, above the process's baseline, as a multiple
  of the payload (in a fresh child process: peak RSS, ``VmHWM``, minus RSS before);
- server memory growth (``used_memory``, sampled every millisecond) while four reader
  processes pull the 400 MB table at once, as a fraction of the payload.

Medians of ``--repeat`` rounds in which the contenders take turns, with their spread
(interquartile range); a ratio is the median over rounds of varsync's time over the
other's (below 1: varsync is faster). The machine may be shared and noisy: compare ratios
taken in the same run. ``--json FILE`` also writes the figures as JSON.

    .venv/bin/python benchmarks/redis_bench.py            # starts its own redis-server
    .venv/bin/python benchmarks/redis_bench.py --url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import redis

import varsync

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _redis_server import running_redis_server  # noqa: E402

MB = 10**6
SHARES = (0.5, 0.25, 0.2, 0.05)  # four leaves, as a policy network's layers might be


def make_nest(megabytes: int, seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    total = megabytes * MB // 4
    sizes = [int(total * share) for share in SHARES]
    sizes[0] += total - sum(sizes)
    return {f"layer_{i}": rng.standard_normal(n, dtype=np.float32) for i, n in enumerate(sizes)}


def interleaved(runs: Dict[str, Callable[[], Any]], repeat: int) -> Dict[str, List[float]]:
    """Seconds of each run, ``repeat`` rounds, the runs taking turns within each round so
    that a noisy neighbour slows them alike."""
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            started = time.perf_counter()
            result = run()
            times[name].append(time.perf_counter() - started)
            del result
    return times


def quartiles(values: List[float]) -> Tuple[float, float]:
    """The first and third quartiles of ``values``: the spread around the median."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def ratio(times: Dict[str, List[float]], mine: str, other: str) -> float:
    """The median over rounds of ``mine``'s time over ``other``'s."""
    return statistics.median(a / b for a, b in zip(times[mine], times[other]))


def memory_status(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak RSS) of this process, in bytes, from /proc."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> None:
    """Make VmHWM start again from the current RSS (Linux >= 4.0). ``ru_maxrss`` would not
    do: Linux carries it across exec, so a spawned child starts with its parent's peak."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


# -- one size: push, pull, copy, change detection -------------------------------------------


def bench_size(url: str, megabytes: int, repeat: int) -> Dict[str, float]:
    nest = make_nest(megabytes)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    hand = redis.Redis.from_url(url)  # what a user writes: a default client
    keys = {name: f"hand:{namespace}:{name}" for name in nest}
    out: Dict[str, float] = {}
    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.create_table("variables", nest)
        # Warm: connections, scripts, server allocations; and the steady state of a
        # learner that pushes often: from the third push on, a table of 4 MiB or more has a
        # spare version for each push to overwrite in place. The hand-written way gets as
        # many warm-up writes.
        for _ in range(3):
            store.push(nest)
            for name, leaf in nest.items():
                hand.set(keys[name], leaf.tobytes())

        targets = {n: np.empty_like(leaf) for n, leaf in nest.items()}

        def copy_into_fresh_arrays() -> Any:
            copies = {n: np.empty_like(leaf) for n, leaf in nest.items()}
            for n, leaf in nest.items():
                np.copyto(copies[n], leaf)
            return copies

        times = interleaved(
            {
                "varsync push": lambda: store.push(nest),
                "hand push": lambda: [hand.set(keys[n], leaf.tobytes()) for n, leaf in nest.items()],
                "varsync pull": store.pull,
                "hand pull": lambda: {n: np.frombuffer(hand.get(k), np.float32) for n, k in keys.items()},
                "np.copyto (preallocated)": lambda: [np.copyto(targets[n], leaf) for n, leaf in nest.items()],
                "np.copyto (fresh arrays)": copy_into_fresh_arrays,
            },
            repeat,
        )
        out.update({name: statistics.median(values) for name, values in times.items()})
        out.update({f"{name} iqr": quartiles(values) for name, values in times.items()})
        out["push ratio"] = ratio(times, "varsync push", "hand push")
        out["pull ratio"] = ratio(times, "varsync pull", "hand pull")
        out["pull / copyto fresh"] = ratio(times, "varsync pull", "np.copyto (fresh arrays)")

        version = store.version()
        calls = []
        for _ in range(2000):
            started = time.perf_counter_ns()
            assert store.pull_if_newer(version) is None
            calls.append(time.perf_counter_ns() - started)
        out["pull_if_newer unchanged"] = statistics.median(calls) / 1e9
        out["pull_if_newer unchanged iqr"] = tuple(q / 1e9 for q in quartiles(calls))
        calls = []
        for _ in range(2000):
            started = time.perf_counter_ns()
            store.version()
            calls.append(time.perf_counter_ns() - started)
        out["version"] = statistics.median(calls) / 1e9
        out["version iqr"] = tuple(q / 1e9 for q in quartiles(calls))
    hand.delete(*keys.values())
    hand.close()
    return out


# -- client memory: one pull in a fresh process -----------------------------------------------


def _peak_of_one_pull(url: str, namespace: str, kind: str, keys: List[str], report: Any) -> None:
    hand = redis.Redis.from_url(url)
    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.version()  # connected before the baseline
        hand.ping()
        gc.collect()
        reset_peak_rss()
        baseline = memory_status("VmRSS")
        if kind == "varsync":
            pulled: Any = store.pull()
        else:
            pulled = [np.frombuffer(hand.get(k), np.float32) for k in keys]
        peak = memory_status("VmHWM")
        del pulled
    report.put(peak - baseline)


def client_peak(url: str, namespace: str, kind: str, keys: List[str]) -> int:
    context = multiprocessing.get_context("spawn")
    report = context.Queue()
    child = context.Process(target=_peak_of_one_pull, args=(url, namespace, kind, keys, report))
    child.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                return report.get(timeout=1)
            except queue.Empty:
                if not child.is_alive():
                    raise RuntimeError(f"the measuring process died ({child.exitcode})") from None
        raise RuntimeError("the measuring process did not report within 300 s")
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()


# -- server memory: concurrent readers -----------------------------------------------------------


def _read_repeatedly(url: str, namespace: str, kind: str, keys: List[str], go: Any, pulls: int) -> None:
    hand = redis.Redis.from_url(url)
    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.version()
        hand.ping()
        go.wait(60)
        for _ in range(pulls):
            if kind == "varsync":
                pulled: Any = store.pull()
            else:
                pulled = [np.frombuffer(hand.get(k), np.float32) for k in keys]
            del pulled


def server_growth(url: str, namespace: str, kind: str, keys: List[str], readers: int, pulls: int) -> int:
    """The largest rise of the server's used_memory while ``readers`` processes pull."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    children = [
        context.Process(target=_read_repeatedly, args=(url, namespace, kind, keys, go, pulls))
        for _ in range(readers)
    ]
    for child in children:
        child.start()
    admin = redis.Redis.from_url(url)
    time.sleep(3)  # let the children import and connect before the baseline
    baseline = int(admin.info("memory")["used_memory"])
    highest = baseline
    go.set()
    deadline = time.monotonic() + 600
    try:
        while any(c.is_alive() for c in children) and time.monotonic() < deadline:
            highest = max(highest, int(admin.info("memory")["used_memory"]))
            time.sleep(0.001)
    finally:
        for child in children:
            child.join(60)
            if child.is_alive():
                child.kill()
                child.join()
    admin.close()
    return highest - baseline


def bench_memory(url: str, megabytes: int, readers: int) -> Dict[str, float]:
    nest = make_nest(megabytes)
    payload = sum(leaf.nbytes for leaf in nest.values())
    namespace = f"bench-mem-{uuid.uuid4().hex[:8]}"
    hand = redis.Redis.from_url(url)
    keys = [f"hand:{namespace}:{name}" for name in nest]
    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.create_table("variables", nest)
        store.push(nest)
    for key, leaf in zip(keys, nest.values()):
        hand.set(key, leaf.tobytes())
    del nest
    gc.collect()
    out = {
        "client peak, varsync pull": client_peak(url, namespace, "varsync", keys) / payload,
        "client peak, hand pull": client_peak(url, namespace, "hand", keys) / payload,
        f"server growth, {readers} varsync readers": server_growth(url, namespace, "varsync", keys, readers, 2) / payload,
        f"server growth, {readers} hand readers": server_growth(url, namespace, "hand", keys, readers, 2) / payload,
    }
    hand.delete(*keys)
    hand.close()
    return out


# -- report ---------------------------------------------------------------------------------------


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e6:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing redis server (default: start one)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 400], help="MB per nest")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--only-memory", action="store_true")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args()

    figures: Dict[str, Any] = {"repeat": args.repeat, "sizes": {}, "memory": {}}

    def run(url: str) -> None:
        info = redis.Redis.from_url(url).info("server")
        memory_info = redis.Redis.from_url(url).info("memory")
        print(f"# varsync redis benchmark, {time.strftime('%Y-%m-%d %H:%M')}")
        print(
            f"machine: {os.cpu_count()} CPUs, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
            f"{platform.platform()}; Python {platform.python_version()}, numpy {np.__version__}, "
            f"redis-py {redis.__version__}; redis-server {info['redis_version']} "
            f"({memory_info.get('mem_allocator', '?')}); median of {args.repeat} rounds\n"
        )
        for megabytes in [] if args.only_memory else args.sizes:
            results = bench_size(url, megabytes, args.repeat)
            figures["sizes"][megabytes] = results
            print(f"## {megabytes} MB float32 nest (4 leaves)\n")
            print("| operation | median | spread (IQR) | ratio |")
            print("|---|---|---|---|")
            rows: List[Tuple[str, str]] = [
                ("varsync push", f"{results['push ratio']:.2f} x hand"),
                ("hand push", ""),
                ("varsync pull", f"{results['pull ratio']:.2f} x hand, "
                 f"{results['pull / copyto fresh']:.2f} x copyto fresh"),
                ("hand pull", ""),
                ("np.copyto (preallocated)", ""),
                ("np.copyto (fresh arrays)", ""),
                ("pull_if_newer unchanged", ""),
                ("version", ""),
            ]
            for name, ratio in rows:
                q1, q3 = results[f"{name} iqr"]
                print(f"| {name} | {milliseconds(results[name])} | "
                      f"{milliseconds(q1)}–{milliseconds(q3)} | {ratio} |")
            print()
        if not args.skip_memory:
            megabytes = max(args.sizes)
            memory = bench_memory(url, megabytes, args.readers)
            figures["memory"] = {"megabytes": megabytes, "readers": args.readers, **memory}
            print(f"## memory, {megabytes} MB nest\n")
            print("| measure | multiple of the payload |")
            print("|---|---|")
            for name, value in memory.items():
                print(f"| {name} | {value:.3f} |")
            print()

    if args.url:
        run(args.url)
    else:
        with running_redis_server() as server:
            run(server.url)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
