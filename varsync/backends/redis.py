"""``redis://`` and ``rediss://``: tables in a Redis server, published atomically by version.

Keys, under ``P = "{prefix}:{namespace}:"`` (namespace and table names percent-encoded)::

    P tables                   set: the names of the tables
    P <table>:head             hash: fmt, sig, epoch, version, data, layout, retained, spare
    P <table>:events           stream: one entry with id "<version>-1" per publish
    P <table>:d:<token>:<i>    string: chunk i of one version (24-byte header + bytes)

A push sends the arrays' bytes, back to back in flat order, as chunks of ``chunk_size``
bytes under a fresh random token: straight from the arrays' memory, pipelined, each reply
checked, each chunk with a TTL. Then one short Lua script checks that every chunk is
there at its exact length, removes their TTL, bumps the version, points the head at the
token, appends to the stream and retires versions older than the ``keep`` previous ones.
From 4 MiB on, the first version retired is kept as the table's *spare*: the next push
renames its chunks to its own token (``_CLAIM``) and overwrites them in place, which saves
the server faulting in fresh memory for every byte (most of a large push's time). A push
that fails before its publish script is sent deletes its chunks and leaves the head on the
previous complete version; once the script is sent the push never deletes anything (the
server may have published it), and a writer that dies mid-push leaves chunks that expire.

A pull reads the head (one small request; all that ``version`` and an unchanged
``pull_if_newer`` cost), then that token's chunks straight into preallocated arrays, each
checked (magic, token, index, length, CRC-32). A chunk gone means newer versions retired
it: the pull starts again from the head. ``wait`` blocks in ``XREAD BLOCK`` on the stream.

The head's ``epoch`` changes whenever the table's history restarts: the table is created
again after the server lost it, a writer finds the version below one it published (a
restore of an older snapshot), or the server restarted since the head's version was
published and this writer did not publish it (the head records the server's ``run_id``),
so no number is ever reused for another value within one epoch. A reader that holds a version of another epoch gets
:class:`~varsync.TableResetError`; a table whose keys vanished reads as empty (version 0),
so holders of a version get the same error and ``pull`` waits for a writer to publish
again. A writer publishing to a vanished table creates it again with its signature.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import logging
import math
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)
from urllib.parse import quote, unquote, urlsplit

import numpy as np
import redis
from redis import exceptions as rx
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from varsync import signature as sig_lib
from varsync.backends.base import Backend, Snapshot, deadline_after, remaining
from varsync.config import parse_timeout
from varsync.errors import (
    AuthenticationError,
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    ItemTooLargeError,
    PullTimeoutError,
    TableNotFoundError,
    TableResetError,
    VarsyncError,
    translate_errors,
)
from varsync.signature import Spec

try:  # ISA-L's CRC-32: the same values as zlib's, about 7x faster where it is installed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the redis extra installs isal where it has wheels
    from zlib import crc32

__all__ = ["RedisBackend"]

log = logging.getLogger(__name__)

FORMAT = "1"
"""Layout version written in every head; a head of another format is refused."""

_MAGIC = b"VSC1"
_HEADER = struct.Struct("<4s8sIII")  # magic, token, chunk index, payload bytes, CRC-32
# A chunk's payload is chunk_size minus this, so that the stored value with its header,
# the server's string header and the protocol's CRLF fits in chunk_size bytes: allocators
# round up to size classes (jemalloc would put 4 MiB + 24 bytes in a 5 MiB extent).
_CHUNK_SLACK = 64
_PENDING_TTL_MS = 3_600_000  # chunks of a push not yet published expire after an hour
_STREAM_LENGTH = 16
_DEFAULT_CHUNK = 4 << 20
_MIN_CHUNK = 4 << 10
_MAX_CHUNK = 256 << 20  # well below Redis's 512 MB proto-max-bulk-len
# Chunk requests in flight per reader. The next chunk is asked for as soon as one is
# received, so the server works while the reader checks it; the server buffers at most
# one chunk per reader. Measured on loopback (Redis 6.2 and 7.0), two 4 MiB requests in
# flight pulled 1.8x slower than one.
_READ_AHEAD = 1
_WRITE_AHEAD = 8  # chunk writes in flight before their replies are read
# Pushes from this size on overwrite the spare version's chunks in place (see _CLAIM);
# below it, the extra round trip costs more than the page faults it saves.
_RECYCLE_FROM_BYTES = _DEFAULT_CHUNK
_DIRECT = 64 << 10  # buffers this big go to and from the socket without a copy
_WAIT_SLICE = 1.0  # seconds per XREAD BLOCK: a vanished table is noticed this fast
_WAIT_GRACE = 0.1  # seconds a wait's XREAD, and the look after it, may outlast its deadline
_DISCARD_SECONDS = 1.0  # bound on deleting a failed push's chunks (they expire anyway)
_MAX_RESTARTS = 1000

_OPTIONS = (
    "db", "username", "password", "prefix", "chunk_size", "keep", "connect_timeout",
    "socket_timeout", "retries", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "ssl_cert_reqs", "ssl_check_hostname",
)
_SECRET_OPTIONS = ("password", "ssl_password")
_CERT_REQS = ("none", "optional", "required")  # redis-py's names for ssl_cert_reqs

# -- the server side ------------------------------------------------------------------------

_CREATE = """
-- KEYS: head, events, tables. ARGV: name, signature, epoch, format.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'sig', 'epoch')
if h[1] then
  if h[2] and h[3] then return {1, h[1], h[2], h[3]} end
  return {-1}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'fmt', ARGV[4], 'sig', ARGV[2], 'epoch', ARGV[3], 'version', '0')
redis.call('SADD', KEYS[3], ARGV[1])
return {0, ARGV[4], ARGV[2], ARGV[3]}
"""

_PUBLISH = """
-- KEYS: head, events. ARGV: epoch the writer knows, token, layout, chunk count, keep,
-- chunk key prefix, last version this writer published, a fresh epoch, stream length,
-- chunk header size, '1' to keep the oldest retired version as the spare, the tokens
-- of the versions this writer published or may have published (comma-separated).
local h = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'data', 'retained', 'layout', 'spare',
                     'run')
