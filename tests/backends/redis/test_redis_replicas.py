"""Reads from Redis replicas (issue 17.1): a primary and two replicas (``--replicaof``), real
processes on free 127.0.0.1 ports; containers write to the primary and read from a replica
named by ``replicas=``. A lagging replica answers "nothing newer" and a wait wakes when the
replica has the version; a replica emptied or reloading for a full resync is read through
the primary; no pull is ever a mix, nor older than one already handed out."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest

import varsync
from varsync.backend import check_consistent, filled
from varsync.testing.faults import Proxy
from varsync.testing import (
    ConcurrencyTests,
    ContractTests,
    LeafSubsetTests,
    LeafVersionTests,
    RoundTripTests,
    ShardedTests,
    VersionTests,
)
from fixtures.redis import RedisServer, command_calls, find_redis_server

redis = pytest.importorskip("redis")

SIGNATURE = {"weights": np.zeros((256, 1024), np.float32), "step": np.zeros((), np.int64)}
LINK_TIMEOUT = 20.0


def replication(server: RedisServer) -> Dict[str, Any]:
    with server.client(socket_timeout=5) as admin:
        return admin.info("replication")


def wait_linked(primary: RedisServer, *replicas: RedisServer) -> None:
    """Return once every replica is linked and has everything the primary wrote."""
    deadline = time.monotonic() + LINK_TIMEOUT
    while time.monotonic() < deadline:
        offset = replication(primary)["master_repl_offset"]
        states = [replication(r) for r in replicas]
        if all(s.get("master_link_status") == "up" and not s.get("master_sync_in_progress")
               and s.get("slave_repl_offset", -1) >= offset for s in states):
            return
        time.sleep(0.02)  # polling the replicas' link state, bounded by the deadline
    raise AssertionError(f"replicas not caught up within {LINK_TIMEOUT} s: {states}")


def head_version(server: RedisServer, namespace: str, table: str = "variables") -> int:
    """The table's version in ``server``'s own data (0 if it has no head)."""
    with server.client(socket_timeout=5) as admin:
        raw = admin.hget(f"varsync:{namespace}:{table}:head", "version")
    return 0 if raw is None else int(raw)


def start_replica(binary: str, directory: Path, primary: RedisServer,
                  config: tuple = ()) -> RedisServer:
    return RedisServer(binary, directory, config=[
        "--replicaof", "127.0.0.1", str(primary.port), *config,
    ]).start()


@contextlib.contextmanager
def cut_off(replica: RedisServer, primary: RedisServer, writable: bool = False) -> Iterator[None]:
    """Within: the replica's replication stopped (it keeps serving what it has, pointed at a
    port where nothing listens), and with ``writable`` open to writes by hand; linked to
    ``primary`` again after."""
    with replica.client() as admin:
        admin.execute_command("REPLICAOF", "127.0.0.1", str(_free_port()))
        if writable:
            admin.config_set("replica-read-only", "no")
    try:
        yield
    finally:
        with replica.client() as admin:
            if writable:
                admin.config_set("replica-read-only", "yes")
            admin.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))


@pytest.fixture(scope="module")
def binary() -> str:
    found = find_redis_server()
    if found is None:
        pytest.skip("no redis-server (set VARSYNC_REDIS_SERVER)")
    return found


@pytest.fixture
def group(binary: str, tmp_path: Path) -> Iterator[List[RedisServer]]:
    """A primary and two replicas of the test's own, linked; all stopped at the end."""
    servers: List[RedisServer] = []
    try:
        servers.append(RedisServer(binary, tmp_path / "primary").start())
        for index in (1, 2):
            servers.append(start_replica(binary, tmp_path / f"replica-{index}", servers[0]))
        wait_linked(*servers)
        yield servers
    finally:
        for server in servers:
            server.stop()


def urls(group: List[RedisServer], replica: int = 1, **options: Any) -> Dict[str, str]:
    """The writer's URL (the primary) and a reader's (reads from replica ``replica``)."""
    namespace = options.pop("namespace", f"t-{uuid.uuid4().hex[:8]}")
    query = "&".join(f"{k}={v}" for k, v in options.items())
    writer = f"{group[0].url}?namespace={namespace}"
    reader = f"{writer}&replicas=127.0.0.1:{group[replica].port}" + (f"&{query}" if query else "")
    return {"writer": writer, "reader": reader, "namespace": namespace}


