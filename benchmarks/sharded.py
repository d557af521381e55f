"""Sharded pushes against the all-gather-to-rank-0 baseline (issue 41, item 5;
``docs/sharded.md``, "Measured").

N trainer ranks, each a process holding its rows of every leaf of a bf16 model, publish
one version over ``redis://`` in two ways (both with ``keep=0`` and no recycling of a
retired version's chunks, so that the server holds one version per table and fits this
machine; a redis-server per N):

- **sharded**: every rank ``push_shard``-s its own rows (``varsync.push_shard``);
- **gather**: the ranks ``torch.distributed.gather`` (gloo, over loopback) their rows into
  a new full model on rank 0, which ``push``-es it to a plain table: what a varsync user
  does without sharded tables.

Both without element deltas (``element_deltas=False``): every element changes, so a patch
would give up, and the copy a push keeps to diff against would add a part to each rank's
memory (a model to rank 0's).

The contenders never share a process: per round, a fresh set of N rank processes runs
the one, then another fresh set the other (the first turn alternating from round to
round, so that both see the same machine and a ratio within a round means something), so
that what one left allocated cannot count in the other's memory. Each set pushes twice,
every element of every rank changed before each push (the optimizer step, untimed): a
first push that opens the connections (and gloo's), untimed, then the timed one. Per
round: the time from the ranks' common start until the version is visible
(``push_shard`` and ``push`` return only then); every rank's peak resident memory over
both pushes (``VmHWM``, reset through ``/proc/self/clear_refs`` once its shard is made)
above what it held after its imports and connections, before its shard was made, and
above what it held with its shard made (what pushing costs beyond holding the shard);
the bytes each rank handed to the backend (varsync's own counters, ``metrics=``: Redis
6.2 counts only per server), and the bytes the server received (``INFO stats``). Then
readers: ``pull_slices`` of 1/2 and 1/4 of every leaf's rows against a ``pull`` of the
whole plain table (a reader of a plain table fetches all of it), with the bytes Redis
sent. Medians and interquartile ranges; ratios round by round.

``python -m benchmarks.sharded`` (1 GiB, N = 2 and 4, 5 rounds after an untimed one;
``--mib`` for another size); ``--smoke``: tiny, N = 2, one round, for ``make test``.
Needs torch (gloo) and a redis-server (``benchmarks.servers``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import queue
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.servers import running_redis_server, stop_children

MiB = 1 << 20
ROUND_TIMEOUT = 600.0  # seconds any one push, or a rank's start, may take
WARMUP = 1  # untimed rounds first: the server's first writes of every key
PUSHES = 2  # per set of rank processes: one that opens the connections, the timed one
CONTENDERS = ("sharded", "gather")
TABLES = {"sharded": "sharded", "gather": "gathered"}
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


def bytes_pushed(registry: Any) -> int:
    """The bytes of arrays this process's container handed to its backend, all tables."""
    return int(
        sum(
            sample.value
            for metric in registry.collect()
            for sample in metric.samples
            if sample.name == "varsync_bytes_pushed_total"
        )
    )


def _shard(rank: int, world: int, shape: tuple[int, int], leaves: int) -> list[np.ndarray]:
    """Rank ``rank``'s rows of every leaf, made in place (no temporary left behind in the
    allocator's heap to count as the push's memory)."""
    import ml_dtypes

    rows, cols = shape
    n = rows // world
    mine = []
    for leaf in range(leaves):
        bits = np.arange(n * cols, dtype=np.uint16)
        bits += 7 * leaf + rank
        mine.append(bits.view(ml_dtypes.bfloat16).reshape(n, cols))
    return mine


