"""Which server a read of a redis table goes to, and whether its answer is trusted there.

Reads go to the replica :class:`~.topology.Topology` offers, if any; a read the replica
cannot serve (lost, ``LOADING``, ``MASTERDOWN``) or whose answer may be the replica's
past is made again on the primary. A replica only ever lags its primary, so a head it
answers is refused (:meth:`Route.accept`) when it may be behind what this backend has
seen of the table (:class:`Floors`): a vanished table, another epoch than the last one
seen, or, within that epoch, a version below the highest one seen that the caller does
not hold. This is routing consistency: a container never sees its view of a table go
back because a replica is behind. It never decides that a history restarted (the core
does, from the epoch each answer carries); it only chooses the server that answers.

In a Redis Cluster a read goes to its slot's primary, and again once a slot in migration
settles (:meth:`.cluster.ClusterClient.settled`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from varsync._backends.redis.cluster import settle_deadline
from varsync._backends.redis.protocol import TableHead
from varsync._backends.redis.topology import READ_FAILURES, Requests, Topology

__all__ = ["Floors", "Route", "Router", "AskPrimary"]

T = TypeVar("T")


class AskPrimary(Exception):
    """What the replica answered may be behind what this backend has seen: the primary
    answers instead."""


class Floors:
    """Per table, the highest version one backend has seen (read or published) and its
    epoch: what a replica's answer must not go below. Thread-safe.

    Raising a floor reads and writes it in one step, under a lock: two threads of one
    container raising it at once (one to 36, one to 40) must end at 40. Without the lock a
    thread preempted between reading the floor and writing it (a CPU-loaded machine
    preempts for milliseconds) wrote its lower version over the higher one, and a replica
    behind the higher one was then believed: the version went back (issue 36)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[str, tuple[str, int]] = {}

    def get(self, name: str) -> tuple[str, int] | None:
        """``(epoch, version)``: the highest version seen of table ``name``, or ``None``."""
        return self._floors.get(name)

    def raise_to(self, name: str, epoch: str, version: int) -> None:
        """``version`` of history ``epoch`` was seen on the primary, or vouched for: the
        floor is at least that (another epoch starts a new floor)."""
        with self._lock:
            floor = self._floors.get(name)
            if floor is None or floor[0] != epoch or floor[1] < version:
                self._floors[name] = (epoch, version)


@dataclass(frozen=True)
class Route:
    """The server one read is on (``client``), and whether it is a replica."""

    client: Requests
    on_replica: bool
    floors: Floors

    def accept(self, name: str, head: TableHead | None, held: int) -> None:
        """Take ``head`` (``None``: the table's keys are gone) as the answer of a read by
        a caller holding version ``held`` of the table, or refuse it on a replica
        (:class:`AskPrimary`) if it may be behind what this backend has seen: a vanished
        table (an emptied replica mid-resync), another epoch than the last seen, a
        version below the highest seen (unless the caller holds that one already: to it
        the version is not news), or one below ``held`` (which would read as a history
        that went back). An accepted head raises the floor."""
        if head is None:
            if self.on_replica:
                raise AskPrimary()
            return
        if self.on_replica:
            floor = self.floors.get(name)
            if floor is not None:
                epoch, highest = floor
                if head.epoch != epoch or (head.version < highest and held < highest):
                    raise AskPrimary()
            if head.version < held:
                raise AskPrimary()
        self.floors.raise_to(name, head.epoch, head.version)


class Router:
    """Runs reads on the replica where reads go to one, else on the primary; see the
    module. ``timeout``: the backend's, bounding a cluster's wait for a slot to settle."""

    def __init__(self, topology: Topology, floors: Floors, timeout: float | None) -> None:
        self._topology = topology
        self.floors = floors
        self._timeout = timeout
        self._primary = Route(topology.primary, False, floors)
        #: Reads a replica could not serve or vouch for, made on the primary.
        self.reads_on_primary = 0

    @property
    def primary(self) -> Route:
        return self._primary

    def read(self, key: str, deadline: float, read: Callable[[Route], T]) -> T:
        """``read(route)`` of the table whose head is ``key``: on the replica, if reads go
        to one; on the primary if the replica fails or :meth:`Route.accept` refuses what
        it answered. In a cluster, again while the table's slot is in migration."""
        cluster = self._topology.cluster
        if cluster is not None:
            return cluster.settled(
                lambda: read(self._primary), key, settle_deadline(deadline, self._timeout)
            )
        replica = self._topology.reader()
        if replica is not None:
            try:
                return read(Route(replica, True, self.floors))
            except AskPrimary:
                self.reads_on_primary += 1
            except READ_FAILURES as exc:
                self.reads_on_primary += 1
                self._topology.replica_failed(exc)
        return read(self._primary)
