"""The bytes of a version, fetched into the arrays a pull returns: a whole segment's
chunks (format 1), or the chunks of the segments holding the leaves a delta pull needs
(:mod:`.leaves`). Every chunk is checked by its header and CRC-32 (:mod:`.wire`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from varsync._backends.redis import wire
from varsync._backends.redis.leaves import Place, Segment, plan, token_of
from varsync._backends.redis.prefault import Prefaulted
from varsync._backends.redis.protocol import TableHead, parse_layout
from varsync._backends.redis.pulled import PulledMemory
from varsync._backends.redis.topology import Requests
from varsync.backend import CorruptDataError, Spec

__all__ = ["Fetcher"]


class Fetcher:
    """Fetches versions into memory from ``pulled`` (a pull's arrays reuse an earlier
    pull's buffers, :mod:`.pulled`). Each method answers ``None`` if a chunk it needs is
    gone: newer versions retired it, and the pull starts again from the head."""

    def __init__(self, pulled: PulledMemory) -> None:
        self.pulled = pulled

    def whole(
        self,
        client: Requests,
        where: str,
        specs: Sequence[Spec],
        head: TableHead,
        chunk_prefix: str,
        deadline: float,
    ) -> list[np.ndarray] | None:
        """A whole version's arrays (format 1). ``where``: ``"table 'name' at
        <address>"``, for messages."""
        table, where = where, f"{where} version {head.version}"
        if head.data is None:
            raise CorruptDataError(f"{where}: its head names no data")
        total, payload, chunks = parse_layout(table, head.layout)
        expected = sum(s.nbytes for s in specs)
        if total != expected:
            raise CorruptDataError(f"{where} holds {total} bytes; its signature needs {expected}")
        token = token_of(where, head.data)
        made, fresh = self.pulled.arrays(specs)
        arrays = [a for a in made if a is not None]
        if head.chunk is not None:  # read with the head (the peek script): nothing to ask
            return wire.unpack_chunk(head.chunk, token, arrays, where)
        with Prefaulted(fresh):
            received: list[np.ndarray] | None = client.on_connection(
                deadline,
                lambda conn: wire.receive_chunks(
                    conn,
                    deadline,
                    chunk_prefix,
                    token,
                    arrays,
                    payload,
                    chunks,
                    where,
                    client.asker(deadline),
                ),
                key=chunk_prefix,
            )
        return received

    def leaves(
        self,
        client: Requests,
        chunk_base: str,
        where: str,
        places: list[Place],
        specs: Sequence[Spec],
        needed: list[int],
        deadline: float,
    ) -> list[np.ndarray | None] | None:
        """The arrays of the ``needed`` leaves (``None`` elsewhere) of a composed version
        whose leaves lie at ``places`` (``where`` names that version, for messages)."""
        arrays, fresh = self.pulled.arrays(specs, needed)
        by_segment: dict[int, tuple[Segment, list[tuple[int, memoryview]]]] = {}
        for index in needed:
            array = arrays[index]
            if array is None or array.nbytes == 0:
                continue
            place = places[index]
            entry = by_segment.setdefault(place.segment.version, (place.segment, []))
            entry[1].append((place.offset, wire.byte_views([array])[0]))
        plans = []
        for segment, wanted in by_segment.values():
            wanted.sort(key=lambda w: w[0])
            indices, parts_of = plan(where, segment, wanted)
            if indices:
                plans.append((segment, indices, parts_of))

        def receive(conn: Any) -> bool:
            for segment, indices, parts_of in plans:
                if not wire.receive_selected(
                    conn,
                    deadline,
                    f"{chunk_base}{segment.token.hex()}:",
                    segment.token,
                    indices,
                    parts_of,
                    f"{where} segment {segment.version}",
                    client.asker(deadline),
                ):
                    return False
            return True

        if plans:
            with Prefaulted(fresh):
                if not client.on_connection(deadline, receive, key=chunk_base):
                    return None
        return arrays
