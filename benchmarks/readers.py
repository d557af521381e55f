"""Reader processes pulling one table at once.

- fan-out: 1, 2, 4, 8 readers ``update`` their own arrays from one table on reverb://,
  redis:// and shm://: aggregate throughput, and how much the server's memory grew;
- reader memory: redis-server's growth while readers pull one table through varsync,
  beside as many hand-written redis-py readers ``GET``-ting the same bytes.

The readers are spawned once, with the suite (their imports overlap the servers' start),
and take commands over a queue; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .harness import GB, MB, Sampler, allocated_bytes_under, nest_of, rss_of
from .servers import next_message, running_redis_server, stop_children

TABLE = "variables"
IDLE_LIMIT = 3600.0  # seconds a reader waits for its next command before it exits


@dataclass
class Readers:
    """``counts`` runs of that many readers, each filling its arrays ``pulls`` times."""

    nbytes: int
    counts: list[int]
    pulls: int


@dataclass
class Pulled:
    """What the readers pull: ``kind`` "varsync" (``update`` from ``url``'s ``table``) or
    "redis-py" (``table`` is ``{key: float32 count}``), and the server's memory measures."""

    contender: str
    kind: str
    url: str
    table: Any
    measures: dict[str, Callable[[], int]]


class ReaderProcesses:
    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.commands = [context.Queue() for _ in range(count)]
        self.results, self.go = context.Queue(), context.Event()
        self.children: list[Any] = []
        try:
            for i in range(count):
                args = (str(i), self.commands[i], self.results, self.go)
                child = context.Process(
                    target=reader, args=args, name=f"bench-reader-{i}", daemon=True
                )
                child.start()
                self.children.append(child)
        except BaseException:
            self.stop()
            raise

    def next(self, timeout: float, what: str) -> Any:
        message = next_message(self.results, self.children, timeout, what)
        if message[0] == "error":
            raise RuntimeError(f"reader {message[1]} failed:\n{message[2]}")
        return message

    def wait_up(self) -> None:
        for _ in self.children:
            self.next(300, "readers starting")

    def stop(self) -> None:
        for command in self.commands:
            command.put(None)
        stop_children(self.children, 60)

    def pull(
        self, pulled: Pulled, plan: Readers, log: Callable[[str], None]
    ) -> list[dict[str, Any]]:
        """Every reader connects and fills its arrays once (untimed); then for each count,
        that many fill theirs ``pulls`` times at once while the server's memory is sampled."""
        self._round(pulled, max(plan.counts), 0, {})
        records = []
        for count in plan.counts:
            done, samplers = self._round(pulled, count, plan.pulls, pulled.measures)
            seconds = max(d[3] for d in done) - min(d[2] for d in done)
            delivered = count * plan.pulls * plan.nbytes
            records.append(
                {
                    "contender": pulled.contender,
                    "readers": count,
                    "bytes": plan.nbytes,
                    "aggregate_bytes_per_s": delivered / seconds,
                    "latencies": [t for d in done for t in d[4]],
                    "server_growth": {m: s.growth for m, s in samplers.items()},
                }
            )
            log(
                f"   {pulled.contender}, {count} reader(s) of {plan.nbytes / MB:.3g} MB: "
                f"{delivered / seconds / GB:.2f} GB/s in all, "
                + ", ".join(f"{m} +{s.growth / MB:.1f} MB" for m, s in samplers.items())
            )
        return records

    def _round(
        self, pulled: Pulled, count: int, pulls: int, measures: dict[str, Callable[[], int]]
    ) -> tuple[list[tuple[Any, ...]], dict[str, Sampler]]:
        self.go.clear()
        for i in range(count):
            self.commands[i].put((pulled.kind, pulled.url, pulled.table, pulls))
        for _ in range(count):
            self.next(600, f"{pulled.contender} readers getting ready")
        with contextlib.ExitStack() as stack:
            samplers = {m: stack.enter_context(Sampler(f, 0.005)) for m, f in measures.items()}
            self.go.set()
            done = [self.next(900, f"{pulled.contender} readers pulling") for _ in range(count)]
        return done, samplers


def run(
    processes: ReaderProcesses,
    reverb: tuple[int, str],
    fan: Readers,
    mem: Readers,
    log: Callable[[str], None],
) -> dict[str, list[dict[str, Any]]]:
    """The fan-out, then the reader-memory comparison, on servers of their own:
    ``reverb`` (pid, address of a server holding table "fanout") and a new redis-server."""
    import redis

    import varsync
    import varsync_shm

    shm_name = f"bench-fanout-{uuid.uuid4().hex[:6]}"
    reverb_pid, reverb_address = reverb
    out: dict[str, list[dict[str, Any]]] = {"fanout": [], "reader_memory": []}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running_redis_server())
        admin = stack.enter_context(redis.Redis.from_url(server.url))
        stack.callback(varsync_shm.remove_store, shm_name)
        redis_memory = {
            "server RSS": lambda: rss_of(server.pid),
            "used_memory": lambda: int(admin.info("memory")["used_memory"]),
        }
        shm_bytes = {
            "bytes in /dev/shm": lambda: allocated_bytes_under(varsync_shm.store_path(shm_name))
        }
        fanout = [
            Pulled(
                "reverb",
                "varsync",
                f"reverb://{reverb_address}",
                "fanout",
                {"server RSS": lambda: rss_of(reverb_pid)},
            ),
            Pulled("redis", "varsync", f"{server.url}?namespace=fanout", TABLE, redis_memory),
            Pulled("shm", "varsync", f"shm://{shm_name}", TABLE, shm_bytes),
        ]
        nest = nest_of(fan.nbytes, 4)
        for pulled in fanout:
            with varsync.connect(pulled.url, timeout=300) as store:
                if pulled.contender != "reverb":  # Reverb's tables are the server's
                    store.create_table(pulled.table, nest)
                for _ in range(3 if pulled.contender == "shm" else 1):
                    store.push(nest, pulled.table, skip_unchanged=False)
        for pulled in fanout:
            out["fanout"] += processes.pull(pulled, fan, log)
        nest = nest_of(mem.nbytes, 4)
        with varsync.connect(server.url, namespace="readers", timeout=300) as store:
            store.create_table(TABLE, nest)
            store.push(nest)
        for name, leaf in nest.items():
            admin.set(f"hand:readers:{name}", leaf.tobytes())
        keys = {f"hand:readers:{name}": leaf.size for name, leaf in nest.items()}
        del nest
        for pulled in (
            Pulled("redis", "varsync", f"{server.url}?namespace=readers", TABLE, redis_memory),
            Pulled("redis-py SETs", "redis-py", server.url, keys, redis_memory),
        ):
            out["reader_memory"] += processes.pull(pulled, mem, log)
    return out


