"""The redis backend on a real local Redis Cluster (three primaries, redis-server processes
of the test's own, tests/fixtures/redis_cluster.py): the conformance suite, tables spread
over the shards with each table's keys in one slot, MOVED and ASK followed, and a table
resharded while readers pull and a writer pushes, every pull whole."""

from __future__ import annotations

import contextlib
import logging
import secrets
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Set

import numpy as np
import pytest

import varsync
from varsync.testing import (
    CapabilityTests,
    ConcurrencyTests,
    ContractTests,
    LeafSubsetTests,
    LeafVersionTests,
    ReaderRegistryTests,
    RoundTripTests,
    ShardedTests,
    TableTests,
    ValidationTests,
    VersionTests,
)
from varsync.backend import ConfigurationError, check_consistent, filled
from varsync._backends.redis import wire
from fixtures.redis_cluster import (  # noqa: F401  (fixtures)
    LocalCluster,
    shared_redis_cluster,
    slot_of,
)

redis = pytest.importorskip("redis")

SIGNATURE = {"w": np.zeros((64, 64), np.float32), "b": np.zeros(100, np.int64)}


def _namespace() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def _until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.01)


def _blocked_in_xread(node: Any) -> bool:
    """Whether a client of ``node`` is blocked in ``XREAD`` (a ``wait_for``)."""
    with node.client() as admin:
        clients = admin.execute_command("CLIENT", "LIST")
    text = clients.decode() if isinstance(clients, bytes) else str(clients)
    return any("cmd=xread" in line and "flags=b" in line for line in text.splitlines())


def _keys_of_table(cluster: LocalCluster, head: str) -> Dict[int, List[bytes]]:
    """Every key of the table whose head key is ``head``, by the port of the node that
    holds it."""
    pattern = head[: -len("head")].replace("{", "\\{").replace("}", "\\}") + "*"
    found: Dict[int, List[bytes]] = {}
    for node in cluster.nodes:
        with node.client() as admin:
            keys = list(admin.scan_iter(match=pattern, count=1000))
        if keys:
            found[node.port] = keys
    return found


class TestConformanceOnACluster(
    TableTests, RoundTripTests, ValidationTests, VersionTests, ConcurrencyTests,
    ContractTests, CapabilityTests, LeafVersionTests, LeafSubsetTests, ReaderRegistryTests,
    ShardedTests,
):
    """The suite but for its fault mixin, whose proxy fronts the URL's one address: in a
    cluster the slot map names every node's own, and requests go around a proxy."""

    @pytest.fixture
    def url(self, shared_redis_cluster: LocalCluster) -> str:  # noqa: F811
        return shared_redis_cluster.url(namespace=_namespace())

    @pytest.fixture
    def new_history(
        self, shared_redis_cluster: LocalCluster  # noqa: F811
    ) -> Callable[[str, str], None]:
        """The table's keys deleted on the node holding them, as a node that lost its
        data; the suite then creates it again (a new epoch)."""

        def restart(url: str, table: str) -> None:
            with varsync.connect(url) as container:
                head = container.backend.keys(table).head
            for port, keys in _keys_of_table(shared_redis_cluster, head).items():
                node = next(n for n in shared_redis_cluster.nodes if n.port == port)
                with node.client() as admin:
                    admin.delete(*keys)

        return restart


