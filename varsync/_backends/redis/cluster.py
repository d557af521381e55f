"""Requests to a Redis Cluster (``redis+cluster://host:port[,host:port...]``): each to the
primary that owns its key's slot.

A table's keys share one hash tag, its namespace and name (:func:`.protocol.keys_of`), so
one node holds the whole table and one script changes it, as on a single server; tables
spread over the primaries by their tags' slots. The list of tables is a set key of its
own slot, added to after the table's creation script (:meth:`.publisher.Publisher.create`).

The slot map comes from ``CLUSTER SLOTS``, asked of the seed nodes at connect and of any
reachable node again when a node is lost. Redirections are followed as a cluster client
must:

- ``MOVED``: the slot has another owner for good. The map takes it, and the request goes
  there (it did not run where it was sent).
- ``ASK``: the slot is migrating and the key is on the target already: that one request
  goes to the target after ``ASKING``. A bulk read follows it chunk by chunk
  (:data:`.wire.Ask`). The publish and claim scripts never follow one: they read chunks
  the script does not declare, which may lie on either node mid-migration.
- ``TRYAGAIN`` (a multi-key request whose keys are split by a migration),
  ``CLUSTERDOWN``, and a script stopped by a key gone to the other node ("non local
  key"): nothing ran or nothing changed (every script reads each key it changes before
  its first change). The backend's :meth:`settled` starts the whole push or pull again
  after a pause, until the migration ends, within :data:`SETTLE_SECONDS`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

from redis import exceptions as rx
from redis.crc import key_slot

from varsync._backends.redis.errors import OutOfTime
from varsync._backends.redis.options import Settings
from varsync._backends.redis.pool import Client
from varsync._backends.redis.protocol import Script, text
from varsync.backend import BackendConnectionError, HostPort, remaining

__all__ = [
    "ClusterClient",
    "SlotInMotion",
    "IN_MOTION",
    "SETTLE_SECONDS",
    "in_motion",
    "settle_deadline",
]

log = logging.getLogger("varsync.backends.redis")

SLOTS = 16384
MAX_REDIRECTIONS = 16  # redirections one request follows before giving up
SETTLE_SECONDS = 30.0  # how long a push or pull waits out a slot in migration
_PAUSE = (0.005, 0.05)  # first and longest pause between looks at a migrating slot
#: Scripts that touch keys they do not declare (chunks): never sent after an ASK.
UNDECLARED_KEYS = ("publish", "claim", "report-reader", "list-readers")

T = TypeVar("T")


def settle_deadline(deadline: float, timeout: float | None) -> float:
    """How long a push or pull waits out a slot in migration: until ``deadline``, and at
    most the backend's ``timeout`` (:data:`SETTLE_SECONDS` without one)."""
    return min(deadline, time.monotonic() + (SETTLE_SECONDS if timeout is None else timeout))


class SlotInMotion(rx.TryAgainError):
    """A script stopped at a key of its slot gone to another node (a migration), before
    it changed anything: try again once the slot settles."""


#: What a request may meet while its slot migrates or the cluster reconfigures: nothing
#: ran, or nothing changed; the whole push or pull is tried again (:meth:`settled`).
IN_MOTION = (rx.TryAgainError, rx.ClusterDownError, rx.AskError)


def in_motion(exc: BaseException) -> BaseException | None:
    """``exc`` as one of :data:`IN_MOTION` if it means the request's slot is moving (a
    script's error, Redis 6.2: "Lua script attempted to access a non local key in a
    cluster node"; 7: "Script attempted to ..."), else ``None``."""
    if isinstance(exc, (*IN_MOTION, rx.MovedError)):
        return exc
    text = str(exc)
    if isinstance(exc, rx.ResponseError) and ("non local key" in text or "cluster is down" in text):
        return SlotInMotion(text)
    return None


def _key_of(args: Sequence[Any]) -> str | None:
    """The key a command of this package routes by (``None``: any node will do)."""
    name = str(args[0]).upper()
    if name in ("PING", "INFO", "TIME", "CLUSTER"):
        return None
    if name == "XREAD":
        words = [str(a).upper() for a in args]
        return str(args[words.index("STREAMS") + 1])
    return str(args[1])


