"""Every varsync backend beside its baselines, in one run (issue 7).

- a size sweep from 1 KB to 1 GB, plus one size above 2 GiB: ``push``, ``pull``,
  ``update`` into ``tf.Variable``s and ``pull_if_newer`` when nothing changed, for
  memory://, reverb://, redis:// and shm://, beside TF-Agents' ReverbVariableContainer on
  the same Reverb server, hand-written redis-py SET/GET on the same redis-server, and
  ``np.copyto`` of the same bytes (the physical reference);
- the same at two sizes with 500 small variables instead of 4 large ones;
- fan-out: 1, 2, 4, 8 reader processes pulling one 100 MB table from each cross-process
  backend (aggregate throughput, server memory growth);
- client memory: peak resident memory above baseline during one push and one pull, in a
  fresh process per backend, as a multiple of the payload.

Within a size, each backend forms a group with its baselines; a group's operations take
turns within every round, so a ratio is taken between times measured side by side.

Run by ``benchmarks/suite.py``; the servers are started here and stopped on the way out.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import queue
import time
import traceback
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

import workers
from common import (
    GB,
    KB,
    MB,
    Sampler,
    allocated_bytes_under,
    nest_of,
    payload_of,
    rss_of,
    signature_of,
    size_label,
    stage,
    timed,
)

TABLE = "variables"
REDIS_BULK_LIMIT = 512 * 2**20  # redis-server's default proto-max-bulk-len


@dataclass
class Case:
    """One workload: ``leaves`` float32 vectors of ``nbytes`` in all."""

    layout: str  # "few": 4 large arrays; "many": 500 small ones
    leaves: int
    nbytes: int
    rounds: int
    inner: int = 1  # back-to-back calls per timed sample (small sizes)
    update: bool = True  # also time update() into tf.Variables

    @property
    def name(self) -> str:
        return f"{self.layout}_{self.nbytes}"


@dataclass
class Plan:
    cases: List[Case]
    big: Optional[Case]  # the run above 2 GiB
    fanout_bytes: int
    fanout_readers: List[int]
    fanout_pulls: int
    probe_bytes: int
    polls: int = 1000
    reverb_polls: int = 300


def full_plan() -> Plan:
    few = [
        Case("few", 4, 1 * KB, 15, 20),
        Case("few", 4, 10 * KB, 15, 20),
        Case("few", 4, 100 * KB, 15, 10),
        Case("few", 4, 1 * MB, 11, 3),
        Case("few", 4, 10 * MB, 7),
        Case("few", 4, 100 * MB, 5),
        Case("few", 4, 1 * GB, 3),
    ]
    many = [Case("many", 500, 1 * MB, 11), Case("many", 500, 100 * MB, 5)]
    return Plan(
        cases=few + many,
        big=Case("few", 4, 2200 * MB, 3, update=False),
        fanout_bytes=100 * MB,
        fanout_readers=[1, 2, 4, 8],
        fanout_pulls=3,
        probe_bytes=400 * MB,
    )


def quick_plan() -> Plan:
    """Minutes become seconds: for trying the suite out, not for figures."""
    return Plan(
        cases=[Case("few", 4, 1 * KB, 3, 5), Case("few", 4, 1 * MB, 3), Case("few", 4, 10 * MB, 3),
               Case("many", 500, 1 * MB, 3)],
        big=None,
        fanout_bytes=10 * MB,
        fanout_readers=[1, 2],
        fanout_pulls=2,
        probe_bytes=20 * MB,
        polls=200,
        reverb_polls=100,
    )


# -- child processes, always bounded -------------------------------------------------------


def _get(results: Any, children: List[Any], timeout: float, what: str) -> Any:
    """The next message on ``results``; an error if every child died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            if children and not any(c.is_alive() for c in children):
                raise RuntimeError(f"{what}: the child processes died") from None
    raise RuntimeError(f"{what}: nothing within {timeout:.0f} s")


def _stop(children: List[Any], grace: float = 20) -> None:
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.1, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            child.kill()
            child.join(10)


