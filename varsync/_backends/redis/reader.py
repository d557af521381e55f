"""Reads of redis tables: heads, whole and delta pulls, leaf versions, and the
``XREAD BLOCK`` a wait sleeps in, each on the server :class:`~.router.Router` routes it
to, and each answering the table's epoch with its version."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

import numpy as np
from redis import exceptions as rx

from varsync._backends.redis.cluster import SlotInMotion
from varsync._backends.redis.fetch import Fetcher
from varsync._backends.redis.leaves import Place, composed, leaf_versions_of, places_of
from varsync._backends.redis.protocol import (
    COMPOSED_FORMATS,
    PEEK,
    PEEK_BYTES,
    TableHead,
    parse_head,
    parse_layout,
    text,
)
from varsync._backends.redis.router import Route, Router
from varsync._backends.redis.tables import Catalog, Stored, read_stored, signature_changed
from varsync.backend import (
    CorruptDataError,
    Head,
    LeafChain,
    LeafRead,
    PatchRead,
    PullTimeoutError,
    Spec,
    remaining,
)

__all__ = ["Reader", "MAX_RESTARTS", "WAIT_SLICE", "WAIT_GRACE"]

log = logging.getLogger("varsync.backends.redis")

MAX_RESTARTS = 1000  # pulls in a row that found their version retired, before giving up
WAIT_SLICE = 1.0  # seconds per XREAD BLOCK: a vanished table is noticed this fast
WAIT_GRACE = 0.1  # seconds an XREAD's answer may take past the wait's deadline
_LEAF_FIELDS = ("data", "layout", "leaves", "segments")

#: What a read answers per leaf: an array, or (``read_patches``) also a chain.
L = TypeVar("L", np.ndarray | None, np.ndarray | LeafChain | None)


def answer(head: TableHead | None) -> Head:
    """The protocol's head for a stored one; a table whose keys vanished reads as empty,
    of no epoch (so a holder of a version hears of the restart from the core)."""
    return Head(0, None) if head is None else Head(head.version, head.epoch)


class Reader:
    """Reads, routed by ``router``; the signature each history of a table was stored with
    is looked up in ``catalog`` (on the primary, ``router.primary``); versions are
    fetched by ``fetch``. ``socket_timeout`` bounds an ``XREAD BLOCK``."""

    def __init__(
        self,
        router: Router,
        catalog: Catalog,
        fetch: Fetcher,
        address: str,
        socket_timeout: float | None,
    ) -> None:
        self._router = router
        self._catalog = catalog
        self.fetch = fetch
        self._address = address
        self._socket_timeout = socket_timeout
        self._peeks = True  # pulls ask PEEK first (see _peek)
        self._checked: dict[str, str] = {}  # per table, the epoch whose signature matched
        #: Pulls that found their version retired mid-read and started again.
        self.pulls_restarted = 0

    def _where(self, name: str) -> str:
        return f"table {name!r} at {self._address}"

    # -- heads -----------------------------------------------------------------------------

    def _head(
        self, route: Route, name: str, fields: Sequence[str], deadline: float
    ) -> TableHead | None:
        """The table's head (one small request), or ``None`` if its keys vanished."""
        key = self._catalog.keys(name).head
        raw = route.client.call("HMGET", key, "fmt", "epoch", "version", *fields, deadline=deadline)
        return parse_head(self._where(name), key, raw, fields)

    def _peek(self, route: Route, name: str, newer_than: int, deadline: float) -> TableHead | None:
        """:meth:`_head` with ``data`` and ``layout``, as a pull looks first, and with the
        version's one chunk (``chunk``) if it is newer than ``newer_than`` and small
        (:data:`PEEK`): one round trip for a small pull. A user the server does not let
        run scripts (an ACL without ``EVAL``/``EVALSHA``) gets :meth:`_head`, from then on;
        so does a pull whose chunk has left for another node of a Redis Cluster (a script
        may not follow it there, a GET may)."""
        if self._peeks:
            keys = self._catalog.keys(name)
            try:
                raw = route.client.script(
                    PEEK, [keys.head], [newer_than, keys.chunks, PEEK_BYTES], deadline=deadline
                )
            except rx.NoPermissionError as exc:
                log.info("pulls from %s take two round trips: %s", self._address, exc)
                self._peeks = False
            except SlotInMotion:
                pass  # its chunk gone to another node (resharding): asked apart, after ASK
            else:
                _, fields = PEEK.answer(raw)
                head = parse_head(self._where(name), keys.head, fields[:5], ("data", "layout"))
                if head is not None and fields[5] is not None:
                    head = dataclasses.replace(head, chunk=fields[5])
                return head
        return self._head(route, name, ("data", "layout"), deadline)

    def head(self, name: str, deadline: float) -> Head:
        def look(route: Route) -> TableHead | None:
            head = self._head(route, name, (), deadline)
            route.accept(name, head, 0)
            return head

        return answer(self._router.read(self._catalog.keys(name).head, deadline, look))

    def details(self, name: str) -> dict[str, Any]:
        """What ``table_info`` shows of the table's head, read on the primary."""
        head = self._catalog.keys(name).head
        raw = self._router.primary.client.call(
            "HMGET",
            head,
            "epoch",
            "version",
            "data",
            "layout",
            "retained",
            "spare",
            "fmt",
            "segments",
        )
        epoch, _, data, layout, retained, spare, fmt, segments = (text(x) for x in raw)
        total, payload, chunks = parse_layout(self._where(name), layout) if layout else (0, 0, 0)
        return {
            "server": self._address,
            "head_key": head,
            "epoch": epoch,
            "data_token": data,
            "stored_bytes": total,
            "chunk_payload": payload,
            "chunks": chunks,
            "retained_versions": len(retained.split(",")) if retained else 0,
            "spare_version": bool(spare),
            # "2": the current version was composed by write_leaves; "3": with patches
            "layout_format": fmt,
            "segments": len(segments.split(",")) if segments else 0,
        }

    # -- the stored signature --------------------------------------------------------------

    def stored(self, name: str, deadline: float = math.inf) -> Stored | None:
        """The table's signature as the primary holds it now, with its epoch (``None``:
        no table)."""
        stored = read_stored(
            self._router.primary.client, self._catalog, name, self._address, deadline
        )
        if stored is not None:  # the primary's epoch: a replica's answers are of it now
            self._router.floors.raise_to(name, stored.epoch, 0)
        return stored

    def _check_signature(
        self, name: str, epoch: str, specs: Sequence[Spec], deadline: float
    ) -> None:
        """Raise if the history ``epoch`` of the table holds another signature than the
        caller's ``specs``: the table was created again with another signature, whose
        data no caller of the old one can decode (a pull would otherwise fail as corrupt
        data). Asked of the primary once per history; the core still decides, from the
        epoch, whether an answer continues what a caller holds."""
        if self._checked.get(name) == epoch:
            return
        stored = self._catalog.get(name)
        if stored is None or stored.epoch != epoch:
            stored = self.stored(name, deadline)
            if stored is None:
                return  # vanished meanwhile: reads as empty
        if not Catalog.same_specs(stored, specs):
            raise signature_changed(name, self._address)
        if stored.epoch == epoch:
            self._checked[name] = epoch

    # -- pulls -----------------------------------------------------------------------------

    def read_leaves(
        self,
        name: str,
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
        every: bool = False,
    ) -> LeafRead:
        """``read_leaves`` (``every``: every leaf's array, for ``read``), on the server the
        router chooses; a leaf with a chain of element patches is rebuilt whole."""

        def composed_leaves(
            route: Route, versioned: str, places: list[Place]
        ) -> list[np.ndarray | None] | None:
            needed = [i for i, p in enumerate(places) if every or p.version > newer_than]
            chunks = self._catalog.keys(name).chunks
            return self.fetch.leaves(
                route.client, chunks, versioned, places, specs, needed, deadline
            )

        head, versions, arrays = self._read(name, newer_than, deadline, specs, composed_leaves)
        return LeafRead(head, versions, arrays)

    def read_leaf_subset(
        self,
        name: str,
        chosen: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        """``read_leaf_subset`` of the ``chosen`` leaves (checked, sorted): the chunks
        covering those changed since ``newer_than``, of whatever segments hold them,
        through :meth:`read_leaves`' machinery (one version, restarts, replicas,
        Cluster). A whole (format 1) version is read as one segment too, only the
        chunks its chosen leaves lie in; unless the peek brought its one small chunk
        along, which is unpacked whole and the rest dropped (no request saved by
        choosing)."""

        def chosen_leaves(
            route: Route, versioned: str, places: list[Place]
        ) -> list[np.ndarray | None] | None:
            needed = [i for i in chosen if places[i].version > newer_than]
            chunks = self._catalog.keys(name).chunks
            return self.fetch.leaves(
                route.client, chunks, versioned, places, specs, needed, deadline
            )

        head, versions, arrays = self._read(
            name, newer_than, deadline, specs, chosen_leaves, frozenset(chosen)
        )
        return LeafRead(head, versions, arrays)

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        """``read_patches``: as :meth:`read_leaves`, where a leaf with a chain comes as
        a :class:`LeafChain` (:meth:`.fetch.Fetcher.chains`)."""

        def composed_chains(
            route: Route, versioned: str, places: list[Place]
        ) -> list[np.ndarray | LeafChain | None] | None:
            chunks = self._catalog.keys(name).chunks
            return self.fetch.chains(
                route.client, chunks, versioned, places, specs, newer_than, deadline
            )

        head, versions, leaves = self._read(name, newer_than, deadline, specs, composed_chains)
        return PatchRead(head, versions, leaves)

    def _read(
        self,
        name: str,
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
        composed_read: Callable[[Route, str, list[Place]], list[L] | None],
        subset: frozenset[int] | None = None,
    ) -> tuple[Head, list[int] | None, list[L] | None]:
        """The head and, if its version is newer than ``newer_than``, its leaf versions
        and leaves: a whole version's arrays, or what ``composed_read(route, where,
        places)`` fetches of a composed one (``None``: a chunk is gone, start again).
        With a ``subset`` of leaves: a whole version too goes to ``composed_read``, as
        one segment, unless its one chunk came with the peek (then only the leaves of
        ``subset`` of its arrays are kept)."""
        keys = self._catalog.keys(name)
        where = self._where(name)

        def attempt(route: Route) -> tuple[Head, list[int] | None, list[L] | None]:
            gone: int | None = None
            for _ in range(MAX_RESTARTS):
                head = self._peek(route, name, newer_than, deadline)
                route.accept(name, head, newer_than)
                if head is None:
                    return answer(head), None, None  # vanished: reads as empty
                self._check_signature(name, head.epoch, specs, deadline)
                if head.version <= newer_than:
                    return answer(head), None, None
                if head.fmt in COMPOSED_FORMATS:  # the map, read with the fields it goes with
                    head = self._head(route, name, _LEAF_FIELDS, deadline)
                    route.accept(name, head, newer_than)
                    if head is None:
                        return answer(head), None, None
                    self._check_signature(name, head.epoch, specs, deadline)
                if head.version == gone:
                    raise CorruptDataError(
                        f"{where} version {head.version}: a chunk of the current version is "
                        "missing (evicted? varsync needs maxmemory-policy noeviction)"
                    )
                if not composed(head) and (subset is None or head.chunk is not None):
                    chunk_prefix = f"{keys.chunks}{head.data}:"
                    whole = self.fetch.whole(
                        route.client, where, specs, head, chunk_prefix, deadline
                    )
                    if whole is not None:
                        arrays: list[L] = list(whole)
                        if subset is not None:
                            arrays = [a if i in subset else None for i, a in enumerate(arrays)]
                        return answer(head), [head.version] * len(specs), arrays
                else:
                    versioned = f"{where} version {head.version}"
                    places = places_of(versioned, head, specs)
                    leaves = composed_read(route, versioned, places)
                    if leaves is not None:
                        return answer(head), [p.version for p in places], leaves
                gone = head.version  # retired by newer versions while we read: start again
                self.pulls_restarted += 1
            raise PullTimeoutError(
                f"{where}: {MAX_RESTARTS} pulls in a row found their version retired before "
                "they finished; the writer publishes faster than this reader can fetch one "
                "version. Connect the writer with a larger keep."
            )

        return self._router.read(keys.head, deadline, attempt)

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        """One ``HMGET`` on the primary."""
        route = self._router.primary
        head = self._head(route, name, ("leaves",), deadline)
        route.accept(name, head, 0)  # a replica's answer may not go below it now
        versions = None if head is None else leaf_versions_of(self._where(name), head)
        if versions is not None:
            return answer(head), versions
        stored = self._catalog.get(name) or self.stored(name, deadline)
        count = 0 if stored is None else len(stored.specs)
        return answer(head), [0 if head is None else head.version] * count

    # -- waits -----------------------------------------------------------------------------

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        """``XREAD BLOCK`` on the table's stream after the entry of version
        ``newer_than``: it answers at once if a newer version is there already (the
        entry's id arms it), else when a push appends one, or at ``deadline``, after at
        most :data:`WAIT_SLICE` and half the ``socket_timeout``, so that the core's loop
        looks at the head (a vanished table) that often, and no XREAD outlasts its
        socket. On the server reads go to: a replica wakes when it has the version."""
        longest = WAIT_SLICE
        if self._socket_timeout is not None:
            longest = min(longest, self._socket_timeout / 2)
        seconds = min(remaining(deadline), longest)
        if seconds <= 0:
            return
        milliseconds = max(1, int(seconds * 1000))
        bound = deadline + WAIT_GRACE
        keys = self._catalog.keys(name)

        def xread(route: Route) -> Any:
            try:
                return route.client.call(
                    "XREAD",
                    "COUNT",
                    1,
                    "BLOCK",
                    milliseconds,
                    "STREAMS",
                    keys.events,
                    f"{newer_than}-1",
                    deadline=bound,
                )
            except rx.ResponseError as exc:  # the server changed role (REPLICAOF, failover)
                if not str(exc).startswith("UNBLOCKED"):
                    raise
                return None

        self._router.read(keys.head, deadline, xread)
