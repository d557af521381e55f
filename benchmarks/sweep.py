"""The size sweep: at each case, every backend in a group with its baselines, the group's
operations taking turns within every round, so that a ratio is taken between times
measured side by side; which contender's turn comes first rotates from round to round.

- memory:// with ``np.copyto`` into existing and into new arrays, ``tf.Variable.assign``;
- reverb:// with TF-Agents' ReverbVariableContainer on the same server and table, and
  varsync's drop-in for it, ``varsync.compat.tf_agents`` (4 arrays; with many arrays,
  memory://'s update instead, against TF-Agents' in the same rounds);
- redis:// with hand-written redis-py SET/GET on the same redis-server, leaf by leaf and
  pipelined, and the same bytes over a raw loopback TCP socket pair (the wire's floor);
  at a target size also ``version`` calls and ``np.copyto`` into new arrays, and where the
  case says so the first push into a new table, once per round;
- shm:// (and, at a target size, pull + read, update into numpy arrays, and the cold paths:
  a push into a new segment and the first read of it, when readers hold both segments).

Every group also times ``pull_if_newer`` when nothing changed, call by call, after its rounds.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, cast

import numpy as np

from . import wire_profile
from .common import GB, MB, nest_of, payload_of, size_label, timed
from .plan import Case, Plan

TABLE = "variables"
REDIS_BULK_LIMIT = 512 * 2**20  # redis-server's default proto-max-bulk-len
FLOOR_TIMEOUT = 300.0  # seconds one transfer of the TCP floor may take before it is an error

Op = tuple[str, str, Callable[[], Any]]  # (contender, operation, call)
Poll = tuple[str, str, Callable[[], Any], int]  # (contender, operation, call, count)
Timings = dict[tuple[str, str], float]  # (contender, operation) -> seconds


@dataclass
class Group:
    """One backend and its baselines at one size."""

    name: str
    ops: list[Op]
    polls: list[Poll]
    close: Callable[[], None]
    warm: int = 1  # untimed rounds first
    # Measurements that time themselves (setup untimed), once per round after the turns.
    per_round: list[Callable[[], Timings]] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)  # once, after the polls
    meter: wire_profile.CpuMeter | None = None  # CPU around its timed samples (15.4)


class Sweep:
    def __init__(
        self,
        plan: Plan,
        reverb: dict[str, str],
        redis_url: str,
        out: dict[str, Any],
        log: Callable[[str], None],
        redis_pid: int | None = None,
    ) -> None:
        self.plan, self.reverb, self.redis_url = plan, reverb, redis_url
        self.redis_pid = redis_pid  # for the redis-server's CPU (Case.profile)
        self.out, self.log = out, log
        self.tag = uuid.uuid4().hex[:6]

    def reverb_address(self, case: Case) -> str:
        """The case's own server, serving its table alone: varsync reads versions through
        Reverb's server_info, which answers every table's info to each request, so other
        tables would slow each of its version checks (TF-Agents' push and pull ask none).
        All the 4-array cases' tables on one server (13 tables) cost each varsync push,
        which checks twice, about 160 us more at 1 KB. The cost of many tables on one
        server is issue 15.1's 50-table measurement (section 9)."""
        return self.reverb[case.name]

    # The groups: each returns None when its backend cannot take this case (recorded).

    def memory_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        store, forget = memory_table(case, nest, self.tag)
        ops = varsync_ops("memory", store, nest, variables)
        ops += copies(nest, targets, variables, fresh=case.nbytes <= GB)  # above: memory to spare

        def close() -> None:
            store.close()
            forget()

        return Group(
            "memory", ops, [("memory", "pull_if_newer", poller(store), self.plan.polls)], close
        )

    def reverb_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group | None:
        import reverb
        from tf_agents.experimental.distributed.reverb_variable_container import (
            ReverbVariableContainer,
        )

        import varsync
        from varsync.backends.reverb import MAX_PUSH_BYTES

        address = self.reverb_address(case)
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
            self.refuse(
                case,
                "tf-agents",
                "push",
                "not run: Reverb aborts the whole client "
                "process on an insert over 2 GiB (gRPC's message limit) and TF-Agents "
                "does not check",
            )
            return None
        tfa = ReverbVariableContainer(address, table_names=(case.name,))
        ops = varsync_ops("reverb", store, nest, variables, case.name)
        ops += [
            ("tf-agents", "push", lambda: tfa.push(variables, case.name)),
            ("tf-agents", "pull", lambda: tfa.pull(case.name)),
            ("tf-agents", "update", lambda: tfa.update(variables, case.name)),
        ]
        closers = [store.close]
        if case.layout == "few" and variables is not None and case.dropin:
            # issues 3 and 15.1: the drop-in, pushing tf.Variables as TF-Agents' users do
            from varsync.compat.tf_agents import ReverbVariableContainer as DropIn

            dropin = DropIn(address, table_names=(case.name,), timeout=300)
            closers.append(dropin.container.close)
            ops += [
                ("varsync drop-in", "push", lambda: dropin.push(variables, case.name)),
                ("varsync drop-in", "pull", lambda: dropin.pull(case.name)),
            ]
        if case.layout != "few" and variables is not None:
            # issue 15.2: memory:// update against TF-Agents' in the same rounds
            memory_store, forget = memory_table(case, nest, f"{self.tag}-reverb")
            closers += [memory_store.close, forget]
            memory_store.push(nest, TABLE)  # only its update is timed
            ops.append(
                (
                    "memory",
                    "update",
                    lambda: memory_store.update(variables, TABLE, delta_only=False),
                )
            )
        ops += copies(nest, targets, variables)

        def close() -> None:
            for closer in closers:
                closer()
            reverb.Client(address).reset(case.name)  # free the server's copy of this size

        polls: list[Poll] = [
            ("reverb", "pull_if_newer", poller(store, case.name), self.plan.reverb_polls)
        ]
        return Group("reverb", ops, polls, close)

    def redis_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        import redis

        import varsync

        store = varsync.connect(
            self.redis_url, namespace=f"bench-{case.name}-{self.tag}", timeout=300
        )
        store.create_table(TABLE, nest)
        hand = redis.Redis.from_url(self.redis_url, socket_timeout=300)
        keys = {name: f"hand:{case.name}:{name}" for name in nest}

        def hand_push() -> None:
            for name, leaf in nest.items():
                hand.set(keys[name], leaf.tobytes())

        def hand_pull() -> dict[str, np.ndarray]:
            return {
                name: np.frombuffer(cast(bytes, hand.get(key)), np.float32)
                for name, key in keys.items()
            }

        def hand_push_pipelined() -> None:  # issue 15.3: one round trip for every leaf
            with hand.pipeline(transaction=False) as pipe:
                for name, leaf in nest.items():
                    pipe.set(keys[name], leaf.tobytes())
                pipe.execute()

        def hand_update() -> None:
            for name, key in keys.items():
                variables[name].assign(np.frombuffer(cast(bytes, hand.get(key)), np.float32))

        ops = varsync_ops("redis", store, nest, variables)
        store_ops = {(c, o): call for c, o, call in ops}
        if max(leaf.nbytes for leaf in nest.values()) > REDIS_BULK_LIMIT:
            self.refuse(case, "redis-py", "push", hand_refusal(self.redis_url, nest))
        else:
            ops += [
                ("redis-py", "push", hand_push),
                ("redis-py pipelined", "push", hand_push_pipelined),
                ("redis-py", "pull", hand_pull),
            ]
            if variables is not None:
                ops.append(("redis-py", "update", hand_update))
        floor = None
        if case.nbytes <= GB:  # issue 15.4: the same bytes over raw loopback TCP
            floor = LoopbackFloor(nest, into=targets)
            ops.append(("tcp loopback", "transfer", floor.transfer))
        # issue 4 compares a pull with np.copyto into new arrays, in the same rounds
        ops += copies(nest, targets, variables, fresh=case.targets)
        polls: list[Poll] = [("redis", "pull_if_newer", poller(store), self.plan.polls)]
        if case.targets:
            polls.append(("redis", "version", store.version, self.plan.versions))
        per_round = []
        if case.first_push:
            fresh = itertools.count()
            per_round.append(
                lambda: redis_first_push(
                    self.redis_url, nest, f"bench-{case.name}-{self.tag}-first-{next(fresh)}", hand
                )
            )

        after = []
        meter = None
        if case.profile:  # issue 15.4: where the time of push, pull and the floor goes
            meter = wire_profile.CpuMeter(
                self.redis_pid, {("redis", "push"), ("redis", "pull"), ("tcp loopback", "transfer")}
            )
            after.append(
                lambda: self.profile_wire(
                    case,
                    meter,
                    {key: store_ops[key] for key in (("redis", "push"), ("redis", "pull"))},
                )
            )

        def close() -> None:
            if floor is not None:
                floor.close()
            store.close()
            hand.flushall()  # free the server's memory for the next size
            hand.close()

        # Three rounds before redis:// is in its steady state: from the third push on, a
        # table pushed at recycle_from (256 MiB) or more has a spare version, which each
        # push overwrites in place.
        return Group(
            "redis", ops, polls, close, warm=3, per_round=per_round, after=after, meter=meter
        )

    def profile_wire(
        self,
        case: Case,
        meter: wire_profile.CpuMeter,
        calls: dict[tuple[str, str], Callable[[], Any]],
    ) -> None:
        """Issue 15.4: the timed rounds' CPU figures and a py-spy profile of more pushes
        and pulls, untimed, into ``out["wire_profile"]``."""
        medians = {
            key: float(np.median([r["wall"] for r in records]))
            for key, records in meter.records.items()
            if records
        }
        profiles = wire_profile.profile(calls, medians)
        for (contender, op), records in meter.records.items():
            self.out.setdefault("wire_profile", []).append(
                {
                    "case": case.name,
                    "bytes": case.nbytes,
                    "contender": contender,
                    "op": op,
                    "cpu": records,
                    "py_spy": profiles.get((contender, op)),
                }
            )

    def shm_group(self, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
        import varsync
        import varsync_shm

        name = f"bench-{case.name}-{self.tag}"
        store = varsync.connect(f"shm://{name}")
        store.create_table(TABLE, nest)

        def read(pulled: dict[str, np.ndarray]) -> None:  # a reader using the views' bytes
            for leaf, value in pulled.items():
                np.copyto(targets[leaf], value)

        ops = varsync_ops("shm", store, nest, variables)
        per_round = []
        if case.targets:  # issue 5: pull ≤ 2 x np.copyto, steady and cold
            ops += [
                ("shm", "pull + read", lambda: read(store.pull())),
                ("shm", "update numpy", lambda: store.update(targets, delta_only=False)),
            ]
            per_round.append(lambda: shm_cold_paths(store, nest, read))
        ops += copies(nest, targets, variables)

        def close() -> None:
            store.close()
            varsync_shm.remove_store(name)

        # Three pushes before shm:// is in its steady state (both alternating segments
        # allocated and mapped), as `varsync bench` does.
        return Group(
            "shm",
            ops,
            [("shm", "pull_if_newer", poller(store), self.plan.polls)],
            close,
            warm=3,
            per_round=per_round,
        )

    def refuse(self, case: Case, contender: str, op: str, reason: str) -> None:
        self.out["refusals"].append(
            {
                "case": case.name,
                "layout": case.layout,
                "bytes": case.nbytes,
                "contender": contender,
                "op": op,
                "reason": reason,
            }
        )
        self.log(f"   {contender} {op} at {size_label(case.nbytes)}: {reason}")

    # The loop.

    def run_case(self, case: Case) -> None:
        import tensorflow as tf

        started = time.monotonic()
        nest = nest_of(case.nbytes, case.leaves)
        targets = {name: np.ones_like(leaf) for name, leaf in nest.items()}  # touched: no faults
        variables = (
            {name: tf.Variable(leaf) for name, leaf in nest.items()} if case.update else None
        )
        self.out["cases"].append(asdict(case))
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
        self.log(
            f"   {case.layout} {size_label(case.nbytes)} ({case.leaves} arrays, "
            f"{case.rounds} rounds): {time.monotonic() - started:.0f} s"
        )

    def run_group(self, case: Case, group: Group) -> None:
        for _ in range(group.warm):
            for _, _, call in group.ops:
                call()
        samples: dict[tuple[str, str], list[float]] = {(c, o): [] for c, o, _ in group.ops}
        turns = contender_turns(group.ops)
        for number in range(case.rounds):
            gc.collect()
            shift = number % len(turns)
            for contender, op, call in itertools.chain(*turns[shift:], *turns[:shift]):

                def sample(call: Callable[[], Any] = call) -> float:
                    return timed(call, case.inner)

                samples[(contender, op)].append(
                    sample()
                    if group.meter is None
                    else group.meter.sample((contender, op), sample, case.inner)
                )
            for measure in group.per_round:
                for key, seconds in measure().items():
                    samples.setdefault(key, []).append(seconds)
        for (contender, op), values in samples.items():
            self.out["sweep"].append(
                {
                    "case": case.name,
                    "layout": case.layout,
                    "leaves": case.leaves,
                    "bytes": case.nbytes,
                    "group": group.name,
                    "contender": contender,
                    "op": op,
                    "samples": values,
                }
            )
        for contender, op, poll, count in group.polls:
            values = time_polls(poll, count, contender, check=op == "pull_if_newer")
            self.out["polls"].append(
                {
                    "case": case.name,
                    "layout": case.layout,
                    "bytes": case.nbytes,
                    "contender": contender,
                    "op": op,
                    "samples": values,
                }
            )
        for after in group.after:
            after()


def contender_turns(ops: list[Op]) -> list[list[Op]]:
    """``ops`` as one turn per contender (its push, pull and update, in that order), in the
    order the contenders first appear. :meth:`Sweep.run_group` rotates the turns by one
    each round: the first calls after a round's ``gc.collect()`` find the caches of both
    processes cold (the collector walks TensorFlow's objects), and whichever turn always
    went first paid that alone. Measured at 1 MB on Redis: varsync's push 1.42x the
    pipelined SETs when it always went first, 1.05x when they did."""
    turns: dict[str, list[Op]] = {}
    for op in ops:
        turns.setdefault(op[0], []).append(op)
    return list(turns.values())


def varsync_ops(
    contender: str, store: Any, nest: Any, variables: Any, table: str = TABLE
) -> list[Op]:
    """A varsync container's push and pull of ``nest`` and, with ``variables``, its update:
    whole ones (``skip_unchanged=False``, ``delta_only=False``), for the same nest is pushed
    every round; what moving only changed leaves saves is the delta group's."""
    ops: list[Op] = [
        (contender, "push", lambda: store.push(nest, table, skip_unchanged=False)),
        (contender, "pull", lambda: store.pull(table)),
    ]
    if variables is not None:
        ops.append((contender, "update", lambda: store.update(variables, table, delta_only=False)))
    return ops


def copies(
    nest: dict[str, np.ndarray], targets: dict[str, np.ndarray], variables: Any, fresh: bool = False
) -> list[Op]:
    """The physical references, timed in every group: np.copyto of the same bytes into
    existing arrays, ``tf.Variable.assign`` of them (the floor of any update), and with
    ``fresh``, np.copyto into new arrays (the page faults any pull into new arrays pays)."""

    def into_existing() -> None:
        for name, leaf in nest.items():
            np.copyto(targets[name], leaf)

    def into_fresh() -> dict[str, np.ndarray]:
        made = {name: np.empty_like(leaf) for name, leaf in nest.items()}
        for name, leaf in nest.items():
            np.copyto(made[name], leaf)
        return made

    ops: list[Op] = [("np.copyto", "copy", into_existing)]
    if fresh:
        ops.append(("np.copyto fresh", "copy", into_fresh))
    if variables is not None:
        ops.append(
            ("tf assign", "update", lambda: [variables[k].assign(v) for k, v in nest.items()])
        )
    return ops


def memory_table(case: Case, nest: Any, tag: str) -> tuple[Any, Callable[[], None]]:
    """A memory:// container holding a table of ``nest``, and the call that frees its
    bytes (the store outlives its containers)."""
    import varsync
    from varsync.backends import memory

    name = f"bench-{case.name}-{tag}"
    store = varsync.connect(f"memory://{name}")
    store.create_table(TABLE, nest)

    def forget() -> None:
        memory._STORES.pop(name, None)

    return store, forget


def redis_first_push(url: str, nest: Any, namespace: str, admin: Any) -> Timings:
    """The first push into a table made for it (made untimed), then its keys deleted: what
    a learner's first push of a run costs, when redis:// has no spare version to reuse."""
    import varsync

    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.create_table(TABLE, nest)
        seconds = timed(lambda: store.push(nest))
    stale = list(admin.scan_iter(match=f"*:{namespace}:*", count=1000))
    if stale:
        admin.unlink(*stale)
    return {("redis", "push, new table"): seconds}


def shm_cold_paths(store: Any, nest: Any, read: Callable[[Any], None]) -> Timings:
    """With a reader holding both segments (no spare free): a push into a new segment and
    the first pull + read of it; then back to the steady state, untimed."""
    held = [store.pull()]
    store.push(nest, skip_unchanged=False)  # refills the spare
    held.append(store.pull())  # now both segments are held
    push = timed(lambda: store.push(nest, skip_unchanged=False))
    first_read = timed(lambda: read(store.pull()))
    del held
    gc.collect()
    for _ in range(3):
        store.push(nest, skip_unchanged=False)
        read(store.pull())
    return {("shm", "push, new segment"): push, ("shm", "pull + read, new segment"): first_read}


def time_polls(poll: Callable[[], Any], count: int, who: str, check: bool = True) -> list[float]:
    """Seconds of each of ``count`` calls of ``poll``, timed one by one; with ``check``, a
    poll that found a newer version (nothing was pushed) is an error."""
    values = []
    for _ in range(count):
        started = time.perf_counter_ns()
        result = poll()
        values.append((time.perf_counter_ns() - started) / 1e9)
        if check and result is not None:
            raise RuntimeError(
                f"{who}: pull_if_newer found a newer version while nothing was pushed"
            )
    return values


def poller(store: Any, table: str = TABLE) -> Callable[[], Any]:
    """``pull_if_newer`` of the version the table had at the first call."""
    held: dict[str, int] = {}

    def poll() -> Any:
        if "version" not in held:
            held["version"] = store.version(table)
        return store.pull_if_newer(held["version"], table)

    return poll


def hand_refusal(url: str, nest: dict[str, np.ndarray]) -> str:
    """Try what a user would write, one SET of a leaf over 512 MB; say what happened."""
    import redis

    _name, leaf = max(nest.items(), key=lambda item: item[1].nbytes)
    client = redis.Redis.from_url(url, socket_timeout=120)
    try:
        client.set("hand:too-large", leaf.tobytes())
        client.delete("hand:too-large")
        return "accepted?! (expected the server to refuse a value over 512 MB)"
    except redis.RedisError as exc:
        return (
            f"refused by redis-server: one SET of a {leaf.nbytes / MB:.0f} MB array "
            f"exceeds its 512 MB proto-max-bulk-len ({type(exc).__name__})"
        )
    finally:
        client.close()


# The physical floor of a networked backend (issue 15.4), timed in the Redis group: the
# sender ``sendall``s each leaf's memory (no copy); a receiver thread ``recv_into``s arrays
# allocated once, of the leaves' sizes (the group's copy targets: no memory of its own,
# which at 1 GB matters on a 24 GiB machine). A transfer returns when the receiver holds
# every byte: what any client-server protocol on loopback pays at least, either way.


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array).data).cast("B")