def _rank_main(
    contender: str, rank: int, world: int, url: str, port: int, shape: tuple[int, int],
    leaves: int, barrier: Any, commands: Any, results: Any,
) -> None:  # fmt: skip
    """One rank of one contender: connect, make its shard, then push it on every
    ``("push", step)`` command until ``("stop", _)``, reporting each push."""
    import prometheus_client

    import varsync

    rows, cols = shape
    n = rows // world
    names = harness.leaf_names(leaves)
    registry = prometheus_client.CollectorRegistry()
    with contextlib.ExitStack() as stack:
        dist: Any = None  # torch.distributed, for the gather's ranks only
        if contender == "gather":
            import torch.distributed

            dist = torch.distributed
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
            )
            stack.callback(dist.destroy_process_group)
        store = stack.enter_context(varsync.connect(url, timeout=ROUND_TIMEOUT, metrics=registry))
        store.signature(TABLES[contender])  # the client made, its imports done
        base = _memory()["VmRSS"]
        mine = _shard(rank, world, shape, leaves)
        held = _memory()["VmRSS"]
        _reset_peak()
        ranges = ((rank * n, (rank + 1) * n), (0, cols))
        results.put(("ready", rank))
        while True:
            command, step = commands.get(timeout=ROUND_TIMEOUT)
            if command == "stop":
                return
            for leaf in mine:  # the optimizer step: every element changes
                leaf.view(np.uint16)[...] += 1
            sent = bytes_pushed(registry)
            barrier.wait(ROUND_TIMEOUT)
            started = time.monotonic()
            if dist is None:
                parts = {name: (ranges, leaf) for name, leaf in zip(names, mine)}
                store.push_shard("sharded", parts, rank=rank, step=step, element_deltas=False)
            else:
                _gather_and_push(store, dist, rank, world, names, mine, rows, cols)
            done = time.monotonic()
            peak = _memory()["VmHWM"]
            results.put(
                (
                    "pushed",
                    {
                        "rank": rank,
                        "started": started,
                        "done": done,
                        "shard": held - base,
                        "over_base": peak - base,
                        "over_shard": peak - held,
                        "sent": bytes_pushed(registry) - sent,
                    },
                )
            )


def _gather_and_push(
    store: Any, dist: Any, rank: int, world: int, names: list[str], mine: list[np.ndarray],
    rows: int, cols: int,
) -> None:  # fmt: skip
    """The baseline: every leaf gathered into a new full array on rank 0 (gloo copies
    bytes; a pair of bf16 travels as one float32), which pushes the whole model without
    element deltas, as the sharded ranks push their parts."""
    import torch

    full = {name: np.empty((rows, cols), mine[0].dtype) for name in names} if rank == 0 else {}
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
        store.push(full, "gathered", element_deltas=False)
    del full


