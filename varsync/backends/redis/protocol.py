"""The server side of the redis backend: the keys of a table, its head, and the Lua
scripts that change a table atomically.

Every reply a script can give has a name, bound once for both sides: a script's text
begins with ``local NAME, ... = 'value', ...`` made from its :class:`Reply` enum, its
Lua returns ``{NAME, ...}``, and Python matches the same member (:meth:`Script.answer`).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Type
from urllib.parse import quote

from redis import exceptions as rx

from varsync.backend import CorruptDataError

FORMAT = "1"
"""Layout version written in every head; a head of another format is refused."""

PENDING_TTL_MS = 3_600_000  # chunks of a push not yet published expire after an hour
STREAM_LENGTH = 16  # entries kept in a table's events stream


class Keys(NamedTuple):
    """A table's keys (see the package's docstring)."""

    head: str
    events: str
    chunks: str  # the prefix of its chunks' keys: ``<chunks><token>:<index>``


def keys_of(key_base: str, name: str) -> Keys:
    table = key_base + quote(name, safe="")
    return Keys(table + ":head", table + ":events", table + ":d:")


def key_base_of(prefix: str, namespace: str) -> str:
    """``P`` of the package's docstring: every key of a namespace starts with it."""
    return f"{prefix}:{quote(namespace, safe='')}:"


# -- the head ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    epoch: str
    version: int
    data: Optional[str]
    layout: Optional[str]


