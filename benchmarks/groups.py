"""The cross-backend benchmarks: each backend at each size in a group with its baselines.

- memory:// beside ``np.copyto`` of the same bytes and ``tf.Variable.assign`` (the floor of
  any update into TensorFlow variables);
- reverb:// beside TF-Agents' ``ReverbVariableContainer`` on the same server and table,
  and varsync's drop-in for it (``varsync.compat.tf_agents``, pushing ``tf.Variable``s);
- redis:// beside hand-written redis-py on the same redis-server: a ``SET`` per leaf,
  the same ``SET``s in one pipeline, and an *atomic* publish (``MULTI``/``EXEC`` of the
  leaves' chunks and a version counter: varsync's push is atomic, so this is the fair
  one); beside the same bytes over a raw loopback TCP socket pair (the wire's floor); at
  the large sizes also a new table's first push beside a hand-written atomic publish into
  new keys (both pay the server's fresh memory: that is the floor);
- shm:// beside ``np.copyto``, its pull also followed by a read of every pulled byte.

Every group also times ``pull_if_newer`` when nothing changed, call by call.
:func:`many_tables` times it on a Reverb server of 50 tables beside the ServerInfo
call every Reverb version check makes (its floor).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, cast

import numpy as np

from .harness import GB, MB, Group, Key, Op, Timings, nest_of, time_polls, timed

TABLE = "variables"
REDIS_BULK_LIMIT = 512 * 2**20  # redis-server's proto-max-bulk-len
CHUNK = 4 << 20  # the hand-written atomic publish's chunk: varsync's default chunk size
FLOOR_TIMEOUT = 300.0


@dataclass
class Case:
    """One size of the sweep: ``leaves`` float32 vectors, ``nbytes`` in all. ``inner``
    back-to-back calls per sample (small sizes); ``first_push``: Redis also times a new
    table's first push, once per round."""

    leaves: int
    nbytes: int
    rounds: int
    inner: int = 1
    first_push: bool = False

    @property
    def name(self) -> str:
        return f"{self.leaves}x{self.nbytes}"


@dataclass
class Context:
    """What the groups share: servers, poll counts, a tag for names."""

    redis_url: str
    reverb: dict[str, str]  # case name -> address of the Reverb server serving its table
    polls: int
    reverb_polls: int
    tag: str = uuid.uuid4().hex[:6]


def varsync_ops(contender: str, store: Any, nest: Any, variables: Any, table: str) -> list[Op]:
    """Whole pushes and updates: the same nest is pushed every round (what moving only
    changed leaves saves is the delta group's)."""
    ops: list[Op] = [
        (contender, "push", lambda: store.push(nest, table, skip_unchanged=False)),
        (contender, "pull", lambda: store.pull(table)),
    ]
    if variables is not None:
        ops.append((contender, "update", lambda: store.update(variables, table, delta_only=False)))
    return ops


def copies(nest: Any, targets: Any, variables: Any) -> list[Op]:
    """The physical references: np.copyto into existing arrays, tf.Variable.assign."""

    def into_existing() -> None:
        for name, leaf in nest.items():
            np.copyto(targets[name], leaf)

    ops: list[Op] = [("np.copyto", "copy", into_existing)]
    if variables is not None:
        ops.append(
            ("tf assign", "update", lambda: [variables[k].assign(v) for k, v in nest.items()])
        )
    return ops


def floors(contender: str) -> dict[Key, list[Key]]:
    return {
        (contender, "push"): [("np.copyto", "copy")],
        (contender, "update"): [("tf assign", "update")],
    }


def poller(store: Any, table: str = TABLE) -> Callable[[], Any]:
    """``pull_if_newer`` of the version the table had at the first call."""
    held: list[int] = []

    def poll() -> Any:
        if not held:
            held.append(store.version(table))
        return store.pull_if_newer(held[0], table)

    return poll