def run_ranks(
    contender: str, url: str, admin: Any, world: int, shape: tuple[int, int], leaves: int,
    steps: Iterator[int],
) -> dict[str, Any]:  # fmt: skip
    """A fresh set of ``world`` rank processes, all ``contender``, pushing ``PUSHES``
    times (steps from ``steps``); the last push: its seconds from the ranks' common start
    until the version was visible, the bytes Redis received, and every rank's record."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(world)
    commands = [context.Queue() for _ in range(world)]
    results = context.Queue()
    port = free_port()
    children = [
        context.Process(
            target=_rank_main,
            args=(contender, r, world, url, port, shape, leaves, barrier, commands[r], results),
            daemon=True,
        )
        for r in range(world)
    ]
    try:
        for child in children:
            child.start()
        for _ in range(world):
            next_message(results, children, f"{contender}: a rank's start")
        for _ in range(PUSHES):
            step = next(steps)
            before = int(admin.info("stats")["total_net_input_bytes"])
            for command in commands:
                command.put(("push", step))
            got = [next_message(results, children, contender)[1] for _ in children]
            received = int(admin.info("stats")["total_net_input_bytes"]) - before
        for command in commands:
            command.put(("stop", 0))
    finally:
        stop_children(children)
    ranks = sorted(got, key=lambda g: int(g["rank"]))
    start = min(g["started"] for g in ranks)
    # the version is visible when push_shard returns on every rank; when push returns on 0
    done = max(g["done"] for g in ranks) if contender == "sharded" else ranks[0]["done"]
    return {"seconds": done - start, "in_bytes": received, "ranks": ranks}


def measure_world(
    url: str, admin: Any, world: int, shape: tuple[int, int], leaves: int, rounds: int,
    log: Any, warmup: int = WARMUP,
) -> dict[str, Any]:  # fmt: skip
    """``warmup`` untimed rounds, then ``rounds`` rounds: in each, a fresh set of rank
    processes per contender, the first turn alternating."""
    import ml_dtypes

    import varsync

    rows, cols = shape
    bf16 = np.dtype(ml_dtypes.bfloat16)
    signature = {name: varsync.Spec((rows, cols), bf16) for name in harness.leaf_names(leaves)}
    admin.flushall()
    with varsync.connect(url, timeout=ROUND_TIMEOUT) as store:
        store.create_sharded_table("sharded", signature, world)
        store.create_table("gathered", signature)
    samples: dict[str, dict[str, Any]] = {
        c: {"seconds": [], "in_bytes": [], "ranks": {r: rank_samples() for r in range(world)}}
        for c in CONTENDERS
    }
    steps = itertools.count(1)
    for index in range(1 - warmup, rounds + 1):
        order = CONTENDERS if index % 2 else CONTENDERS[::-1]
        turns = {c: run_ranks(c, url, admin, world, shape, leaves, steps) for c in order}
        if index <= 0:
            continue  # untimed: the server's first writes of every key
        for contender, turn in turns.items():
            record = samples[contender]
            record["seconds"].append(turn["seconds"])
            record["in_bytes"].append(turn["in_bytes"])
            for got in turn["ranks"]:
                for key, values in record["ranks"][got["rank"]].items():
                    values.append(got[key])
        s, g = turns["sharded"], turns["gather"]
        log(
            f"N={world} round {index}: sharded {s['seconds']:.2f} s, gather+push "
            f"{g['seconds']:.2f} s; rank 0 peak over its shard "
            f"{s['ranks'][0]['over_shard'] / MiB:.0f} / {g['ranks'][0]['over_shard'] / MiB:.0f} MiB"
        )
    return {"trainers": samples, "readers": measure_readers(url, admin, world, shape, leaves)}


def rank_samples() -> dict[str, list[float]]:
    return {"shard": [], "over_base": [], "over_shard": [], "sent": []}


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


def mib_text(nbytes: float) -> str:
    return f"{nbytes / MiB:.0f} MiB" if abs(nbytes) >= 10 * MiB else f"{nbytes / MiB:.1f} MiB"


def report(results: dict[int, dict[str, Any]], model_bytes: int) -> str:
    def mib(values: list[float]) -> str:
        return mib_text(harness.summary(values)["median"])

    lines = [
        "| N | contender | time to a visible version | ratio sharded / gather | rank 0 peak "
        "over its baseline | as × model/N | rank 0 peak over its shard | largest peak over "
        "a shard | Redis in, per round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for world, result in results.items():
        trainers = result["trainers"]
        ratio = harness.paired_ratio(trainers["sharded"]["seconds"], trainers["gather"]["seconds"])
        for contender, record in trainers.items():
            rank0 = record["ranks"][0]
            over_base = harness.summary(rank0["over_base"])
            largest = max(
                harness.summary(r["over_shard"])["median"] for r in record["ranks"].values()
            )
            lines.append(
                f"| {world} | {contender} "
                f"| {harness.spread_text(harness.summary(record['seconds']))} "
                f"| {harness.ratio_text(ratio) if contender == 'sharded' else ''} "
                f"| {over_base['median'] / MiB:.0f} MiB "
                f"({over_base['q1'] / MiB:.0f}–{over_base['q3'] / MiB:.0f}) "
                f"| {over_base['median'] / (model_bytes / world):.2f} "
                f"| {mib(rank0['over_shard'])} | {mib_text(largest)} "
                f"| {mib(record['in_bytes'])} |"
            )
    lines += [
        "",
        "| N | contender | rank | its shard (resident) | peak over its baseline | peak over "
        "its shard | bytes handed to Redis |",
        "|---|---|---|---|---|---|---|",
    ]
    for world, result in results.items():
        for contender, record in result["trainers"].items():
            for rank, r in record["ranks"].items():
                lines.append(
                    f"| {world} | {contender} | {rank} | {mib(r['shard'])} "
                    f"| {mib(r['over_base'])} | {mib(r['over_shard'])} | {mib(r['sent'])} |"
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