@contextlib.contextmanager
def reverb_server(signatures: Dict[str, Any]) -> Iterator[Tuple[int, str]]:
    """A Reverb server in a child process: yields (its pid, "localhost:port")."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    child = context.Process(target=workers.serve_reverb, args=(signatures, ready, stop),
                            name="bench-reverb-server", daemon=True)
    child.start()
    try:
        kind, value = _get(ready, [child], 300, "starting the Reverb server")
        if kind != "port":
            raise RuntimeError(f"the Reverb server did not start:\n{value}")
        yield child.pid, f"localhost:{value}"
    finally:
        stop.set()
        _stop([child], 30)


# -- the size sweep ----------------------------------------------------------------------------


@dataclass
class Group:
    """One backend and its baselines at one size: operations timed in turns."""

    name: str
    ops: List[Tuple[str, str, Callable[[], Any]]]  # (contender, operation, call)
    polls: List[Tuple[str, Callable[[], Any], int]]  # (contender, poll call, count)
    close: Callable[[], None]
    warm: int = 1


class Sweep:
    def __init__(self, plan: Plan, reverb_address: str, redis_url: str,
                 out: Dict[str, Any], log: Callable[[str], None]) -> None:
        self.plan, self.reverb_address, self.redis_url = plan, reverb_address, redis_url
        self.out, self.log = out, log
        self.tag = uuid.uuid4().hex[:6]
        self.case_reverb = reverb_address

    @contextlib.contextmanager
    def reverb_for(self, case: Case) -> Iterator[None]:
        """Point ``case_reverb`` at the shared server for the 4-array sweep, or at a server
        of its own for a case of many arrays: varsync reads versions through Reverb's
        server_info, which carries every table's signature, so a 500-leaf table would slow
        every other table's calls."""
        if case.layout == "few":
            yield
            return
        with reverb_server({case.name: signature_of(case.nbytes, case.leaves)}) as (_, address):
            self.case_reverb = address
            try:
                yield
            finally:
                self.case_reverb = self.reverb_address

    # The groups: each returns None when its backend cannot take this case (recorded).

    def memory_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        import varsync
        from varsync.backends import memory

        name = f"bench-{case.name}-{self.tag}"
        store = varsync.connect(f"memory://{name}")
        store.create_table(TABLE, nest)
        ops = _varsync_ops("memory", store, nest, variables)
        ops += _copies(nest, targets, variables, fresh=case.nbytes <= GB)  # above: memory to spare

        def close() -> None:
            store.close()
            memory._STORES.pop(name, None)  # free the bytes: the store outlives containers

        return Group("memory", ops, [("memory", _poller(store), self.plan.polls)], close)

    def reverb_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Optional[Group]:
        import reverb
        import varsync
        from tf_agents.experimental.distributed.reverb_variable_container import (
            ReverbVariableContainer,
        )
        from varsync.backends.reverb import MAX_PUSH_BYTES

        address = self.case_reverb
        store = varsync.connect(f"reverb://{address}", timeout=300)
        if payload_of(nest) > MAX_PUSH_BYTES:
            try:
                store.push(nest, case.name)
                reason = "accepted?! (expected a refusal)"
            except varsync.ItemTooLargeError as exc:
                reason = f"refused by design (ItemTooLargeError: {str(exc).split('. ')[0]})"
            finally:
                store.close()
            self.refuse(case, "reverb", "push", reason)
            self.refuse(case, "tf-agents", "push", "not run: Reverb aborts the whole client "
                        "process on an insert over 2 GiB (gRPC's message limit) and TF-Agents "
                        "does not check")
            return None
        tfa = ReverbVariableContainer(address, table_names=(case.name,))
        ops = _varsync_ops("reverb", store, nest, variables, case.name)
        ops += [("tf-agents", "push", lambda: tfa.push(variables, case.name)),
                ("tf-agents", "pull", lambda: tfa.pull(case.name)),
                ("tf-agents", "update", lambda: tfa.update(variables, case.name))]
        ops += _copies(nest, targets, variables)

        def close() -> None:
            store.close()
            reverb.Client(address).reset(case.name)  # free the server's copy of this size

        return Group("reverb", ops, [("reverb", _poller(store, case.name), self.plan.reverb_polls)], close)

    def redis_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        import redis
        import varsync

        store = varsync.connect(self.redis_url, namespace=f"bench-{case.name}-{self.tag}", timeout=300)
        store.create_table(TABLE, nest)
        hand = redis.Redis.from_url(self.redis_url, socket_timeout=300)
        keys = {name: f"hand:{case.name}:{name}" for name in nest}

        def hand_push() -> None:
            for name, leaf in nest.items():
                hand.set(keys[name], leaf.tobytes())

        def hand_pull() -> Dict[str, np.ndarray]:
            return {name: np.frombuffer(hand.get(key), np.float32) for name, key in keys.items()}

        def hand_update() -> None:
            for name, key in keys.items():
                variables[name].assign(np.frombuffer(hand.get(key), np.float32))

        ops = _varsync_ops("redis", store, nest, variables)
        if max(leaf.nbytes for leaf in nest.values()) > REDIS_BULK_LIMIT:
            self.refuse(case, "redis-py", "push", _hand_refusal(self.redis_url, nest))
        else:
            ops += [("redis-py", "push", hand_push), ("redis-py", "pull", hand_pull)]
            if variables is not None:
                ops.append(("redis-py", "update", hand_update))
        ops += _copies(nest, targets, variables)

        def close() -> None:
            store.close()
            hand.flushall()  # free the server's memory for the next size
            hand.close()

        # Three rounds before redis:// is in its steady state: from the third push on, a
        # table of 4 MiB or more has a spare version, which each push overwrites in place.
        return Group("redis", ops, [("redis", _poller(store), self.plan.polls)], close, warm=3)

    def shm_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        import varsync
        import varsync_shm

        name = f"bench-{case.name}-{self.tag}"
        store = varsync.connect(f"shm://{name}")
        store.create_table(TABLE, nest)
        ops = _varsync_ops("shm", store, nest, variables)
        ops += _copies(nest, targets, variables)

        def close() -> None:
            store.close()
            varsync_shm.remove_store(name)

        # Three pushes before shm:// is in its steady state (both alternating segments
        # allocated and mapped), as `varsync bench` does.
        return Group("shm", ops, [("shm", _poller(store), self.plan.polls)], close, warm=3)

    def refuse(self, case: Case, contender: str, op: str, reason: str) -> None:
        self.out["refusals"].append({"case": case.name, "layout": case.layout, "bytes": case.nbytes,
                                     "contender": contender, "op": op, "reason": reason})
        self.log(f"   {contender} {op} at {size_label(case.nbytes)}: {reason}")

    # The loop.

    def run_case(self, case: Case) -> None:
        import tensorflow as tf

        started = time.monotonic()
        nest = nest_of(case.nbytes, case.leaves)
        targets = {name: np.ones_like(leaf) for name, leaf in nest.items()}  # touched: no page faults
        variables = {name: tf.Variable(leaf) for name, leaf in nest.items()} if case.update else None
        self.out["cases"].append(asdict(case))
        with self.reverb_for(case):
            for make in (self.memory_group, self.reverb_group, self.redis_group, self.shm_group):
                group = make(case, nest, variables, targets)
                if group is None:
                    continue
                try:
                    self.run_group(case, group)
                finally:
                    group.close()
                gc.collect()
        del nest, targets, variables
        gc.collect()
        self.log(f"   {case.layout} {size_label(case.nbytes)} ({case.leaves} arrays, "
                 f"{case.rounds} rounds): {time.monotonic() - started:.0f} s")

    def run_group(self, case: Case, group: Group) -> None:
        for _ in range(group.warm):
            for _, _, call in group.ops:
                call()
        samples: Dict[Tuple[str, str], List[float]] = {(c, o): [] for c, o, _ in group.ops}
        for _ in range(case.rounds):
            gc.collect()
            for contender, op, call in group.ops:
                samples[(contender, op)].append(timed(call, case.inner))
        for (contender, op), values in samples.items():
            self.out["sweep"].append({"case": case.name, "layout": case.layout, "leaves": case.leaves,
                                      "bytes": case.nbytes, "group": group.name,
                                      "contender": contender, "op": op, "samples": values})
        for contender, poll, count in group.polls:
            values = []
            for _ in range(count):
                started = time.perf_counter_ns()
                result = poll()
                values.append((time.perf_counter_ns() - started) / 1e9)
                if result is not None:
                    raise RuntimeError(f"{contender}: pull_if_newer found a newer version while nothing was pushed")
            self.out["polls"].append({"case": case.name, "layout": case.layout, "bytes": case.nbytes,
                                      "contender": contender, "samples": values})


