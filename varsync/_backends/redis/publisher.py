"""Pushes to redis tables: a table created, a version's chunks sent under a fresh token
and published by the publish script (or refused, and its chunks deleted), a partial
push's leaves (and element patches) composed on the current version; see the package's
docstring."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np
from redis import exceptions as rx

from varsync._backends.redis import wire
from varsync._backends.redis.cluster import in_motion, settle_deadline
from varsync._backends.redis.errors import OutOfTime
from varsync._backends.redis.leaves import placed, placed_patches
from varsync._backends.redis.options import Settings
from varsync._backends.redis.protocol import (
    CLAIM,
    CREATE,
    FORMAT,
    PENDING_TTL_MS,
    PUBLISH,
    STREAM_LENGTH,
    Claimed,
    Created,
    Keys,
    Published,
    check_format,
    fresh_token,
    text,
)
from varsync._backends.redis.router import Floors
from varsync._backends.redis.tables import (
    Catalog,
    Stored,
    Writes,
    Written,
    read_stored,
    signature_changed,
)
from varsync._backends.redis.topology import Topology
from varsync.backend import (
    BackendConnectionError,
    CorruptDataError,
    Head,
    Spec,
    TableNotFoundError,
    deadline_after,
)

__all__ = ["Publisher"]

log = logging.getLogger("varsync.backends.redis")

_DISCARD_SECONDS = 1.0  # bound on deleting a failed push's chunks (they expire anyway)


class Publisher:
    """Writes to the primary of ``topology``. ``catalog``: the tables' keys and stored
    signatures; ``writes``: what this writer published per table (for the publish
    script's checks); ``floors``: raised to every version published, so a replica behind
    it is never believed (:mod:`.router`). ``settings``: chunk size, ``keep``,
    ``recycle_from``; ``timeout``: the backend's, bounding a cluster's wait for a slot
    in migration to settle."""

    def __init__(
        self,
        topology: Topology,
        catalog: Catalog,
        writes: Writes,
        floors: Floors,
        settings: Settings,
        timeout: float | None,
    ) -> None:
        self._topology = topology
        self._client = topology.primary
        self._catalog = catalog
        self._writes = writes
        self._floors = floors
        self._address = settings.address
        self._chunk_size = settings.chunk_size
        self._keep = settings.keep
        self._recycle_from = settings.recycle_from
        self._timeout = timeout

    def written(self, name: str) -> Written | None:
        """What this writer published to the table, in the history it last wrote to."""
        return self._writes.get(name)

    # -- tables ----------------------------------------------------------------------------

    def create(self, name: str, signature: str, deadline: float = math.inf) -> Stored:
        """Create the table with ``signature`` unless it exists (a new epoch); the
        signature and epoch it has now."""
        keys = self._catalog.keys(name)
        cluster = self._topology.cluster
        listed = [keys.head, keys.events]
        if cluster is None:
            listed.append(self._catalog.tables_key)  # in a cluster, a slot of its own
        reply, rest = CREATE.answer(
            self._client.script(
                CREATE, listed, [name, signature, fresh_token().hex(), FORMAT], deadline=deadline
            )
        )
        if reply is Created.NOT_A_HEAD:
            raise CorruptDataError(
                f"key {keys.head!r} at {self._address} exists but is not a varsync table head; "
                "is something else using this key prefix? Use another prefix or namespace."
            )
        fmt, stored, epoch = (text(x) for x in rest)
        check_format(self._where(name), fmt)
        if cluster is not None:  # after the table: a listing never names a missing one
            self._client.call("SADD", self._catalog.tables_key, name, deadline=deadline)
        self._floors.raise_to(name, epoch, 0)
        return self._catalog.remember(name, epoch, stored)

    def _where(self, name: str) -> str:
        return f"table {name!r} at {self._address}"

    def _written(self, name: str, specs: Sequence[Spec], deadline: float) -> Written:
        """This writer's record of the table; a first one in the history the catalog
        knows, if the table's signature there is the caller's."""
        written = self._writes.get(name)
        if written is None:
            stored = self._catalog.get(name) or read_stored(
                self._client, self._catalog, name, self._address, deadline
            )
            if stored is None:
                raise TableNotFoundError(f"no table {name!r} at {self._address}")
            if not Catalog.same_specs(stored, specs):
                raise signature_changed(name, self._address)
            written = self._writes.of(name, stored.epoch, stored.signature)
        return written

    # -- pushes ----------------------------------------------------------------------------

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        head = self._push(name, arrays, specs, deadline)
        assert head is not None  # a whole write is never refused
        return head

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        """The given leaves as one new segment (:mod:`.leaves`); ``None`` if refused."""
        arrays, names = placed(name, leaves, specs)
        return self._push(name, arrays, specs, deadline, names, base)

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Head | None:
        """The given leaves and, after them, the patches' bytes as one new segment, each
        patch a link of its leaf's chain (:mod:`.leaves`); ``None`` if refused."""
        arrays, names = placed(name, leaves, specs)
        patched, links = placed_patches(name, patches, leaves, specs, sum(a.nbytes for a in arrays))
        return self._push(name, [*arrays, *patched], specs, deadline, names, base, links)

    def _push(
        self,
        name: str,
        arrays: Sequence[np.ndarray],
        specs: Sequence[Spec],
        deadline: float,
        leaves: str = "",
        base: Head | None = None,
        patches: str = "",
    ) -> Head | None:
        """Publish ``arrays`` as one new segment: the whole value (``leaves`` empty), or
        the leaves ``leaves`` names (``"+index.offset,..."``) and the element patches
        ``patches`` names (``"index.offset.length,..."``) on top of the current version
        (``base``: only on that one); ``None`` if the script refused such leaves. In a
        cluster, again while the table's slot is in migration (nothing was published)."""
        cluster = self._topology.cluster
        if cluster is None:
            return self._push_once(name, arrays, specs, deadline, leaves, base, patches)
        return cluster.settled(
            lambda: self._push_once(name, arrays, specs, deadline, leaves, base, patches),
            self._catalog.keys(name).head,
            settle_deadline(deadline, self._timeout),
        )

    def _push_once(
        self,
        name: str,
        arrays: Sequence[np.ndarray],
        specs: Sequence[Spec],
        deadline: float,
        leaves: str,
        base: Head | None,
        patches: str,
    ) -> Head | None:
        keys = self._catalog.keys(name)
        token = fresh_token()
        hexed = token.hex()
        total = sum(a.nbytes for a in arrays)
        payload = self._chunk_size - wire.CHUNK_SLACK
        chunks = -(-total // payload)
        layout = f"{total}:{payload}:{chunks}"
        recycle = total >= self._recycle_from  # see DEFAULT_RECYCLE_FROM
        chunk_prefix = keys.chunks + hexed + ":"
        written = self._written(name, specs, deadline)
        if base is not None and base.epoch != written.epoch:
            return None  # the base is of another history than this writer's: not current
        extra = [len(specs), leaves, "" if base is None else str(base.version), patches]
        # Keys under this fresh token are this push's alone, until the publish script
        # is sent: from then on the server may have published them, so never delete.
        ours = True

        def publish_after_chunks() -> bytes:
            nonlocal ours
            ours = False
            written.doubt(hexed)
            return wire.command(
                "EVALSHA",
                PUBLISH.sha,
                *self.publish_arguments(keys, written, hexed, layout, chunks, recycle, extra),
            )

        try:
            recycled = recycle and self._claim(keys, written, layout, hexed, deadline) == chunks
            # Fresh chunks are followed by their publish script before their replies
            # are read: one round trip for a small push. The script finds a refused
            # SET's chunk missing. Not so a refused SETRANGE, which leaves the spare's
            # bytes at the right length: recycled chunks are published once their
            # replies are in (a push that large hardly notices the round trip).
            sent = self.send_chunks(
                chunk_prefix,
                token,
                arrays,
                payload,
                deadline,
                recycled,
                then=None if recycled else publish_after_chunks,
            )
            answer = sent.reply
            for _ in range(3):
                if answer is None:  # not sent with the chunks, or refused: send it now
                    if sent.error is not None:
                        raise sent.error
                    ours = False
                    written.doubt(hexed)
                    answer = self.publish(
                        keys, written, hexed, layout, chunks, recycle, extra, deadline
                    )
                elif isinstance(answer, rx.NoScriptError):  # the script did not run
                    ours, answer = True, None
                    continue
                if isinstance(answer, BaseException):
                    moving = None if self._topology.cluster is None else in_motion(answer)
                    if moving is not None:
                        ours = True  # its slot is moving: the script changed nothing
                        raise sent.error or moving  # a chunk's MOVED moves the map
                    raise sent.error or answer  # a chunk's error explains the script's
                reply, rest = PUBLISH.answer(answer)
                if reply is Published.PUBLISHED:
                    version, epoch = int(rest[0]), text(rest[1])
                    return self._published(name, written, version, epoch, hexed)
                ours = True  # refused before it touched anything: nothing published
                if sent.error is not None:
                    raise sent.error  # why its chunk was missing
                if reply in (Published.BASE_MOVED, Published.NO_BASE):
                    return None  # leaves on another base: the core writes the whole value
                written = self._republish_target(name, reply, rest, written, deadline)
                answer = None
            raise BackendConnectionError(
                f"table {name!r} at {self._address} kept changing under this push; "
                "nothing was published"
            )
        except rx.ResponseError as exc:
            if self._topology.cluster is not None and in_motion(exc) is not None:
                ours = True  # redirected, or stopped before any change: not published
            raise
        except (rx.ConnectionError, rx.TimeoutError) as exc:
            if ours or isinstance(exc, rx.AuthenticationError):
                raise
            raise BackendConnectionError(
                f"pushing {total} bytes to table {name!r} at {self._address}: "
                f"{type(exc).__name__}: {exc}. The publish script was sent but its answer "
                "was lost: the server may have published this push. Pull to see; a push "
                "again publishes the value again under the next version."
            ) from exc
        finally:
            if ours and not self._topology.primary_lost:  # else: nowhere to delete them
                self._discard(chunk_prefix, chunks)

    def _claim(self, keys: Keys, written: Written, layout: str, token: str, deadline: float) -> int:
        """How many of the spare version's chunks this push now owns (see CLAIM)."""
        reply, rest = CLAIM.answer(
            self._client.script(
                CLAIM,
                [keys.head],
                [written.epoch, layout, keys.chunks, token, PENDING_TTL_MS],
                deadline=deadline,
            )
        )
        return int(rest[0]) if reply is Claimed.CLAIMED else 0

    def publish_arguments(
        self,
        keys: Keys,
        written: Written,
        token: str,
        layout: str,
        chunks: int,
        recycle: bool,
        extra: Sequence[Any],
    ) -> list[Any]:
        """The publish script's key count, keys and arguments (``extra``: leaf count,
        leaves, base version, patches; see :meth:`_push`)."""
        return [
            2,
            keys.head,
            keys.events,
            written.epoch,
            token,
            layout,
            chunks,
            self._keep,
            keys.chunks,
            written.published,
            fresh_token().hex(),
            STREAM_LENGTH,
            wire.HEADER.size,
            "1" if recycle else "0",
            written.vouched(),
            *extra,
        ]

    def publish(
        self,
        keys: Keys,
        written: Written,
        token: str,
        layout: str,
        chunks: int,
        recycle: bool,
        extra: Sequence[Any],
        deadline: float = math.inf,
    ) -> Any:
        """Run the publish script once (never retried: a second run after a lost answer
        would publish the same token twice); its raw reply."""
        count, *rest = self.publish_arguments(keys, written, token, layout, chunks, recycle, extra)
        return self._client.script(
            PUBLISH, rest[:count], rest[count:], deadline=deadline, retry=False
        )

    def _published(self, name: str, written: Written, version: int, epoch: str, token: str) -> Head:
        """Remember what this push published; its head."""
        if epoch != written.epoch:
            log.warning(
                "table %r at %s: version %d starts a new history (epoch %s -> %s): the "
                "server restarted or went back to an older state since the version "
                "before was published; readers holding a version get TableResetError "
                "and resynchronise with pull()",
                name,
                self._address,
                version,
                written.epoch,
                epoch,
            )
            written = self._writes.of(name, epoch, written.signature)
            self._catalog.remember(name, epoch, written.signature)
        self._writes.published(written, version, token)
        self._floors.raise_to(name, epoch, version)
        return Head(version, epoch)

    def _republish_target(
        self, name: str, reply: Published, rest: list[Any], written: Written, deadline: float
    ) -> Written:
        """After a publish script refused: the record to publish with on the next try."""
        if reply is Published.VANISHED:  # the server lost its data
            log.warning(
                "table %r at %s vanished (the server lost its data?); creating it again with "
                "its signature and a new epoch",
                name,
                self._address,
            )
            again = self.create(name, written.signature, deadline)
            if again.signature != written.signature:
                raise signature_changed(name, self._address)
            return self._writes.of(name, again.epoch, again.signature)
        if reply is Published.OTHER_EPOCH:  # created again by someone else since we looked
            stored = text(
                self._client.call("HGET", self._catalog.keys(name).head, "sig", deadline=deadline)
            )
            if stored != written.signature:
                raise signature_changed(name, self._address)
            epoch = text(rest[0])
            self._catalog.remember(name, epoch, stored)
            return self._writes.of(name, epoch, stored)
        if reply is Published.CHUNK_MISSING:
            raise CorruptDataError(
                f"table {name!r} at {self._address}: chunk {text(rest[0])} of this push "
                "vanished before it was published (evicted? varsync needs maxmemory-policy "
                "noeviction or a volatile-* policy); nothing was published"
            )
        raise CorruptDataError(
            f"table {name!r} at {self._address}: its head holds a malformed {text(rest[0])}; "
            "is something else writing under this prefix?"
        )

    def send_chunks(
        self,
        chunk_prefix: str,
        token: bytes,
        arrays: Sequence[np.ndarray],
        payload: int,
        deadline: float = math.inf,
        recycled: bool = False,
        then: Callable[[], bytes] | None = None,
    ) -> wire.Sent:
        """Write every chunk, then ``then``'s command (see :func:`.wire.send_chunks`)."""
        sent: wire.Sent = self._client.on_connection(
            deadline,
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
