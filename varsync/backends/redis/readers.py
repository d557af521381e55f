"""The reader registry of a redis table (``supports_reader_registry``).

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

from varsync.backend import TableNotFoundError, current_deadline, remaining
from varsync.backends.redis.cluster import SETTLE_SECONDS
from varsync.backends.redis.protocol import Reply, Script, text

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
    """Mixed into :class:`~varsync.backends.redis.backend.RedisBackend` (its ``_keys``,
    ``_errors`` and ``_client``): ``report_reader`` and ``readers``, one script each."""

    supports_reader_registry = True

    def report_reader(self, name: str, reader: str, record: str, ttl: float) -> None:
        backend: Any = self
        head = backend._keys(name).head
        index, prefix = reader_keys(head)
        member = quote(reader, safe="")
        with backend._errors(f"reporting a reader of table {name!r}"):
            reply, _ = REPORT.answer(
                _settled(
                    backend,
                    head,
                    lambda: backend._client.script(
                        REPORT,
                        [prefix + member, index],
                        [head, member, record, max(int(ttl * 1000), 1)],
                    ),
                )
            )
        if reply is Reported.NO_TABLE:
            raise TableNotFoundError(f"no table {name!r} at {backend.address}")

    def readers(self, name: str) -> dict[str, str]:
        backend: Any = self
        index, prefix = reader_keys(backend._keys(name).head)
        with backend._errors(f"listing the readers of table {name!r}"):
            return parse_listing(
                _settled(backend, index, lambda: backend._client.script(LIST, [index], [prefix]))
            )


def _settled(backend: Any, key: str, run: Callable[[], Any]) -> Any:
    """``run()``; in a Redis Cluster, again once the table's slot is no longer migrating:
    both scripts touch keys they do not declare (the head, the entries), which may have
    left for the slot's target node, so they are never sent after an ASK
    (``cluster.UNDECLARED_KEYS``); a listing there could drop entries not yet moved."""
    cluster = backend._topology.cluster
    if cluster is None:
        return run()
    return cluster.settled(run, key, min(remaining(current_deadline()), SETTLE_SECONDS))