def _varsync_ops(contender: str, store: Any, nest: Any, variables: Any,
                 table: str = TABLE) -> List[Tuple[str, str, Callable[[], Any]]]:
    """A varsync container's push and pull of ``nest`` and, with ``variables``, its update."""
    ops = [(contender, "push", lambda: store.push(nest, table)),
           (contender, "pull", lambda: store.pull(table))]
    if variables is not None:
        ops.append((contender, "update", lambda: store.update(variables, table)))
    return ops


def _copies(nest: Dict[str, np.ndarray], targets: Dict[str, np.ndarray], variables: Any,
            fresh: bool = False) -> List[Tuple[str, str, Callable[[], Any]]]:
    """The physical references, timed in every group: np.copyto of the same bytes into
    existing arrays, ``tf.Variable.assign`` of them (the floor of any update), and with
    ``fresh``, np.copyto into new arrays (the page faults any pull into new arrays pays)."""

    def into_existing() -> None:
        for name, leaf in nest.items():
            np.copyto(targets[name], leaf)

    def into_fresh() -> Dict[str, np.ndarray]:
        copies = {name: np.empty_like(leaf) for name, leaf in nest.items()}
        for name, leaf in nest.items():
            np.copyto(copies[name], leaf)
        return copies

    ops = [("np.copyto", "copy", into_existing)]
    if fresh:
        ops.append(("np.copyto fresh", "copy", into_fresh))
    if variables is not None:
        ops.append(("tf assign", "update", lambda: [variables[k].assign(v) for k, v in nest.items()]))
    return ops


