"""varsync's Reverb backend against TF-Agents' ReverbVariableContainer, same server, same run.

A Reverb server runs in a separate process. For a 40 MB nest of float32 arrays, each
round does TF-Agents' push + pull and varsync's push + pull (interleaved, so both see
the same machine load); medians and their ratio are printed. Then: ``pull_if_newer``
when nothing changed on 40 MB and 400 MB tables (TF-Agents has no such call: it must pull
the whole nest to read the train step), and the client's peak memory above baseline
during a 400 MB push and pull.

    scripts/loopback-only .venv/bin/python benchmarks/reverb_bench.py [--rounds 15] [--markdown FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from typing import Callable, Dict, List

import numpy as np

MB = 1_000_000


def nest_of(total_bytes: int, layers: int = 8) -> Dict[str, np.ndarray]:
    """A policy-like nest: ``layers`` float32 kernels plus biases, ``total_bytes`` in all."""
    rng = np.random.default_rng(0)
    per_layer = total_bytes // 4 // layers
    width = 1000
    nest = {}
    for i in range(layers):
        nest[f"layer_{i:02d}/kernel"] = rng.standard_normal((per_layer // width - 1, width)).astype(np.float32)
        nest[f"layer_{i:02d}/bias"] = rng.standard_normal(width).astype(np.float32)
    return nest


def _serve(tables: Dict[str, Dict[str, np.ndarray]], ready, stop) -> None:
    from varsync.reverb import serve

    signatures = {name: {k: (v.shape, v.dtype.name) for k, v in nest.items()} for name, nest in tables.items()}
    import varsync

    with serve({n: {k: varsync.Spec(*s) for k, s in sig.items()} for n, sig in signatures.items()}) as server:
        ready.put(server.port)
        stop.wait(3600)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_above_baseline(fn: Callable[[], object]) -> int:
    """Peak resident memory during ``fn`` minus the resident memory before it (sampled every ms)."""
    baseline = rss_bytes()
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak, rss_bytes()) - baseline


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--polls", type=int, default=500)
    parser.add_argument("--markdown", help="also write the results as markdown to this file")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)

    import tensorflow as tf
    from tf_agents.experimental.distributed.reverb_variable_container import (
        ReverbVariableContainer as TFAgentsContainer,
    )

    import varsync
    from varsync.compat.tf_agents import ReverbVariableContainer as DropIn

    small, large = nest_of(40 * MB), nest_of(400 * MB)
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    server = context.Process(target=_serve, args=({"t40": small, "t400": large}, ready, stop), daemon=True)
    server.start()
    lines: List[str] = []
    figures: Dict[str, Dict] = {"rounds": args.rounds, "push_pull": {}, "poll": {}, "memory": {}}

    def report(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        port = ready.get(timeout=300)
        address = f"localhost:{port}"
        payload = sum(a.nbytes for a in small.values())
        report(f"# Reverb: varsync vs TF-Agents' ReverbVariableContainer")
        report()
        report(f"Measured {datetime.date.today()} on {os.cpu_count()} cores, "
               f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB "
               "(shared, noisy machine: medians and same-run ratios). Reverb server in a separate "
               f"process on loopback; nest of {len(small)} float32 arrays, {payload / MB:.1f} MB.")
        report()

        tfa = TFAgentsContainer(address, table_names=("t40",))
        store = varsync.connect(f"reverb://{address}", timeout=60)
        dropin = DropIn(address, table_names=("t40",), timeout=60)
        tf_vars = {k: tf.Variable(v) for k, v in small.items()}

        runs: Dict[str, List[float]] = {"tf-agents": [], "varsync numpy": [], "varsync drop-in (tf.Variable)": []}
        pushes: Dict[str, List[float]] = {k: [] for k in runs}
        pulls: Dict[str, List[float]] = {k: [] for k in runs}
        candidates = {
            "tf-agents": (lambda: tfa.push(tf_vars, "t40"), lambda: tfa.pull("t40")),
            "varsync numpy": (lambda: store.push(small, "t40"), lambda: store.pull("t40")),
            "varsync drop-in (tf.Variable)": (lambda: dropin.push(tf_vars, "t40"), lambda: dropin.pull("t40")),
        }
        for name, (push, pull) in candidates.items():  # warm up: writers, samplers, tf.functions
            push(); pull()
        for _ in range(args.rounds):
            for name, (push, pull) in candidates.items():
                a, b = timed(push), timed(pull)
                pushes[name].append(a)
                pulls[name].append(b)
                runs[name].append(a + b)

        base = statistics.median(runs["tf-agents"])
        report(f"## push + pull, 40 MB ({args.rounds} rounds, interleaved)")
        report()
        report("| client | push median (ms) | pull median (ms) | push+pull median (ms) | spread (IQR, ms) | ratio to TF-Agents | per-round ratios: median (IQR) |")
        report("|---|---:|---:|---:|---:|---:|---:|")
        for name in runs:
            q = statistics.quantiles(runs[name], n=4)
            paired = [mine / theirs for mine, theirs in zip(runs[name], runs["tf-agents"])]
            pq = statistics.quantiles(paired, n=4)
            figures["push_pull"][name] = {
                "push_ms": statistics.median(pushes[name]) * 1e3, "pull_ms": statistics.median(pulls[name]) * 1e3,
                "total_ms": statistics.median(runs[name]) * 1e3, "q1_ms": q[0] * 1e3, "q3_ms": q[2] * 1e3,
                "ratio": statistics.median(runs[name]) / base, "paired_ratio": statistics.median(paired),
                "paired_q1": pq[0], "paired_q3": pq[2]}
            report(f"| {name} | {statistics.median(pushes[name]) * 1e3:.1f} | {statistics.median(pulls[name]) * 1e3:.1f} | "
                   f"{statistics.median(runs[name]) * 1e3:.1f} | {q[0] * 1e3:.1f}-{q[2] * 1e3:.1f} | "
                   f"{statistics.median(runs[name]) / base:.2f} | {statistics.median(paired):.2f} ({pq[0]:.2f}-{pq[2]:.2f}) |")
        report()
        report("Target: varsync's push+pull at most 0.80 of TF-Agents' (the ratio of medians; the per-round "
               "ratios compare the two clients within each round, which cancels the machine's slow drifts).")
        report()

        report(f"## pull_if_newer when nothing changed ({args.polls} polls)")
        report()
        report("| table | varsync pull_if_newer median (ms) | p90 (ms) | TF-Agents' only way: pull (ms) |")
        report("|---|---:|---:|---:|")
        store.push(large, "t400")
        for table in ("t40", "t400"):
            held = store.version(table)
            polls = [timed(lambda: store.pull_if_newer(held, table)) for _ in range(args.polls)]
            full = [timed(lambda: store.pull(table)) for _ in range(3)]
            figures["poll"][table[1:] + " MB"] = {
                "median_ms": statistics.median(polls) * 1e3,
                "p90_ms": statistics.quantiles(polls, n=10)[-1] * 1e3, "pull_ms": statistics.median(full) * 1e3}
            report(f"| {table[1:]} MB | {statistics.median(polls) * 1e3:.3f} | "
                   f"{statistics.quantiles(polls, n=10)[-1] * 1e3:.3f} | {statistics.median(full) * 1e3:.0f} |")
        report()
        report("Target: under 2 ms median on both.")
        report()

        large_bytes = sum(a.nbytes for a in large.values())
        push_peak = peak_above_baseline(lambda: store.push(large, "t400"))
        pulled = []
        pull_peak = peak_above_baseline(lambda: pulled.append(store.pull("t400")))
        report(f"## Client memory, 400 MB nest ({large_bytes / MB:.0f} MB payload)")
        report()
        report("| operation | peak resident memory above baseline (MB) | multiple of payload |")
        report("|---|---:|---:|")
        figures["memory"] = {"payload": large_bytes, "push": push_peak / large_bytes, "pull": pull_peak / large_bytes}
        report(f"| push | {push_peak / MB:.0f} | {push_peak / large_bytes:.2f} |")
        report(f"| pull (result kept) | {pull_peak / MB:.0f} | {pull_peak / large_bytes:.2f} |")
        report()
        store.close()
        dropin.container.close()
    finally:
        stop.set()
        server.join(30)
        if server.is_alive():
            server.kill()
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
