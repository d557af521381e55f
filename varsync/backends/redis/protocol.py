"""The server side of the redis backend: the keys of a table, its head, and the Lua
scripts that change a table atomically.

Every reply a script can give has a name, bound once for both sides: a script's text
begins with ``local NAME, ... = 'value', ...`` made from its :class:`Reply` enum, its
Lua returns ``{NAME, ...}``, and Python matches the same member (:meth:`Script.answer`).
"""

from __future__ import annotations

import enum
import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Type
from urllib.parse import quote

from redis import exceptions as rx

from varsync.backend import CorruptDataError

FORMAT = "1"
"""Layout format of a head whose current version is one whole segment (every version
written by :meth:`write`): what every varsync reads."""
LEAF_FORMAT = "2"
"""Layout format of a head whose current version was composed by ``write_leaves``: its
leaves lie in several segments (``leaves`` and ``segments`` fields, :mod:`.leaves`).
Readers of format 1 only refuse it with their format error."""
FORMATS = (FORMAT, LEAF_FORMAT)

PENDING_TTL_MS = 3_600_000  # chunks of a push not yet published expire after an hour
STREAM_LENGTH = 16  # entries at least kept in a table's events stream (trimmed by '~')


class Keys(NamedTuple):
    """A table's keys (see the package's docstring)."""

    head: str
    events: str
    chunks: str  # the prefix of its chunks' keys: ``<chunks><token>:<index>``


def keys_of(key_base: str, name: str, namespace: Optional[str] = None) -> Keys:
    """``namespace`` (given in a Redis Cluster): the namespace and the name in braces, a
    hash tag, so that every key of the table (chunks, registry) falls in one slot, one
    node holds it and one script changes it, and tables of the same name in different
    namespaces spread over the nodes. Both are percent-encoded: the tag is always them."""
    quoted = quote(name, safe="")
    if namespace is not None:
        quoted = "{" + quote(namespace, safe="") + ":" + quoted + "}"
    table = key_base + quoted
    return Keys(table + ":head", table + ":events", table + ":d:")


# A generator of this module's own, seeded from the OS, and again in a forked child: not
# random's global one, which a program may seed with a constant, making two writers draw
# the same tokens. Unique, not secret (tokens are in key names): unlike secrets', no
# system call per push.
_TOKENS = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TOKENS.seed)


def fresh_token() -> bytes:
    """8 random bytes: a push's token (its chunks' keys, their headers) or, as hex, an
    epoch."""
    return _TOKENS.getrandbits(64).to_bytes(8, "little")


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
    fmt: str = FORMAT
    leaves: Optional[str] = None  # format 2: the leaf map, see :mod:`.leaves`
    segments: Optional[str] = None  # the live segments, see :mod:`.leaves`
    chunk: Optional[bytes] = None  # the one chunk of a small version, read with it (PEEK)


def text(value: Any) -> Any:
    """A reply's bytes as text (anything else as it is)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def is_epoch(epoch: Optional[str]) -> bool:
    """Whether ``epoch`` is one varsync writes (``fresh_token().hex()``)."""
    return epoch is not None and len(epoch) == 16 and all(c in "0123456789abcdef" for c in epoch)


def check_format(where: str, fmt: Optional[str]) -> None:
    """``where``: ``"table 'name' at <address>"``, for messages (as below)."""
    if fmt not in FORMATS:
        raise CorruptDataError(
            f"{where} has layout format {fmt!r}; this varsync reads formats "
            f"{' and '.join(FORMATS)} (a newer varsync wrote it, or something else did)"
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
    return Head(epoch, number, named.get("data"), named.get("layout"), fmt,
                named.get("leaves"), named.get("segments"))


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
    BASE_MOVED = "base-moved"  # version: leaves written on another base: nothing published
    NO_BASE = "no-base"  # why: no version of this history to compose leaves on: nothing


class Peeked(Reply):
    HEAD = "head"  # fmt, epoch, version, data, layout, and the chunk (PEEK) or nil


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
        """The reply's name (a member of :attr:`replies`) and the rest of it: from a
        table, or from one string of space-separated fields."""
        try:
            if isinstance(raw, bytes):
                raw = raw.split(b" ")
            return self.replies(text(raw[0])), list(raw[1:])
        except (TypeError, ValueError, IndexError, KeyError):
            raise rx.InvalidResponse(
                f"the {self.name} script answered {str(raw)[:80]}, none of "
                f"{', '.join(r.name for r in self.replies)}"
            ) from None


CREATE = Script.of("create", """
-- KEYS: head, events, tables (not in a Redis Cluster: its own slot, added to apart).
-- ARGV: name, signature, epoch, format.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'sig', 'epoch')
if h[1] then
  if h[2] and h[3] then return {EXISTS, h[1], h[2], h[3]} end
  return {NOT_A_HEAD}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {NOT_A_HEAD} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'fmt', ARGV[4], 'sig', ARGV[2], 'epoch', ARGV[3], 'version', '0')
