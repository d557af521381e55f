"""A large redis:// pull against the wire's floor, and where its time goes
(``python -m benchmarks.redis_pull``; issue 40's "pull at least 50 % of raw loopback
TCP at 1 GB").

In the same rounds, turns rotating: the nest's bytes over a raw loopback TCP socket pair
(:class:`benchmarks.groups.LoopbackFloor`, the Redis group's floor: receive into arrays
written before), ``pull()`` whose arrays reuse an earlier pull's memory (the default,
``reuse_pulled``: the steady state of ``params = pull()``) and ``pull()`` into new memory
(``reuse_pulled=0``: the first pull, or a caller that holds its last two). Each timed
call also reads the redis-server's CPU and minor page faults (``/proc/<pid>/stat``).

Then a few more pulls with timers around the client's stages (:mod:`varsync._backends.
redis.wire`): sending each chunk's ``GET`` (whose wall time includes the time the client
is preempted by the server it wakes: on a busy machine the scheduler runs the server on
the client's core), the wait for a reply's first line, the payload's ``recv_into``, the
CRC-32, and the rest (Python). Those pulls are not among the timed ones.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .groups import LoopbackFloor
from .harness import MB, nest_of, paired_ratio, spread_text, summary, timed
from .servers import running_redis_server

STAGES = ("request sent", "first line", "payload", "CRC-32")


def server_cpu(pid: int) -> tuple[float, int]:
    """The process's CPU seconds (user + system) and minor page faults so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


@contextlib.contextmanager
def stage_timers(into: dict[str, float]) -> Iterator[None]:
    """Wall seconds spent in each of the wire's :data:`STAGES` while the block runs,
    added to ``into`` (and ``preempted``: involuntary context switches while sending)."""
    from varsync._backends.redis import wire

    patched = [  # (owner, attribute, stage)
        (wire.Wire, "flush", "request sent"),
        (wire.Wire, "bulk_length", "first line"),
        (wire.Wire, "readinto", "payload"),
        (wire, "checksum", "CRC-32"),
    ]
    originals = [getattr(owner, attribute) for owner, attribute, _ in patched]

    def timer(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any) -> Any:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
            started = time.perf_counter()
            try:
                return call(*args)
            finally:
                into[name] = into.get(name, 0.0) + time.perf_counter() - started
                if name == "request sent":
                    after = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
                    into["preempted"] = into.get("preempted", 0) + after - before

        return timed_call

    try:
        for (owner, attribute, name), original in zip(patched, originals):
            setattr(owner, attribute, timer(name, original))
        yield
    finally:
        for (owner, attribute, _), original in zip(patched, originals):
            setattr(owner, attribute, original)


def main(argv: list[str] | None = None) -> None:
    import varsync

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1000, help="nest size in MB (1000: 1 GB)")
    parser.add_argument("--leaves", type=int, default=16, help="float32 leaves (16)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (7)")
    parser.add_argument("--profiled", type=int, default=4, help="pulls with stage timers (4)")
    args = parser.parse_args(argv)
    nbytes = args.mb * MB
    nest = nest_of(nbytes, args.leaves)
    targets = {name: np.ones_like(leaf) for name, leaf in nest.items()}  # touched: no faults
    print(f"{args.leaves} float32 leaves, {nbytes / MB:.0f} MB; load {os.getloadavg()}")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running_redis_server())
        store = stack.enter_context(varsync.connect(server.url, namespace="pull", timeout=300))
        fresh = stack.enter_context(
            varsync.connect(f"{server.url}?reuse_pulled=0", namespace="pull", timeout=300)
        )
        store.create_table("t", nest)
        store.push(nest, "t")
        floor = LoopbackFloor(nest, into=targets)
        stack.callback(floor.close)
        ops: list[tuple[str, Callable[[], Any]]] = [
            ("tcp loopback", floor.transfer),
            ("pull, memory reused", lambda: store.pull("t")),
            ("pull, new memory", lambda: fresh.pull("t")),
        ]
        for _, call in ops:  # warm: connections, scripts, the reused buffers
            call()
        times: dict[str, list[float]] = {name: [] for name, _ in ops}
        cpu: dict[str, list[float]] = {name: [] for name, _ in ops}
        faults: dict[str, list[float]] = {name: [] for name, _ in ops}
        for number in range(args.rounds):
            gc.collect()
            shift = number % len(ops)
            for name, call in ops[shift:] + ops[:shift]:
                cpu_before, faults_before = server_cpu(server.pid)
                times[name].append(timed(call))
                cpu_after, faults_after = server_cpu(server.pid)
                cpu[name].append(cpu_after - cpu_before)
                faults[name].append(faults_after - faults_before)
        stages: dict[str, float] = {}
        wall = client = 0.0
        for _ in range(args.profiled):
            gc.collect()
            with stage_timers(stages):
                started, on_cpu = time.perf_counter(), time.thread_time()
                store.pull("t")
                wall += time.perf_counter() - started
                client += time.thread_time() - on_cpu
    print(f"load at the end {os.getloadavg()}")
    print("| contender | time | throughput | % of the floor | server CPU | server faults |")
    print("|---|---|---|---|---|---|")
    floor_times = times["tcp loopback"]
    for name, samples in times.items():
        spread = summary(samples)
        share = "–"
        if name != "tcp loopback":
            ratio = paired_ratio(floor_times, samples)
            low, high = 100 * ratio["q1"], 100 * ratio["q3"]
            share = f"{100 * ratio['median']:.0f} % ({low:.0f}–{high:.0f})"
        print(
            f"| {name} | {spread_text(spread)} | {nbytes / spread['median'] / 1e9:.2f} GB/s "
            f"| {share} | {summary(cpu[name])['median'] * 1e3:.0f} ms "
            f"| {summary(faults[name])['median']:.0f} |"
        )
    count = max(args.profiled, 1)
    print(f"\nStages of {args.profiled} pulls (memory reused), per pull:")
    print(f"  wall {wall / count * 1e3:.0f} ms, client thread on CPU {client / count * 1e3:.0f} ms")
    for name in STAGES:
        seconds = stages.get(name, 0.0) / count
        share = 100 * seconds * count / max(wall, 1e-9)
        print(f"  {name:14s} {seconds * 1e3:6.0f} ms  {share:3.0f} %")
    rest = wall - sum(stages.get(name, 0.0) for name in STAGES)
    print(f"  {'other':14s} {rest / count * 1e3:6.0f} ms  {100 * rest / max(wall, 1e-9):3.0f} %")
    print(f"  preempted while sending a request: {stages.get('preempted', 0) / count:.0f} times")


if __name__ == "__main__":
    main()