class ClusterClient:
    """The :class:`~.pool.Client` interface over the primaries of a Redis Cluster: one
    :class:`Client` (a pool) per primary, chosen by slot."""

    def __init__(self, settings: Settings, failed_over: Callable[[], None]) -> None:
        self._settings = settings
        self._failed_over = failed_over  # a lost node's slots went to another: a failover
        self._lock = threading.Lock()
        self._nodes: dict[HostPort, Client] = {}
        self._owners: list[HostPort | None] = [None] * SLOTS
        self.server = settings.cluster[0]  # for messages
        self.redirections = 0  # MOVED and ASK replies followed, for tests and details()
        self.failovers = 0  # times a lost node's slots were found with another owner
        self.refresh(math.inf)

    # -- the slot map ------------------------------------------------------------------------

    def node(self, server: HostPort) -> Client:
        with self._lock:
            client = self._nodes.get(server)
            if client is None:
                client = self._nodes[server] = Client(self._settings, server)
            return client

    def refresh(self, deadline: float) -> bool:
        """The slot map, from the first node that answers ``CLUSTER SLOTS`` (the nodes
        known first, then the seeds); whether a slot changed owner."""
        errors = []
        for server in dict.fromkeys([*self._nodes, *self._settings.cluster]):
            if remaining(deadline) <= 0:
                break
            try:
                ranges = self.node(server).call("CLUSTER", "SLOTS", deadline=deadline)
            except (rx.RedisError, OSError, OutOfTime) as exc:
                errors.append(f"{server.address}: {type(exc).__name__}: {exc}")
                continue
            owners: list[HostPort | None] = [None] * SLOTS
            for entry in ranges:
                start, end, primary = int(entry[0]), int(entry[1]), entry[2]
                host = str(text(primary[0])) or server.host  # "" or "?": the node asked
                owner = HostPort(server.host if host == "?" else host, int(primary[1]))
                owners[start : end + 1] = [owner] * (end - start + 1)
            with self._lock:
                changed = owners != self._owners
                self._owners = owners
            return changed
        raise BackendConnectionError(
            f"asking the cluster's nodes for its slots (CLUSTER SLOTS): "
            f"{'; '.join(errors) or 'out of time'}. Is it a Redis Cluster "
            "(cluster-enabled yes), and are the addresses in the redis+cluster:// URL "
            "its nodes?"
        )

    def owner(self, key: str | None) -> Client:
        """The client of the primary owning ``key``'s slot (any node for ``None``)."""
        if key is None:
            anyone = next((o for o in self._owners if o is not None), None)
            if anyone is None:
                raise rx.ClusterDownError("no node of the cluster serves any slot")
            return self.node(anyone)
        slot = key_slot(key.encode())
        owner = self._owners[slot]
        if owner is None:
            raise rx.ClusterDownError(f"no node of the cluster serves slot {slot} (of key {key!r})")
        return self.node(owner)

    def _moved(self, exc: rx.MovedError) -> None:
        self.redirections += 1
        with self._lock:
            self._owners[exc.slot_id] = HostPort(exc.host, int(exc.port))

    # -- requests ----------------------------------------------------------------------------

    def _redirected(
        self,
        key: str | None,
        deadline: float,
        attempt: Callable[[Client, bool], T],
        follow_ask: bool = True,
    ) -> T:
        """``attempt(client, asking)`` on the key's node, following MOVED (and ASK if
        ``follow_ask``) redirections; a lost node has the slot map asked again."""
        asked: Client | None = None
        for _ in range(MAX_REDIRECTIONS):
            client = asked or self.owner(key)
            try:
                return attempt(client, asked is not None)
            except rx.MovedError as exc:
                self._moved(exc)
                asked = None
            except rx.AskError as exc:
                if not follow_ask:
                    raise
                self.redirections += 1
                asked = self.node(HostPort(exc.host, int(exc.port)))
            except rx.ResponseError as exc:
                moving = in_motion(exc)
                if moving is None or moving is exc:
                    raise
                raise moving from exc
            except (rx.ConnectionError, rx.TimeoutError, OSError):
                self._lost(deadline)
                raise
        raise rx.ClusterDownError(
            f"key {key!r}: {MAX_REDIRECTIONS} redirections in a row; the cluster's slot map "
            "keeps changing"
        )

    def _lost(self, deadline: float) -> None:
        """A node did not answer: it may have failed over. Ask for the slots again (a
        failure to is left for the next request). Slots that changed owner now went to a
        promoted replica, which may lack the last pushes its primary acknowledged: the
        backend's writer then vouches only for its last push (as after a Sentinel
        failover), so that no version number names two values."""
        try:
            if self.refresh(min(deadline, time.monotonic() + 1.0)):
                log.warning("the cluster's slot map changed after a node was lost (a failover?)")
                self.failovers += 1
                self._failed_over()
        except BackendConnectionError as exc:
            log.debug("could not refresh the cluster's slot map: %s", exc)

    def call(self, *args: Any, deadline: float = math.inf, retry: bool = True) -> Any:
        return self._redirected(
            _key_of(args),
            deadline,
            lambda client, asking: client.call(
                *args, deadline=deadline, retry=retry, asking=asking
            ),
        )

    def script(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        deadline: float = math.inf,
        retry: bool = True,
    ) -> Any:
        return self._redirected(
            keys[0],
            deadline,
            lambda client, asking: client.script(
                script, keys, args, deadline=deadline, retry=retry, asking=asking
            ),
            follow_ask=script.name not in UNDECLARED_KEYS,
        )

    def on_connection(
        self, deadline: float, use: Callable[[Any], Any], key: str | None = None
    ) -> Any:
        """``use`` on a connection to ``key``'s node. A MOVED reply read there updates
        the map and is raised: the backend's :meth:`settled` tries again."""
        try:
            return self.owner(key).on_connection(deadline, use)
        except rx.MovedError as exc:
            self._moved(exc)
            raise
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            self._lost(deadline)
            raise

    def asker(self, deadline: float) -> Callable[[rx.AskError, Callable[[Any], bool]], bool]:
        def ask(exc: rx.AskError, use: Callable[[Any], bool]) -> bool:
            self.redirections += 1
            answer: bool = self.node(HostPort(exc.host, int(exc.port))).on_connection(deadline, use)
            return answer

        return ask

    def settled(self, attempt: Callable[[], T], key: str, deadline: float) -> T:
        """``attempt()`` (a whole push or pull of the table ``key`` is of), again once the
        slot it met in migration (:data:`IN_MOTION`) is no longer migrating, until
        ``deadline`` (see :func:`settle_deadline`); and again at once after a lost node
        whose slots the refreshed map gives to another (a failover)."""
        moves = 0
        failovers = self.failovers
        while True:
            try:
                return attempt()
            except (rx.ConnectionError, rx.TimeoutError) as exc:
                # the node was lost, and the map asked again names another owner (a
                # promoted replica): once more there. Raised out of a push only before
                # its publish script was sent (after it, the push says its answer was
                # lost, a varsync error), so nothing was published.
                if self.failovers == failovers or isinstance(exc, rx.AuthenticationError):
                    raise
                failovers = self.failovers
                log.debug("trying %r again on its slot's new owner (%s)", key, exc)
            except (*IN_MOTION, rx.MovedError) as exc:
                if isinstance(exc, rx.MovedError):  # also one read off a pipeline
                    self._moved(exc)
                    moves += 1
                    if moves <= MAX_REDIRECTIONS and remaining(deadline) > 0:
                        continue  # at once: the map says where the slot went
                log.debug("slot of %r in motion (%s); trying again once it settles", key, exc)
                if not self._until_settled(key, deadline):
                    raise

    def _until_settled(self, key: str, deadline: float) -> bool:
        """Wait until the key's slot is not migrating (its owner's ``CLUSTER NODES``
        lists no migration of it): a cheap look every few milliseconds, instead of a
        whole push tried again. ``False`` if the deadline came first."""
        slot = key_slot(key.encode())
        pause = _PAUSE[0]
        while remaining(deadline) > pause:
            time.sleep(pause)
            pause = min(pause * 2, _PAUSE[1])
            try:
                nodes = str(text(self.owner(key).call("CLUSTER", "NODES", deadline=deadline)))
            except (rx.RedisError, OSError):
                continue  # the map or a node is changing: look again after the next pause
            mine = next((line for line in nodes.splitlines() if "myself" in line), "")
            if f"[{slot}->-" not in mine and f"[{slot}-<-" not in mine:
                return True
        return False

    def close(self) -> None:
        with self._lock:
            nodes = list(self._nodes.values())
        for client in nodes:
            client.close()
