"""Leaf versions in a table head: which segment holds each leaf, for pushes that send only
the leaves that changed and pulls that fetch only the leaves changed since what they hold.

A *segment* is what one push stored: the bytes of the leaves it wrote, back to back in flat
order, cut into chunks under its token exactly as a whole version's (:mod:`.wire`). A
whole write's segment holds every leaf (format 1: ``data`` and ``layout`` are the value).
A version composed by ``write_leaves`` (format 2) has two more head fields::

    leaves    "<version>|<entry>,<entry>,..."  one entry per leaf, in flat order:
              "w" (the leaf lies in the whole segment written at version w, where the
              flat layout puts it) or "w.offset" (at that byte offset of segment w);
              w is also the leaf's leaf version
    segments  "w:token:bytes:bytes per chunk:chunks,..."  every segment that the current
              or a retained version references (the publish script keeps it, format 1 too)

The map is stamped with its version: a map of another version (an older varsync's whole
write since) is ignored, and the head read as one whole segment. The publish script
composes the map, and retires a segment once no retained version references it (each
retained item lists the segments its version references; see ``PUBLISH``).

A pull fetches, per segment it needs, the whole chunks covering the leaves it needs (each
checked by its header and CRC-32, as a whole version's); bytes of a fetched chunk that
belong to leaves it does not need are received into scratch memory and dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from varsync.backend import CorruptDataError, LeafSnapshot, PullTimeoutError, Spec
from varsync.backends.redis import wire
from varsync.backends.redis.prefault import Prefaulted
from varsync.backends.redis.protocol import LEAF_FORMAT, Head, parse_layout
from varsync.signature import flat_specs
from varsync.signature_json import from_json

if TYPE_CHECKING:  # pragma: no cover
    from varsync.backends.redis.backend import RedisBackend

__all__ = ["read_leaves", "leaf_versions", "write_leaves", "places_of", "parse_segments"]

MAX_RESTARTS = 1000
_LEAF_FIELDS = ("data", "layout", "leaves", "segments")


@dataclass(frozen=True)
class Segment:
    version: int  # the version that wrote it
    token: bytes
    total: int
    payload: int
    chunks: int


@dataclass(frozen=True)
class Place:
    """Where one leaf of a version lies, and its leaf version (its segment's)."""

    segment: Segment
    offset: int


def _token(where: str, text: str | None) -> bytes:
    try:
        token = bytes.fromhex(text or "")
        if len(token) == 8:
            return token
    except ValueError:
        pass
    raise CorruptDataError(
        f"{where}: its head names data {text!r}, not a token varsync writes; is something "
        "else writing under this prefix?"
    )


def _digits(where: str, field: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise CorruptDataError(f"{where}: malformed {field} {text[:80]!r} in its head")
    return int(text)


def parse_segments(where: str, text: str | None) -> dict[int, Segment]:
    """The head's ``segments``, by the version that wrote each."""
    segments: dict[int, Segment] = {}
    for item in (text or "").split(","):
        if not item:
            continue
        version, _, rest = item.partition(":")
        token, _, layout = rest.partition(":")
        segments[_digits(where, "segments", version)] = Segment(
            _digits(where, "segments", version),
            _token(where, token),
            *parse_layout(where, layout),
        )
    return segments


def composed(head: Head) -> bool:
    """Whether the head's current version is a composed one (its map is of this version)."""
    return head.fmt == LEAF_FORMAT and (head.leaves or "").startswith(f"{head.version}|")


def places_of(where: str, head: Head, specs: Sequence[Spec]) -> list[Place]:
    """Where each leaf of the head's version lies, checked against ``specs``."""
    starts = np.cumsum([0] + [s.nbytes for s in specs]).tolist()
    expected = starts[-1]
    if not composed(head):
        total, payload, chunks = parse_layout(where, head.layout)
        if total != expected:
            raise CorruptDataError(f"{where} holds {total} bytes; its signature needs {expected}")
        whole = Segment(head.version, _token(where, head.data), total, payload, chunks)
        return [Place(whole, start) for start in starts[:-1]]
    segments = parse_segments(where, head.segments)
    entries = (head.leaves or "").partition("|")[2]
    items = entries.split(",") if entries else []
    if len(items) != len(specs):
        raise CorruptDataError(
            f"{where}: its leaf map has {len(items)} leaves; its signature has {len(specs)}"
        )
    places = []
    for index, item in enumerate(items):
        version_text, dot, offset_text = item.partition(".")
        version = _digits(where, "leaf map", version_text)
        segment = segments.get(version)
        if segment is None or version > head.version:
            raise CorruptDataError(
                f"{where}: leaf {index} lies in segment {version}, which its head does not list"
            )
        if dot:
            offset = _digits(where, "leaf map", offset_text)
        elif segment.total == expected:
            offset = starts[index]
        else:
            raise CorruptDataError(f"{where}: leaf {index} has no offset in segment {version}")
        if offset + specs[index].nbytes > segment.total:
            raise CorruptDataError(f"{where}: leaf {index} lies past the end of segment {version}")
        places.append(Place(segment, offset))
    return places


def _plan(
    where: str, segment: Segment, wanted: list[tuple[int, memoryview]]
) -> tuple[list[int], list[list[memoryview]]]:
    """The chunks of ``segment`` covering ``wanted`` (``(offset, target)``, sorted), and
    for each the views its payload goes to: targets' slices, the rest into scratch."""
    scratch: memoryview | None = None
    indices: list[int] = []
    parts_of: list[list[memoryview]] = []
    end = 0
    for offset, target in wanted:
        if offset < end:
            raise CorruptDataError(f"{where}: two leaves overlap in segment {segment.version}")
        end = offset + len(target)
    position = 0  # into wanted
    for first, last in _spans(segment.payload, wanted):
        for chunk in range(first, last + 1):
            if indices and chunk <= indices[-1]:
                continue
            start = chunk * segment.payload
            stop = min(segment.total, start + segment.payload)
            parts: list[memoryview] = []
            at = start
            while position < len(wanted) and wanted[position][0] < stop:
                offset, target = wanted[position]
                lo, hi = max(offset, at), min(offset + len(target), stop)
                if lo > at:
                    scratch = scratch or _scratch(segment.payload)
                    parts.append(scratch[at - start : lo - start])
                if hi > lo:
                    parts.append(target[lo - offset : hi - offset])
                at = max(at, hi)
                if offset + len(target) <= stop:
                    position += 1
                else:
                    break
            if at < stop:
                scratch = scratch or _scratch(segment.payload)
                parts.append(scratch[at - start : stop - start])
            indices.append(chunk)
            parts_of.append(parts)
    return indices, parts_of


def _scratch(size: int) -> memoryview:
    """Memory for the bytes of fetched chunks that no wanted leaf takes (not zeroed)."""
    return np.empty(size, np.uint8).data


def _spans(payload: int, wanted: list[tuple[int, memoryview]]) -> list[tuple[int, int]]:
    """The first and last chunk index of each non-empty wanted range."""
    return [(offset // payload, (offset + len(target) - 1) // payload) for offset, target in wanted]


def fetch_whole(
    backend: RedisBackend,
    name: str,
    specs: Sequence[Spec],
    head: Head,
    chunk_prefix: str,
    deadline: float,
) -> list[np.ndarray] | None:
    """A whole version's arrays (format 1), or ``None`` if one of its chunks is gone."""
    where = f"{backend._where(name)} version {head.version}"
    if head.data is None:
        raise CorruptDataError(f"{where}: its head names no data")
    total, payload, chunks = parse_layout(backend._where(name), head.layout)
    expected = sum(s.nbytes for s in specs)
    if total != expected:
        raise CorruptDataError(f"{where} holds {total} bytes; its signature needs {expected}")
    token = _token(where, head.data)
    made, fresh = backend._pulled.arrays(specs)
    arrays = [a for a in made if a is not None]
    if head.chunk is not None:  # read with the head (the peek script): nothing to ask
        return wire.unpack_chunk(head.chunk, token, arrays, where)
    client = backend._read_client()
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


def _fetch(
    backend: RedisBackend,
    chunk_base: str,
    where: str,
    places: list[Place],
    specs: Sequence[Spec],
    needed: list[int],
    deadline: float,
) -> list[np.ndarray | None] | None:
    """The arrays of the ``needed`` leaves (``None`` elsewhere), or ``None`` if a chunk of
    one of their segments is gone."""
    arrays, fresh = backend._pulled.arrays(specs, needed)
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
        indices, parts_of = _plan(where, segment, wanted)
        if indices:
            plans.append((segment, indices, parts_of))

    client = backend._read_client()

    def receive(conn: object) -> bool:
        for segment, indices, parts_of in plans:
            prefix = f"{chunk_base}{segment.token.hex()}:"
            named = f"{where} segment {segment.version}"
            if not wire.receive_selected(
                conn,
                deadline,
                prefix,
                segment.token,
                indices,
                parts_of,
                named,
                client.asker(deadline),
            ):
                return False
        return True

    if plans:
        with Prefaulted(fresh):
            if not client.on_connection(deadline, receive, key=chunk_base):
                return None
    return arrays


def read_leaves(
    backend: RedisBackend,
    name: str,
    newer_than: int,
    deadline: float,
    specs: Sequence[Spec],
    every: bool = False,
    first: Head | None = None,
) -> LeafSnapshot:
    """``Backend.read_leaves`` (``every``: all leaves, for ``read``), inside the caller's
    error translation; ``first``: the head the caller read already."""
    chunk_base = backend._keys(name).chunks
    where = backend._where(name)
    gone: int | None = None
    for _ in range(MAX_RESTARTS):
        head = first or backend._peek(name, newer_than, deadline)
        first = None
        if head is None:
            return 0, None, None  # vanished: reads as empty; holders get TableResetError
        backend._trusted(name, head, newer_than, deadline)
        if head.version <= newer_than:
            return head.version, None, None
        if head.fmt == LEAF_FORMAT:  # the map, read with the fields it goes with
            head = backend._head(name, *_LEAF_FIELDS, deadline=deadline)
            if head is None:
                return 0, None, None
            backend._trusted(name, head, newer_than, deadline)
        if head.version == gone:
            raise CorruptDataError(
                f"{where} version {head.version}: a chunk of the current version is missing "
                "(evicted? varsync needs maxmemory-policy noeviction)"
            )
        versioned = f"{where} version {head.version}"
        if not composed(head):  # one whole segment: as read() fetches it
            whole = backend._fetch(name, specs, head, f"{chunk_base}{head.data}:", deadline)
            if whole is not None:
                return head.version, [head.version] * len(specs), list(whole)
        else:
            places = places_of(versioned, head, specs)
            versions = [p.segment.version for p in places]
            needed = [i for i, v in enumerate(versions) if every or v > newer_than]
            arrays = _fetch(backend, chunk_base, versioned, places, specs, needed, deadline)
            if arrays is not None:
                return head.version, versions, arrays
        gone = head.version  # retired by newer versions while we read: start again
        backend.pulls_restarted += 1
    raise PullTimeoutError(
        f"{where}: {MAX_RESTARTS} pulls in a row found their version retired before they "
        "finished; the writer publishes faster than this reader can fetch one version. "
        "Connect the writer with a larger keep."
    )


def leaf_versions(backend: RedisBackend, name: str) -> tuple[int, list[int]]:
    """``Backend.leaf_versions``: one ``HMGET``, inside the caller's error translation."""
    head = backend._head(name, "leaves")
    if head is not None:  # the primary's answer: a replica's may not go below it now
        backend._saw(name, head.epoch, head.version)
    if head is not None and composed(head):
        entries = (head.leaves or "").partition("|")[2]
        where = backend._where(name)
        return head.version, [
            _digits(where, "leaf map", item.partition(".")[0])
            for item in (entries.split(",") if entries else [])
        ]
    table = backend._known_table(name)
    if table.leaf_count is None:
        table.leaf_count = len(flat_specs(from_json(table.signature)))
    version = 0 if head is None else head.version
    return version, [version] * table.leaf_count


def write_leaves(
    backend: RedisBackend,
    name: str,
    leaves: Mapping[int, np.ndarray],
    specs: Sequence[Spec],
    base: int | None,
) -> int:
    """``Backend.write_leaves``: the given leaves as one new segment (see the module)."""
    indices = sorted(leaves)
    for index in indices:
        if not 0 <= index < len(specs):
            raise IndexError(
                f"write_leaves on table {name!r}: leaf index {index} is outside the "
                f"table's {len(specs)} leaves"
            )
    offsets = np.cumsum([0] + [leaves[i].nbytes for i in indices]).tolist()
    placed = ",".join(f"{i}.{o}" for i, o in zip(indices, offsets))
    return backend._push(
        name,
        [leaves[i] for i in indices],
        len(specs),
        "+" + placed,
        "" if base is None else str(base),
    )
