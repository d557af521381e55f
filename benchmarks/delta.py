"""The delta group ("move only what changed"): what a push, a pull and an
update of a nest that changed in part cost on memory://, redis:// and shm://, in bytes
moved and in time, beside the whole transfers they replace.

Stages, each over the three backends taking turns in the same rounds (the backends'
order rotated every round, the reader's calls reversed every other round), a writer
and a reader container per backend in this process:

- ``frozen90``: ``nbytes`` (100 MB) in 10 leaves that never change
  (90 % of the bytes) and 5 that all change before every push (10 %). Per round: the
  writer's ``push`` (skip_unchanged on, the default), then the reader's
  ``pull_if_newer(v, held=nest)``, ``update(targets)`` (numpy arrays) and a whole
  ``pull()`` of the same version.
- ``one_of_50``: 50 leaves of ``nbytes / 50`` (2 MB); the same one changes before
  every push. ``one_of_50_rotating``: a different one every push.
- ``all_changed``: the ``frozen90`` layout with every leaf changed before every push,
  pushed with skip_unchanged on and with ``skip_unchanged=False`` (the pre-delta path: a
  plain whole write) to two tables.

Bytes moved per call: on redis://, the group's own server's ``INFO stats`` around it
(:class:`ServerBytes`); on shm://, the backend's ``details()`` counters of the bytes its
partial pushes copied and its delta pulls read, plus whole writes' and reads' arrays;
on memory:// (and wherever no counter exists), the arrays crossing the Backend protocol
(:class:`Meter`), which are recorded for every backend too. A backend without
``supports_leaf_versions`` runs the core's fallback (whole reads and writes); each
backend's mode is recorded.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from varsync._metrics import leaf_bytes

from .frameworks import _import_problem, _version
from .harness import MB, machine, size_label

Nest = dict[str, np.ndarray]
BACKENDS = ("memory", "redis", "shm")
WHOLE_PUSH = "push, skip_unchanged=False"
WHOLE_UPDATE = "update, delta_only=False"


@dataclass
class DeltaPlan:
    """Sizes and rounds of the group."""

    nbytes: int = 100 * MB
    leaves: int = 50  # the one_of_50 stages
    rounds: int = 15
    push_rounds: int = 25  # all_changed: its ratio's target (1.05) is within the noise
    warm: int = 2
    rotating: bool = True  # also the one_of_50 stage with a different leaf each push


def plan_for(smoke: bool, quick: bool) -> DeltaPlan:
    if smoke:
        return DeltaPlan(
            nbytes=1 * MB,
            rounds=2,
            push_rounds=2,
            warm=1,
        )
    if quick:
        return DeltaPlan(
            nbytes=10 * MB,
            rounds=3,
            push_rounds=3,
            warm=1,
        )
    return DeltaPlan()


# -- bytes --------------------------------------------------------------------------------


class Meter:
    """The bytes of the arrays crossing one backend instance's protocol: handed to
    ``write`` / ``write_leaves``, returned by ``read`` / ``read_leaves`` (a ``None`` leaf,
    one the caller holds, counts nothing), and the seconds spent in those calls. Wraps
    the instance's methods, not its class; a call made from inside another counts once."""

    def __init__(self, backend: Any) -> None:
        self.whole = 0  # write and read
        self.leaves = 0  # write_leaves and read_leaves
        self.seconds = 0.0  # inside the calls: what the rest of a push or pull is not
        self._depth = 0
        writes = ("write", "write_leaves", "write_patches")
        for name in (*writes, "read", "read_leaves", "read_patches"):
            if hasattr(backend, name):
                setattr(backend, name, self._wrapped(name, getattr(backend, name)))

    @property
    def total(self) -> int:
        return self.whole + self.leaves

    def _wrapped(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            started = time.perf_counter()
            try:
                result = method(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - started
            if self._depth == 0:
                counted = _arrays_bytes(name, args, kwargs, result)
                if name in ("write", "read"):
                    self.whole += counted
                else:
                    self.leaves += counted
            return result

        return call


def _arrays_bytes(name: str, args: Sequence[Any], kwargs: dict[str, Any], result: Any) -> int:
    if name == "write":
        arrays = args[1] if len(args) > 1 else kwargs.get("arrays", ())
    elif name in ("write_leaves", "write_patches"):
        given = args[1] if len(args) > 1 else kwargs.get("leaves", {})
        arrays = list(given.values())
        if name == "write_patches":  # the patches' own bytes too
            patches = args[2] if len(args) > 2 else kwargs.get("patches", {})
            return sum(int(a.nbytes) for a in arrays) + sum(map(len, patches.values()))
    else:  # read: (head, arrays); read_leaves, read_patches: (head, leaf versions, leaves)
        arrays = result[-1] or ()
    return sum(leaf_bytes(a) for a in arrays)


class ServerBytes:
    """Bytes a redis-server received and sent, from its ``INFO stats``: the group's own
    server, so everything it counts between two readings is the benchmark's."""

    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=60)
        self.overhead = 0
        self.overhead = int(statistics.median(self.since(self.reading()) for _ in range(5)))
        self.version = str(self.client.info("server").get("redis_version", "?"))

    def reading(self) -> int:
        stats = self.client.info("stats")
        return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])

    def since(self, before: int) -> int:
        """Bytes in and out since ``before``, less one INFO's reply and request."""
        return self.reading() - before - self.overhead

    def close(self) -> None:
        self.client.close()