def test_reads_go_to_the_replica_and_writes_to_the_primary(group: List[RedisServer]) -> None:
    primary, replica = group[0], group[1]
    url = urls(group)
    with varsync.connect(url["writer"], timeout=10) as writer, \
            varsync.connect(url["reader"], timeout=10) as reader:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        wait_linked(*group)
        with primary.client() as p, replica.client() as r:
            before = command_calls(p), command_calls(r)
            version, values = reader.pull_if_newer(0)
            assert (version, check_consistent(values)) == (1, 1)
            after = command_calls(p), command_calls(r)
        assert after[0].get("get", 0) == before[0].get("get", 0)  # no chunk from the primary
        assert after[1].get("get", 0) > before[1].get("get", 0)
        assert reader.backend.describe_options()["read_from"] == "replica"


def test_a_lagging_replica_answers_nothing_newer_and_a_wait_wakes_only_once_it_has_the_version(
    group: List[RedisServer],
) -> None:
    primary, replica = group[0], group[1]
    url = urls(group)
    with varsync.connect(url["writer"], timeout=10) as writer, \
            varsync.connect(url["reader"], timeout=10) as reader:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        wait_linked(*group)
        held, values = reader.pull_if_newer(0)
        assert (held, check_consistent(values)) == (1, 1)
        # Replication stops: the replica keeps serving v1, trying to reach a primary at a
        # port where nothing listens yet. It resumes, without a REPLICAOF, once a proxy to
        # the primary listens there: a REPLICAOF would also close the replica's blocked
        # clients (the waiter's XREAD), whose reads then go to the primary by design.
        gate = _free_port()
        with replica.client() as admin:
            admin.execute_command("REPLICAOF", "127.0.0.1", str(gate))
        assert writer.push(filled(SIGNATURE, 2)) == 2
        assert reader.pull_if_newer(held) is None
        assert reader.version() == 1
        woke: Dict[str, int] = {}

        def wait() -> None:
            woke["version"] = reader.wait_for(held, timeout=20)
            woke["replica had"] = head_version(replica, url["namespace"])

        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            waiter.join(1.5)  # the primary has had version 2 all along
            assert waiter.is_alive() and head_version(replica, url["namespace"]) == 1
            with Proxy("127.0.0.1", primary.port, listen_port=gate):
                waiter.join(30)
        finally:
            waiter.join(30)
        assert woke["version"] >= 2 and woke["replica had"] >= 2
        version, values = reader.pull_if_newer(held)
        assert (version, check_consistent(values)) == (2, 2)


def test_a_container_reading_a_lagging_replica_still_sees_its_own_push(
    group: List[RedisServer],
) -> None:
    """Read-your-writes on a replica that stays at the version the container holds: the
    container knows of its own newer push, so "nothing newer" is asked of the primary."""
    replica = group[1]
    url = urls(group)
    with varsync.connect(url["reader"], timeout=10) as container:  # writes: the primary
        container.create_table("variables", SIGNATURE)
        container.push(filled(SIGNATURE, 1))
        wait_linked(*group)
        held, values = container.pull_if_newer(0)
        assert (held, check_consistent(values)) == (1, 1)
        with cut_off(replica, group[0]):  # the replica keeps serving v1
            assert container.push(filled(SIGNATURE, 2)) == 2
            before = container.backend.reads_on_primary
            version, values = container.pull_if_newer(held)
            assert (version, check_consistent(values)) == (2, 2)
            assert container.backend.reads_on_primary > before
            # Holding the newest version the container knows, the replica's older one is
            # its lag, asked of the primary, not a history that went back (CI once saw
            # TableResetError "at version 81 ... since you read version 87" here, from
            # eight threads sharing one container).
            assert container.pull_if_newer(version) is None
            assert head_version(replica, url["namespace"]) == 1
            assert container.version() == 2