def memory_group(ctx: Context, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
    import varsync
    from varsync._backends import memory

    name = f"bench-{case.name}-{ctx.tag}"
    store = varsync.connect(f"memory://{name}")
    store.create_table(TABLE, nest)

    def close() -> None:
        store.close()
        memory._STORES.pop(name, None)

    ops = varsync_ops("memory", store, nest, variables, TABLE) + copies(nest, targets, variables)
    polls = [("memory", "pull_if_newer", poller(store), ctx.polls)]
    return Group("memory", ops, floors("memory"), close, polls=polls)


def reverb_group(ctx: Context, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
    import reverb
    from tf_agents.experimental.distributed.reverb_variable_container import (
        ReverbVariableContainer,
    )

    import varsync
    from varsync.compat.tf_agents import ReverbVariableContainer as DropIn

    address, table = ctx.reverb[case.name], case.name
    store = varsync.connect(f"reverb://{address}", timeout=300)
    tfa = ReverbVariableContainer(address, table_names=(table,))
    ops = varsync_ops("reverb", store, nest, variables, table) + [
        ("tf-agents", "push", lambda: tfa.push(variables, table)),
        ("tf-agents", "pull", lambda: tfa.pull(table)),
        ("tf-agents", "update", lambda: tfa.update(variables, table)),
    ]
    closers = [store.close]
    if case.leaves == 4 and case.nbytes < GB:  # the drop-in pushes tf.Variables, as TF-Agents'
        dropin = DropIn(address, table_names=(table,), timeout=300)
        closers.append(dropin.container.close)
        ops += [
            ("varsync drop-in", "push", lambda: dropin.push(variables, table)),
            ("varsync drop-in", "pull", lambda: dropin.pull(table)),
        ]
    ops += copies(nest, targets, variables)
    baselines = {
        (c, op): [("tf-agents", op)]
        for c in ("reverb", "varsync drop-in")
        for op in ("push", "pull", "push+pull")
    }
    baselines[("reverb", "update")] = [("tf-agents", "update"), ("tf assign", "update")]

    def close() -> None:
        for closer in closers:
            closer()
        reverb.Client(address).reset(table)  # free the server's copy of this size

    polls = [("reverb", "pull_if_newer", poller(store, table), ctx.reverb_polls)]
    return Group("reverb", ops, baselines, close, polls=polls)


def redis_group(ctx: Context, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
    import redis

    import varsync

    namespace = f"bench-{case.name}-{ctx.tag}"
    store = varsync.connect(ctx.redis_url, namespace=namespace, timeout=300)
    store.create_table(TABLE, nest)
    hand = redis.Redis.from_url(ctx.redis_url, socket_timeout=300)
    keys = {name: f"hand:{case.name}:{name}" for name in nest}
    ops = varsync_ops("redis", store, nest, variables, TABLE)
    if max(leaf.nbytes for leaf in nest.values()) <= REDIS_BULK_LIMIT:

        def hand_push() -> None:  # what a user writes first
            for name, leaf in nest.items():
                hand.set(keys[name], leaf.tobytes())

        def hand_push_pipelined() -> None:  # one round trip, not atomic
            with hand.pipeline(transaction=False) as pipe:
                for name, leaf in nest.items():
                    pipe.set(keys[name], leaf.tobytes())
                pipe.execute()

        def hand_pull() -> dict[str, np.ndarray]:
            return {
                k: np.frombuffer(cast(bytes, hand.get(key)), np.float32) for k, key in keys.items()
            }

        def hand_update() -> None:
            for k, key in keys.items():
                variables[k].assign(np.frombuffer(cast(bytes, hand.get(key)), np.float32))

        ops += [
            ("redis-py SETs", "push", hand_push),
            ("redis-py pipelined SETs", "push", hand_push_pipelined),
            ("redis-py SETs", "pull", hand_pull),
        ]
        if variables is not None:
            ops.append(("redis-py SETs", "update", hand_update))
    ops.append(
        ("redis-py MULTI/EXEC", "push", lambda: atomic_publish(hand, nest, f"atomic:{case.name}"))
    )
    floor = LoopbackFloor(nest, into=targets) if case.nbytes <= GB else None
    if floor is not None:
        ops.append(("tcp loopback", "transfer", floor.transfer))
    ops += copies(nest, targets, variables)
    hands = [("redis-py MULTI/EXEC", "push"), ("redis-py pipelined SETs", "push")]
    baselines = {
        ("redis", "push"): [*hands, ("redis-py SETs", "push"), ("tcp loopback", "transfer")],
        ("redis", "pull"): [("redis-py SETs", "pull"), ("tcp loopback", "transfer")],
        ("redis", "update"): [("redis-py SETs", "update"), ("tf assign", "update")],
        ("redis", "push, new table"): [("redis-py MULTI/EXEC", "push, new keys")],
    }
    per_round = []
    if case.first_push:
        fresh = itertools.count()
        per_round.append(
            lambda: first_pushes(ctx.redis_url, nest, f"{namespace}-{next(fresh)}", hand)
        )

    def close() -> None:
        if floor is not None:
            floor.close()
        store.close()
        hand.flushall()  # free the server's memory for the next size
        hand.close()

    # Three warm rounds: from the third push on, a large table has a spare version that
    # each push overwrites in place (redis://'s steady state).
    polls = [("redis", "pull_if_newer", poller(store), ctx.polls)]
    return Group("redis", ops, baselines, close, warm=3, per_round=per_round, polls=polls)


def atomic_publish(client: Any, nest: dict[str, np.ndarray], prefix: str) -> Any:
    """The hand-written atomic publish: every leaf's bytes in chunks of ``CHUNK`` (no copy:
    memoryviews of the arrays) and a version counter, in one ``MULTI``/``EXEC``, so that no
    reader sees a mix of two versions, as with varsync's push."""
    with client.pipeline(transaction=True) as pipe:
        for name, leaf in nest.items():
            data = bytes_of(leaf)
            for i, start in enumerate(range(0, max(len(data), 1), CHUNK)):
                pipe.set(f"{prefix}:{name}:{i}", data[start : start + CHUNK])
        pipe.incr(f"{prefix}:version")
        return pipe.execute()


def bytes_of(array: np.ndarray) -> memoryview:
    """The array's memory as bytes, no copy."""
    return memoryview(np.ascontiguousarray(array).data).cast("B")


def first_pushes(url: str, nest: Any, namespace: str, admin: Any) -> Timings:
    """A new table's first push (the table made untimed) and a hand-written atomic publish
    into new keys: both make the server write fresh memory, the floor of a first push.
    varsync's goes first, the colder turn. Their keys are deleted after."""
    import varsync

    with varsync.connect(url, namespace=namespace, timeout=300) as store:
        store.create_table(TABLE, nest)
        mine = timed(lambda: store.push(nest))
    theirs = timed(lambda: atomic_publish(admin, nest, f"{namespace}:atomic"))
    stale = list(admin.scan_iter(match=f"*{namespace}*", count=1000))
    if stale:
        admin.unlink(*stale)
    return {("redis", "push, new table"): mine, ("redis-py MULTI/EXEC", "push, new keys"): theirs}


def shm_group(ctx: Context, case: Case, nest: Any, variables: Any, targets: Any) -> Group:
    import varsync
    import varsync_shm

    name = f"bench-{case.name}-{ctx.tag}"
    store = varsync.connect(f"shm://{name}")
    store.create_table(TABLE, nest)

    def pull_and_read() -> None:  # a pull returns views: a reader then reads the bytes
        for leaf, value in store.pull().items():
            np.copyto(targets[leaf], value)

    ops = varsync_ops("shm", store, nest, variables, TABLE)
    ops += [("shm", "pull + read", pull_and_read)] + copies(nest, targets, variables)
    baselines = floors("shm") | {("shm", "pull + read"): [("np.copyto", "copy")]}

    def close() -> None:
        store.close()
        varsync_shm.remove_store(name)

    # three pushes before both alternating segments exist: shm://'s steady state
    polls = [("shm", "pull_if_newer", poller(store), ctx.polls)]
    return Group("shm", ops, baselines, close, warm=3, polls=polls)


GROUPS = {"memory": memory_group, "reverb": reverb_group, "redis": redis_group, "shm": shm_group}


def many_tables(address: str, tables: list[str], count: int) -> dict[str, list[float]]:
    """``pull_if_newer`` unchanged on one table of a Reverb server holding many, call by
    call, each call followed by the raw ServerInfo request every Reverb version check makes
    (its reply carries every table's info): the floor the poll cannot go below."""
    import reverb

    import varsync

    # the raw ServerInfo request varsync makes (reverb.Client.server_info would also
    # decode every table's signature in Python, which no version check does)
    server_info = reverb.Client(address)._client.ServerInfo
    with varsync.connect(f"reverb://{address}", timeout=300) as store:
        nest = store.signature(tables[0])
        for table in tables:
            store.push({k: np.ones(s.shape, s.dtype) for k, s in nest.items()}, table)
        poll = poller(store, tables[0])
        poll()
        samples: dict[str, list[float]] = {"pull_if_newer": [], "server_info": []}
        for _ in range(count):
            samples["pull_if_newer"] += time_polls(poll, 1, "reverb, many tables")
            samples["server_info"].append(timed(lambda: server_info(0)))
    return samples


# The wire's floor, timed in the Redis group: the sender ``sendall``s each leaf's memory;
# a receiver thread ``recv_into``s the group's copy targets (no memory of its own). A
# transfer returns when every byte arrived: what any protocol over loopback pays at least.


class LoopbackFloor:
    def __init__(self, nest: dict[str, np.ndarray], into: dict[str, np.ndarray]) -> None:
        self.views = [bytes_of(leaf) for leaf in nest.values()]
        self.buffers = [bytes_of(into[name]) for name in nest]
        self.error: BaseException | None = None
        self._arrived = threading.Semaphore(0)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(listener.getsockname()[:2], FLOOR_TIMEOUT)
            try:
                self.receiver, _ = listener.accept()
            except BaseException:
                self.sender.close()
                raise
        self.receiver.settimeout(None)
        # no Nagle: a leaf's last segment would wait for the delayed ACK of the one before
        self.sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._thread = threading.Thread(target=self._receive, name="bench-tcp-floor", daemon=True)
        self._thread.start()

    def transfer(self) -> None:
        for view in self.views:
            self.sender.sendall(view)
        if not self._arrived.acquire(timeout=FLOOR_TIMEOUT):
            raise TimeoutError(f"the loopback receiver got nothing within {FLOOR_TIMEOUT:.0f} s")
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


def sweep_case(
    ctx: Context,
    case: Case,
    backends: list[str],
    out: list[dict[str, Any]],
    log: Callable[[str], None],
) -> None:
    """Every backend's group at ``case``, one after the other, into ``out`` (one record per
    operation: its samples, round by round, and the baselines it is compared with)."""
    import gc

    from .harness import run_group

    nest = nest_of(case.nbytes, case.leaves)
    targets = {name: np.ones_like(leaf) for name, leaf in nest.items()}  # touched: no faults
    variables = None
    with contextlib.suppress(ImportError):
        import tensorflow as tf

        variables = {name: tf.Variable(leaf) for name, leaf in nest.items()}
    for backend in backends:
        group = GROUPS[backend](ctx, case, nest, variables, targets)
        try:
            samples = run_group(group, case.rounds, case.inner)
            for contender in {c for c, _ in samples}:
                push, pull = samples.get((contender, "push")), samples.get((contender, "pull"))
                if push and pull:
                    samples[(contender, "push+pull")] = [a + b for a, b in zip(push, pull)]
            polls = {(c, o): time_polls(call, n, c) for c, o, call, n in group.polls}
        finally:
            group.close()
            gc.collect()
        for (contender, op), values in {**samples, **polls}.items():
            out.append(
                {
                    "case": case.name,
                    "leaves": case.leaves,
                    "bytes": case.nbytes,
                    "group": backend,
                    "contender": contender,
                    "op": op,
                    "samples": values,
                    "baselines": group.baselines.get((contender, op), []),
                }
            )
        log(f"   {backend} at {case.leaves} x {case.nbytes / MB:.3g} MB: {case.rounds} rounds")