class LoopbackFloor:
    """A connected pair of loopback TCP sockets and a receiver thread, for ``nest``'s bytes,
    received into ``into`` (arrays of the same names and sizes, written by every transfer).
    ``transfer()`` sends them once and waits until they all arrived; ``close()`` stops the
    thread and closes both sockets."""

    def __init__(self, nest: dict[str, np.ndarray], into: dict[str, np.ndarray]) -> None:
        self.views = [_bytes_of(leaf) for leaf in nest.values()]
        self.buffers = [_bytes_of(into[name]) for name in nest]
        if [v.nbytes for v in self.views] != [b.nbytes for b in self.buffers]:
            raise ValueError("LoopbackFloor: `into` must hold arrays of the nest's sizes")
        self.total = sum(view.nbytes for view in self.views)
        self.error: BaseException | None = None
        self._arrived = threading.Semaphore(0)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(
                listener.getsockname()[:2], timeout=FLOOR_TIMEOUT
            )
            try:
                self.receiver, _ = listener.accept()
            except BaseException:
                self.sender.close()
                raise
        self.receiver.settimeout(None)  # the thread blocks until bytes come or close()
        # No Nagle: a leaf's last partial segment would wait for the previous one's ACK,
        # which the receiver delays (a 10 KB nest measured 30 ms instead of ~0.1 ms)
        self.sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._thread = threading.Thread(target=self._receive, name="bench-tcp-floor", daemon=True)
        self._thread.start()

    def transfer(self) -> None:
        for view in self.views:
            self.sender.sendall(view)
        if not self._arrived.acquire(timeout=FLOOR_TIMEOUT):
            raise TimeoutError(
                f"the loopback receiver did not get {self.total} bytes within {FLOOR_TIMEOUT:.0f} s"
            )
        if self.error is not None:
            raise RuntimeError("the loopback receiver failed") from self.error

    def _receive(self) -> None:
        try:
            while True:
                for buffer in self.buffers:
                    got = 0
                    while got < buffer.nbytes:
                        n = self.receiver.recv_into(buffer[got:])
                        if n == 0:  # close(): the sender shut down
                            return
                        got += n
                self._arrived.release()
        except OSError as exc:
            self.error = exc
            self._arrived.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sender.shutdown(socket.SHUT_WR)
        self._thread.join(30)
        for sock in (self.sender, self.receiver):
            sock.close()