class _PausedFloors(dict):  # type: ignore[type-arg]
    """The backend's floors, whose first read waits until let go: a thread preempted
    between reading a table's floor and writing it, as a CPU-loaded machine does."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.entered, self.go = threading.Event(), threading.Event()
        self._first = True

    def get(self, *args: Any) -> Any:
        found = super().get(*args)
        if self._first:
            self._first = False
            self.entered.set()
            self.go.wait(10)
        return found


def test_a_slower_thread_never_lowers_the_version_a_container_has_seen(
    group: List[RedisServer],
) -> None:
    """Issue 36: a thread that read version 2 and notes it after another thread of the
    same container noted version 3 must leave 3 as what a replica's answer may not go
    below. (CI saw ``version()`` answer 36 after a pull of 40, from eight threads under
    CPU load: the note was read and written in two steps, and a preempted thread wrote
    its older version over the newer one.)"""
    replica = group[1]
    url = urls(group)
    with varsync.connect(url["reader"], timeout=10) as writer:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        writer.push(filled(SIGNATURE, 2))
        epoch = writer.backend.head("variables", math.inf).epoch
    wait_linked(*group)
    # replication stops: the replica keeps serving v2
    with cut_off(replica, group[0]), varsync.connect(url["reader"], timeout=10) as container:
        backend = container.backend
        floors = backend.router.floors
        floors._floors = paused = _PausedFloors(floors._floors)
        slow = threading.Thread(target=floors.raise_to, args=("variables", epoch, 2))
        slow.start()
        assert paused.entered.wait(10)
        pushed: List[int] = []
        fast = threading.Thread(  # notes version 3 meanwhile (or waits for the slow one)
            target=lambda: pushed.append(container.push(filled(SIGNATURE, 3))))
        fast.start()
        fast.join(1.0)
        paused.go.set()
        slow.join(10)
        fast.join(10)
        assert pushed == [3]
        assert head_version(replica, url["namespace"]) == 2
        assert container.version() == 3


def test_a_version_the_primary_answered_is_never_followed_by_an_older_one_from_the_replica(
    group: List[RedisServer],
) -> None:
    """Issue 36, the cause of "a thread saw version 36 after 40": a replica behind what a
    container had seen is asked of the primary, whose answer (newer than anything the
    container had seen) must then bound the replica's next answers too. Here the replica,
    cut off at version 2 while the container pushed 3 and another writer 4, is moved by
    hand to version 3: between the container's own push and the primary's answer."""
    replica = group[1]
    url = urls(group)
    with varsync.connect(url["writer"], timeout=10) as writer, \
            varsync.connect(url["reader"], timeout=10) as container:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        writer.push(filled(SIGNATURE, 2))
        wait_linked(*group)
        assert container.pull_if_newer(0)[0] == 2
        with cut_off(replica, group[0], writable=True):  # the replica keeps serving v2
            assert container.push(filled(SIGNATURE, 3)) == 3
            assert writer.push(filled(SIGNATURE, 4)) == 4
            assert container.version() == 4  # the replica's 2 is behind 3: the primary's
            with replica.client() as admin:
                admin.hset(f"varsync:{url['namespace']}:variables:head", "version", "3")
            assert head_version(replica, url["namespace"]) == 3
            assert container.version() == 4


def test_a_replica_that_cannot_serve_is_read_through_the_primary(
    group: List[RedisServer],
) -> None:
    """A replica cut off from its primary with replica-serve-stale-data no answers
    MASTERDOWN; a stopped replica does not answer at all: both read on the primary."""
    replica = group[1]
    url = urls(group)
    with varsync.connect(url["writer"], timeout=10) as writer, \
            varsync.connect(url["reader"], timeout=10) as reader:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        wait_linked(*group)
        with replica.client() as admin:
            admin.config_set("replica-serve-stale-data", "no")
            admin.execute_command("REPLICAOF", "127.0.0.1", str(_free_port()))
        writer.push(filled(SIGNATURE, 2))
        version, values = reader.pull_if_newer(1)
        assert (version, check_consistent(values)) == (2, 2)
        assert reader.backend.reads_on_primary >= 1
        replica.stop()
        writer.push(filled(SIGNATURE, 3))
        version, values = reader.pull_if_newer(2)
        assert (version, check_consistent(values)) == (3, 3)


def test_pulls_stay_whole_and_never_go_back_while_a_replica_resyncs(
    group: List[RedisServer],
) -> None:
    """Readers pull in a loop from replica 1 while a writer pushes and the replica is
    restarted empty (a full resync: served empty, then LOADING, then the new data) and
    detached and attached again: every pull is whole and newer than the one before."""
    primary, replica = group[0], group[1]
    url = urls(group, chunk_size=65536, keep=1)
    stop = threading.Event()
    failures: List[str] = []
    pulled: List[int] = []
    with varsync.connect(url["writer"], timeout=10) as writer:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))

        def read() -> None:
            try:
                with varsync.connect(url["reader"], timeout=10) as reader:
                    held = 0
                    while not stop.is_set():
                        newer = reader.pull_if_newer(held, timeout=10)
                        if newer is None:
                            continue
                        version, values = newer
                        if version <= held or check_consistent(values) != version:
                            failures.append(f"held {held}, got {version}: "
                                            f"{check_consistent(values)}")
                        held = version
                        pulled.append(version)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                failures.append(f"{type(exc).__name__}: {exc}")

        readers = [threading.Thread(target=read) for _ in range(2)]
        for thread in readers:
            thread.start()
        try:
            number = 1

            def push_some(count: int) -> None:
                nonlocal number
                for _ in range(count):
                    number += 1
                    assert writer.push(filled(SIGNATURE, number)) == number

            push_some(10)
            replica.restart()  # empty, then a full resync
            push_some(10)
            wait_linked(primary, replica)
            push_some(5)
            with replica.client() as admin:
                admin.execute_command("REPLICAOF", "NO", "ONE")
                admin.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
            push_some(10)
            wait_linked(primary, replica)
            push_some(5)
            caught_up = time.monotonic() + 10  # the readers get to the last version
            while max(pulled, default=0) < number and not failures:
                assert time.monotonic() < caught_up, f"readers at {max(pulled, default=0)}"
                time.sleep(0.01)
        finally:
            stop.set()
            for thread in readers:
                thread.join(30)
    assert not failures, failures[:5]
    assert pulled and max(pulled) == number


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def shared_group(binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[RedisServer]]:
    servers: List[RedisServer] = []
    base = tmp_path_factory.mktemp("replicas")
    try:
        servers.append(RedisServer(binary, base / "primary").start())
        for index in (1, 2):
            servers.append(start_replica(binary, base / f"replica-{index}", servers[0]))
        wait_linked(*servers)
        yield servers
    finally:
        for server in servers:
            server.stop()


class TestConformanceReadingFromAReplica(
    RoundTripTests, VersionTests, ConcurrencyTests, ContractTests, LeafVersionTests,
    LeafSubsetTests, ShardedTests,
):
    """The suite's mixins about reads with every read of every container on a replica
    (writes on the primary): read-your-writes and monotonic reads hold within a container
    (a replica behind what the container saw or wrote is read through the primary). The
    mixins about writes, tables, faults and the reader registry, which all go to the
    primary, run in TestRedisConformance (the fault tests' proxy fronts the primary only,
    and reads would go around it). Sharded tables run here too: their ranks read the
    manifest and the stage, their readers the manifest and the parts, on a replica; so do
    reads of chosen leaves."""

    @pytest.fixture
    def url(self, shared_group: List[RedisServer]) -> str:
        replicas = ",".join(f"127.0.0.1:{s.port}" for s in shared_group[1:])
        return (f"{shared_group[0].url}?namespace=c-{uuid.uuid4().hex[:10]}"
                f"&replicas={replicas}")

    @pytest.fixture
    def new_history(self, shared_group: List[RedisServer]) -> Callable[[str, str], None]:
        def restart(url: str, table: str) -> None:
            with varsync.connect(url) as container:
                pattern = container.backend.keys(table).head[: -len("head")] + "*"
            with shared_group[0].client() as admin:
                for key in list(admin.scan_iter(match=pattern, count=1000)):
                    admin.delete(key)
            with contextlib.suppress(AssertionError):
                wait_linked(*shared_group)

        return restart
