"""The delta group (issue 16, "move only what changed"): what a push, a pull and an
update of a nest that changed in part cost on memory://, redis:// and shm://, in bytes
moved and in time, beside the whole transfers they replace.

Stages, each over the three backends taking turns in the same rounds (the backends'
order rotated every round, the reader's calls reversed every other round), a writer
and a reader container per backend in this process:

- ``frozen90`` (measures 16.1, 16.2): ``nbytes`` (100 MB) in 10 leaves that never change
  (90 % of the bytes) and 5 that all change before every push (10 %). Per round: the
  writer's ``push`` (skip_unchanged on, the default), then the reader's
  ``pull_if_newer(v, held=nest)``, ``update(targets)`` (numpy arrays) and a whole
  ``pull()`` of the same version.
- ``one_of_50`` (16.3): 50 leaves of ``nbytes / 50`` (2 MB); the same one changes before
  every push. ``one_of_50_rotating`` (beyond the targets): a different one every push.
- ``all_changed`` (16.4): the ``frozen90`` layout with every leaf changed before every
  push, pushed with skip_unchanged on and with ``skip_unchanged=False`` (the pre-delta
  path: a plain whole write) to two tables; and ``varsync.delta.changed_leaves`` alone.
- ``push_leaves_paths`` (issue 36, memory:// only): ``push_leaves`` of 2,000 paths into a
  table of 10,000 small leaves beside a whole push of the same table. Alone:
  ``python -m benchmarks.delta [--leaves N] [--paths K] [--rounds R]``.

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
import traceback
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from .common import MB, machine, paired_ratio, size_label, summary
from .frameworks import _import_problem, _version, working_tree

Nest = dict[str, np.ndarray]
BACKENDS = ("memory", "redis", "shm")
WHOLE_PUSH = "push, skip_unchanged=False"
WHOLE_UPDATE = "update, delta_only=False"


@dataclass
class DeltaPlan:
    """Sizes and rounds of the group. ``seconds``: about how long it takes (the suite
    skips the group when less of its budget is left)."""

    nbytes: int = 100 * MB
    leaves: int = 50  # the one_of_50 stages
    rounds: int = 15
    push_rounds: int = 25  # all_changed: its ratio's target (1.05) is within the noise
    warm: int = 2
    rotating: bool = True  # also the one_of_50 stage with a different leaf each push
    detection_samples: int = 11
    paths_table: int = 10_000  # push_leaves_paths: the table's leaves, float32 (4,) each
    paths: int = 2_000  # push_leaves_paths: the paths each push_leaves gives
    paths_rounds: int = 7
    seconds: float = 240


def plan_for(smoke: bool, quick: bool) -> DeltaPlan:
    if smoke:
        return DeltaPlan(
            nbytes=1 * MB,
            rounds=2,
            push_rounds=2,
            warm=1,
            detection_samples=2,
            paths_table=1_000,
            paths=200,
            paths_rounds=2,
            seconds=20,
        )
    if quick:
        return DeltaPlan(
            nbytes=10 * MB,
            rounds=3,
            push_rounds=3,
            warm=1,
            detection_samples=3,
            paths_rounds=3,
            seconds=40,
        )
    return DeltaPlan()


# -- bytes --------------------------------------------------------------------------------


class Meter:
    """The bytes of the arrays crossing one backend instance's protocol: handed to
    ``write`` / ``write_leaves``, returned by ``read`` / ``read_leaves`` (a ``None`` leaf,
    one the caller holds, counts nothing). Wraps the instance's methods, not its class;
    a call made from inside another counts once."""

    def __init__(self, backend: Any) -> None:
        self.whole = 0  # write and read
        self.leaves = 0  # write_leaves and read_leaves
        self._depth = 0
        for name in ("write", "write_leaves", "read", "read_leaves"):
            if hasattr(backend, name):
                setattr(backend, name, self._wrapped(name, getattr(backend, name)))

    @property
    def total(self) -> int:
        return self.whole + self.leaves

    def _wrapped(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            try:
                result = method(*args, **kwargs)
            finally:
                self._depth -= 1
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
    elif name == "write_leaves":
        given = args[1] if len(args) > 1 else kwargs.get("leaves", {})
        arrays = list(given.values())
    else:  # read: (version, arrays); read_leaves: (version, leaf versions, arrays)
        arrays = result[-1] or ()
    return sum(int(a.nbytes) for a in arrays if a is not None)


class ServerBytes:
    """Bytes a redis-server received and sent, from its ``INFO stats``: the group's own
    server, so everything it counts between two readings is the benchmark's."""

    def __init__(self, url: str) -> None:
        import redis

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
    out.update(
        {
            "machine": machine(),
            "plan": asdict(plan),
            "records": [],
            "skipped": {},
            "backends": {},
            "stages": {},
            "tree": working_tree(),
            "versions": {
                name: _version(name)
                for name in ("varsync", "varsync-shm", "redis", "numpy", "xxhash")
            },
        }
    )
    log(f"   load average {out['machine']['load_average'][0]:.1f}")
    shm_store = f"bench-delta-{uuid.uuid4().hex[:6]}"
    sides: list[Side] = []
    try:
        sides = connect_sides(out, log, servers, shm_store)
        nest, live = frozen90(plan.nbytes)
        names = sorted(nest)
        stages = [
            Workload(
                "frozen90",
                "90 % of the bytes frozen, 10 % changed every push",
                nest,
                lambda n: live,
            )
        ]
        fifty = even(plan.nbytes, plan.leaves)
        fixed = sorted(fifty)[plan.leaves // 2]
        stages.append(
            Workload(
                "one_of_50",
                f"1 of {plan.leaves} leaves ({fixed}) changed every push",
                fifty,
                lambda n: [fixed],
            )
        )
        if plan.rotating:
            order = sorted(fifty)
            stages.append(
                Workload(
                    "one_of_50_rotating",
                    f"1 of {plan.leaves} leaves changed every push, a different one each time",
                    fifty,
                    lambda n: [order[n % len(order)]],
                )
            )
        for workload in stages:
            run_stage(
                workload,
                sides,
                plan,
                out,
                log,
                partial(ReaderStage, table=workload.key),
                plan.rounds,
            )
        run_stage(
            Workload("all_changed", "every leaf changed every push", nest, lambda n: names),
            sides,
            plan,
            out,
            log,
            partial(PushStage, table="all_changed"),
            plan.push_rounds,
        )
        del fifty
        detection(nest, live, plan, out, log)
        push_leaves_paths(plan, out, log)
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
    import varsync

    sides = []
    tag = uuid.uuid4().hex[:6]
    for name in BACKENDS:
        reason = None
        server: ServerBytes | None = None
        try:
            if name == "memory":
                urls: tuple[str, dict[str, Any]] = (f"memory://bench-delta-{tag}", {})
            elif name == "redis":
                reason = _import_problem("redis")
                if reason is None:
                    from .servers import find_redis_server, running_redis_server

                    if find_redis_server() is None:
                        reason = "no redis-server binary here"
                    else:
                        url = servers.enter_context(running_redis_server()).url
                        log(f"   redis-server (the group's own) at {url}")
                        server = ServerBytes(url)
                        urls = (url, {"namespace": f"delta-{tag}"})
            else:
                reason = _import_problem("varsync_shm")
                urls = (f"shm://{shm_store}", {})
            if reason:
                out["skipped"][name] = reason
                log(f"   {name}: skipped: {reason}")
                continue
            writer, reader, whole = (
                varsync.connect(urls[0], timeout=300, **urls[1]) for _ in range(3)
            )
        except Exception:
            out["skipped"][name] = f"failed: {traceback.format_exc().splitlines()[-1]}"
            log(f"   {name} FAILED to connect:\n{traceback.format_exc()}")
            continue
        side = Side(
            name, writer, reader, whole, [Meter(c.backend) for c in (writer, reader, whole)], server
        )
        out["backends"][name] = {
            "class": type(writer.backend).__name__,
            "supports_leaf_versions": side.leaf_versions,
        }
        if server is not None:
            out["backends"][name]["server_version"] = server.version
        log(
            f"   {name}: {type(writer.backend).__name__}, supports_leaf_versions = "
            f"{side.leaf_versions}"
        )
        sides.append(side)
    return sides


Timing = tuple[str, float, int, int]  # operation, seconds, bytes moved, protocol bytes


def _fail(
    side: Side, stage: str, sides: list[Side], out: dict[str, Any], log: Callable[[str], None]
) -> None:
    out["skipped"][side.name] = f"failed in {stage}: {traceback.format_exc().splitlines()[-1]}"
    log(f"   {side.name} FAILED in {stage}; left out of the rest:\n{traceback.format_exc()}")
    sides.remove(side)
    side.close()


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
    every backend; before each round, the workload's changing leaves get new values. A
    backend that fails is recorded as such and left out of the rest."""
    key, nest, started = workload.key, workload.nest, time.monotonic()
    stages: dict[str, Stage] = {}
    for side in list(sides):
        try:
            stages[side.name] = kind(side)
            stages[side.name].setup(nest)
        except Exception:
            _fail(side, key, sides, out, log)
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
            try:
                timings = stages[side.name].round(nest, number)
            except Exception:
                _fail(side, key, sides, out, log)
                continue
            for op, seconds, moved, protocol in timings if number >= plan.warm else ():
                r = records.setdefault(
                    (side.name, op),
                    {
                        "stage": key,
                        "backend": side.name,
                        "op": op,
                        "seconds": [],
                        "moved": [],
                        "protocol": [],
                        "changed": [],
                    },
                )
                for field, value in (
                    ("seconds", seconds),
                    ("moved", moved),
                    ("protocol", protocol),
                    ("changed", changed),
                ):
                    r[field].append(value)
    for side in list(sides):
        try:
            stages[side.name].check(nest)
        except Exception:
            _fail(side, key, sides, out, log)
    out["records"] += list(records.values())
    out["stages"][key].update(
        seconds=time.monotonic() - started, load_average_after=os.getloadavg()
    )
    stages.clear()
    _log_stage(key, out, log)


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


def detection(
    nest: Nest, live: list[str], plan: DeltaPlan, out: dict[str, Any], log: Callable[[str], None]
) -> None:
    """``varsync.delta.changed_leaves`` alone on the ``frozen90`` nest, against the
    record of a push of it: after every leaf changed (a 64-byte sample per leaf shows
    it), after the live 10 % changed (the frozen 90 % hashed whole), after nothing
    changed (every leaf hashed)."""
    from varsync import delta

    arrays = [nest[name] for name in sorted(nest)]

    def record_of() -> Any:
        _, samples, hashes = delta.changed_leaves(None, arrays)
        return delta.Written(1, samples, hashes)

    # every record is of values that differ from the final ones by exactly its case
    everything = record_of()
    change(nest, sorted(nest))
    frozen_only = record_of()
    change(nest, live)
    cases: dict[str, tuple[Any, int]] = {
        "every leaf changed": (everything, len(arrays)),
        "10 % changed (the frozen 90 % hashed)": (frozen_only, len(live)),
        "nothing changed (every leaf hashed)": (record_of(), 0),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    found: dict[str, int] = {}
    for number in range(plan.detection_samples):
        for name, (last, _) in (
            list(cases.items()) if number % 2 == 0 else list(cases.items())[::-1]
        ):
            seconds, (changed, _, _) = clocked(partial(delta.changed_leaves, last, arrays))
            samples[name].append(seconds)
            found[name] = len(changed)
    out["detection"] = {
        "bytes": sum(a.nbytes for a in arrays),
        "leaves": len(arrays),
        "cases": [
            {
                "case": name,
                "expected": cases[name][1],
                "found": found[name],
                "seconds": samples[name],
            }
            for name in cases
        ],
    }
    for c in out["detection"]["cases"]:
        s = summary(c["seconds"])
        log(
            f"   changed_leaves, {c['case']}: {s['median'] * 1e3:.3g} ms "
            f"({c['found']} of {len(arrays)} leaves found changed, {c['expected']} expected)"
        )


def _log_stage(key: str, out: dict[str, Any], log: Callable[[str], None]) -> None:
    info = out["stages"][key]
    log(
        f"   {key}: {size_label(info['bytes'])}, {info['leaves']} leaves, "
        f"{size_label(info['changed_bytes'])} changed per push, "
        f"{info.get('seconds', 0):.0f} s"
    )
    records = {
        (r["backend"], r["op"]): r for r in out["records"] if r["stage"] == key and r["seconds"]
    }
    against = {
        "pull_if_newer(held)": ["pull"],
        "update": ["pull", WHOLE_UPDATE],
        "push": [WHOLE_PUSH] if key == "all_changed" else [],
    }
    for (backend, op), r in records.items():
        ratio = summary([m / c for m, c in zip(r["moved"], r["changed"]) if c])
        times = ""
        for other in against.get(op, []):
            if (backend, other) in records:
                paired = paired_ratio(r["seconds"], records[(backend, other)]["seconds"])
                times += f", {paired['median']:.2f}x the time of {other}"
        log(
            f"     {backend:6} {op:26} {summary(r['seconds'])['median'] * 1e3:8.2f} ms, moved "
            f"{size_label(statistics.median(r['moved']))} = {ratio['median']:.2f}x the bytes "
            f"changed{times}"
        )


def push_leaves_paths(plan: DeltaPlan, out: dict[str, Any], log: Callable[[str], None]) -> None:
    """``push_leaves`` of ``plan.paths`` paths into a memory:// table of
    ``plan.paths_table`` float32 leaves of shape (4,), beside a whole push of the same
    table (skip_unchanged=False), the two in the same rounds, their order reversed every
    other round (issue 36: the paths were looked up in O(paths x leaves))."""
    import varsync

    nest = {f"v{i:05d}": np.zeros(4, np.float32) for i in range(plan.paths_table)}
    names = sorted(nest)[:: max(1, len(nest) // plan.paths)][: plan.paths]
    samples: dict[str, list[float]] = {"push_leaves": [], WHOLE_PUSH: []}
    with varsync.connect(f"memory://bench-paths-{uuid.uuid4().hex[:6]}") as store:
        store.create_table("paths", nest)
        store.push(nest, "paths")
        for number in range(plan.warm + plan.paths_rounds):
            gc.collect()
            change(nest, list(nest))
            leaves = {(name,): nest[name] + 1 for name in names}
            calls: list[tuple[str, Callable[[], Any]]] = [
                ("push_leaves", partial(store.push_leaves, leaves, "paths")),
                (WHOLE_PUSH, partial(store.push, nest, "paths", skip_unchanged=False)),
            ]
            for op, call in calls if number % 2 == 0 else calls[::-1]:
                took, _ = clocked(call)
                if number >= plan.warm:
                    samples[op].append(took)
    out["push_leaves_paths"] = {
        "leaves": len(nest),
        "paths": len(names),
        "leaf_bytes": 16,
        "seconds": samples,
    }
    log(
        f"   push_leaves_paths: {len(names)} paths into {len(nest)} leaves of 16 B, "
        f"{len(samples['push_leaves'])} rounds"
    )
    for op, times in samples.items():
        s = summary(times)
        log(
            f"     {op:26} median {s['median'] * 1e3:8.2f} ms, IQR {s['q1'] * 1e3:.2f}-"
            f"{s['q3'] * 1e3:.2f} ms, min-max {s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f} ms"
        )
    ratio = paired_ratio(samples["push_leaves"], samples[WHOLE_PUSH])
    log(
        f"     push_leaves / whole push: median {ratio['median']:.2f}x "
        f"(IQR {ratio['q1']:.2f}-{ratio['q3']:.2f}x)"
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.delta",
        description=(
            "push_leaves of many paths beside a whole push, on memory:// (the delta group's "
            "push_leaves_paths stage alone; the whole group runs in benchmarks.suite)"
        ),
    )
    parser.add_argument("--leaves", type=int, default=DeltaPlan.paths_table)
    parser.add_argument("--paths", type=int, default=DeltaPlan.paths)
    parser.add_argument("--rounds", type=int, default=DeltaPlan.paths_rounds)
    args = parser.parse_args()
    push_leaves_paths(
        DeltaPlan(paths_table=args.leaves, paths=args.paths, paths_rounds=args.rounds), {}, print
    )
