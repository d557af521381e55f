"""Which server each request of a redis backend goes to: writes to the primary, reads to
one replica when the backend was given some, and where Sentinel says they are.

- ``replicas=host:port[,...]``: one replica is chosen at random per backend (so the
  readers of many containers spread over the replicas); a read it cannot serve (lost
  connection, ``LOADING`` during a full resync, ``MASTERDOWN``) goes to the primary, and
  the replica is left alone for :data:`REPLICA_PAUSE` seconds.
- ``redis+sentinel://``: the primary is whatever the sentinels answer to
  ``SENTINEL get-master-addr-by-name``, asked at connect and again before the first
  request after a lost connection or a ``READONLY`` reply (the primary moved: a failover);
  with ``read_from=replica``, a replica the sentinels list as linked to it
  (``SENTINEL replicas``), asked again after that replica failed.

Which server a read goes to, and whether its answer is trusted, is :mod:`.router`'s.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Any, Callable, Union

import redis
from redis import exceptions as rx

from varsync._backends.redis.cluster import ClusterClient
from varsync._backends.redis.options import Settings
from varsync._backends.redis.pool import Client
from varsync.backend import BackendConnectionError, HostPort, remaining

__all__ = ["Topology", "Requests", "REPLICA_PAUSE", "READ_FAILURES"]

#: Where a backend's requests go: one server, or the primaries of a cluster.
Requests = Union[Client, ClusterClient]

log = logging.getLogger("varsync.backends.redis")

REPLICA_PAUSE = 1.0  # seconds a replica that failed a read is left alone
SENTINEL_TIMEOUT = 1.0  # seconds for one sentinel's answer (a dead one must not stall all)
#: What a replica may answer that the primary can still serve.
READ_FAILURES = (rx.ConnectionError, rx.TimeoutError, rx.MasterDownError, OSError)


class Topology:
    """The primary's :class:`Client` (``primary``; in a cluster, the
    :class:`~.cluster.ClusterClient` of every primary, also ``cluster``) and, if reads go
    to replicas, one replica's (:meth:`reader`)."""

    def __init__(self, settings: Settings, moved: Callable[[], None]) -> None:
        self._settings = settings
        self._moved = moved  # called when a failover moved the primary elsewhere
        self._lock = threading.Lock()
        self._stale = False  # the primary may have moved: ask the sentinels again
        self._replica_since = 0.0  # monotonic time before which the replica is left alone
        self.replica: Client | None = None
        self.cluster: ClusterClient | None = None
        self.primary: Requests
        if settings.cluster:  # each table's primary: its slot's (replicas= refused)
            self.primary = self.cluster = ClusterClient(settings, failed_over=moved)
            return
        server = settings.server
        if settings.sentinels:
            server = self._ask_primary(math.inf)
        self.primary = Client(
            settings,
            server,
            before=self._locate if settings.sentinels else None,
            failed=self._primary_failed if settings.sentinels else None,
        )
        if settings.read_from == "replica":
            chosen = self._choose_replica(math.inf)
            if chosen is not None:
                self.replica = Client(settings, chosen)

    @property
    def sentinel(self) -> bool:
        return bool(self._settings.sentinels)

    # -- reads -------------------------------------------------------------------------------

    def reader(self) -> Client | None:
        """The replica to read from now, or ``None``: read from the primary."""
        if self._settings.read_from != "replica" or time.monotonic() < self._replica_since:
            return None
        if self.replica is None and self.sentinel:  # none was linked when last asked
            chosen = self._choose_replica(time.monotonic() + SENTINEL_TIMEOUT)
            if chosen is not None:
                self.replica = Client(self._settings, chosen)
            else:
                self._replica_since = time.monotonic() + REPLICA_PAUSE
        return self.replica

    def replica_failed(self, exc: BaseException) -> None:
        """The replica could not serve a read: leave it alone for a while (and with
        Sentinel, choose again then: it may be the new primary, or gone)."""
        log.debug(
            "reading from replica %s failed (%s); reading from the primary",
            self.replica.server.address if self.replica else None,
            exc,
        )
        self._replica_since = time.monotonic() + REPLICA_PAUSE
        if self.sentinel and self.replica is not None:
            self.replica.close()
            self.replica = None

    def _choose_replica(self, deadline: float) -> HostPort | None:
        if self._settings.replicas:
            return random.choice(self._settings.replicas)
        try:
            linked = self._ask_replicas(deadline)
        except BackendConnectionError:
            return None
        return random.choice(linked) if linked else None

    # -- the primary, by Sentinel ----------------------------------------------------------

    @property
    def primary_lost(self) -> bool:
        """Whether the last request to the Sentinel-found primary lost its connection."""
        return self._stale

    def _primary_failed(self, exc: BaseException) -> None:
        self._stale = True

    def suspect_primary(self) -> None:
        """A reply said the primary is not one (``READONLY``): with Sentinel, ask again."""
        if self.sentinel:
            self._stale = True

    def _locate(self, deadline: float) -> None:
        """Before a request to the primary: after a failure, ask where it is now."""
        if not self._stale:
            return
        with self._lock:
            if not self._stale:
                return
            try:
                server = self._ask_primary(deadline)
            except BackendConnectionError as exc:
                log.debug("no sentinel answered (%s); trying the last known primary", exc)
                return  # still stale: asked again before the next request
            self._stale = False
            primary = self.primary
            if isinstance(primary, Client) and server != primary.server:
                log.warning(
                    "the primary of %r moved from %s to %s (a failover)",
                    self._settings.service,
                    primary.server.address,
                    server.address,
                )
                primary.move_to(server)
                self._moved()

    def _ask(self, deadline: float, *command: Any) -> list[Any]:
        """The first answer of a sentinel to ``command``, trying each in turn; the one
        that answered is tried first next time."""
        errors = []
        sentinels = list(self._settings.sentinels)
        for sentinel in sentinels:
            left = remaining(deadline)
            if left <= 0:
                break
            bound = min(SENTINEL_TIMEOUT, left, self._settings.connect_timeout or math.inf)
            conn = redis.Connection(
                host=sentinel.host,
                port=sentinel.port,
                socket_timeout=bound,
                socket_connect_timeout=bound,
                protocol=2,
            )
            try:
                conn.send_command(*command)
                reply = conn.read_response()
            except (rx.RedisError, OSError) as exc:
                errors.append(f"{sentinel.address}: {type(exc).__name__}: {exc}")
                continue
            finally:
                conn.disconnect()
            if reply:
                return list(reply)
            errors.append(f"{sentinel.address}: no answer for {self._settings.service!r}")
        raise BackendConnectionError(
            f"asking the sentinels for {' '.join(map(str, command))}: "
            f"{'; '.join(errors) or 'out of time'}. Check the sentinel addresses and the "
            "service name (sentinel monitor <name> ...) in the redis+sentinel:// URL"
        )

    def _ask_primary(self, deadline: float) -> HostPort:
        host, port = self._ask(
            deadline, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._settings.service
        )[:2]
        return HostPort(_text(host), int(port))

    def _ask_replicas(self, deadline: float) -> list[HostPort]:
        """The replicas the sentinels see linked to the primary and not down."""
        try:
            entries = self._ask(deadline, "SENTINEL", "REPLICAS", self._settings.service)
        except BackendConnectionError:
            return []
        linked = []
        for entry in entries:
            fields = dict(zip(map(_text, entry[::2]), map(_text, entry[1::2])))
            flags = set(fields.get("flags", "").split(","))
            if flags & {"s_down", "o_down", "disconnected"}:
                continue
            if fields.get("master-link-status") != "ok":
                continue
            linked.append(HostPort(fields["ip"], int(fields["port"])))
        return linked

    def close(self) -> None:
        self.primary.close()
        if self.replica is not None:
            self.replica.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