def test_tables_spread_over_the_primaries_and_each_lies_on_one_node(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    url = shared_redis_cluster.url(namespace=_namespace(), chunk_size=4096)
    names = [f"table-{i}" for i in range(24)]
    with varsync.connect(url) as container:
        for number, name in enumerate(names):
            container.create_table(name, SIGNATURE)
            container.push(filled(SIGNATURE, number), table=name)
            container.push(filled(SIGNATURE, number + 100), table=name)
        assert container.tables() == sorted(names)
        holders: Set[int] = set()
        for number, name in enumerate(names):
            assert check_consistent(container.pull(table=name)) == number + 100
            head = container.backend.keys(name).head
            found = _keys_of_table(shared_redis_cluster, head)
            assert len(found) == 1, f"{name}'s keys lie on {sorted(found)}"
            port, keys = found.popitem()
            assert port == shared_redis_cluster.owner_of(head).port
            assert len({slot_of(k) for k in keys}) == 1
            assert len(keys) > 10  # head, events, and the chunks of two versions
            holders.add(port)
        assert holders == {n.port for n in shared_redis_cluster.nodes}
    # the default table name in many namespaces (one per run, say): spread too
    spread = set()
    for _ in range(12):
        with varsync.connect(shared_redis_cluster.url(namespace=_namespace())) as container:
            container.create_table("variables", SIGNATURE)
            spread.add(shared_redis_cluster.owner_of(container.backend.keys("variables").head))
    assert len(spread) >= 2


def test_a_stale_slot_map_follows_moved_for_pulls_pushes_and_waits(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    url = shared_redis_cluster.url(namespace=_namespace(), chunk_size=4096)
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        assert check_consistent(reader.pull()) == 1
        head = writer.backend.keys("variables").head
        source = shared_redis_cluster.owner_of(head)
        target = next(n for n in shared_redis_cluster.nodes if n is not source)
        shared_redis_cluster.migrate_slot(slot_of(head), target)
        assert shared_redis_cluster.owner_of(head) is target

        before = reader.backend.primary.redirections
        assert reader.pull_if_newer(1) is None  # its map still names the old owner
        assert reader.backend.primary.redirections > before
        assert writer.push(filled(SIGNATURE, 2)) == 2  # so does the writer's
        assert check_consistent(reader.pull()) == 2

        woken: List[int] = []
        waiting = threading.Thread(target=lambda: woken.append(reader.wait_for(2, timeout=10)))
        waiting.start()
        _until("the reader blocks in XREAD on the new owner",
               lambda: _blocked_in_xread(target))
        writer.push(filled(SIGNATURE, 3))
        waiting.join(15)
        assert woken == [3]


def test_pulls_follow_ask_mid_migration_and_pushes_wait_for_it_to_end(
    shared_redis_cluster: LocalCluster, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    caplog.set_level(logging.DEBUG, logger="varsync.backends.redis")
    url = shared_redis_cluster.url(namespace=_namespace(), chunk_size=4096, keep=2)
    with varsync.connect(url, timeout=20) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        head = writer.backend.keys("variables").head
        source = shared_redis_cluster.owner_of(head)
        target = next(n for n in shared_redis_cluster.nodes if n is not source)
        migration = shared_redis_cluster.begin_migration(slot_of(head), target)
        # half the keys moved: some chunks of version 1 on each node, the head on either
        total = migration.remaining()
        while migration.remaining() > total // 2:
            migration.move_keys(3)
        before = reader.backend.primary.redirections
        assert check_consistent(reader.pull()) == 1
        assert reader.backend.primary.redirections > before  # ASK followed

        pushed: List[int] = []
        pushing = threading.Thread(target=lambda: pushed.append(
            writer.push(filled(SIGNATURE, 2))))
        pushing.start()
        _until("the push meets the slot in migration", lambda: any(
            "in motion" in record.getMessage() for record in caplog.records))
        assert pushed == []  # a push cannot be published on a table split over two nodes
        assert check_consistent(reader.pull()) == 1
        migration.finish()
        pushing.join(25)
        assert pushed == [2]
        assert check_consistent(reader.pull()) == 2
        assert list(_keys_of_table(shared_redis_cluster, head)) == [target.port]


def test_a_small_pull_whose_chunk_left_mid_migration_follows_it(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    """A version of one chunk comes with its head (the peek script) unless the chunk has
    left for the slot's target node: a script may not read it there, so the pull reads
    the head and then the chunk after ASK, at once, not once the migration has ended."""
    url = shared_redis_cluster.url(namespace=_namespace())
    with varsync.connect(url, timeout=20) as writer, varsync.connect(url, timeout=5) as reader:
        writer.create_table("variables", SIGNATURE)  # 17 KB: one chunk
        writer.push(filled(SIGNATURE, 1))
        head = writer.backend.keys("variables").head
        source = shared_redis_cluster.owner_of(head)
        target = next(n for n in shared_redis_cluster.nodes if n is not source)
        migration = shared_redis_cluster.begin_migration(slot_of(head), target)
        try:
            with source.client() as admin:
                keys = [k.decode() for k in admin.execute_command(
                    "CLUSTER", "GETKEYSINSLOT", slot_of(head), 100)]
                (chunk,) = [k for k in keys if ":d:" in k]
                admin.migrate("127.0.0.1", target.port, chunk, 0, 5000)
            before = reader.backend.primary.redirections
            assert check_consistent(reader.pull()) == 1  # within its 5 s timeout
            assert reader.backend.primary.redirections > before  # ASK followed
        finally:
            migration.finish()
        assert check_consistent(reader.pull()) == 1


@pytest.mark.parametrize("signature, chunk_size", [
    ({"w": np.zeros((128, 128), np.float32), "b": np.zeros(1000, np.int32)}, 4096),
    # 5 MB: pushes claim the spare version's chunks and overwrite them in place
    ({"w": np.zeros((1250, 1000), np.float32), "b": np.zeros(1000, np.int32)}, 256 << 10),
], ids=["70KB-in-4KiB-chunks", "5MB-recycled-in-256KiB-chunks"])
def test_a_table_resharded_back_and_forth_while_readers_pull_stays_whole(
    shared_redis_cluster: LocalCluster, signature: Dict[str, np.ndarray], chunk_size: int,  # noqa: F811
) -> None:
    """A writer pushes, three readers pull and wait, while the table's slot moves to
    another node and back in batches of a few keys: every pull is one whole version,
    no reader's version goes back, and nothing is lost."""
    url = shared_redis_cluster.url(
        namespace=_namespace(), chunk_size=chunk_size, keep=2, recycle_from=4 << 20)
    with varsync.connect(url, timeout=20) as writer:
        writer.create_table("variables", signature)
        writer.push(filled(signature, 1))
        head = writer.backend.keys("variables").head
        slot = slot_of(head)
        stop = threading.Event()
        errors: List[BaseException] = []
        seen: List[List[int]] = [[] for _ in range(3)]
        pushed: List[int] = [1]

        def push_loop() -> None:
            try:
                number = 1
                while not stop.is_set():
                    number += 1
                    assert writer.push(filled(signature, number)) == number
                    pushed.append(number)
                    time.sleep(0.01)
            except BaseException as exc:  # noqa: BLE001  (reported by the test)
                errors.append(exc)

        def pull_loop(index: int) -> None:
            try:
                with varsync.connect(url, timeout=20) as reader:
                    first = reader.pull_if_newer(0)
                    assert first is not None
                    version, held = first[0], check_consistent(first[1])
                    seen[index].append(held)
                    while not stop.is_set():
                        with contextlib.suppress(varsync.PullTimeoutError):
                            reader.wait_for(version, timeout=0.5)
                        newer = reader.pull_if_newer(version)
                        if newer is not None:
                            version, values = newer
                            number = check_consistent(values)
                            assert number > held, f"went back from {held} to {number}"
                            held = number
                            seen[index].append(held)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=push_loop)] + [
            threading.Thread(target=pull_loop, args=(i,)) for i in range(3)
        ]
        for thread in threads:
            thread.start()
        try:
            home = shared_redis_cluster.owner_of(head)
            away = next(n for n in shared_redis_cluster.nodes if n is not home)
            for target in (away, home):
                shared_redis_cluster.migrate_slot(slot, target, batch=3, pause=0.005)
                settled, moved = len(pushed), time.monotonic()
                while len(pushed) <= settled + 3 and not errors:  # pushes resume
                    assert time.monotonic() - moved < 10, "no push after the slot settled"
                    time.sleep(0.01)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        assert all(len(s) >= 3 for s in seen), [len(s) for s in seen]
        if chunk_size > 4096:  # the in-place path was the one taken
            assert writer.table_info().details["spare_version"]
        with varsync.connect(url) as reader:
            assert check_consistent(reader.pull()) == pushed[-1]


@pytest.mark.parametrize("query, expected", [
    ("/1", "database 0 only"),
    ("?db=2", "database 0 only"),
    ("?replicas=127.0.0.1:7000", "reads from each table's primary"),
    ("?read_from=replica", "reads from each table's primary"),
    ("?prefix=a{b", "brace"),
])
def test_cluster_urls_refuse_what_a_cluster_cannot_do(query: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        varsync.connect(f"redis+cluster://127.0.0.1:1{query}")


def test_a_cluster_url_names_no_node() -> None:
    with pytest.raises(ConfigurationError, match="names no node"):
        varsync.connect("redis+cluster:///")


def test_a_cluster_url_whose_nodes_do_not_answer_says_so() -> None:
    with pytest.raises(varsync.BackendConnectionError, match="CLUSTER SLOTS"):
        varsync.connect("redis+cluster://127.0.0.1:1,127.0.0.1:2", timeout=2)


def test_a_cluster_url_naming_a_standalone_server_says_what_it_is(redis_servers: Any) -> None:
    server = redis_servers()
    with pytest.raises(varsync.BackendConnectionError, match="cluster-enabled yes"):
        varsync.connect(f"redis+cluster://127.0.0.1:{server.port}", timeout=5)


def test_a_publish_stopped_by_a_migrating_slot_changes_nothing(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    """The publish script reads every key it will change before its first change: with
    the chunks it would retire gone to the migration's target, the server stops it, and
    the head, the stream and the new chunks' TTLs are as they were."""
    url = shared_redis_cluster.url(namespace=_namespace(), chunk_size=4096, keep=0)
    with varsync.connect(url) as writer:
        writer.create_table("variables", SIGNATURE)
        writer.push(filled(SIGNATURE, 1))
        backend = writer.backend
        keys = backend.keys("variables")
        source = shared_redis_cluster.owner_of(keys.head)
        target = next(n for n in shared_redis_cluster.nodes if n is not source)
        with source.client() as admin:
            head_before = admin.hgetall(keys.head)
            stream_before = admin.xlen(keys.events)
        retired = head_before[b"data"].decode()
        # the next push's chunks, written before the migration begins
        token = secrets.token_bytes(8)
        arrays = [np.ascontiguousarray(a) for a in varsync.flatten(filled(SIGNATURE, 2))]
        payload = backend.chunk_size - wire.CHUNK_SLACK
        total = sum(a.nbytes for a in arrays)
        chunks = -(-total // payload)
        publisher = backend.publisher
        sent = publisher.send_chunks(keys.chunks + token.hex() + ":", token, arrays, payload)
        assert sent.error is None
        migration = shared_redis_cluster.begin_migration(slot_of(keys.head), target)
        with source.client() as admin:  # only the chunks version 1 retires (keep=0) move
            doomed = list(admin.scan_iter(match=f"*:d:{retired}:*", count=1000))
            assert doomed
            admin.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                  "KEYS", *doomed)
        written = publisher.written("variables")
        assert written is not None
        with pytest.raises(redis.exceptions.TryAgainError, match="non local key"):
            publisher.publish(keys, written, token.hex(), f"{total}:{payload}:{chunks}",
                              chunks, False, [len(arrays), "", ""])
        with source.client() as admin:
            assert admin.hgetall(keys.head) == head_before
            assert admin.xlen(keys.events) == stream_before
            fresh = list(admin.scan_iter(match=f"*:d:{token.hex()}:*", count=1000))
            assert len(fresh) == chunks and all(admin.pttl(k) > 0 for k in fresh)
        migration.finish()
        assert writer.push(filled(SIGNATURE, 3)) == 2
        assert check_consistent(writer.pull()) == 3


def test_varsync_watch_shows_the_tables_of_every_primary_and_their_readers(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    url = shared_redis_cluster.url(namespace=_namespace())
    names = [f"t{i}" for i in range(6)]
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        for name in names:
            writer.create_table(name, SIGNATURE)
            writer.push(filled(SIGNATURE, 1), table=name)
        reader.report_as("actor-7")
        reader.pull(table="t3")
        shown = subprocess.run(
            [sys.executable, "-m", "varsync.cli", "watch", url, "--once", "--interval", "0.2"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    assert {line.split()[0] for line in shown.splitlines() if line[:1] == "t"} == set(names)
    assert any("actor-7" in line and line.startswith("t3") for line in shown.splitlines())


def test_a_killed_primary_fails_over_to_its_replica_and_pushes_and_pulls_go_on(
    redis_binary: str, tmp_path: Any,
) -> None:
    """SIGKILL of the primary holding the table: the cluster promotes its replica
    (cluster-node-timeout 2 s); the writer's and the reader's calls fail within their
    timeouts meanwhile, then find the new owner by asking the slot map again; no pull
    mixes versions, and a reader holding a version the promoted replica never got is
    told so (a reset), never shown another value under its number."""
    with LocalCluster(redis_binary, tmp_path / "cluster", replicas_per_primary=1) as cluster:
        url = cluster.url(chunk_size=4096)
        with varsync.connect(url, timeout=2) as writer, varsync.connect(url, timeout=2) as reader:
            writer.create_table("variables", SIGNATURE)
            for number in (1, 2, 3):
                writer.push(filled(SIGNATURE, number))
            held = reader.pull_if_newer(0)
            assert held is not None and check_consistent(held[1]) == 3
            head = writer.backend.keys("variables").head
            doomed = cluster.owner_of(head)
            (replica,) = cluster.replicas_of(doomed)
            doomed.kill()
            killed = time.monotonic()
            pushed = None
            while pushed is None and time.monotonic() - killed < 30:
                try:
                    pushed = writer.push(filled(SIGNATURE, 4))
                except (varsync.BackendConnectionError, varsync.PullTimeoutError):
                    time.sleep(0.2)
            assert pushed is not None, "no push landed within 30 s of the kill"
            recovered = time.monotonic() - killed
            with replica.client() as admin:
                assert admin.execute_command("ROLE")[0] in (b"master", "master")
            try:
                newer = reader.pull_if_newer(held[0])
            except varsync.TableResetError:
                newer = reader.pull_if_newer(0)  # a new history: pull again
            assert newer is not None and check_consistent(newer[1]) == 4
            assert check_consistent(reader.pull()) == 4
            assert recovered < 30
