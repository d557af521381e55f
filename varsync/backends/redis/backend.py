"""The redis backend's class: the Backend protocol translated to this package's keys,
scripts (:mod:`.protocol`) and chunks (:mod:`.wire`); see the package's docstring."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import numpy as np
from redis import exceptions as rx

from varsync.backend import (
    Backend,
    BackendConnectionError,
    CorruptDataError,
    LeafSnapshot,
    Snapshot,
    Spec,
    TableNotFoundError,
    deadline_after,
)
from varsync.backends.redis import leaves as leaf_map
from varsync.backends.redis import wire
from varsync.backends.redis.cluster import SlotInMotion, in_motion
from varsync.backends.redis.errors import OutOfTime, translated
from varsync.backends.redis.options import parse_settings
from varsync.backends.redis.pool import MOVED_ROLE
from varsync.backends.redis.protocol import (
    CLAIM,
    CREATE,
    FORMAT,
    PEEK,
    PEEK_BYTES,
    PENDING_TTL_MS,
    PUBLISH,
    STREAM_LENGTH,
    Claimed,
    Created,
    Head,
    Keys,
    Published,
    check_format,
    fresh_token,
    is_epoch,
    key_base_of,
    keys_of,
    parse_head,
    parse_layout,
    text,
)
from varsync.backends.redis.pulled import PulledMemory
from varsync.backends.redis.readers import ReaderRegistry
from varsync.backends.redis.tables import Known, Table
from varsync.backends.redis.topology import Floors, Requests, RoutedReads, Topology
from varsync.backends.redis.waits import Waits

__all__ = ["RedisBackend"]

log = logging.getLogger("varsync.backends.redis")

_DISCARD_SECONDS = 1.0  # bound on deleting a failed push's chunks (they expire anyway)

#: The least time a new backend's first request may take, retries included (see __init__).
FIRST_ANSWER_SECONDS = 5.0


class RedisBackend(Waits, RoutedReads, ReaderRegistry, Backend):
    """Tables in a Redis server (``redis://[user:password@]host:port/db``; ``rediss://``
    for TLS). Options: ``db``, ``username``, ``password``, ``prefix`` (key prefix, default
    ``varsync``), ``chunk_size`` (bytes, default 4 MiB), ``keep`` (previous versions kept
    for readers in flight, default 1), ``connect_timeout`` and ``socket_timeout``
    (default: ``timeout``), ``retries`` (reconnect attempts, default 0), ``recycle_from``
    (bytes from which a push overwrites a retired version's chunks, default 256 MiB), redis-py's
    ``ssl_*`` options for ``rediss://``; ``replicas`` and ``read_from`` (reads from a
    replica, :mod:`.topology`), ``redis+sentinel://host:port[,...]/service[/db]``, and
    ``redis+cluster://host:port[,...]`` (a Redis Cluster, :mod:`.cluster`)."""

    supports_create_table = True
    shared_across_processes = True
    supports_blocking_wait = True
    persistent = False  # only as persistent as the server's own configuration makes it
    max_push_bytes = None
    #: Chunks carry raw bytes, read back into arrays of the table's specs: any dtype.
    #: Pushes of changed leaves only, pulls of leaves changed since: see :mod:`.leaves`.
    supports_leaf_versions = True
    supported_ml_dtypes = (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
    )

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any):
        settings = parse_settings(url, timeout, namespace, options)
        super().__init__(url, timeout=timeout, namespace=namespace)
        self._settings = settings
        self._pulled = PulledMemory(settings.reuse_pulled)
        self.address = settings.address
        self.prefix = settings.prefix
        self.key_base = key_base_of(settings.prefix, namespace)
        self.chunk_size = settings.chunk_size
        self.keep = settings.keep
        self.socket_timeout = settings.socket_timeout
        self._known = Known(self.address)
        with self._errors("connecting"):
            self._topology = Topology(settings, moved=self._known.moved)
        self._client: Requests = self._topology.primary  # writes, what replicas cannot vouch for
        self._cluster = self._topology.cluster
        self._local = threading.local()  # .client: the replica a read in this thread is on
        self._floors = Floors()  # per table, the highest version seen, and its epoch
        self._table_keys: dict[str, Keys] = {}
        self._peeks = True  # pulls ask PEEK first (see _peek)
        self.pulls_restarted = 0  # pulls that found their version retired mid-read
        self.reads_on_primary = 0  # reads a replica could not vouch for, asked of the primary
        try:
            with self._errors("connecting"):
                # Bounded, however many retries: by the timeout, but never below
                # FIRST_ANSWER_SECONDS, so that a short timeout (for waits) still connects.
                # 0 waits for no push and bounds nothing else.
                limit = None if not self.timeout else max(self.timeout, FIRST_ANSWER_SECONDS)
                try:
                    self._client.call("PING", deadline=deadline_after(limit))
                except OutOfTime:
                    raise BackendConnectionError(
                        f"connecting at {self.address}: no answer within {limit:g} s; is "
                        "the server up, and not hung?"
                    ) from None
        except BaseException:
            self._topology.close()
            raise

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        with translated(doing, self.address):
            try:
                yield
            except MOVED_ROLE:  # also a reply read off a pipeline: the primary may have moved
                topology = getattr(self, "_topology", None)
                if topology is not None:
                    topology.suspect_primary()
                raise

    def _keys(self, name: str) -> Keys:
        keys = self._table_keys.get(name)
        if keys is None:  # every request asks: worked out (percent-encoding) once a table
            keys = keys_of(self.key_base, name, None if self._cluster is None else self.namespace)
            self._table_keys[name] = keys
        return keys

    def _where(self, name: str) -> str:
        return f"table {name!r} at {self.address}"

    # -- tables ----------------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._errors(f"creating table {name!r}"):
            return self._create(name, signature).signature

    def _create(self, name: str, signature: str) -> Table:
        keys = self._keys(name)
        listed = [keys.head, keys.events]
        if self._cluster is None:
            listed.append(self.key_base + "tables")  # in a cluster, a slot of its own
        reply, rest = CREATE.answer(
            self._client.script(CREATE, listed, [name, signature, fresh_token().hex(), FORMAT])
        )
        if reply is Created.NOT_A_HEAD:
            raise CorruptDataError(
                f"key {keys.head!r} at {self.address} exists but is not a varsync table head; "
                "is something else using this key prefix? Use another prefix or namespace."
            )
        fmt, stored, epoch = (text(x) for x in rest)
        check_format(self._where(name), fmt)
        if self._cluster is not None:  # after the table: a listing never names a missing one
            self._client.call("SADD", self.key_base + "tables", name)
        return self._known.remember(name, epoch, stored)

    def signature(self, name: str) -> str | None:
        with self._errors(f"reading table {name!r}"):
            table = self._signature(name)
        return None if table is None else table.signature

    def _signature(self, name: str, deadline: float = math.inf) -> Table | None:
        head = self._keys(name).head
        raw = self._client.call("HMGET", head, "fmt", "sig", "epoch", deadline=deadline)
        fmt, stored, epoch = (text(x) for x in raw)
        if fmt is None and stored is None and epoch is None:
            return None
        if stored is None or not is_epoch(epoch):
            raise CorruptDataError(
                f"key {head!r} at {self.address} is not a varsync table head (no signature, "
                "or no valid epoch); is something else using this key prefix?"
            )
        check_format(self._where(name), fmt)
        return self._known.remember(name, epoch, stored)

    def tables(self) -> list[str]:
        with self._errors("listing tables"):
            names = self._client.call("SMEMBERS", self.key_base + "tables")
        return sorted(text(n) for n in names)

    def details(self, name: str) -> dict[str, Any]:
        head = self._keys(name).head
        with self._errors(f"reading table {name!r}"):
            raw = self._client.call(
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
            "server": self.address,
            "head_key": head,
            "epoch": epoch,
            "data_token": data,
            "stored_bytes": total,
            "chunk_payload": payload,
            "chunks": chunks,
            "retained_versions": len(retained.split(",")) if retained else 0,
            "spare_version": bool(spare),
            "layout_format": fmt,  # "2": the current version was composed by write_leaves
            "segments": len(segments.split(",")) if segments else 0,
            "keep": self.keep,
            "pulls_restarted": self.pulls_restarted,
        }

    # -- what this backend knows of each table, and which history it trusts ----------------

    def _known_table(self, name: str, deadline: float = math.inf) -> Table:
        table = self._known.get(name)
        if table is None:
            table = self._signature(name, deadline)
            if table is None:
                raise TableNotFoundError(f"no table {name!r} at {self.address}")
        return table

    def _trusted(self, name: str, head: Head, held: int, deadline: float = math.inf) -> None:
        """Check the head's epoch for a caller holding version ``held`` (0: none).

        Another epoch means the table's history restarted: a holder gets the core's
        reset error (:class:`Histories` decides); a caller holding nothing moves to the
        new history, if the table kept the signature this backend read.
        """
        self._vouch(name, head, held)
        table = self._known_table(name, deadline)
        self._vouch(name, head, held)  # a first look adopted the primary's epoch: again
        if held == 0 and not self._known.trusts(name, head.epoch):
            stored = text(
                self._client.call("HGET", self._keys(name).head, "sig", deadline=deadline)
            )
            self._known.check_same_signature(name, stored, table)
        self._known.check(name, head.epoch, held, current=head.version)
        self._saw(name, head.epoch, head.version)

    def _adopt_epoch(self, name: str, epoch: str, table: Table) -> Table:
        """Move to the table's new epoch, if it was created again with our signature."""
        stored = text(self._client.call("HGET", self._keys(name).head, "sig"))
        self._known.check_same_signature(name, stored, table)
        return self._known.remember(name, epoch, stored)

    # -- data --------------------------------------------------------------------------------

    def _head(self, name: str, *fields: str, deadline: float = math.inf) -> Head | None:
        """The table's head (one small request), or ``None`` if its keys vanished."""
        raw = self._read_client().call(
            "HMGET", self._keys(name).head, "fmt", "epoch", "version", *fields, deadline=deadline
        )
        return self._parsed_head(name, raw, fields)

    def _peek(self, name: str, newer_than: int, deadline: float) -> Head | None:
        """:meth:`_head` with ``data`` and ``layout``, as a pull looks first, and with the
        version's one chunk (``chunk``) if it is newer than ``newer_than`` and small
        (:data:`PEEK`): one round trip for a small pull. A user the server does not let
        run scripts (an ACL without ``EVAL``/``EVALSHA``) gets :meth:`_head`, from then on;
        so does a pull whose chunk has left for another node of a Redis Cluster (a script
        may not follow it there, a GET may)."""
        if self._peeks:
            keys = self._keys(name)
            try:
                raw = self._read_client().script(
                    PEEK, [keys.head], [newer_than, keys.chunks, PEEK_BYTES], deadline=deadline
                )
            except rx.NoPermissionError as exc:
                log.info("pulls from %s take two round trips: %s", self.address, exc)
                self._peeks = False
            except SlotInMotion:
                pass  # its chunk gone to another node (resharding): asked apart, after ASK
            else:
                _, fields = PEEK.answer(raw)
                return self._parsed_head(name, fields[:5], ("data", "layout"), fields[5])
        return self._head(name, "data", "layout", deadline=deadline)

    def _parsed_head(
        self, name: str, raw: Sequence[Any], fields: Sequence[str], chunk: bytes | None = None
    ) -> Head | None:
        """The head from the values read of ``fmt``, ``epoch``, ``version`` and ``fields``
        (with the ``chunk`` read beside them, if any), or ``None`` if its keys vanished."""
        head = parse_head(self._where(name), self._keys(name).head, raw, fields)
        if head is None:
            self._vouch(name, head, 0)  # on a replica, the primary says whether it vanished
        elif chunk is not None:
            head = dataclasses.replace(head, chunk=chunk)
        return head

    def version(self, name: str) -> int:
        def look() -> Head | None:
            head = self._head(name)
            self._vouch(name, head, -1)
            return head

        with self._errors(f"reading the version of table {name!r}"):
            head = self._routed(name, look)
        if head is None:
            return 0
        # What a replica's answer may not go below from now on: this answer too. One the
        # primary gave (asked because the replica was behind) may be ahead of every
        # version this backend had seen; the replica's next answer, still behind it but
        # not below that older floor, went back (issue 36: 60, then 56, under CPU load).
        self._saw(name, head.epoch, head.version)
        return head.version

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        return self._push(name, arrays, len(specs))

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: int | None = None,
    ) -> int:
        return leaf_map.write_leaves(self, name, leaves, specs, base)

    def read_leaves(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> LeafSnapshot:
        deadline = deadline_after(self.timeout if timeout == 0 else timeout)
        with self._errors(f"pulling table {name!r}"):
            return self._routed(
                name, lambda: leaf_map.read_leaves(self, name, newer_than, deadline, specs)
            )

    def leaf_versions(self, name: str) -> tuple[int, list[int]]:
        with self._errors(f"reading the leaf versions of table {name!r}"):
            return leaf_map.leaf_versions(self, name)

    def current_history(self, name: str) -> str | None:
        with self._errors(f"reading the history of table {name!r}"):
            epoch = text(self._client.call("HGET", self._keys(name).head, "epoch"))
        return epoch if epoch is None or is_epoch(epoch) else None

    def history_of(self, name: str) -> str | None:
        table = self._known.get(name)  # the epoch this backend trusts (its Histories')
        return None if table is None else table.epoch

    def _push(
        self,
        name: str,
        arrays: Sequence[np.ndarray],
        count: int,
        leaves: str = "",
        base: str = "",
    ) -> int:
        """Publish ``arrays`` as one new segment: the whole value (``leaves`` empty), or
        the leaves ``leaves`` names (``"+index.offset,..."``) on top of the current
        version (``base``: only on that one); 0 if the script refused such leaves. In a
        cluster, again while the table's slot is in migration (nothing was published)."""
        total = sum(a.nbytes for a in arrays)
        with self._errors(f"pushing {total} bytes to table {name!r}"):
            if self._cluster is None:
                return self._push_once(name, arrays, count, leaves, base)
            return self._cluster.settled(
                lambda: self._push_once(name, arrays, count, leaves, base),
                self._keys(name).head,
                self.timeout,
            )

    def _push_once(
        self, name: str, arrays: Sequence[np.ndarray], count: int, leaves: str, base: str
    ) -> int:
        keys = self._keys(name)
        token = fresh_token()
        hexed = token.hex()
        total = sum(a.nbytes for a in arrays)
        payload = self.chunk_size - wire.CHUNK_SLACK
        chunks = -(-total // payload)
        layout = f"{total}:{payload}:{chunks}"
        recycle = total >= self._settings.recycle_from  # see DEFAULT_RECYCLE_FROM
        chunk_prefix = keys.chunks + hexed + ":"
        extra = [count, leaves, base]
        table = self._known_table(name)
        # Keys under this fresh token are this push's alone, until the publish script
        # is sent: from then on the server may have published them, so never delete.
        ours = True

        def publish_after_chunks() -> bytes:
            nonlocal ours
            ours = False
            table.doubt(hexed)
            return wire.command(
                "EVALSHA",
                PUBLISH.sha,
                *self._publish_arguments(keys, table, hexed, layout, chunks, recycle, extra),
            )

        try:
            recycled = recycle and self._claim(keys, table, layout, hexed) == chunks
            # Fresh chunks are followed by their publish script before their replies
            # are read: one round trip for a small push. The script finds a refused
            # SET's chunk missing. Not so a refused SETRANGE, which leaves the spare's
            # bytes at the right length: recycled chunks are published once their
            # replies are in (a push that large hardly notices the round trip).
            sent = self._send_chunks(
                chunk_prefix,
                token,
                arrays,
                payload,
                recycled,
                then=None if recycled else publish_after_chunks,
            )
            answer = sent.reply
            for _ in range(3):
                if answer is None:  # not sent with the chunks, or refused: send it now
                    if sent.error is not None:
                        raise sent.error
                    ours = False
                    table.doubt(hexed)
                    answer = self._publish(keys, table, hexed, layout, chunks, recycle, extra)
                elif isinstance(answer, rx.NoScriptError):  # the script did not run
                    ours, answer = True, None
                    continue
                if isinstance(answer, BaseException):
                    moving = None if self._cluster is None else in_motion(answer)
                    if moving is not None:
                        ours = True  # its slot is moving: the script changed nothing
                        raise sent.error or moving  # a chunk's MOVED moves the map
                    raise sent.error or answer  # a chunk's error explains the script's
                reply, rest = PUBLISH.answer(answer)
                if reply is Published.PUBLISHED:
                    version, epoch = int(rest[0]), text(rest[1])
                    return self._published(name, table, version, epoch, hexed)
                ours = True  # refused before it touched anything: nothing published
                if sent.error is not None:
                    raise sent.error  # why its chunk was missing
                if reply in (Published.BASE_MOVED, Published.NO_BASE):
                    return 0  # leaves on another base: the core writes the whole value
                table = self._republish_target(name, reply, rest, table)
                answer = None
            raise BackendConnectionError(
                f"table {name!r} at {self.address} kept changing under this push; "
                "nothing was published"
            )
        except rx.ResponseError as exc:
            if self._cluster is not None and in_motion(exc) is not None:
                ours = True  # redirected, or stopped before any change: not published
            raise
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
            if ours and not self._topology.primary_lost:  # else: nowhere to delete them
                self._discard(chunk_prefix, chunks)

    def _claim(self, keys: Keys, table: Table, layout: str, token: str) -> int:
        """How many of the spare version's chunks this push now owns (see CLAIM)."""
        reply, rest = CLAIM.answer(
            self._client.script(
                CLAIM, [keys.head], [table.epoch, layout, keys.chunks, token, PENDING_TTL_MS]
            )
        )
        return int(rest[0]) if reply is Claimed.CLAIMED else 0

    def _publish_arguments(
        self,
        keys: Keys,
        table: Table,
        token: str,
        layout: str,
        chunks: int,
        recycle: bool,
        extra: Sequence[Any],
    ) -> list[Any]:
        """The publish script's key count, keys and arguments (``extra``: leaf count,
        leaves, base; see :meth:`_push`)."""
        return [
            2,
            keys.head,
            keys.events,
            table.epoch,
            token,
            layout,
            chunks,
            self.keep,
            keys.chunks,
            table.published,
            fresh_token().hex(),
            STREAM_LENGTH,
            wire.HEADER.size,
            "1" if recycle else "0",
            table.vouched(),
            *extra,
        ]

    def _publish(
        self,
        keys: Keys,
        table: Table,
        token: str,
        layout: str,
        chunks: int,
        recycle: bool,
        extra: Sequence[Any],
    ) -> Any:
        """Run the publish script once (never retried: a second run after a lost answer
        would publish the same token twice); its raw reply."""
        count, *rest = self._publish_arguments(keys, table, token, layout, chunks, recycle, extra)
        return self._client.script(PUBLISH, rest[:count], rest[count:], retry=False)

    def _published(self, name: str, table: Table, version: int, epoch: str, token: str) -> int:
        """Remember what this push published; return its version."""
        if epoch != table.epoch:
            log.warning(
                "table %r at %s: version %d starts a new history (epoch %s -> %s): the "
                "server restarted or went back to an older state since the version "
                "before was published; readers holding a version get TableResetError "
                "and resynchronise with pull()",
                name,
                self.address,
                version,
                table.epoch,
                epoch,
            )
            table = self._known.remember(name, epoch, table.signature)
        self._known.published(table, version, token)
        self._saw(name, epoch, version)
        return version

    def _republish_target(
        self, name: str, reply: Published, rest: list[Any], table: Table
    ) -> Table:
        """After a publish script refused: the table to publish into on the next try."""
        if reply is Published.VANISHED:  # the server lost its data
            log.warning(
                "table %r at %s vanished (the server lost its data?); creating it again with "
                "its signature and a new epoch",
                name,
                self.address,
            )
            again = self._create(name, table.signature)
            self._known.check_same_signature(name, again.signature, table)
            return again
        if reply is Published.OTHER_EPOCH:  # created again by someone else since we looked
            return self._adopt_epoch(name, text(rest[0]), table)
        if reply is Published.CHUNK_MISSING:
            raise CorruptDataError(
                f"table {name!r} at {self.address}: chunk {text(rest[0])} of this push "
                "vanished before it was published (evicted? varsync needs maxmemory-policy "
                "noeviction or a volatile-* policy); nothing was published"
            )
        raise CorruptDataError(
            f"table {name!r} at {self.address}: its head holds a malformed {text(rest[0])}; "
            "is something else writing under this prefix?"
        )

    def _send_chunks(
        self,
        chunk_prefix: str,
        token: bytes,
        arrays: Sequence[np.ndarray],
        payload: int,
        recycled: bool = False,
        then: Callable[[], bytes] | None = None,
    ) -> wire.Sent:
        """Write every chunk, then ``then``'s command (see :func:`.wire.send_chunks`)."""
        sent: wire.Sent = self._client.on_connection(
            math.inf,
            lambda conn: wire.send_chunks(
                conn, chunk_prefix, token, arrays, payload, recycled, then
            ),
            key=chunk_prefix,
        )
        return sent

    def _discard(self, chunk_prefix: str, count: int) -> None:
        """Best-effort deletion, bounded in time, of the chunks of a push that was not
        published (they expire anyway)."""
        deadline = deadline_after(_DISCARD_SECONDS)
        try:
            for start in range(0, count, 512):
                keys = [f"{chunk_prefix}{i}" for i in range(start, min(count, start + 512))]
                try:
                    self._client.call("UNLINK", *keys, deadline=deadline, retry=False)
                except rx.TryAgainError:  # a cluster's slot in migration: keys on both nodes
                    for key in keys:  # one at a time, each where its ASK says
                        self._client.call("UNLINK", key, deadline=deadline, retry=False)
        except (rx.RedisError, OutOfTime) as exc:
            log.warning(
                "could not delete the chunks of a failed push (%s); they expire within %d s",
                exc,
                PENDING_TTL_MS // 1000,
            )

    def read(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> Snapshot:
        # 0 does not wait for a push (the core never asks read to); it bounds nothing else
        deadline = deadline_after(self.timeout if timeout == 0 else timeout)
        with self._errors(f"pulling table {name!r}"):
            version, _, arrays = self._routed(
                name,
                lambda: leaf_map.read_leaves(self, name, newer_than, deadline, specs, every=True),
            )
        return version, None if arrays is None else [a for a in arrays if a is not None]

    def _fetch(
        self, name: str, specs: Sequence[Spec], head: Head, chunk_prefix: str, deadline: float
    ) -> list[np.ndarray] | None:
        """A whole version's arrays, or ``None`` if one of its chunks is gone."""
        return leaf_map.fetch_whole(self, name, specs, head, chunk_prefix, deadline)

    # -- the rest ----------------------------------------------------------------------------

    def close(self) -> None:
        self._topology.close()
        self._pulled.clear()

    def describe_options(self) -> Mapping[str, Any]:
        return {"timeout": self.timeout, "namespace": self.namespace, **self._settings.described()}

    def __repr__(self) -> str:
        return f"<RedisBackend {self.address} prefix={self.key_base!r}>"