def text(value: Any) -> Any:
    """A reply's bytes as text (anything else as it is)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def is_epoch(epoch: Optional[str]) -> bool:
    """Whether ``epoch`` is one varsync writes (``secrets.token_hex(8)``)."""
    return epoch is not None and len(epoch) == 16 and all(c in "0123456789abcdef" for c in epoch)


def check_format(where: str, fmt: Optional[str]) -> None:
    """``where``: ``"table 'name' at <address>"``, for messages (as below)."""
    if fmt != FORMAT:
        raise CorruptDataError(
            f"{where} has layout format {fmt!r}; this varsync reads format {FORMAT} (a "
            "newer varsync wrote it, or something else did)"
        )


def parse_head(
    where: str, key: str, raw: Sequence[Any], fields: Sequence[str]
) -> Optional[Head]:
    """The head from ``HMGET key fmt epoch version *fields``, or ``None`` if its keys
    vanished."""
    fmt, epoch, version, *extra = (text(x) for x in raw)
    if fmt is None and epoch is None and version is None:
        return None
    check_format(where, fmt)
    try:
        # ASCII digits below 2**53, as the publish script checks (Lua numbers are doubles)
        digits = version or ""
        if not is_epoch(epoch) or not (digits.isascii() and digits.isdigit()):
            raise ValueError
        number = int(digits)
        if number >= 2**53:
            raise ValueError
    except (TypeError, ValueError):
        raise CorruptDataError(
            f"{where}: head {key!r} has epoch {epoch!r} and version {version!r}; is "
            "something else writing under this prefix?"
        ) from None
    named = dict(zip(fields, extra))
    return Head(epoch, number, named.get("data"), named.get("layout"))


def parse_layout(where: str, layout: Optional[str]) -> Tuple[int, int, int]:
    """A head's ``layout``: total bytes, payload bytes per chunk, chunks."""
    try:
        total, chunk, chunks = (int(x) for x in str(layout).split(":"))
        if total < 0 or chunk <= 0 or chunks != -(-total // chunk):
            raise ValueError
    except ValueError:
        raise CorruptDataError(f"{where}: malformed layout {layout!r} in its head") from None
    return total, chunk, chunks


# -- scripts ------------------------------------------------------------------------------------


class Reply(str, enum.Enum):
    """The first element of a script's reply: the member's value is what the Lua returns,
    its name what both sides call it."""


class Created(Reply):
    CREATED = "created"  # fmt, signature, epoch: this call made the table
    EXISTS = "exists"  # fmt, signature, epoch of the table already there
    NOT_A_HEAD = "not-a-head"  # the head key holds something else


class Published(Reply):
    PUBLISHED = "published"  # version, epoch (a new one if this push started a history)
    VANISHED = "vanished"  # the head is gone: nothing published
    OTHER_EPOCH = "other-epoch"  # epoch: the table was created again since the writer looked
    CHUNK_MISSING = "chunk-missing"  # index of a chunk not there at its length
    MALFORMED_HEAD = "malformed-head"  # the head field that is malformed


class Claimed(Reply):
    CLAIMED = "claimed"  # chunks renamed to the push's keys
    NO_SPARE = "no-spare"  # no spare (or another epoch): nothing changed
    SPARE_DROPPED = "spare-dropped"  # a spare the push could not use, no longer the spare


@dataclass(frozen=True)
class Script:
    name: str
    text: str
    sha: str
    replies: Type[Reply]

    @classmethod
    def of(cls, name: str, body: str, replies: Type[Reply]) -> "Script":
        members = list(replies)
        text = (
            f"local {', '.join(r.name for r in members)} = "
            f"{', '.join(repr(r.value) for r in members)}\n{body}"
        )
        return cls(name, text, hashlib.sha1(text.encode()).hexdigest(), replies)

    def answer(self, raw: Any) -> Tuple[Any, List[Any]]:
        """The reply's name (a member of :attr:`replies`) and the rest of it."""
        try:
            return self.replies(text(raw[0])), list(raw[1:])
        except (TypeError, ValueError, IndexError, KeyError):
            raise rx.InvalidResponse(
                f"the {self.name} script answered {str(raw)[:80]}, none of "
                f"{', '.join(r.name for r in self.replies)}"
            ) from None


CREATE = Script.of("create", """
-- KEYS: head, events, tables. ARGV: name, signature, epoch, format.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'sig', 'epoch')
if h[1] then
  if h[2] and h[3] then return {EXISTS, h[1], h[2], h[3]} end
  return {NOT_A_HEAD}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {NOT_A_HEAD} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'fmt', ARGV[4], 'sig', ARGV[2], 'epoch', ARGV[3], 'version', '0')
redis.call('SADD', KEYS[3], ARGV[1])
return {CREATED, ARGV[4], ARGV[2], ARGV[3]}
""", Created)

PUBLISH = Script.of("publish", """
-- KEYS: head, events. ARGV: epoch the writer knows, token, layout, chunk count, keep,
-- chunk key prefix, last version this writer published, a fresh epoch, stream length,
-- chunk header size, '1' to keep the oldest retired version as the spare, the tokens
-- of the versions this writer published or may have published (comma-separated).
local h = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'data', 'retained', 'layout', 'spare',
                     'run')
if not h[1] then return {VANISHED} end
if h[1] ~= ARGV[1] then return {OTHER_EPOCH, h[1]} end
-- digits only, below 2^53: Lua numbers are doubles, exact up to there
if not string.match(h[2] or '', '^%d+$') then return {MALFORMED_HEAD, 'version'} end
local version = tonumber(h[2])
if version >= 9007199254740992 then return {MALFORMED_HEAD, 'version'} end
local chunks = tonumber(ARGV[4])
local data = ARGV[6] .. ARGV[2] .. ':'
local total, payload = string.match(ARGV[3], '^(%d+):(%d+):')
local header = tonumber(ARGV[10])
for i = 0, chunks - 1 do
  local size = header + tonumber(payload)
  if i == chunks - 1 then size = header + tonumber(total) - tonumber(payload) * (chunks - 1) end
  if redis.call('STRLEN', data .. i) ~= size then return {CHUNK_MISSING, tostring(i)} end
end
for i = 0, chunks - 1 do redis.call('PERSIST', data .. i) end
local epoch = h[1]
local published = tonumber(ARGV[7])
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
if version < published then
  -- the version went back (an older snapshot came back): start a new history
  epoch = ARGV[8]
  version = published
elseif version > 0 and h[7] ~= run and h[3] and
       not string.find(',' .. ARGV[12] .. ',', ',' .. h[3] .. ',', 1, true) then
  -- the server restarted since this version was published, perhaps from an older
  -- snapshot, and this writer cannot vouch for it: its number may have named another
  -- value before the restart, so start a new history
  epoch = ARGV[8]
end
version = version + 1
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if last[1] and tonumber(string.match(last[1][1], '^(%d+)')) >= version then
  redis.call('DEL', KEYS[2])
end
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[9], string.format('%d-1', version),
           'v', string.format('%d', version))
-- retained items: 'token:bytes:bytes per chunk:chunks' (or 'token:chunks', from before
-- spares), newest first
local retained = {}
if h[3] and h[3] ~= '' then
  if string.match(h[5] or '', '^%d+:%d+:%d+$') then
    table.insert(retained, h[3] .. ':' .. h[5])
  else
    table.insert(retained, h[3] .. ':' .. (string.match(h[5] or '', '^%d+:%d+:(%d+)$') or '0'))
  end
end
if h[4] and h[4] ~= '' then
  for item in string.gmatch(h[4], '[^,]+') do table.insert(retained, item) end
end
local keep = tonumber(ARGV[5])
local spare = h[6] or ''
local kept = {}
for index, item in ipairs(retained) do
  if index <= keep then
    table.insert(kept, item)
  elseif spare == '' and ARGV[11] == '1' and string.match(item, '^%x+:%d+:%d+:%d+$') then
    spare = item  -- its chunks stay, for the next push to overwrite in place
  else
    local token = string.match(item, '^(%x+):')
    local count = string.match(item, ':(%d+)$')
    if token and count then
      for i = 0, tonumber(count) - 1 do redis.call('UNLINK', ARGV[6] .. token .. ':' .. i) end
    end
  end
end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'version', string.format('%d', version),
           'data', ARGV[2], 'layout', ARGV[3], 'retained', table.concat(kept, ','),
           'spare', spare, 'run', run)
return {PUBLISHED, version, epoch}
""", Published)

CLAIM = Script.of("claim", """
-- KEYS: head. ARGV: epoch the writer knows, the push's layout, chunk key prefix, the
-- push's token, TTL (ms) of an unpublished push's chunks.
-- Hands the spare version's chunks to a push (renamed to its chunk keys) when they have
-- exactly the push's layout. Otherwise the spare is dropped (its chunks deleted, unless
-- they are a readable version's).
local h = redis.call('HMGET', KEYS[1], 'epoch', 'spare', 'data', 'retained')
if not h[1] or h[1] ~= ARGV[1] or not h[2] or h[2] == '' then return {NO_SPARE} end
redis.call('HSET', KEYS[1], 'spare', '')
local token, layout = string.match(h[2], '^(%x+):(%d+:%d+:%d+)$')
if not token then return {SPARE_DROPPED} end
-- never the chunks of a version still readable (only a damaged head could say so)
if token == h[3] or string.find(',' .. (h[4] or ''), ',' .. token .. ':', 1, true) then
  return {SPARE_DROPPED}
end
local count = tonumber(string.match(layout, ':(%d+)$'))
local old = ARGV[3] .. token .. ':'
local usable = layout == ARGV[2]
for i = 0, count - 1 do
  if usable and redis.call('EXISTS', old .. i) == 0 then usable = false end
end
if not usable then
  for i = 0, count - 1 do redis.call('UNLINK', old .. i) end
  return {SPARE_DROPPED}
end
local new = ARGV[3] .. ARGV[4] .. ':'
for i = 0, count - 1 do
  redis.call('RENAME', old .. i, new .. i)
  redis.call('PEXPIRE', new .. i, ARGV[5])
end
return {CLAIMED, count}
""", Claimed)