def _poller(store: Any, table: str = TABLE) -> Callable[[], Any]:
    held = {}

    def poll() -> Any:
        if "version" not in held:
            held["version"] = store.version(table)
        return store.pull_if_newer(held["version"], table)

    return poll


def _hand_refusal(url: str, nest: Dict[str, np.ndarray]) -> str:
    """Try what a user would write, one SET of a leaf over 512 MB; say what happened."""
    import redis

    name, leaf = max(nest.items(), key=lambda item: item[1].nbytes)
    client = redis.Redis.from_url(url, socket_timeout=120)
    try:
        client.set("hand:too-large", leaf.tobytes())
        client.delete("hand:too-large")
        return "accepted?! (expected the server to refuse a value over 512 MB)"
    except redis.RedisError as exc:
        return (f"refused by redis-server: one SET of a {leaf.nbytes / MB:.0f} MB array exceeds "
                f"its 512 MB proto-max-bulk-len ({type(exc).__name__})")
    finally:
        client.close()


# -- fan-out ---------------------------------------------------------------------------------------


def run_fanout(plan: Plan, out: Dict[str, Any], log: Callable[[str], None]) -> None:
    """On servers of its own, so that their memory before the readers is this table's alone
    (allocators keep what earlier sizes freed)."""
    from _redis_server import running_redis_server

    table = {"fanout": signature_of(plan.fanout_bytes, 4)}
    with reverb_server(table) as reverb, running_redis_server() as redis_server:
        _fanout(plan, reverb, redis_server, out, log)