if KEYS[3] then redis.call('SADD', KEYS[3], ARGV[1]) end
return {CREATED, ARGV[4], ARGV[2], ARGV[3]}
""", Created)

PUBLISH = Script.of("publish", """
-- KEYS: head, events. ARGV: epoch the writer knows, token, layout, chunk count, keep,
-- chunk key prefix, last version this writer published, a fresh epoch, stream length,
-- chunk header size, '1' to keep the oldest retired segment as the spare, the tokens
-- of the versions this writer published or may have published (comma-separated), the
-- table's leaf count, '' for a whole write or '+' and the leaves it holds as
-- 'index.offset' (comma-separated, offsets into its bytes), '' or the base version.
-- Every check comes before the first change, so a refusal leaves the table as it was;
-- and every key it changes is read before the first change, so that in a Redis Cluster
-- a slot in migration (a key of it gone to the target node) stops it there, unchanged.
local h = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'data', 'retained', 'layout', 'spare',
                     'run', 'fmt', 'leaves', 'segments')
local partial = ARGV[14] ~= ''
if not h[1] then
  if partial then return {NO_BASE, 'vanished'} end
  return {VANISHED}
end
local based = partial and ARGV[15] ~= ''
if h[1] ~= ARGV[1] then
  if based then return {NO_BASE, 'another history'} end
  return {OTHER_EPOCH, h[1]}
end
-- digits only, below 2^53: Lua numbers are doubles, exact up to there
if not string.match(h[2] or '', '^%d+$') then return {MALFORMED_HEAD, 'version'} end
local version = tonumber(h[2])
if version >= 9007199254740992 then return {MALFORMED_HEAD, 'version'} end
local before = h[2]
if partial then
  if ARGV[15] ~= '' and ARGV[15] ~= before then return {BASE_MOVED, before} end
  if version == 0 or not h[3] or h[3] == '' then return {NO_BASE, 'empty'} end
end
local epoch = h[1]
local published = tonumber(ARGV[7])
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)  -- plain: a pattern tried at every byte cost more
local run = at and string.match(info, '^%x+', at + 7) or ''
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
-- leaves on a base are composed only in the history the writer knows; without a base
-- on whatever is current: its leaf versions stay below every version of the new history
if based and epoch ~= h[1] then return {NO_BASE, 'new history'} end
version = version + 1
local now = string.format('%d', version)
local chunks = tonumber(ARGV[4])
local data = ARGV[6] .. ARGV[2] .. ':'
local total, payload = string.match(ARGV[3], '^(%d+):(%d+):')
local header = tonumber(ARGV[10])
for i = 0, chunks - 1 do
  local size = header + tonumber(payload)
  if i == chunks - 1 then size = header + tonumber(total) - tonumber(payload) * (chunks - 1) end
  if redis.call('STRLEN', data .. i) ~= size then return {CHUNK_MISSING, tostring(i)} end
end
-- segments: 'version that wrote it:token:bytes:bytes per chunk:chunks'
local segments, token_of = {}, {}
for item in string.gmatch(h[10] or '', '[^,]+') do
  local w, token = string.match(item, '^(%d+):(%x+):%d+:%d+:%d+$')
  if not w then return {MALFORMED_HEAD, 'segments'} end
  table.insert(segments, item)
  token_of[w] = token
end
local whole = string.match(h[5] or '', '^%d+:%d+:%d+$')
if h[3] and h[3] ~= '' and whole and not token_of[before] then
  table.insert(segments, before .. ':' .. h[3] .. ':' .. h[5])
  token_of[before] = h[3]
