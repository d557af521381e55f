"""The reader registry of a redis table (:class:`~varsync.backend.SupportsReaderRegistry`).

Each reader's entry is a key of its own beside the table's head,
``<table>:reader:<reader id, percent-encoded>``: a string holding the core's record, with
the report's ttl as its own expiry (``PX``: the server's clock, so readers on hosts whose
clocks differ expire alike). The table's index, ``<table>:readers:exp``, a sorted set of
encoded reader id -> the server time (ms) its entry expires, is how a listing finds the
entries: a listing returns the members whose entry key is there and removes the others,
so an index member without an entry (expired, or written by hand) counts for nothing.
With an entry key per reader, an ACL can let an actor write its own entry and no other
one (docs/redis.md, Security). The index expires itself a second after its longest-lived
entry, so a table whose readers all went keeps nothing of them. The head is read, never
written: reports never change a table's version. Entries of the earlier layout (one hash,
``<table>:readers``) are ignored and expire on their own.
"""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import quote, unquote

from varsync._backends.redis.cluster import SETTLE_SECONDS, ClusterClient, settle_deadline
from varsync._backends.redis.protocol import Reply, Script, text
from varsync._backends.redis.tables import Catalog
from varsync._backends.redis.topology import Requests
from varsync.backend import TableNotFoundError

__all__ = ["ReaderRegistry", "REPORT", "LIST", "Reported", "reader_keys"]


class Reported(Reply):
    REPORTED = "reported"  # the entry is stored
    NO_TABLE = "no-table"  # the table's head is gone


REPORT = Script.load("report-reader", Reported)


class Listed(Reply):
    LISTED = "listed"  # encoded reader id, record, encoded reader id, record, ...


LIST = Script.load("list-readers", Listed)


def reader_keys(head: str) -> tuple[str, str]:
    """The registry's index and the prefix of its entries' keys, from the table's head
    key (``<table>:head``): in a Redis Cluster they keep the head's hash tag."""
    table = head[: -len(":head")] if head.endswith(":head") else head
    return table + ":readers:exp", table + ":reader:"


def parse_listing(raw: Any) -> dict[str, str]:
    """The ``LIST`` script's reply as reader id -> record. A member that is not an id as
    :func:`quote` encodes it (written by something else) is skipped."""
    _, rest = LIST.answer(raw)
    pairs: list[Any] = list(rest)
    out = {}
    for i in range(0, len(pairs) - 1, 2):
        member = text(pairs[i])
        reader = unquote(member)
        if quote(reader, safe="") == member:
            out[reader] = text(pairs[i + 1])
    return out


class ReaderRegistry:
    """``report_reader`` and ``readers``, one script each on the table's primary
    (``primary``; in a Redis Cluster, ``cluster``, the same client). ``catalog``: the
    tables' keys."""

    def __init__(
        self, primary: Requests, cluster: ClusterClient | None, catalog: Catalog, address: str
    ) -> None:
        self._client = primary
        self._cluster = cluster
        self._catalog = catalog
        self._address = address

    def report(self, name: str, reader: str, record: str, ttl: float, deadline: float) -> None:
        head = self._catalog.keys(name).head
        index, prefix = reader_keys(head)
        member = quote(reader, safe="")
        reply, _ = REPORT.answer(
            self._settled(
                head,
                deadline,
                lambda: self._client.script(
                    REPORT,
                    [prefix + member, index],
                    [head, member, record, max(int(ttl * 1000), 1)],
                    deadline=deadline,
                ),
            )
        )
        if reply is Reported.NO_TABLE:
            raise TableNotFoundError(f"no table {name!r} at {self._address}")

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        index, prefix = reader_keys(self._catalog.keys(name).head)
        return parse_listing(
            self._settled(
                index,
                deadline,
                lambda: self._client.script(LIST, [index], [prefix], deadline=deadline),
            )
        )

    def _settled(self, key: str, deadline: float, run: Callable[[], Any]) -> Any:
        """``run()``; in a Redis Cluster, again once the table's slot is no longer
        migrating: both scripts touch keys they do not declare (the head, the entries),
        which may have left for the slot's target node, so they are never sent after an
        ASK (``cluster.UNDECLARED_KEYS``); a listing there could drop entries not yet
        moved."""
        if self._cluster is None:
            return run()
        return self._cluster.settled(run, key, settle_deadline(deadline, SETTLE_SECONDS))
