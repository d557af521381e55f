"""Sharded pushes against the all-gather-to-rank-0 baseline (issue 41, item 5;
``docs/sharded.md``, "Measured").

N trainer ranks, each a process holding its rows of every leaf of a bf16 model, publish
one version per round over ``redis://`` in two ways that take turns in the same rounds
(both with ``keep=0`` and no recycling of a retired version's chunks, so that the server
holds one version per table and fits this machine; a redis-server per N):

- **sharded**: every rank ``push_shard``-s its own rows (``varsync.push_shard``);
- **gather**: the ranks ``torch.distributed.gather`` (gloo, over loopback) their rows into
  a new full model on rank 0, which ``push``-es it to a plain table: what a varsync user
  does without sharded tables.

Before each round every rank changes each of its elements (the optimizer step, untimed),
so each push sends the whole model. Per round: the time from the ranks' common start
until the version is visible (``push_shard`` and ``push`` return only then), every rank's
peak resident memory over the round (``VmHWM``, reset through ``/proc/self/clear_refs``
before it) above what it held before its shard was made, and above what it held when the
round started (what the round itself added: one process runs both contenders, so memory
one of them leaves allocated counts in the other's first figure), the bytes Redis received
(``INFO stats``). Then readers: ``pull_slices`` of 1/2 and 1/4 of every leaf's rows
against a ``pull`` of the whole plain table (a reader of a plain table fetches all of
it), with the bytes Redis sent. Medians and interquartile ranges; ratios round by round.

``python -m benchmarks.sharded`` (1 GiB, N = 2 and 4, 5 rounds); ``--smoke``: tiny, N = 2,
one round, for ``make test``. Needs torch (gloo) and a redis-server
(``benchmarks.servers``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.servers import running_redis_server, stop_children

MiB = 1 << 20
ROUND_TIMEOUT = 600.0  # seconds any one round, or a rank's start, may take
WARMUP = 2  # untimed rounds first: a sharded table's two slots are written once each
#: Memory a run needs, in models: Redis holds one version per table (a model per slot of
#: the sharded table, one for the plain table) and a push's new chunks beside the old
#: ones; rank 0 of the baseline holds a whole model, the reader one.
MODELS_OF_MEMORY = 6


def leaf_shape(nbytes: int, leaves: int) -> tuple[int, int]:
    """Rows and columns of each of ``leaves`` bf16 leaves holding ``nbytes`` in all
    (rows divisible by 4, columns even)."""
    per_leaf = nbytes // leaves // 2
    cols = 8192 if per_leaf >= 8192 * 64 else 128
    rows = max(4, per_leaf // cols // 4 * 4)
    return rows, cols


def _memory() -> dict[str, int]:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS


def _rank_main(
    rank: int, world: int, url: str, port: int, shape: tuple[int, int], leaves: int,
    barrier: Any, commands: Any, results: Any,
) -> None:  # fmt: skip
    import ml_dtypes
    import torch.distributed as dist

    import varsync

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rows, cols = shape
    n = rows // world
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    store = varsync.connect(url, timeout=ROUND_TIMEOUT)
    try:
        store.signature("sharded")  # the client made, its imports done
        base = _memory()["VmRSS"]
        mine = [
            (np.arange(n * cols, dtype=np.uint16) + 7 * leaf + rank).view(bf16).reshape(n, cols)
            for leaf in range(leaves)
        ]
        names = harness.leaf_names(leaves)
        ranges = ((rank * n, (rank + 1) * n), (0, cols))
        results.put(("ready", rank))
        while True:
            command, step = commands.get(timeout=ROUND_TIMEOUT)
            if command == "stop":
                return
            for leaf in mine:  # the optimizer step: every element changes
                leaf.view(np.uint16)[...] += 1
            _reset_peak()
            at_start = _memory()["VmRSS"]
            barrier.wait(ROUND_TIMEOUT)
            started = time.monotonic()
            if command == "sharded":
                parts = {name: (ranges, leaf) for name, leaf in zip(names, mine)}
                store.push_shard("sharded", parts, rank=rank, step=step)
            else:
                _gather_and_push(store, dist, rank, world, names, mine, rows, cols, bf16)
            done = time.monotonic()
            peak = _memory()["VmHWM"]
            results.put(("round", (command, rank, started, done, peak - base, peak - at_start)))
    finally:
        store.close()
        dist.destroy_process_group()


def _gather_and_push(
    store: Any, dist: Any, rank: int, world: int, names: list[str], mine: list[np.ndarray],
    rows: int, cols: int, bf16: np.dtype,
) -> None:  # fmt: skip
    """The baseline: every leaf gathered into a new full array on rank 0 (gloo copies
    bytes; a pair of bf16 travels as one float32), which pushes the whole model."""
    import torch

    full = {name: np.empty((rows, cols), bf16) for name in names} if rank == 0 else {}
    n = rows // world
    for name, leaf in zip(names, mine):
        tensor = torch.from_numpy(leaf.view(np.float32))
        into = None
        if rank == 0:
            into = [
                torch.from_numpy(full[name][r * n : (r + 1) * n].view(np.float32))
                for r in range(world)
            ]
        dist.gather(tensor, gather_list=into, dst=0)
    if rank == 0:
        store.push(full, "gathered")
    del full


def measure_world(
    url: str, admin: Any, world: int, shape: tuple[int, int], leaves: int, rounds: int,
    log: Any, warmup: int = WARMUP,
) -> dict[str, Any]:  # fmt: skip
    """Two untimed rounds, then ``rounds`` rounds of both contenders taking turns."""
    import ml_dtypes

    import varsync

    rows, cols = shape
    bf16 = np.dtype(ml_dtypes.bfloat16)
    signature = {name: varsync.Spec((rows, cols), bf16) for name in harness.leaf_names(leaves)}
    admin.flushall()
    with varsync.connect(url, timeout=ROUND_TIMEOUT) as store:
        store.create_sharded_table("sharded", signature, world)
        store.create_table("gathered", signature)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(world)
    commands = [context.Queue() for _ in range(world)]
    results = context.Queue()
    port = free_port()
    children = [
        context.Process(
            target=_rank_main,
            args=(r, world, url, port, shape, leaves, barrier, commands[r], results),
            daemon=True,
        )
        for r in range(world)
    ]
    samples: dict[str, dict[str, list[float]]] = {
        c: {"seconds": [], "peak0": [], "growth0": [], "peak_max": [], "in_bytes": []}
        for c in ("sharded", "gather")
    }
    try:
        for child in children:
            child.start()
        for _ in range(world):
            next_message(results, children, "a rank's start")
        step = 0
        for index in range(1 - warmup, rounds + 1):
            order = ("sharded", "gather") if index % 2 else ("gather", "sharded")
            for command in order:
                step += 1
                before = int(admin.info("stats")["total_net_input_bytes"])
                for queue in commands:
                    queue.put((command, step))
                got = [next_message(results, children, command)[1] for _ in children]
                received = int(admin.info("stats")["total_net_input_bytes"]) - before
                start = min(g[2] for g in got)
                seconds = max(g[3] for g in got) if command == "sharded" else got_rank0(got)[3]
                peaks = {g[1]: g[4] for g in got}
                if index <= 0:
                    continue  # untimed: the first writes of every key, in both slots
                record = samples[command]
                record["seconds"].append(seconds - start)
                record["peak0"].append(peaks[0])
                record["growth0"].append(got_rank0(got)[5])
                record["peak_max"].append(max(peaks.values()))
                record["in_bytes"].append(received)
            if index > 0:
                s, g = samples["sharded"]["seconds"][-1], samples["gather"]["seconds"][-1]
                log(f"N={world} round {index}: sharded {s:.2f} s, gather+push {g:.2f} s")
        for queue in commands:
            queue.put(("stop", 0))
    finally:
        stop_children(children)
    return {"trainers": samples, "readers": measure_readers(url, admin, world, shape, leaves)}


def next_message(results: Any, children: list[Any], what: str) -> Any:
    """The next message from the ranks; an error as soon as any rank died."""
    deadline = time.monotonic() + ROUND_TIMEOUT
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            dead = [c.exitcode for c in children if not c.is_alive()]
            if dead:
                raise RuntimeError(f"{what}: a rank died (exit codes {dead})") from None
    raise RuntimeError(f"{what}: nothing within {ROUND_TIMEOUT:.0f} s")


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def got_rank0(got: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return next(g for g in got if g[1] == 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure_readers(
    url: str, admin: Any, world: int, shape: tuple[int, int], leaves: int, repeat: int = 3
) -> dict[str, dict[str, list[float]]]:
    """A reader's ``pull_slices`` of 1/2 and 1/4 of every leaf's rows, and of all of them;
    a ``pull`` of the plain table, which a reader of 1/k must fetch whole."""
    import varsync

    rows, cols = shape
    names = harness.leaf_names(leaves)

    def rows_of(k: int) -> Callable[[Any], Any]:
        return lambda s: s.pull_slices("sharded", dict.fromkeys(names, ((0, rows // k), (0, cols))))

    reads = {f"sharded 1/{k}": rows_of(k) for k in (1, 2, 4)}
    reads["plain pull"] = lambda s: s.pull("gathered")
    out: dict[str, dict[str, list[float]]] = {k: {"seconds": [], "out_bytes": []} for k in reads}
    with varsync.connect(url, timeout=ROUND_TIMEOUT) as store:
        for fn in reads.values():
            fn(store)  # signatures and layouts cached: only data moves below
        for _ in range(repeat):
            for label, fn in reads.items():
                before = int(admin.info("stats")["total_net_output_bytes"])
                started = time.monotonic()
                fn(store)
                out[label]["seconds"].append(time.monotonic() - started)
                out[label]["out_bytes"].append(
                    int(admin.info("stats")["total_net_output_bytes"]) - before
                )
    return out


def report(results: dict[int, dict[str, Any]], model_bytes: int) -> str:
    lines = [
        "| N | contender | time to a visible version | ratio sharded / gather | rank 0 peak "
        "above its start | rank 0 peak / (model/N) | rank 0 growth in the round | largest "
        "rank peak | Redis in, per round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for world, result in results.items():
        trainers = result["trainers"]
        ratio = harness.paired_ratio(trainers["sharded"]["seconds"], trainers["gather"]["seconds"])
        for contender, record in trainers.items():
            peak0 = harness.summary(record["peak0"])
            seconds = harness.spread_text(harness.summary(record["seconds"]))
            lines.append(
                f"| {world} | {contender} | {seconds} "
                f"| {harness.ratio_text(ratio) if contender == 'sharded' else ''} "
                f"| {peak0['median'] / MiB:.0f} MiB "
                f"({peak0['q1'] / MiB:.0f}–{peak0['q3'] / MiB:.0f}) "
                f"| {peak0['median'] / (model_bytes / world):.2f} "
                f"| {harness.summary(record['growth0'])['median'] / MiB:.0f} MiB "
                f"| {harness.summary(record['peak_max'])['median'] / MiB:.0f} MiB "
                f"| {harness.summary(record['in_bytes'])['median'] / MiB:.0f} MiB |"
            )
    lines += [
        "",
        "| N | read | time | Redis out | of the model |",
        "|---|---|---|---|---|",
    ]
    for world, result in results.items():
        for label, record in result["readers"].items():
            sent = harness.summary(record["out_bytes"])["median"]
            lines.append(
                f"| {world} | {label} | {harness.spread_text(harness.summary(record['seconds']))} "
                f"| {sent / MiB:.1f} MiB | {sent / model_bytes:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[int, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, N = 2, one round")
    parser.add_argument("--mib", type=int, default=1024, help="model size in MiB (bf16)")
    parser.add_argument("--leaves", type=int, default=16)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.smoke:
        args.mib, args.leaves, args.worlds, args.rounds = 1, 4, [2], 1
    shape = leaf_shape(args.mib * MiB, args.leaves)
    model_bytes = shape[0] * shape[1] * 2 * args.leaves
    harness.log(
        f"model: {args.leaves} bf16 leaves of {shape[0]}x{shape[1]}, "
        f"{model_bytes / MiB:.0f} MiB; N = {args.worlds}; {args.rounds} rounds"
    )
    import redis

    results: dict[int, dict[str, Any]] = {}
    for world in args.worlds:
        if available_memory() < MODELS_OF_MEMORY * model_bytes:
            raise SystemExit(
                f"N={world} needs about {MODELS_OF_MEMORY * model_bytes / 2**30:.1f} GiB of "
                f"free memory ({MODELS_OF_MEMORY} models), the machine has "
                f"{available_memory() / 2**30:.1f} GiB available: wait, or pass a smaller --mib"
            )
        # a server per N: what one run's allocator kept is not the next one's
        with running_redis_server() as server, redis.Redis(port=server.port) as admin:
            url = f"{server.url}?keep=0&recycle_from={2 * model_bytes}"
            results[world] = measure_world(
                url, admin, world, shape, args.leaves, args.rounds, harness.log,
                warmup=0 if args.smoke else WARMUP,
            )  # fmt: skip
    print(report(results, model_bytes))
    return results


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