def _fanout(plan: Plan, reverb: Tuple[int, str], redis_server: Any,
            out: Dict[str, Any], log: Callable[[str], None]) -> None:
    import redis
    import varsync
    import varsync_shm

    reverb_pid, reverb_address = reverb
    nest = nest_of(plan.fanout_bytes, 4)
    payload = payload_of(nest)
    shm_name = f"bench-fanout-{uuid.uuid4().hex[:6]}"
    admin = redis.Redis.from_url(redis_server.url)
    backends = [
        ("reverb", f"reverb://{reverb_address}", "fanout",
         {"server RSS": lambda: rss_of(reverb_pid)}),
        ("redis", f"{redis_server.url}?namespace=fanout", TABLE,
         {"server RSS": lambda: rss_of(redis_server.process.pid),
          "used_memory": lambda: int(admin.info("memory")["used_memory"])}),
        ("shm", f"shm://{shm_name}", TABLE,
         {"bytes in /dev/shm": lambda: allocated_bytes_under(varsync_shm.store_path(shm_name))}),
    ]
    context = multiprocessing.get_context("spawn")
    readers = max(plan.fanout_readers)
    commands = [context.Queue() for _ in range(readers)]
    results, go = context.Queue(), context.Event()
    children = [context.Process(target=workers.fanout_reader, args=(i, commands[i], results, go),
                                name=f"bench-reader-{i}", daemon=True) for i in range(readers)]
    for child in children:
        child.start()
    try:
        for backend, url, table, measures in backends:
            with varsync.connect(url, timeout=300) as store:
                if backend != "reverb":
                    store.create_table(table, nest)
                for _ in range(3 if backend == "shm" else 1):
                    store.push(nest, table)
            for count in plan.fanout_readers:
                go.clear()
                for i in range(count):
                    commands[i].put(("pull", url, table, plan.fanout_pulls))
                for _ in range(count):
                    _check(_get(results, children, 600, f"{backend} readers getting ready"), "ready")
                with contextlib.ExitStack() as stack:
                    samplers = {name: stack.enter_context(Sampler(measure, 0.005 if name == "used_memory" else 0.002))
                                for name, measure in measures.items()}
                    go.set()
                    done = [_check(_get(results, children, 900, f"{backend} readers pulling"), "done")
                            for _ in range(count)]
                start = min(d[2] for d in done)
                end = max(d[3] for d in done)
                latencies = [t for d in done for t in d[4]]
                out["fanout"].append({
                    "contender": backend, "readers": count, "pulls_each": plan.fanout_pulls,
                    "bytes": payload, "seconds": end - start,
                    "aggregate_bytes_per_s": count * plan.fanout_pulls * payload / (end - start),
                    "latencies": latencies,
                    "server_growth": {name: s.growth for name, s in samplers.items()},
                    "server_baseline": {name: s.baseline for name, s in samplers.items()},
                })
                log(f"   {backend}, {count} reader(s): "
                    f"{count * plan.fanout_pulls * payload / (end - start) / GB:.2f} GB/s in all, "
                    + ", ".join(f"{n} +{s.growth / MB:.0f} MB" for n, s in samplers.items()))
    finally:
        for command in commands:
            command.put(None)
        _stop(children)
        admin.close()
        varsync_shm.remove_store(shm_name)


def _check(message: Tuple, expected: str) -> Tuple:
    if message[0] != expected:
        raise RuntimeError(f"reader {message[1]} failed:\n{message[2]}")
    return message


# -- client memory -------------------------------------------------------------------------------


def run_client_memory(plan: Plan, reverb_address: str, redis_url: str,
                      out: Dict[str, Any], log: Callable[[str], None]) -> None:
    import varsync_shm

    shm_name = f"bench-probe-{uuid.uuid4().hex[:6]}"
    groups = [("memory", "memory://probe", TABLE), ("reverb", f"reverb://{reverb_address}", "probe"),
              ("redis", redis_url, TABLE), ("shm", f"shm://{shm_name}", TABLE)]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    children = [context.Process(target=workers.memory_probe, args=(g, url, t, plan.probe_bytes, results),
                                name=f"bench-probe-{g}", daemon=True) for g, url, t in groups]
    # glibc raises its mmap threshold after each large free and then keeps freed buffers in
    # the heap: a warm-up would hide the next call's allocations in the baseline. A fixed
    # threshold returns every buffer over 128 KiB to the system when freed.
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    try:
        for child in children:
            child.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    try:
        for _ in children:
            group, figures = _get(results, children, 600, "client memory probes")
            if "error" in figures:
                raise RuntimeError(f"the {group} memory probe failed:\n{figures['error']}")
            for name, peak in figures.items():
                contender, _, op = name.rpartition(" ")
                out["client_memory"].append({"contender": contender or group, "op": op,
                                             "bytes": plan.probe_bytes, "peak_above_baseline": peak})
    finally:
        _stop(children, 60)
        varsync_shm.remove_store(shm_name)
    log("   " + ", ".join(f"{m['contender']} {m['op']} {m['peak_above_baseline'] / m['bytes']:.2f}x"
                          for m in out["client_memory"]))