end
-- the current version's leaf map ('w': leaf of whole segment w; 'w.offset'), if partial
local entries = nil
if h[8] == '2' and string.sub(h[9] or '', 1, #before + 1) == before .. '|' then
  entries = {}
  for e in string.gmatch(string.sub(h[9], #before + 2), '[^,]+') do table.insert(entries, e) end
end
local function refs(map)  -- the segments (by version) a leaf map references
  local seen, list = {}, {}
  for _, e in ipairs(map) do
    local w = string.match(e, '^(%d+)')
    if not w or not token_of[w] then return nil end
    if not seen[w] then seen[w] = true; table.insert(list, w) end
  end
  return list
end
local count = tonumber(ARGV[13])
local map = nil
if partial then
  map = {}
  for i = 1, count do map[i] = before end
  if entries then
    map = {}
    for i, e in ipairs(entries) do map[i] = e end
  end
  if #map ~= count then return {MALFORMED_HEAD, 'leaves'} end
  for index, offset in string.gmatch(ARGV[14], '(%d+)%.(%d+)') do
    map[tonumber(index) + 1] = now .. '.' .. offset
  end
end
-- retained items, newest first: 'token:bytes:bytes per chunk:chunks' (or 'token:chunks',
-- from before spares), then '/' and the segments it references if not only its own
local retained = {}
if h[3] and h[3] ~= '' then
  local item = h[3] .. ':' .. (whole and h[5] or '0')
  if entries then
    local list = refs(entries)
    if not list then return {MALFORMED_HEAD, 'leaves'} end
    item = item .. '/' .. table.concat(list, '.')
  end
  table.insert(retained, item)
end
for item in string.gmatch(h[4] or '', '[^,]+') do table.insert(retained, item) end
table.insert(segments, now .. ':' .. ARGV[2] .. ':' .. ARGV[3])
token_of[now] = ARGV[2]
local live = {}
if partial then
  local list = refs(map)
  if not list then return {MALFORMED_HEAD, 'leaves'} end
  for _, w in ipairs(list) do live[token_of[w]] = true end
else
  live[ARGV[2]] = true
end
local keep = tonumber(ARGV[5])
for index, item in ipairs(retained) do
  if index <= keep then
    local own, list = string.match(item, '^(%x+):[^/]*/?(.*)$')
    if list == '' then live[own or ''] = true end
    for w in string.gmatch(list or '', '%d+') do
      if token_of[w] then live[token_of[w]] = true end
    end
  end
end
local spare = h[6] or ''
local doomed = {}  -- the chunks of segments retired now: unlinked once published
local function retire(token, layout)  -- a segment no retained version references
  local count = tonumber(string.match(layout, '(%d+)$') or '0')
  if spare == '' and ARGV[11] == '1' and string.match(layout, '^[1-9]%d*:%d+:%d+$') then
    spare = token .. ':' .. layout  -- its chunks stay, for the next push to overwrite in place
  else
    for i = 0, count - 1 do table.insert(doomed, ARGV[6] .. token .. ':' .. i) end
  end
end
local kept, alive, known = {}, {}, {}
for _, item in ipairs(segments) do
  local token, layout = string.match(item, '^%d+:(%x+):(.*)$')
  known[token] = true
  if live[token] then table.insert(alive, item) else retire(token, layout) end
end
for index, item in ipairs(retained) do
  if index <= keep then
    table.insert(kept, item)
  else
    local token, layout = string.match(item, '^(%x+):([^/]*)')
    if token and not known[token] and not live[token] then retire(token, layout) end
  end
end
-- a push that does not recycle frees the spare a larger push (or another writer's
-- recycle_from) left, unless a kept version still reads it (only a damaged head says so)
if ARGV[11] ~= '1' and spare ~= '' then
  local token, layout = string.match(spare, '^(%x+):(%d+:%d+:%d+)$')
  if token and not live[token] and not known[token] and token ~= ARGV[2] then
    for i = 0, tonumber(string.match(layout, ':(%d+)$')) - 1 do
      table.insert(doomed, ARGV[6] .. token .. ':' .. i)
    end
  end
  spare = ''
end
for _, key in ipairs(doomed) do redis.call('EXISTS', key) end
-- every check is done: publish
for i = 0, chunks - 1 do redis.call('PERSIST', data .. i) end
-- the event waiters wake on. A stream whose top entry is not below this version (a
-- history that went back) refuses it and is started again: asking XADD, rather than
-- reading the top entry first, saves a command per push. Trimmed by whole nodes ('~'):
-- exact trimming cost each push more than the rest of its stream work.
local event = string.format('%d-1', version)
local added = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], event, 'v', now)
if type(added) == 'table' and added['err'] then
  if not string.find(added['err'], 'equal or smaller', 1, true) then
    return redis.error_reply(added['err'])
  end
  redis.call('DEL', KEYS[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], event, 'v', now)
end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'version', now, 'data', ARGV[2], 'layout', ARGV[3],
           'retained', table.concat(kept, ','), 'spare', spare, 'run', run,
           'fmt', partial and '2' or '1',
           'leaves', partial and (now .. '|' .. table.concat(map, ',')) or '',
           'segments', table.concat(alive, ','))
