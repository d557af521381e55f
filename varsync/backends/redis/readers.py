"""The reader registry of a redis table (``supports_reader_registry``).

Two keys beside the table's head: ``<table>:readers``, a hash of reader id -> the core's
record text, and ``<table>:readers:exp``, a sorted set of reader id -> the server time
(ms) at which its entry expires. Both change in one script, and expiry is decided by the
server's own clock (``TIME``), so readers on hosts whose clocks differ expire alike. A
listing removes expired entries in the same script that reads the rest. Both keys expire
themselves once their last entry would have, so a table whose readers all went leaves
nothing behind. The head is not touched: reports never change a table's version.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from varsync.backend import TableNotFoundError
from varsync.backends.redis.protocol import Reply, Script, text

__all__ = ["ReaderRegistry", "REPORT", "LIST", "Reported", "reader_keys"]


class Reported(Reply):
    REPORTED = "reported"  # the entry is stored
    NO_TABLE = "no-table"  # the table's head is gone


REPORT = Script.of("report-reader", """
-- KEYS: head, readers hash, expiry zset. ARGV: reader id, record, ttl (ms).
if redis.call('EXISTS', KEYS[1]) == 0 then return {NO_TABLE} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
-- the keys live as long as their longest-lived entry
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local keep = tonumber(last[2]) - now + 1000
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[3], keep)
return {REPORTED}
""", Reported)


class Listed(Reply):
    LISTED = "listed"  # reader, record, reader, record, ...


LIST = Script.of("list-readers", """
-- KEYS: readers hash, expiry zset. Removes the expired entries, returns the others.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, reader in ipairs(gone) do
  redis.call('HDEL', KEYS[1], reader)
  redis.call('ZREM', KEYS[2], reader)
end
local out = {LISTED}
local alive = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
for _, reader in ipairs(alive) do
  local record = redis.call('HGET', KEYS[1], reader)
  if record then
    table.insert(out, reader)
    table.insert(out, record)
  end
end
return out
""", Listed)


def reader_keys(head: str) -> Tuple[str, str]:
    """The registry's two keys, from the table's head key (``<table>:head``)."""
    table = head[: -len(":head")] if head.endswith(":head") else head
    return table + ":readers", table + ":readers:exp"


def parse_listing(raw: Any) -> Dict[str, str]:
    """The ``LIST`` script's reply as reader id -> record."""
    _, rest = LIST.answer(raw)
    pairs: List[Any] = list(rest)
    return {text(pairs[i]): text(pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)}


class ReaderRegistry:
    """Mixed into :class:`~varsync.backends.redis.backend.RedisBackend` (its ``_keys``,
    ``_errors`` and ``_client``): ``report_reader`` and ``readers``, one script each."""

    supports_reader_registry = True

    def report_reader(self, name: str, reader: str, record: str, ttl: float) -> None:
        backend: Any = self
        head = backend._keys(name).head
        with backend._errors(f"reporting a reader of table {name!r}"):
            reply, _ = REPORT.answer(backend._client.script(
                REPORT, [head, *reader_keys(head)], [reader, record, max(int(ttl * 1000), 1)]
            ))
        if reply is Reported.NO_TABLE:
            raise TableNotFoundError(f"no table {name!r} at {backend.address}")

    def readers(self, name: str) -> Dict[str, str]:
        backend: Any = self
        head = backend._keys(name).head
        with backend._errors(f"listing the readers of table {name!r}"):
            return parse_listing(backend._client.script(LIST, list(reader_keys(head)), []))