if not h[1] then return {-1, ''} end
if h[1] ~= ARGV[1] then return {-2, h[1]} end
-- digits only, below 2^53: Lua numbers are doubles, exact up to there
if not string.match(h[2] or '', '^%d+$') then return {-4, 'version'} end
local version = tonumber(h[2])
if version >= 9007199254740992 then return {-4, 'version'} end
local chunks = tonumber(ARGV[4])
local data = ARGV[6] .. ARGV[2] .. ':'
local total, payload = string.match(ARGV[3], '^(%d+):(%d+):')
local header = tonumber(ARGV[10])
for i = 0, chunks - 1 do
  local size = header + tonumber(payload)
  if i == chunks - 1 then size = header + tonumber(total) - tonumber(payload) * (chunks - 1) end
  if redis.call('STRLEN', data .. i) ~= size then return {-3, tostring(i)} end
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
return {version, epoch}
"""

_CLAIM = """
-- KEYS: head. ARGV: epoch the writer knows, the push's layout, chunk key prefix, the
-- push's token, TTL (ms) of an unpublished push's chunks.
-- Hands the spare version's chunks to a push (renamed to its chunk keys) when they have
-- exactly the push's layout; returns how many. Otherwise the spare is deleted.
local h = redis.call('HMGET', KEYS[1], 'epoch', 'spare', 'data', 'retained')
if not h[1] or h[1] ~= ARGV[1] or not h[2] or h[2] == '' then return 0 end
redis.call('HSET', KEYS[1], 'spare', '')
local token, layout = string.match(h[2], '^(%x+):(%d+:%d+:%d+)$')
if not token then return 0 end
-- never the chunks of a version still readable (only a damaged head could say so)
if token == h[3] or string.find(',' .. (h[4] or ''), ',' .. token .. ':', 1, true) then
  return 0
end
local count = tonumber(string.match(layout, ':(%d+)$'))
local old = ARGV[3] .. token .. ':'
local usable = layout == ARGV[2]
for i = 0, count - 1 do
  if usable and redis.call('EXISTS', old .. i) == 0 then usable = false end
end
if not usable then
  for i = 0, count - 1 do redis.call('UNLINK', old .. i) end
  return 0
end
local new = ARGV[3] .. ARGV[4] .. ':'
for i = 0, count - 1 do
  redis.call('RENAME', old .. i, new .. i)
  redis.call('PEXPIRE', new .. i, ARGV[5])
