"""The bytes of a version, fetched into the arrays a pull returns: a whole segment's
chunks (format 1), or the chunks of the segments holding the leaves a delta pull needs
(:mod:`.leaves`), with the element patches of their chains. Every chunk is checked by
its header and CRC-32 (:mod:`.wire`), every patched value by its writer's hash."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from varsync._backends.redis import wire
from varsync._backends.redis.leaves import Link, Place, Segment, plan, token_of
from varsync._backends.redis.protocol import TableHead, parse_layout
from varsync._backends.redis.pulled import PulledMemory
from varsync._backends.redis.topology import Requests
from varsync._elements import Patch, apply
from varsync._prefault import Prefaulted
from varsync.backend import CorruptDataError, LeafChain, PatchLink, Spec

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
        whose leaves lie at ``places`` (``where`` names that version, for messages); a
        leaf with a chain is its anchor with every link applied in place, each checked
        against its writer's hash."""
        fetched = self._fetch(client, chunk_base, where, places, specs, needed, deadline, 0)
        if fetched is None:
            return None
        arrays, chains = fetched
        for index, chain in chains.items():
            array = arrays[index]
            assert array is not None  # a whole read takes every anchor
            for link in chain:
                apply(array, Patch.from_bytes(link.data))
        return arrays

    def chains(
        self,
        client: Requests,
        chunk_base: str,
        where: str,
        places: list[Place],
        specs: Sequence[Spec],
        held: int,
        deadline: float,
    ) -> list[np.ndarray | LeafChain | None] | None:
        """The leaves changed since ``held`` (``read_patches``), ``None`` elsewhere: a
        leaf with no chain whole; one whose chain reaches back to a leaf version at
        most ``held`` as the links since; any other as its anchor and every link."""
        needed = [i for i, place in enumerate(places) if place.version > held]
        fetched = self._fetch(client, chunk_base, where, places, specs, needed, deadline, held)
        if fetched is None:
            return None
        arrays, chains = fetched
        out: list[np.ndarray | LeafChain | None] = list(arrays)
        for index, chain in chains.items():
            anchor = arrays[index]
            anchored = 0 if anchor is None else places[index].segment.version
            out[index] = LeafChain(anchor, anchored, chain)
        return out

    def _fetch(
        self,
        client: Requests,
        chunk_base: str,
        where: str,
        places: list[Place],
        specs: Sequence[Spec],
        needed: list[int],
        deadline: float,
        held: int,
    ) -> tuple[list[np.ndarray | None], dict[int, list[PatchLink]]] | None:
        """The ``needed`` leaves' anchors (``None`` where the links since ``held``, a
        version the reader holds, reach back to it: only those links are fetched), and
        the links of each leaf with a chain, in one pass over the chunks covering them;
        ``None`` if a chunk is gone."""
        chosen: dict[int, list[tuple[int, Link]]] = {}  # per leaf: (its base, link)
        anchored = []
        for index in needed:
            place = places[index]
            bases = [place.segment.version] + [link.segment.version for link in place.links]
            links = list(zip(bases, place.links))
            since = [(base, link) for base, link in links if link.segment.version > held]
            if held and since and since[0][0] <= held:  # the reader holds the first's base
                chosen[index] = since
                continue
            if links:
                chosen[index] = links
            anchored.append(index)
        arrays, fresh = self.pulled.arrays(specs, anchored)
        wanted: dict[int, tuple[Segment, list[tuple[int, memoryview]]]] = {}

        def want(segment: Segment, offset: int, target: memoryview) -> None:
            if len(target):
                wanted.setdefault(segment.version, (segment, []))[1].append((offset, target))

        for index in anchored:
            array = arrays[index]
            assert array is not None
            want(places[index].segment, places[index].offset, wire.byte_views([array])[0])
        data = {index: [bytearray(link.length) for _, link in c] for index, c in chosen.items()}
        for index, chain in chosen.items():
            for (_, link), target in zip(chain, data[index]):
                want(link.segment, link.offset, memoryview(target))
        if not self._receive(client, chunk_base, where, list(wanted.values()), fresh, deadline):
            return None
        return arrays, {
            index: [
                PatchLink(base, link.segment.version, bytes(target))
                for (base, link), target in zip(chain, data[index])
            ]
            for index, chain in chosen.items()
        }

    def _receive(
        self,
        client: Requests,
        chunk_base: str,
        where: str,
        wanted: list[tuple[Segment, list[tuple[int, memoryview]]]],
        fresh: list[np.ndarray],
        deadline: float,
    ) -> bool:
        """Fetch the chunks covering each segment's ``(offset, target)`` ranges into the
        targets; ``False`` if one is gone."""
        plans = []
        for segment, ranges in wanted:
            ranges.sort(key=lambda w: w[0])
            indices, parts_of = plan(where, segment, ranges)
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

        if not plans:
            return True
        with Prefaulted(fresh):
            received: bool = client.on_connection(deadline, receive, key=chunk_base)
        return received
