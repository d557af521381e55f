"""Element deltas per block of a sharded table (``docs/sharded.md``, "Element deltas per
block"): N rank processes each hold their rows of a bf16 model; at every step 1 % of each
leaf's elements change (positions and new bit patterns at random: the share of bf16
weights an RL optimizer step changes), and every rank pushes the step to two sharded
tables on one redis-server, in the same rounds, the first turn alternating:

- **elements**: ``push_shard(..., element_deltas=True)``: the changed elements of each
  block;
- **blocks**: ``element_deltas=False``: changed blocks whole (every block, here).

Then a reader ``update``-s numpy bf16 arrays from each table (holding the step before).
Per step: the time from the ranks' common start until the version is visible (the last
rank's ``push_shard`` returns), the bytes each rank handed the backend (varsync's
``metrics=``), the reader's ``update`` time and the bytes the server sent it (``INFO
stats``). Medians and spreads over the steps after the first three (the first two write
each slot whole, the third catches a slot up from whole blocks).

``python -m benchmarks.sharded_elements`` (256 MiB, N = 4, 10 steps); ``--smoke``: tiny,
for ``make test``. Needs a redis-server (``benchmarks.servers``) and ``ml_dtypes``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.servers import next_message, running_redis_server, stop_children
from benchmarks.sharded import bytes_pushed

MiB = 1 << 20
TIMEOUT = 600.0  # seconds any one step may take
TABLES = {"elements": True, "blocks": False}  # table -> element_deltas
SHARE = 0.01  # of the elements that change per step
WARM = 3  # steps before the figures: slots written whole, then one caught up whole


def _rank_main(
    rank: int, world: int, url: str, rows: int, cols: int, leaves: int,
    barrier: Any, commands: Any, results: Any,
) -> None:  # fmt: skip
    """One rank: its rows of every leaf; per ``("step", s, order)`` change 1 % of them and
    push them to each table in ``order``, reporting each push's start, end and bytes."""
    import ml_dtypes
    import prometheus_client

    import varsync

    n = rows // world
    names = harness.leaf_names(leaves)
    rng = np.random.default_rng(rank)
    mine = [rng.integers(0, 1 << 16, (n, cols), np.uint16) for _ in names]
    registry = prometheus_client.CollectorRegistry()
    with varsync.connect(url, timeout=TIMEOUT, metrics=registry) as store:
        ranges = ((rank * n, (rank + 1) * n), (0, cols))
        results.put(("ready", rank))
        while True:
            command, step, order = commands.get(timeout=TIMEOUT)
            if command == "stop":
                return
            changes = np.random.default_rng((rank, step))
            for bits in mine:  # the optimizer step
                flat = bits.reshape(-1)
                at = changes.choice(flat.size, int(flat.size * SHARE), replace=False)
                flat[at] = changes.integers(0, 1 << 16, at.size, np.uint16)
            parts = {
                name: (ranges, bits.view(ml_dtypes.bfloat16)) for name, bits in zip(names, mine)
            }
            report: dict[str, Any] = {"rank": rank}
            for table in order:
                sent = bytes_pushed(registry)
                barrier.wait(TIMEOUT)
                started = time.monotonic()
                store.push_shard(table, parts, rank=rank, step=step, element_deltas=TABLES[table])
                report[table] = (started, time.monotonic(), bytes_pushed(registry) - sent)
            results.put(("pushed", report))


def run(world: int, nbytes: int, leaves: int, steps: int, log: Any) -> dict[str, Any]:
    """``steps`` steps of ``world`` ranks; per step and table the figures above."""
    import ml_dtypes
    import redis

    import varsync

    cols = 2048 if nbytes >= 64 * MiB else 64
    rows = max(world, nbytes // leaves // 2 // cols // world * world)
    names = harness.leaf_names(leaves)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    signature = {name: varsync.Spec([rows, cols], bf16) for name in names}
    figures: dict[str, dict[str, list[float]]] = {
        t: {"visible_s": [], "rank_bytes": [], "update_s": [], "update_bytes": []} for t in TABLES
    }
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running_redis_server())
        admin = stack.enter_context(redis.Redis.from_url(server.url))
        reader = stack.enter_context(varsync.connect(server.url, timeout=TIMEOUT))
        for table in TABLES:
            reader.create_sharded_table(table, signature, world)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(world)
        commands = [context.Queue() for _ in range(world)]
        results = context.Queue()
        children = [
            context.Process(
                target=_rank_main,
                args=(r, world, server.url, rows, cols, leaves, barrier, commands[r], results),
                daemon=True,
            )
            for r in range(world)
        ]
        stack.callback(stop_children, children)
        for child in children:
            child.start()
        for _ in children:
            next_message(results, children, TIMEOUT, "a rank's start")
        into = {t: {name: np.zeros((rows, cols), bf16) for name in names} for t in TABLES}
        for step in range(1, steps + 1):
            order = list(TABLES) if step % 2 else list(TABLES)[::-1]
            for command in commands:
                command.put(("step", step, order))
            reports = [next_message(results, children, TIMEOUT, "a push")[1] for _ in children]
            for table in order:
                before = int(admin.info("stats")["total_net_output_bytes"])
                started = time.perf_counter()
                assert reader.update(into[table], table) == step
                seconds = time.perf_counter() - started
                sent = int(admin.info("stats")["total_net_output_bytes"]) - before
                visible = max(r[table][1] for r in reports) - min(r[table][0] for r in reports)
                rank_bytes = max(r[table][2] for r in reports)
                size = harness.size_label
                log(
                    f"| {step} | {table} | {visible * 1e3:.0f} ms | {size(rank_bytes)} "
                    f"| {seconds * 1e3:.0f} ms | {size(sent)} |"
                )
                if step > WARM:
                    row = figures[table]
                    row["visible_s"].append(visible)
                    row["rank_bytes"].append(rank_bytes)
                    row["update_s"].append(seconds)
                    row["update_bytes"].append(sent)
            for name in names:  # both readers hold the same step, bit for bit
                assert into["elements"][name].tobytes() == into["blocks"][name].tobytes(), name
        for command in commands:
            command.put(("stop", 0, []))
    return {"world": world, "model_bytes": rows * cols * 2 * leaves, "figures": figures}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256, help="model size")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--leaves", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny, for make test")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mib, args.world, args.leaves, args.steps = 1, 2, 4, WARM + 2
    about = harness.machine()
    print(f"machine: {about['cpu']}, {about['cores']} cores, load {about['load_average']}")
    print(f"{args.mib} MiB bf16 in {args.leaves} leaves, {args.world} ranks, {SHARE:.0%} changed")
    print("\n| step | table | visible | bytes per rank | update | update bytes |")
    print("|---|---|---|---|---|---|")
    result = run(args.world, args.mib * MiB, args.leaves, args.steps, print)
    figures = result["figures"]
    print("\n| measure | elements | blocks | elements / blocks, per step |")
    print("|---|---|---|---|")
    for measure in ("visible_s", "rank_bytes", "update_s", "update_bytes"):
        mine, other = figures["elements"][measure], figures["blocks"][measure]
        if not mine:
            continue
        ratio = harness.ratio_text(harness.paired_ratio(mine, other))
        if measure.endswith("_s"):
            a, b = (harness.spread_text(harness.summary(x)) for x in (mine, other))
        else:
            a, b = (harness.size_label(float(np.median(x))) for x in (mine, other))
        print(f"| {measure} | {a} | {b} | {ratio} |")
    print(f"load average at the end: {os.getloadavg()}")
    return result


if __name__ == "__main__":
    main()