end
return count
"""


@dataclass(frozen=True)
class _Script:
    text: str
    sha: str

    @classmethod
    def of(cls, text: str) -> "_Script":
        return cls(text, hashlib.sha1(text.encode()).hexdigest())


_CREATE_SCRIPT = _Script.of(_CREATE)
_PUBLISH_SCRIPT = _Script.of(_PUBLISH)
_CLAIM_SCRIPT = _Script.of(_CLAIM)

# -- errors: redis-py's, mapped here and nowhere else -----------------------------------------

_DRIVER_ERRORS = {
    rx.AuthenticationError: AuthenticationError,
    getattr(rx, "AuthorizationError", rx.AuthenticationError): AuthenticationError,
    rx.NoPermissionError: AuthenticationError,
    rx.AuthenticationWrongNumberOfArgsError: AuthenticationError,
    rx.OutOfMemoryError: ItemTooLargeError,
    rx.ReadOnlyError: ConfigurationError,
    rx.ConnectionError: BackendConnectionError,
    rx.TimeoutError: BackendConnectionError,
    OSError: BackendConnectionError,  # the raw socket of bulk transfers
    rx.RedisError: VarsyncError,
}

_OOM_HINT = (
    "the server reached its maxmemory; nothing was published and the table keeps its "
    "previous version. Raise maxmemory (a table needs about (keep + 2) x its size, see "
    "docs/redis.md) or free memory"
)


def _reclassified(exc: rx.RedisError) -> Optional[BaseException]:
    """Errors redis-py reports as a plain ``ResponseError`` (or wrapped in a script
    error) that mean something specific."""
    text = str(exc)
    if "OOM command not allowed" in text:
        return rx.OutOfMemoryError(f"{_OOM_HINT} ({text})")
    if "NOPERM" in text or "no permissions" in text or "can't run this command" in text:
        return rx.NoPermissionError(
            f"{text} (the ACL user lacks a command or key varsync needs; see the ACL "
            "line in docs/redis.md)"
        )
    if "WRONGTYPE" in text:
        return CorruptDataError(
            f"a key holds another kind of value than varsync stores there ({text}); is "
            "something else using this key prefix? Use another prefix or namespace."
        )
    return None


# -- options -------------------------------------------------------------------------------------


def _int_option(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name}={value!r} is not an integer") from None
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ConfigurationError(f"{name}={value!r} is out of range; expected {bound}")
    return number


def _bool_option(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean; expected true or false")


def _check_text(options: Mapping[str, Any]) -> None:
    """Refuse text that cannot go to the server (UTF-8, host names as IDNA), such as a
    lone surrogate from ``os.fsdecode``, before redis-py fails on it mid-call."""
    for name, value in options.items():
        if not isinstance(value, str):
            continue
        try:
            value.encode("idna" if name == "host" else "utf-8")
        except UnicodeError:
            shown = "(not shown)" if name in _SECRET_OPTIONS else repr(value)
            expected = "a host name or address" if name == "host" else "text encodable as UTF-8"
            raise ConfigurationError(
                f"the redis {name} {shown} is not {expected} (a lone surrogate, or a "
                f"label over 63 characters?); give the {name} as proper text"
            ) from None


def _socket_timeout(name: str, value: Any) -> Optional[float]:
    """Seconds for a socket operation; at least 0.1 (0 would make the socket
    non-blocking), ``None`` for no bound."""
    seconds = parse_timeout(value, name)
    return None if seconds is None else max(seconds, 0.1)


@dataclass(frozen=True)
class _Head:
    epoch: str
    version: int
    data: Optional[str]
    layout: Optional[str]


@dataclass
class _Known:
    """What this backend last saw of a table: the epoch it trusts, the signature text,
    and the last version it published itself with its token, plus the token of a push
    whose publish script was sent but not answered (to notice a server going back in
    time, and to vouch for the head after a server restart)."""

    epoch: str
    signature: str
    specs: List[Spec]
    published: int = 0
    token: str = ""
    in_doubt: str = ""

    def vouched(self) -> str:
        return ",".join(t for t in (self.token, self.in_doubt) if t)


class _OutOfTime(Exception):
    """A request outlived the deadline of the call that made it (``_errors`` makes it a
    :class:`PullTimeoutError`)."""


class _Pool:
    """Idle connections of one backend, taken and given back without counting: one that
    an interrupt drops between the two is closed when it is collected and costs nothing
    else (redis-py's pool counts its connections, and loses slots that way). A
    connection comes back clean (every reply read) or disconnected, never dirty."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._idle: Deque[Any] = collections.deque()
        self._pid = os.getpid()

    def take(self) -> Any:
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._idle, self._pid = collections.deque(), os.getpid()
        try:
            return self._idle.pop()
        except IndexError:
            return self._make()

    def give_back(self, conn: Any, clean: bool) -> None:
        if not clean:
            conn.disconnect()
        self._idle.append(conn)

    def disconnect(self) -> None:
        with contextlib.suppress(IndexError):
            while True:
                self._idle.pop().disconnect()


class RedisBackend(Backend):
    """Tables in a Redis server (``redis://[user:password@]host:port/db``; ``rediss://``
    for TLS). Options: ``db``, ``username``, ``password``, ``prefix`` (key prefix, default
    ``varsync``), ``chunk_size`` (bytes, default 4 MiB), ``keep`` (previous versions kept
    for readers in flight, default 1), ``connect_timeout`` and ``socket_timeout``
    (default: ``timeout``), ``retries`` (reconnect attempts, default 0), and redis-py's
    ``ssl_*`` options for ``rediss://``."""

    supports_create_table = True
    shared_across_processes = True
    supports_blocking_wait = True
    persistent = False  # only as persistent as the server's own configuration makes it
    max_push_bytes = None

    def __init__(self, url: str, *, timeout: Optional[float], namespace: str, **options: Any):
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"the redis backend takes no option(s) {unknown}; its options are "
                f"{', '.join(_OPTIONS)}, and timeout, namespace"
            )
        super().__init__(url, timeout=timeout, namespace=namespace)
        parts = urlsplit(url)
        tls = parts.scheme.lower() == "rediss"
        try:
            port = 6379 if parts.port is None else parts.port
            if port == 0:
                raise ValueError
        except ValueError:
            raise ConfigurationError(
                f"the redis URL has a malformed port: {parts.netloc.rpartition('@')[2]!r}"
            ) from None
        host = parts.hostname or "localhost"
        db = self._database(parts.path, options.pop("db", None))
        username = options.pop("username", None)
        if username is None and parts.username:
            username = unquote(parts.username)
        password = options.pop("password", None)
        if password is None and parts.password is not None:
            password = unquote(parts.password)
        prefix = options.pop("prefix", "varsync")
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError("prefix must be a non-empty string (default: varsync)")
        self.chunk_size = _int_option(
            "chunk_size", options.pop("chunk_size", _DEFAULT_CHUNK), _MIN_CHUNK, _MAX_CHUNK
        )
        self.keep = _int_option("keep", options.pop("keep", 1), 0, 100)
        retries = _int_option("retries", options.pop("retries", 0), 0, 100)
        connect_timeout = _socket_timeout(
            "connect_timeout", options.pop("connect_timeout", timeout)
        )
        self.socket_timeout = _socket_timeout(
            "socket_timeout", options.pop("socket_timeout", timeout)
        )
        ssl = {k: options.pop(k) for k in list(options) if k.startswith("ssl_")}
        if ssl and not tls:
            raise ConfigurationError(
                f"TLS options {sorted(ssl)} need a rediss:// URL, not {parts.scheme}://"
            )
        if "ssl_check_hostname" in ssl:
            ssl["ssl_check_hostname"] = _bool_option(
                "ssl_check_hostname", ssl["ssl_check_hostname"]
            )
        if isinstance(ssl.get("ssl_cert_reqs"), str) and ssl["ssl_cert_reqs"] not in _CERT_REQS:
            raise ConfigurationError(
                f"ssl_cert_reqs={ssl['ssl_cert_reqs']!r} is not one of {', '.join(_CERT_REQS)}"
            )

        _check_text(
            {"host": host, "username": username, "password": password, "prefix": prefix,
             "namespace": namespace, **ssl}
        )
        shown_host = f"[{host}]" if ":" in host else host
        self.address = f"{parts.scheme.lower()}://{shown_host}:{port}/{db}"
        self.prefix = prefix
        self.key_base = f"{prefix}:{quote(namespace, safe='')}:"
        self._username = username
        self._tls = tls
        self._retries = retries
        self._connect_timeout = connect_timeout
        self._backoff = ExponentialBackoff(cap=0.5, base=0.05)
        connection = redis.SSLConnection if tls else redis.Connection
        self._pool = _Pool(lambda: connection(
            host=host,
            port=port,
            db=db,
            username=username,
            password=password,
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(self._backoff, retries),
            protocol=2,
            **ssl,
        ))
        self._known: Dict[str, _Known] = {}
        self._lock = threading.Lock()
        self.pulls_restarted = 0  # pulls that found their version retired mid-read
        try:
            with self._errors("connecting"):
                self._call("PING")
        except BaseException:
            self._pool.disconnect()
            raise

    @staticmethod
    def _database(path: str, option: Any) -> int:
        from_path = path.strip("/")
        db = _int_option("db", from_path, 0) if from_path else 0
        if option is not None:
            chosen = _int_option("db", option, 0)
            if from_path and chosen != db:
                raise ConfigurationError(
                    f"the URL names database {db} and the db option {chosen}; give one"
                )
            db = chosen
        return db

    # -- errors --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Turn redis-py's (and the bulk socket's) exceptions into varsync errors."""
        with translate_errors(_DRIVER_ERRORS, f"{doing} at {self.address}"):
            try:
                yield
            except _OutOfTime as exc:
                raise PullTimeoutError(
                    f"{doing} at {self.address}: {exc}; pass a longer timeout, or check "
                    "that the server is not hung or overloaded"
                ) from None
            except rx.RedisError as exc:
                better = _reclassified(exc)
                if better is None:
                    raise
                if isinstance(better, VarsyncError):
                    raise type(better)(f"{doing} at {self.address}: {better}") from exc
                raise better from exc

    # -- keys and scripts -----------------------------------------------------------------------

    def _keys(self, name: str) -> Tuple[str, str, str]:
        """The table's head, events and chunk-prefix keys."""
        table = self.key_base + quote(name, safe="")
        return table + ":head", table + ":events", table + ":d:"

    def _script(
        self, script: _Script, keys: Sequence[str], args: Sequence[Any],
        deadline: float = math.inf, retry: bool = True,
    ) -> Any:
        command = (len(keys), *keys, *args)
        try:
            return self._call("EVALSHA", script.sha, *command, deadline=deadline, retry=retry)
        except rx.NoScriptError:
            return self._call("EVAL", script.text, *command, deadline=deadline, retry=retry)

    # -- requests: every one on a connection taken and given back safely, bounded in time ------

    def _call(self, *args: Any, deadline: float = math.inf, retry: bool = True) -> Any:
        """One small command's raw reply; tried again on a lost connection up to
        ``retries`` times (``retry=False``: never, for a command that must run once)."""

        def command(conn: Any) -> Any:
            conn.send_command(*args, check_health=False)
            return conn.read_response()

        for failures in itertools.count(1):
            try:
                return self._on_connection(deadline, command)
            except (rx.ConnectionError, rx.TimeoutError) as exc:
                if not retry or failures > self._retries or isinstance(
                    exc, rx.AuthenticationError
                ):
                    raise
                pause = self._backoff.compute(failures)
                if remaining(deadline) <= pause:
                    raise
                time.sleep(pause)  # backoff before reconnecting
        raise AssertionError("unreachable")  # pragma: no cover

    def _on_connection(self, deadline: float, use: Callable[[Any], Any]) -> Any:
        """``use(connection)`` on a pooled, connected connection whose every socket
        operation is bounded by ``socket_timeout`` and by what is left until ``deadline``
        (past it: :class:`_OutOfTime`). The connection goes back clean, or disconnected
        if ``use`` did not finish: its replies may be half read."""
        conn = None
        clean = False
        try:
            conn = self._pool.take()
            if conn._sock is not None and _closed_or_dirty(conn):
                conn.disconnect()  # the server closed it (restarted?) while it was idle
            left = remaining(deadline)
            if left <= 0:
                raise _OutOfTime("the call's timeout ran out")
            bound = _least(self.socket_timeout, None if math.isinf(left) else left)
            conn.socket_timeout = bound
            conn.socket_connect_timeout = _least(self._connect_timeout, bound)
            if conn._sock is not None:  # redis-py keeps the connected socket here
                conn._sock.settimeout(bound)
            conn.connect()
            result = use(conn)
            clean = True
            return result
        except rx.ResponseError:
            clean = True  # an error reply, read whole
            raise
        except rx.TimeoutError:
            if remaining(deadline) <= 0.01:  # the deadline's bound, not socket_timeout
                raise _OutOfTime("the server did not answer within the call's timeout") from None
            raise
        finally:
            if conn is not None:
                self._pool.give_back(conn, clean)

    # -- tables ----------------------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._errors(f"creating table {name!r}"):
            known = self._create(name, signature)
        return known.signature

    def _create(self, name: str, signature: str) -> _Known:
        head, events, _ = self._keys(name)
        reply = self._script(
            _CREATE_SCRIPT,
            [head, events, self.key_base + "tables"],
            [name, signature, secrets.token_hex(8), FORMAT],
        )
        if int(reply[0]) < 0:
            raise CorruptDataError(
                f"key {head!r} at {self.address} exists but is not a varsync table head; "
                "is something else using this key prefix? Use another prefix or namespace."
            )
        fmt, stored, epoch = (_text(x) for x in reply[1:4])
        self._check_format(name, fmt)
        return self._remember(name, epoch, stored)

    def signature(self, name: str) -> Optional[str]:
        with self._errors(f"reading table {name!r}"):
            return self._signature(name)

    def _signature(self, name: str, deadline: float = math.inf) -> Optional[str]:
        head, _, _ = self._keys(name)
        raw = self._call("HMGET", head, "fmt", "sig", "epoch", deadline=deadline)
        fmt, stored, epoch = (_text(x) for x in raw)
        if fmt is None and stored is None and epoch is None:
            return None
        if stored is None or not _is_epoch(epoch):
            raise CorruptDataError(
                f"key {head!r} at {self.address} is not a varsync table head (no signature, "
                "or no valid epoch); is something else using this key prefix?"
            )
        self._check_format(name, fmt)
        return self._remember(name, epoch, stored).signature

    def tables(self) -> List[str]:
        with self._errors("listing tables"):
            names = self._call("SMEMBERS", self.key_base + "tables")
        return sorted(_text(n) for n in names)

    def details(self, name: str) -> Dict[str, Any]:
        head_key, _, _ = self._keys(name)
        with self._errors(f"reading table {name!r}"):
            raw = self._call(
                "HMGET", head_key, "epoch", "version", "data", "layout", "retained", "spare"
            )
        epoch, _, data, layout, retained, spare = (_text(x) for x in raw)
        total, payload, chunks = self._layout(name, layout) if layout else (0, 0, 0)
        return {
            "server": self.address,
            "head_key": head_key,
            "epoch": epoch,
            "data_token": data,
            "stored_bytes": total,
            "chunk_payload": payload,
            "chunks": chunks,
            "retained_versions": len(retained.split(",")) if retained else 0,
            "spare_version": bool(spare),
            "keep": self.keep,
            "pulls_restarted": self.pulls_restarted,
        }

    # -- what this backend knows of each table -------------------------------------------------

    def _remember(self, name: str, epoch: str, signature: str, published: int = 0) -> _Known:
        with self._lock:
            known = self._known.get(name)
            if known is not None and known.epoch == epoch and known.signature == signature:
                return known
            try:
                specs = sig_lib.flat_specs(sig_lib.from_json(signature))
            except VarsyncError as exc:
                raise CorruptDataError(f"table {name!r} at {self.address}: {exc}") from None
            known = _Known(epoch, signature, specs, published)
            self._known[name] = known
            return known

    def _known_table(self, name: str, deadline: float = math.inf) -> _Known:
        known = self._known.get(name)
        if known is None:
            if self._signature(name, deadline) is None:
                raise TableNotFoundError(f"no table {name!r} at {self.address}")
            known = self._known[name]
        return known

    def _trusted(
        self, name: str, head: _Head, newer_than: int, deadline: float = math.inf
    ) -> _Known:
        """The table as this backend knows it, after checking the head's epoch.

        Another epoch means the table's history restarted. A caller holding a version
        (``newer_than > 0``) gets :class:`TableResetError`; one asking for anything
        (``newer_than == 0``) resynchronises to the new epoch.
        """
        known = self._known_table(name, deadline)
        if head.epoch == known.epoch:
            return known
        if newer_than > 0:
            raise TableResetError(
                f"table {name!r} at {self.address} started a new history (epoch "
                f"{known.epoch} -> {head.epoch}) since you read version {newer_than}: the "
                "server lost its data or went back to an older snapshot. Your version means "
                "nothing now; pull() to resynchronise."
            )
        return self._adopt_epoch(name, head.epoch, known, deadline)

    def _adopt_epoch(
        self, name: str, epoch: str, known: _Known, deadline: float = math.inf
    ) -> _Known:
        """Remember the table's new epoch, if it was created again with our signature."""
        head_key, _, _ = self._keys(name)
        stored = _text(self._call("HGET", head_key, "sig", deadline=deadline))
        self._check_same_signature(name, stored, known)
        return self._remember(name, epoch, stored)

    def _check_same_signature(self, name: str, stored: Optional[str], known: _Known) -> None:
        if stored != known.signature:
            raise TableResetError(
                f"table {name!r} at {self.address} was created again with another "
                "signature than the one this container read: its data is in a layout this "
                "container cannot decode. Connect again (varsync.connect) to use the new "
                "signature, or create the table again with this one."
            )

    # -- data ------------------------------------------------------------------------------------

    def _head(self, name: str, *fields: str, deadline: float = math.inf) -> Optional[_Head]:
        """The table's head (one small request), or ``None`` if its keys vanished."""
        head_key, _, _ = self._keys(name)
        raw = self._call("HMGET", head_key, "fmt", "epoch", "version", *fields, deadline=deadline)
        raw = [_text(x) for x in raw]
        fmt, epoch, version = raw[:3]
        extra = dict(zip(fields, raw[3:]))
        if fmt is None and epoch is None and version is None:
            return None
        self._check_format(name, fmt)
        try:
            # ASCII digits below 2**53, as the publish script checks (Lua numbers are doubles)
            digits = version or ""
            if not _is_epoch(epoch) or not (digits.isascii() and digits.isdigit()):
                raise ValueError
            number = int(digits)
            if number >= 2**53:
                raise ValueError
        except (TypeError, ValueError):
            raise CorruptDataError(
                f"table {name!r} at {self.address}: head {head_key!r} has epoch {epoch!r} "
                f"and version {version!r}; is something else writing under this prefix?"
            ) from None
        return _Head(epoch, number, extra.get("data"), extra.get("layout"))

    def _check_format(self, name: str, fmt: Optional[str]) -> None:
        if fmt != FORMAT:
            raise CorruptDataError(
                f"table {name!r} at {self.address} has layout format {fmt!r}; this varsync "
                f"reads format {FORMAT} (a newer varsync wrote it, or something else did)"
            )

    def version(self, name: str) -> int:
        with self._errors(f"reading the version of table {name!r}"):
            head = self._head(name)
        return 0 if head is None else head.version

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        head_key, _, data = self._keys(name)
        token = secrets.token_bytes(8)
        total = sum(a.nbytes for a in arrays)
        payload = self.chunk_size - _CHUNK_SLACK
        chunks = -(-total // payload)
        layout = f"{total}:{payload}:{chunks}"
        recycle = total >= _RECYCLE_FROM_BYTES
        chunk_prefix = data + token.hex() + ":"
        with self._errors(f"pushing {total} bytes to table {name!r}"):
            known = self._known_table(name)
            # Keys under this fresh token are this push's alone, until the publish script
            # is sent: from then on the server may have published them, so never delete.
            ours = True
            try:
                recycled = recycle and chunks == int(self._script(
                    _CLAIM_SCRIPT,
                    [head_key],
                    [known.epoch, layout, data, token.hex(), _PENDING_TTL_MS],
                ))
                self._send_chunks(chunk_prefix, token, arrays, payload, recycled)
                for _ in range(3):
                    ours = False
                    known.in_doubt = token.hex()
                    reply = self._publish(name, known, token.hex(), layout, chunks, recycle)
                    code, value = int(reply[0]), _text(reply[1])
                    if code > 0:
                        return self._published(name, known, code, value, token.hex())
                    ours = True  # refused before it touched anything: nothing published
                    known = self._republish_target(name, code, value, known)
                raise BackendConnectionError(
                    f"table {name!r} at {self.address} kept changing under this push; "
                    "nothing was published"
                )
            except (rx.ConnectionError, rx.TimeoutError) as exc:
                if ours or isinstance(exc, rx.AuthenticationError):
                    raise
                raise BackendConnectionError(
                    f"pushing {total} bytes to table {name!r} at {self.address}: "
                    f"{type(exc).__name__}: {exc}. The publish script was sent but its answer "
                    "was lost: the server may have published this push. Pull to see; a push "
                    "again publishes the value again under the next version."
                ) from exc
            finally:
                if ours:
                    self._discard(chunk_prefix, chunks)

    def _publish(
        self, name: str, known: _Known, token: str, layout: str, chunks: int, recycle: bool
    ) -> Any:
        """Run the publish script once (never retried: a second run after a lost answer
        would publish the same token twice)."""
        head_key, events, data = self._keys(name)
        return self._script(
            _PUBLISH_SCRIPT,
            [head_key, events],
            [known.epoch, token, layout, chunks, self.keep, data, known.published,
             secrets.token_hex(8), _STREAM_LENGTH, _HEADER.size, "1" if recycle else "0",
             known.vouched()],
            retry=False,
        )

    def _published(self, name: str, known: _Known, version: int, epoch: str, token: str) -> int:
        """Remember what this push published; return its version."""
        with self._lock:
            if epoch != known.epoch:
                log.warning(
                    "table %r at %s: version %d starts a new history (epoch %s -> %s): the "
                    "server restarted or went back to an older state since the version "
                    "before was published; readers holding a version get TableResetError "
                    "and resynchronise with pull()", name, self.address, version,
                    known.epoch, epoch,
                )
                known = _Known(epoch, known.signature, known.specs)
                self._known[name] = known
            known.published, known.token, known.in_doubt = version, token, ""
        return version

    def _republish_target(
        self, name: str, code: int, value: Optional[str], known: _Known
    ) -> _Known:
        """After a publish script refused: the table to publish into on the next try."""
        if code == -1:  # the table vanished: the server lost its data
            log.warning(
                "table %r at %s vanished (the server lost its data?); creating it again with "
                "its signature and a new epoch", name, self.address
            )
            again = self._create(name, known.signature)
            self._check_same_signature(name, again.signature, known)
            return again
        if code == -2:  # created again by someone else since this backend looked
            return self._adopt_epoch(name, value or "", known)
        if code == -3:
            raise CorruptDataError(
                f"table {name!r} at {self.address}: chunk {value} of this push vanished "
                "before it was published (evicted? varsync needs maxmemory-policy "
                "noeviction or a volatile-* policy); nothing was published"
            )
        raise CorruptDataError(
            f"table {name!r} at {self.address}: its head holds a malformed {value}; is "
            "something else writing under this prefix?"
        )

    def _send_chunks(
        self,
        chunk_prefix: str,
        token: bytes,
        arrays: Sequence[np.ndarray],
        payload: int,
        recycled: bool = False,
    ) -> None:
        """Write every chunk (pipelined, straight from the arrays' memory) and check every
        reply. Raises the first error, after reading every reply so the connection stays
        usable.

        ``recycled``: the chunk keys exist already, each exactly as long as the chunk
        written to it (the spare version's, see ``_CLAIM``), and are overwritten in place
        (SETRANGE) rather than created (SET): Redis then reuses memory it has, where a
        new value is fresh memory that the server faults in page by page, measured as
        most of a large push's time."""
        ttl = str(_PENDING_TTL_MS).encode()
        reply = b":" if recycled else b"+"  # SETRANGE answers the length, SET +OK

        def send(conn: Any) -> Optional[BaseException]:
            wire = _Wire(conn, math.inf)
            pending = 0
            error: Optional[BaseException] = None
            for index, parts in enumerate(_chunk_parts(_byte_views(arrays), payload)):
                nbytes = sum(len(p) for p in parts)
                crc = _crc32(parts)
                key = f"{chunk_prefix}{index}".encode()
                if recycled:
                    wire.put(
                        b"*4\r\n$8\r\nSETRANGE\r\n$%d\r\n%b\r\n$1\r\n0\r\n$%d\r\n"
                        % (len(key), key, nbytes + _HEADER.size)
                    )
                else:
                    wire.put(
                        b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n"
                        % (len(key), key, nbytes + _HEADER.size)
                    )
                wire.put(_HEADER.pack(_MAGIC, token, index, nbytes, crc))
                for part in parts:
                    wire.put(part)
                if recycled:
                    wire.put(b"\r\n")
                else:
                    wire.put(b"\r\n$2\r\nPX\r\n$%d\r\n%b\r\n" % (len(ttl), ttl))
                pending += 1
                if pending >= _WRITE_AHEAD:
                    wire.flush()
                    error = wire.status(reply)
                    pending -= 1
                    if error is not None:
                        break
            wire.flush()
            while pending:  # read every reply, even after an error
                answer = wire.status(reply)
                error = error or answer
                pending -= 1
            return error

        error = self._on_connection(math.inf, send)
        if error is not None:
            raise error

    def _discard(self, chunk_prefix: str, count: int) -> None:
        """Best-effort deletion, bounded in time, of the chunks of a push that was not
        published (they expire anyway)."""
        deadline = deadline_after(_DISCARD_SECONDS)
        try:
            for start in range(0, count, 512):
                keys = [f"{chunk_prefix}{i}" for i in range(start, min(count, start + 512))]
                self._call("UNLINK", *keys, deadline=deadline, retry=False)
        except (rx.RedisError, _OutOfTime) as exc:
            log.warning("could not delete the chunks of a failed push (%s); they expire "
                        "within %d s", exc, _PENDING_TTL_MS // 1000)

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        # 0 does not wait for a push (the core never asks read to); it bounds nothing else
        deadline = deadline_after(self.timeout if timeout == 0 else timeout)
        _, _, data = self._keys(name)
        with self._errors(f"pulling table {name!r}"):
            gone: Optional[str] = None
            for _ in range(_MAX_RESTARTS):
                head = self._head(name, "data", "layout", deadline=deadline)
                if head is None:
                    return 0, None  # vanished: reads as empty; holders get TableResetError
                known = self._trusted(name, head, newer_than, deadline)
                if head.version <= newer_than:
                    return head.version, None
                if head.data is None or head.data == gone:
                    raise CorruptDataError(
                        f"table {name!r} at {self.address} version {head.version}: "
                        + ("its head names no data" if head.data is None else
                           "a chunk of the current version is missing (evicted? varsync "
                           "needs maxmemory-policy noeviction)")
                    )
                arrays = self._fetch(name, known, head, data + head.data + ":", deadline)
                if arrays is not None:
                    return head.version, arrays
                gone = head.data  # retired by newer versions while we read: start again
                self.pulls_restarted += 1
            raise PullTimeoutError(
                f"table {name!r} at {self.address}: {_MAX_RESTARTS} pulls in a row found "
                "their version retired before they finished; the writer publishes faster "
                "than this reader can fetch one version. Connect the writer with a larger "
                "keep."
            )

    def _layout(self, name: str, layout: Optional[str]) -> Tuple[int, int, int]:
        try:
            total, chunk, chunks = (int(x) for x in str(layout).split(":"))
            if total < 0 or chunk <= 0 or chunks != -(-total // chunk):
                raise ValueError
        except ValueError:
            raise CorruptDataError(
                f"table {name!r} at {self.address}: malformed layout {layout!r} in its head"
            ) from None
        return total, chunk, chunks

    def _fetch(
        self, name: str, known: _Known, head: _Head, chunk_prefix: str, deadline: float
    ) -> Optional[List[np.ndarray]]:
        """The version's arrays, or ``None`` if one of its chunks is gone."""
        total, chunk, chunks = self._layout(name, head.layout)
        expected = sum(s.nbytes for s in known.specs)
        if total != expected:
            raise CorruptDataError(
                f"table {name!r} at {self.address} version {head.version} holds {total} "
                f"bytes; its signature needs {expected}"
            )
        try:
            token = bytes.fromhex(head.data or "")
            if len(token) != 8:
                raise ValueError
        except ValueError:
            raise CorruptDataError(
                f"table {name!r} at {self.address} version {head.version}: its head names "
                f"data {head.data!r}, not a token varsync writes; is something else writing "
                "under this prefix?"
            ) from None
        arrays = [np.empty(s.shape, s.dtype) for s in known.specs]

        def receive(conn: Any) -> Optional[List[np.ndarray]]:
            wire = _Wire(conn, deadline)
            requested = 0
            for _ in range(min(_READ_AHEAD, chunks)):
                wire.request_get(f"{chunk_prefix}{requested}".encode())
                requested += 1
            wire.flush()
            for index, parts in enumerate(_chunk_parts(_byte_views(arrays), chunk)):
                wire.arm()
                length = wire.bulk_length()
                if length is None:
                    return None
                nbytes = sum(len(p) for p in parts)
                where = f"table {name!r} at {self.address} version {head.version} chunk {index}"
                if length != nbytes + _HEADER.size:
                    raise CorruptDataError(
                        f"{where} holds {length} bytes; expected {nbytes + _HEADER.size}"
                    )
                header = _HEADER.unpack(wire.exactly(_HEADER.size))
                if header[:4] != (_MAGIC, token, index, nbytes):
                    raise CorruptDataError(
                        f"{where} is not the chunk the head names (foreign or stale data)"
                    )
                crc = header[4]
                for part in parts:
                    wire.readinto(part)
                wire.end_of_bulk()
                if requested < chunks:
                    wire.request_get(f"{chunk_prefix}{requested}".encode())
                    requested += 1
                    wire.flush()
                if _crc32(parts) != crc:
                    raise CorruptDataError(
                        f"{where} fails its checksum: the stored bytes were changed"
                    )
            return arrays

        return self._on_connection(deadline, receive)  # type: ignore[no-any-return]

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        deadline = deadline_after(timeout)
        # timeout=0: one look, bounded by the container's timeout, and no XREAD at all
        looks = deadline_after(self.timeout) if timeout == 0 else deadline + _WAIT_GRACE
        _, events, _ = self._keys(name)
        block = _WAIT_SLICE
        if self.socket_timeout is not None:  # an XREAD must end before its socket times out
            block = min(block, self.socket_timeout / 2)
        with self._errors(f"waiting on table {name!r}"):
            while True:
                head = self._head(name, deadline=looks)
                if head is None:
                    if newer_than > 0:
                        return 0  # vanished: the core reports the reset
                else:
                    self._trusted(name, head, newer_than, looks)
                    if head.version != newer_than:
                        return head.version
                left = remaining(deadline)
                if left <= 0:
                    raise PullTimeoutError(
                        f"table {name!r} at {self.address} stayed at version "
                        f"{0 if head is None else head.version} (waiting for a version above "
                        f"{newer_than}) for {timeout} s"
                    )
                milliseconds = max(1, int(min(left, block) * 1000))
                self._call(
                    "XREAD", "COUNT", 1, "BLOCK", milliseconds, "STREAMS", events,
                    f"{newer_than}-1", deadline=deadline + _WAIT_GRACE,
                )

    def close(self) -> None:
        self._pool.disconnect()

    def describe_options(self) -> Mapping[str, Any]:
        return {
            "timeout": self.timeout,
            "namespace": self.namespace,
            "server": self.address,
            "username": self._username,
            "tls": self._tls,
            "prefix": self.prefix,
            "chunk_size": self.chunk_size,
            "keep": self.keep,
            "connect_timeout": self._connect_timeout,
            "socket_timeout": self.socket_timeout,
            "retries": self._retries,
        }

    def __repr__(self) -> str:
        return f"<RedisBackend {self.address} prefix={self.key_base!r}>"


# -- bytes on the wire ---------------------------------------------------------------------------


def _is_epoch(epoch: Optional[str]) -> bool:
    """Whether ``epoch`` is one varsync writes (``secrets.token_hex(8)``)."""
    return epoch is not None and len(epoch) == 16 and all(c in "0123456789abcdef" for c in epoch)


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _crc32(parts: Sequence[memoryview]) -> int:
    value = 0
    for part in parts:
        value = crc32(part, value)
    return value


def _byte_views(arrays: Sequence[np.ndarray]) -> List[memoryview]:
    """Each (C-contiguous) array's memory as a flat view of unsigned bytes, no copy."""
    return [memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]


def _chunk_parts(views: Sequence[memoryview], chunk: int) -> Iterator[List[memoryview]]:
    """The arrays' bytes back to back, cut into chunks: each chunk as the list of slices
    of the views it covers."""
    parts: List[memoryview] = []
    room = chunk
    for view in views:
        position, size = 0, len(view)
        while position < size:
            take = min(room, size - position)
            parts.append(view[position : position + take])
            position += take
            room -= take
            if room == 0:
                yield parts
                parts, room = [], chunk
    if parts:
        yield parts


def _closed_or_dirty(conn: Any) -> bool:
    """Whether an idle connection has something to read: the server closed it, or sent
    what nobody asked for. Either way it cannot carry a request."""
    try:
        return bool(conn.can_read(timeout=0))
    except (rx.ConnectionError, rx.TimeoutError, OSError):
        return True


def _least(*seconds: Optional[float]) -> Optional[float]:
    """The smallest of these bounds, ``None`` (no bound) being the largest."""
    bounds = [s for s in seconds if s is not None]
    return min(bounds) if bounds else None


class _Wire:
    """RESP2 on a pooled connection's socket, for what redis-py cannot do without copying:
    send array memory as it is, and receive bulk replies straight into arrays."""

    _BUFFER = 256 << 10

    def __init__(self, conn: Any, deadline: float) -> None:
        self.sock: socket.socket = conn._sock  # redis-py keeps the connected socket here
        self.base_timeout = self.sock.gettimeout()
        self.deadline = deadline
        self.buffer = bytearray(self._BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.out = bytearray()

    # -- sending

    def put(self, data: Any) -> None:
        if len(data) >= _DIRECT:
            self.flush()
            self._send(data)
        else:
            self.out += data
            if len(self.out) >= _DIRECT:
                self.flush()

    def flush(self) -> None:
        if self.out:
            self._send(self.out)
            del self.out[:]

    def request_get(self, key: bytes) -> None:
        self.put(b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(key), key))

    def _send(self, data: Any) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise rx.TimeoutError("timed out sending to the server") from None

    # -- receiving

    def arm(self) -> None:
        """Bound the next reply by the transfer's deadline."""
        if self.deadline == float("inf"):
            return
        left = remaining(self.deadline)
        if left <= 0:
            raise _OutOfTime("the transfer took longer than its timeout")
        self.sock.settimeout(left if self.base_timeout is None else min(left, self.base_timeout))

    def _recv_into(self, target: memoryview) -> int:
        try:
            got = self.sock.recv_into(target)
        except socket.timeout:
            if self.deadline != float("inf") and remaining(self.deadline) <= 0.01:
                raise _OutOfTime("the transfer took longer than its timeout") from None
            raise rx.TimeoutError("timed out reading from the server") from None
        if got == 0:
            raise rx.ConnectionError("the server closed the connection")
        return got

    def _fill(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buffer):
            kept = bytes(self.view[self.start : self.end])
            self.view[: len(kept)] = kept
            self.start, self.end = 0, len(kept)
        self.end += self._recv_into(self.view[self.end :])

    def line(self) -> bytes:
        while True:
            at = self.buffer.find(b"\r\n", self.start, self.end)
            if at >= 0:
                text = bytes(self.view[self.start : at])
                self.start = at + 2
                return text
            if self.end - self.start >= len(self.buffer):
                raise rx.InvalidResponse("a reply line longer than 256 KiB")
            self._fill()

    def readinto(self, target: memoryview) -> None:
        size = len(target)
        done = min(size, self.end - self.start)
        target[:done] = self.view[self.start : self.start + done]
        self.start += done
        while done < size:
            if size - done >= _DIRECT:
                done += self._recv_into(target[done:])
            else:
                self._fill()
                take = min(size - done, self.end - self.start)
                target[done : done + take] = self.view[self.start : self.start + take]
                self.start += take
                done += take

    def exactly(self, size: int) -> bytes:
        out = bytearray(size)
        self.readinto(memoryview(out))
        return bytes(out)

    def end_of_bulk(self) -> None:
        if self.exactly(2) != b"\r\n":
            raise rx.InvalidResponse("a bulk reply did not end with CRLF")

    def bulk_length(self) -> Optional[int]:
        """The length of the next bulk reply; ``None`` for a nil (missing key)."""
        line = self.line()
        if line[:1] == b"$":
            length = int(line[1:])
            return None if length < 0 else length
        raise self._unexpected(line)

    def status(self, kind: bytes = b"+") -> Optional[BaseException]:
        """The next reply: ``None`` if it is of ``kind`` (``+`` a status such as OK, ``:``
        an integer), else its error (not raised)."""
        line = self.line()
        if line[:1] == kind:
            return None
        return self._unexpected(line)

    @staticmethod
    def _unexpected(line: bytes) -> BaseException:
        if line[:1] != b"-":
            return rx.InvalidResponse(f"unexpected reply {line[:60]!r}")
        text = line[1:].decode("utf-8", "replace")
        for code, kind in (
            ("OOM", rx.OutOfMemoryError),
            ("NOPERM", rx.NoPermissionError),
            ("NOAUTH", rx.AuthenticationError),
            ("WRONGPASS", rx.AuthenticationError),
            ("READONLY", rx.ReadOnlyError),
            ("LOADING", rx.BusyLoadingError),
        ):
            if text.startswith(code):
                return kind(text)
        return rx.ResponseError(text)