for _, key in ipairs(doomed) do redis.call('UNLINK', key) end
-- one string, not a table: Redis 6 writes a table's reply with a write(2) of its own after
-- the reply to the push's chunk SET (its length is deferred), one string goes with it
return PUBLISHED .. ' ' .. now .. ' ' .. epoch
""", Published)

CLAIM = Script.of("claim", """
-- KEYS: head. ARGV: epoch the writer knows, the push's layout, chunk key prefix, the
-- push's token, TTL (ms) of an unpublished push's chunks.
-- Hands the spare version's chunks to a push (renamed to its chunk keys) when they have
-- exactly the push's layout. Otherwise the spare is dropped (its chunks deleted, unless
-- they are a readable version's).
-- Every key it changes is read before the first change (see the publish script).
local h = redis.call('HMGET', KEYS[1], 'epoch', 'spare', 'data', 'retained', 'segments')
if not h[1] or h[1] ~= ARGV[1] or not h[2] or h[2] == '' then return {NO_SPARE} end
local token, layout = string.match(h[2], '^(%x+):(%d+:%d+:%d+)$')
if not token then
  redis.call('HSET', KEYS[1], 'spare', '')
  return {SPARE_DROPPED}
end
-- never the chunks of a segment still readable (only a damaged head could say so)
if token == h[3] or string.find(',' .. (h[4] or ''), ',' .. token .. ':', 1, true) or
   string.find(h[5] or '', ':' .. token .. ':', 1, true) then
  redis.call('HSET', KEYS[1], 'spare', '')
  return {SPARE_DROPPED}
end
local count = tonumber(string.match(layout, ':(%d+)$'))
local old = ARGV[3] .. token .. ':'
local new = ARGV[3] .. ARGV[4] .. ':'
local usable = layout == ARGV[2]
for i = 0, count - 1 do
  if redis.call('EXISTS', old .. i) == 0 then usable = false end
  if usable then redis.call('EXISTS', new .. i) end
end
redis.call('HSET', KEYS[1], 'spare', '')
if not usable then
  for i = 0, count - 1 do redis.call('UNLINK', old .. i) end
  return {SPARE_DROPPED}
end
for i = 0, count - 1 do
  redis.call('RENAME', old .. i, new .. i)
  redis.call('PEXPIRE', new .. i, ARGV[5])
end
return {CLAIMED, count}
""", Claimed)

#: The most bytes a version may hold for PEEK to return it with its head.
PEEK_BYTES = 256 << 10

PEEK = Script.of("peek", """
-- KEYS: head. ARGV: the version the reader holds (0: none), chunk key prefix, most bytes.
-- Reads only. The head's fields a pull reads first and, when the version is newer than
-- the reader's and its value one whole chunk of at most that many bytes, that chunk: read
-- in the same atomic step as the head, so a small pull takes one round trip, not two.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'epoch', 'version', 'data', 'layout')
local chunk = false
local version = tonumber(h[3] or '')
if h[1] == '1' and h[4] and version and version > tonumber(ARGV[1]) then
  local total, chunks = string.match(h[5] or '', '^(%d+):%d+:(%d+)$')
  if chunks == '1' and tonumber(total) <= tonumber(ARGV[3]) then
    chunk = redis.call('GET', ARGV[2] .. h[4] .. ':0')
  end
end
return {HEAD, h[1], h[2], h[3], h[4], h[5], chunk}
""", Peeked)