@contextmanager
def fresh_store(name: str, prefix: str) -> Iterator[tuple[str, ServerBytes | None]]:
    """A fresh store of backend ``name`` (``memory``, ``redis``, ``shm``), named from
    ``prefix``: its URL and, for redis://, the byte counter of its own server, which is
    stopped on the way out (an shm:// store is removed)."""
    if name == "redis":
        from .servers import running_redis_server

        with running_redis_server() as server:
            counter = ServerBytes(server.url)
            try:
                yield server.url, counter
            finally:
                counter.close()
    elif name == "shm":
        import varsync_shm

        shm = f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            yield f"shm://{shm}", None
        finally:
            varsync_shm.remove_store(shm)
    elif name == "memory":
        yield f"memory://{prefix}-{uuid.uuid4().hex[:8]}", None
    else:
        raise SystemExit(f"no store {name!r}: expected memory, redis or shm")


SHM_COUNTERS = ("leaf_bytes_written", "leaf_bytes_read")


@dataclass
class Side:
    """One backend's writer and readers (``whole``: the one whose updates assign every
    leaf, the pre-delta update), and how their bytes are counted."""

    name: str
    writer: Any
    reader: Any
    whole: Any
    meters: list[Meter]
    server: ServerBytes | None = None

    @property
    def leaf_versions(self) -> bool:
        return bool(type(self.writer.backend).supports_leaf_versions)

    def _counters(self, tables: Sequence[str]) -> int | None:
        total, found = 0, False
        for container in (self.writer, self.reader, self.whole):
            for table in tables:
                details = container.backend.details(table)
                for key in SHM_COUNTERS:
                    if key in details:
                        total, found = total + int(details[key]), True
        return total if found else None

    def bytes_source(self, table: str) -> str:
        if self.server is not None:
            return "server"
        if self.name == "shm" and self._counters([table]) is not None:
            return "shm counters"
        return "protocol"

    def reading(self, tables: Sequence[str]) -> tuple[int, int]:
        """(the basis of bytes moved, protocol bytes) now."""
        protocol = sum(m.total for m in self.meters)
        if self.server is not None:
            return self.server.reading(), protocol
        counters = self._counters(tables) if self.name == "shm" else None
        if counters is not None:
            return counters + sum(m.whole for m in self.meters), protocol
        return protocol, protocol

    def moved_since(self, before: tuple[int, int], tables: Sequence[str]) -> tuple[int, int]:
        if self.server is not None:
            return self.server.since(before[0]), sum(m.total for m in self.meters) - before[1]
        after = self.reading(tables)
        return after[0] - before[0], after[1] - before[1]

    def close(self) -> None:
        for container in (self.whole, self.reader, self.writer):
            container.close()
        if self.server is not None:
            self.server.close()