# -- in the reader process ---------------------------------------------------------------


def reader(name: str, commands: Any, results: Any, go: Any) -> None:
    """For each ``(kind, url, table, pulls)`` command: connect (once per URL), fill its own
    arrays once untimed, report ready, wait for ``go``, fill them ``pulls`` times, report
    the times. ``None`` ends it; so do ``IDLE_LIMIT`` seconds without a command."""
    clients: dict[str, Any] = {}
    results.put(("up", name))
    try:
        while True:
            try:
                command = commands.get(timeout=IDLE_LIMIT)
            except queue.Empty:
                return
            if command is None:
                return
            kind, url, table, pulls = command
            try:
                if url not in clients:
                    clients[url] = _connect(kind, url)
                fill, _ = _filler(kind, clients[url], table)
                fill()  # warm: connection, mappings, page faults of the arrays
                results.put(("ready", name))
                if not go.wait(600):
                    results.put(("error", name, "no go signal within 600 s"))
                    continue
                started, times = time.monotonic(), []
                for _ in range(pulls):
                    t0 = time.perf_counter()
                    fill()
                    times.append(time.perf_counter() - t0)
                results.put(("done", name, started, time.monotonic(), times))
                del fill  # a reader holds one command's arrays at a time
            except Exception:
                results.put(("error", name, traceback.format_exc()))
    finally:
        for client in clients.values():
            client.close()


def _connect(kind: str, url: str) -> Any:
    if kind == "redis-py":
        import redis

        return redis.Redis.from_url(url, socket_timeout=300)
    import varsync

    return varsync.connect(url, timeout=300)


def _filler(kind: str, client: Any, table: Any) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A call that fills this reader's own arrays with the table's values, and the arrays."""
    if kind == "redis-py":
        arrays = {key: np.empty(count, np.float32) for key, count in table.items()}

        def hand_fill() -> None:
            for key, array in arrays.items():
                np.copyto(array, np.frombuffer(client.get(key), np.float32))

        return hand_fill, arrays
    signature = client.signature(table)
    mine = {name: np.empty(spec.shape, spec.dtype) for name, spec in signature.items()}
    # every leaf, every time: the table does not change between fills, so a delta update
    # (the default) would move nothing after the first
    return (lambda: client.update(mine, table, delta_only=False)), mine