# -- all of it -------------------------------------------------------------------------------------


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run(plan: Plan, out: Dict[str, Any], log: Callable[[str], None],
        time_left: Callable[[], float]) -> None:
    """Start the servers, run every stage the time left allows, stop the servers."""
    import redis
    from _redis_server import running_redis_server

    for key in ("sweep", "polls", "refusals", "fanout", "client_memory", "cases", "skipped"):
        out.setdefault(key, [])
    cases = [c for c in plan.cases + ([plan.big] if plan.big else []) if c.layout == "few"]
    signatures = {case.name: signature_of(case.nbytes, case.leaves) for case in cases}
    signatures["probe"] = signature_of(plan.probe_bytes, 4)
    with reverb_server(signatures) as reverb_info, running_redis_server() as redis_server:
        info = redis.Redis.from_url(redis_server.url).info("server")
        out["versions"] = {shown: _version(name) for shown, name in (
            ("varsync", "varsync"), ("varsync-shm", "varsync-shm"), ("dm-reverb", "dm-reverb"),
            ("tensorflow-cpu", "tensorflow-cpu"), ("tf-agents", "tf-agents"), ("redis-py", "redis"),
            ("numpy", "numpy"))}
        out["versions"]["redis-server"] = info["redis_version"]
        log(f"   Reverb server pid {reverb_info[0]} at {reverb_info[1]}; redis-server "
            f"{info['redis_version']} at {redis_server.url}")
        sweep = Sweep(plan, reverb_info[1], redis_server.url, out, log)
        with stage("size sweep", log, out.setdefault("stage_seconds", {})):
            for case in plan.cases:
                sweep.run_case(case)
        stages: List[Tuple[str, float, Callable[[], None]]] = []
        if plan.big:
            stages.append((f"{size_label(plan.big.nbytes)} (above 2 GiB)", 150,
                           lambda: big_case(sweep, plan.big, out, log)))
        stages += [
            ("fan-out", 150, lambda: run_fanout(plan, out, log)),
            ("client memory", 60,
             lambda: run_client_memory(plan, reverb_info[1], redis_server.url, out, log)),
        ]
        for name, needs, call in stages:
            if time_left() < needs:
                out["skipped"].append(f"{name}: not run, {time_left():.0f} s of the time budget left "
                                      f"and it needs about {needs:.0f} s")
                log(f"   skipped {name} (time budget)")
                continue
            try:
                with stage(name, log, out.setdefault("stage_seconds", {})):
                    call()
            except Exception:  # noqa: BLE001 - one stage failing must not lose the others
                out["skipped"].append(f"{name}: failed: {traceback.format_exc().splitlines()[-1]}")
                log(f"   {name} FAILED:\n{traceback.format_exc()}")


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def big_case(sweep: Sweep, case: Case, out: Dict[str, Any], log: Callable[[str], None]) -> None:
    # Client: the nest, the copy target and one pulled value; redis-server: up to three
    # versions (the current one, `keep=1` previous, the one being pushed).
    needed = 6.5 * case.nbytes
    if available_memory() < needed:
        out["skipped"].append(f"{size_label(case.nbytes)}: not run, {available_memory() / GB:.1f} GB "
                              f"of memory available and it needs about {needed / GB:.0f} GB")
        log("   skipped the run above 2 GiB (memory)")
        return
    sweep.run_case(case)