def clocked(call: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``call`` took, with the garbage collector off, and what it returned."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        started = time.perf_counter()
        result = call()
        return time.perf_counter() - started, result
    finally:
        if enabled:
            gc.enable()


# -- workloads ----------------------------------------------------------------------------


@dataclass
class Workload:
    key: str
    title: str
    nest: Nest
    changing: Callable[[int], list[str]]  # round number -> the leaves changed before its push


def frozen90(nbytes: int, seed: int = 0) -> tuple[Nest, list[str]]:
    """10 leaves holding 90 % of ``nbytes`` (``frozen0``-``frozen9``) and 5 holding 10 %
    (``live0``-``live4``), float32, random."""
    rng = np.random.default_rng(seed)
    nest = {
        f"frozen{i}": rng.standard_normal(max(1, nbytes * 9 // 100 // 4), dtype=np.float32)
        for i in range(10)
    }
    live = [f"live{i}" for i in range(5)]
    nest.update(
        {name: rng.standard_normal(max(1, nbytes // 50 // 4), dtype=np.float32) for name in live}
    )
    return nest, live


def even(nbytes: int, leaves: int, seed: int = 1) -> Nest:
    rng = np.random.default_rng(seed)
    return {
        f"v{i:02d}": rng.standard_normal(max(1, nbytes // leaves // 4), dtype=np.float32)
        for i in range(leaves)
    }


def change(nest: Nest, names: Sequence[str]) -> int:
    """Give every leaf named a new value (every element + 1); the bytes changed."""
    for name in names:
        np.add(nest[name], 1.0, out=nest[name])
    return sum(nest[name].nbytes for name in names)


# -- the group ----------------------------------------------------------------------------


def run(
    plan: DeltaPlan, out: dict[str, Any], log: Callable[[str], None], servers: ExitStack
) -> None:
    """Every stage on every backend that can run here, into ``out`` (results.json's
    "delta"). A redis-server of the group's own is started in ``servers`` (the caller
    stops it); the shm:// store is removed on the way out."""
    started = time.monotonic()
    names = ("varsync", "varsync-shm", "redis", "numpy", "xxhash")
    out.update(machine=machine(), plan=asdict(plan), records=[], skipped={}, backends={})
    out.update(stages={}, versions={name: _version(name) for name in names})
    shm_store = f"bench-delta-{uuid.uuid4().hex[:6]}"
    sides: list[Side] = []
    try:
        sides = connect_sides(out, log, servers, shm_store)
        nest, live = frozen90(plan.nbytes)
        fifty = even(plan.nbytes, plan.leaves)
        order = sorted(fifty)
        fixed = order[plan.leaves // 2]
        title = f"1 of {plan.leaves} leaves"
        stages = [
            Workload("frozen90", "90 % of the bytes frozen, 10 % changed every push", nest,
                     lambda n: live),
            Workload("one_of_50", f"{title} ({fixed}) changed every push", fifty,
                     lambda n: [fixed]),
            Workload("one_of_50_rotating", f"{title} changed every push, a new one each time",
                     fifty, lambda n: [order[n % len(order)]]),
        ]  # fmt: skip
        for workload in stages[: 3 if plan.rotating else 2]:
            reading = partial(ReaderStage, table=workload.key)
            run_stage(workload, sides, plan, out, log, reading, plan.rounds)
        everything = Workload("all_changed", "every leaf changed every push", nest,
                              lambda n: sorted(nest))  # fmt: skip
        pushing = partial(PushStage, table="all_changed")
        run_stage(everything, sides, plan, out, log, pushing, plan.push_rounds)
    finally:
        for side in sides:
            side.close()
        if "shm" in out["backends"]:
            import varsync_shm

            varsync_shm.remove_store(shm_store)
    out["load_average_after"] = os.getloadavg()
    out["seconds"] = time.monotonic() - started
    log(f"   load average {out['load_average_after'][0]:.1f} at the end")


def connect_sides(
    out: dict[str, Any], log: Callable[[str], None], servers: ExitStack, shm_store: str
) -> list[Side]:
    """A writer and two readers per backend that can run here (the others recorded)."""
    import varsync

    sides, tag = [], uuid.uuid4().hex[:6]
    for name in BACKENDS:
        server: ServerBytes | None = None
        reason = _import_problem({"redis": "redis", "shm": "varsync_shm"}.get(name, "varsync"))
        if name == "redis" and reason is None:
            from .servers import find_redis_server, running_redis_server

            if find_redis_server() is None:
                reason = "no redis-server binary here"
            else:
                server = ServerBytes(servers.enter_context(running_redis_server()).url)
        if reason:
            out["skipped"][name] = reason
            log(f"   {name}: skipped: {reason}")
            continue
        url, options = {
            "memory": (f"memory://bench-delta-{tag}", {}),
            "redis": (server.url if server else "", {"namespace": f"delta-{tag}"}),
            "shm": (f"shm://{shm_store}", {}),
        }[name]
        writer, reader, whole = (varsync.connect(url, timeout=300, **options) for _ in range(3))
        meters = [Meter(c.backend) for c in (writer, reader, whole)]
        side = Side(name, writer, reader, whole, meters, server)
        out["backends"][name] = {
            "class": type(writer.backend).__name__,
            "supports_leaf_versions": side.leaf_versions,
        }
        log(f"   {name}: {type(writer.backend).__name__}, leaf versions: {side.leaf_versions}")
        sides.append(side)
    return sides


Timing = tuple[str, float, int, int]  # operation, seconds, bytes moved, protocol bytes


def _timed_op(side: Side, op: str, call: Callable[[], Any], table: str) -> tuple[Timing, Any]:
    before = side.reading([table])
    seconds, result = clocked(call)
    moved, protocol = side.moved_since(before, [table])
    return (op, seconds, moved, protocol), result


def run_stage(
    workload: Workload,
    sides: list[Side],
    plan: DeltaPlan,
    out: dict[str, Any],
    log: Callable[[str], None],
    kind: Callable[[Side], Stage],
    rounds: int,
) -> None:
    """``plan.warm`` untimed rounds then ``rounds`` timed ones of ``kind``'s calls on
    every backend, the backends' order rotating; before each round, the workload's
    changing leaves get new values."""
    key, nest, started = workload.key, workload.nest, time.monotonic()
    stages = {side.name: kind(side) for side in sides}
    for stage in stages.values():
        stage.setup(nest)
    out["stages"][key] = {
        "title": workload.title,
        "bytes": sum(a.nbytes for a in nest.values()),
        "leaves": len(nest),
        "changed_bytes": sum(nest[n].nbytes for n in workload.changing(0)),
        "load_average_before": os.getloadavg(),
        "bytes_source": {s.name: s.bytes_source(stages[s.name].table) for s in sides},
    }
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for number in range(plan.warm + rounds):
        gc.collect()
        changed = change(nest, workload.changing(number))
        shift = number % max(1, len(sides))
        for side in sides[shift:] + sides[:shift]:
            timings = stages[side.name].round(nest, number)
            for op, seconds, moved, protocol in timings if number >= plan.warm else ():
                fields = ("seconds", "moved", "protocol", "changed")
                r = records.setdefault(
                    (side.name, op),
                    {"stage": key, "backend": side.name, "op": op} | {f: [] for f in fields},
                )
                for field, value in zip(fields, (seconds, moved, protocol, changed)):
                    r[field].append(value)
    for stage in stages.values():
        stage.check(nest)
    out["records"] += list(records.values())
    out["stages"][key].update(
        seconds=time.monotonic() - started, load_average_after=os.getloadavg()
    )
    log(f"   {key}: {size_label(out['stages'][key]['bytes'])}, {time.monotonic() - started:.0f} s")


class Stage:
    """One backend's calls in a stage: ``setup`` before the rounds, ``round`` timed in
    each (returning its timings), ``check`` after."""

    def __init__(self, side: Side, table: str) -> None:
        self.side, self.table = side, table

    def setup(self, nest: Nest) -> None:
        raise NotImplementedError

    def round(self, nest: Nest, number: int) -> list[Timing]:
        raise NotImplementedError

    def check(self, nest: Nest) -> None:
        pass


class ReaderStage(Stage):
    """The writer's push, then the reader's three ways to the new version: a delta
    ``pull_if_newer`` with the nest it holds, a delta ``update`` of its targets, a whole
    ``pull``, in an order reversed every other round."""

    def setup(self, nest: Nest) -> None:
        writer, reader = self.side.writer, self.side.reader
        writer.create_table(self.table, nest)
        writer.push(nest, self.table)
        self.held = reader.pull_if_newer(0, self.table)
        self.targets = {k: np.empty_like(v) for k, v in nest.items()}
        reader.update(self.targets, self.table)
        self.whole_targets = {k: np.empty_like(v) for k, v in nest.items()}

    def round(self, nest: Nest, number: int) -> list[Timing]:
        side, table = self.side, self.table
        pushed, version = _timed_op(side, "push", lambda: side.writer.push(nest, table), table)
        calls: list[tuple[str, Callable[[], Any]]] = [
            (
                "pull_if_newer(held)",
                lambda: side.reader.pull_if_newer(self.held[0], table, held=self.held[1]),
            ),
            ("update", lambda: side.reader.update(self.targets, table)),
            ("pull", lambda: side.reader.pull(table)),
            (WHOLE_UPDATE, lambda: side.whole.update(self.whole_targets, table, delta_only=False)),
        ]
        timings = [pushed]
        for op, call in calls if number % 2 == 0 else calls[::-1]:
            timing, result = _timed_op(side, op, call, table)
            if op == "pull_if_newer(held)":
                if result is None:
                    raise RuntimeError(
                        f"pull_if_newer({self.held[0]}) found nothing newer after push {version}"
                    )
                self.held = result
            del result
            timings.append(timing)
        return timings

    def check(self, nest: Nest) -> None:
        for what, got in (("pull_if_newer(held=)", self.held[1]), ("update", self.targets)):
            for name, value in nest.items():
                if not np.array_equal(np.asarray(got[name]), value):
                    raise RuntimeError(
                        f"{self.side.name} {what}: leaf {name} differs from what was pushed"
                    )


class PushStage(Stage):
    """The default push to one table against ``skip_unchanged=False`` to another."""

    def setup(self, nest: Nest) -> None:
        for table in (self.table, self.table + "_whole"):
            self.side.writer.create_table(table, nest)
            self.side.writer.push(nest, table)

    def round(self, nest: Nest, number: int) -> list[Timing]:
        writer, table = self.side.writer, self.table
        calls: list[tuple[str, Callable[[], Any], str]] = [
            ("push", lambda: writer.push(nest, table), table),
            (
                WHOLE_PUSH,
                lambda: writer.push(nest, table + "_whole", skip_unchanged=False),
                table + "_whole",
            ),
        ]
        return [
            _timed_op(self.side, op, call, name)[0]
            for op, call, name in (calls if number % 2 == 0 else calls[::-1])
        ]
