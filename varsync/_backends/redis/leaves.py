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

Element deltas (format 3, ``write_patches``): a push may give a leaf as an element
patch against its value in the version before; the patch's bytes lie in the push's
segment after its whole leaves, and the leaf's entry gains a link::

    entry     "<anchor>~v.offset.length~..."  the anchor ("w" or "w.offset", as above:
              the leaf's whole value at leaf version w), then each link since, oldest
              first: a patch of ``length`` bytes at that offset of segment v, which
              turns the leaf's value at the version before (the anchor's, or the
              previous link's) into its value at v; the last v is the leaf version

A leaf written whole again loses its chain. Every segment an entry names (anchor and
links) is referenced by its version, so it is retained as long as such a version is.

A pull fetches, per segment it needs, the whole chunks covering the leaves it needs (each
checked by its header and CRC-32, as a whole version's); bytes of a fetched chunk that
belong to leaves it does not need are received into scratch memory and dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from varsync._backends.redis.protocol import COMPOSED_FORMATS, TableHead, parse_layout
from varsync.backend import CorruptDataError, Spec

__all__ = [
    "Segment",
    "Link",
    "Place",
    "composed",
    "places_of",
    "parse_segments",
    "plan",
    "leaf_versions_of",
    "placed",
    "placed_patches",
    "token_of",
]


@dataclass(frozen=True)
class Segment:
    version: int  # the version that wrote it
    token: bytes
    total: int
    payload: int
    chunks: int


@dataclass(frozen=True)
class Link:
    """Where one element patch of a leaf's chain lies: ``length`` bytes at ``offset`` of
    ``segment``, whose version is the link's."""

    segment: Segment
    offset: int
    length: int


@dataclass(frozen=True)
class Place:
    """Where one leaf of a version lies: its anchor (its whole value) at ``offset`` of
    ``segment``, and the links of its chain since, oldest first."""

    segment: Segment
    offset: int
    links: tuple[Link, ...] = ()

    @property
    def version(self) -> int:
        """The leaf version: the last link's, else the anchor's segment's."""
        return self.links[-1].segment.version if self.links else self.segment.version


def token_of(where: str, text: str | None) -> bytes:
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
            token_of(where, token),
            *parse_layout(where, layout),
        )
    return segments


def composed(head: TableHead) -> bool:
    """Whether the head's current version is a composed one (its map is of this version)."""
    return head.fmt in COMPOSED_FORMATS and (head.leaves or "").startswith(f"{head.version}|")


def places_of(where: str, head: TableHead, specs: Sequence[Spec]) -> list[Place]:
    """Where each leaf of the head's version lies, checked against ``specs``."""
    starts = np.cumsum([0] + [s.nbytes for s in specs]).tolist()
    expected = starts[-1]
    if not composed(head):
        total, payload, chunks = parse_layout(where, head.layout)
        if total != expected:
            raise CorruptDataError(f"{where} holds {total} bytes; its signature needs {expected}")
        whole = Segment(head.version, token_of(where, head.data), total, payload, chunks)
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
        anchor, *chain = item.split("~")
        version_text, dot, offset_text = anchor.partition(".")
        segment = _segment(where, head, segments, index, version_text)
        if dot:
            offset = _digits(where, "leaf map", offset_text)
        elif segment.total == expected:
            offset = starts[index]
        else:
            raise CorruptDataError(
                f"{where}: leaf {index} has no offset in segment {segment.version}"
            )
        if offset + specs[index].nbytes > segment.total:
            raise CorruptDataError(
                f"{where}: leaf {index} lies past the end of segment {segment.version}"
            )
        links: list[Link] = []
        for link in chain:
            fields = link.split(".")
            if len(fields) != 3:
                raise CorruptDataError(f"{where}: malformed leaf map entry {item[:80]!r}")
            version_text, offset_text, length_text = fields
            linked = _segment(where, head, segments, index, version_text)
            start = _digits(where, "leaf map", offset_text)
            length = _digits(where, "leaf map", length_text)
            if linked.version <= (links[-1].segment if links else segment).version:
                raise CorruptDataError(f"{where}: leaf {index}'s patches are out of order")
            if start + length > linked.total:
                raise CorruptDataError(
                    f"{where}: a patch of leaf {index} lies past the end of segment "
                    f"{linked.version}"
                )
            links.append(Link(linked, start, length))
        places.append(Place(segment, offset, tuple(links)))
    return places


def _segment(
    where: str, head: TableHead, segments: dict[int, Segment], index: int, text: str
) -> Segment:
    """The segment a leaf map's entry for leaf ``index`` names by its version."""
    version = _digits(where, "leaf map", text)
    segment = segments.get(version)
    if segment is None or version > head.version:
        raise CorruptDataError(
            f"{where}: leaf {index} lies in segment {version}, which its head does not list"
        )
    return segment


def plan(
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
                    scratch = scratch or _scratch(segment)
                    parts.append(scratch[at - start : lo - start])
                if hi > lo:
                    parts.append(target[lo - offset : hi - offset])
                at = max(at, hi)
                if offset + len(target) <= stop:
                    position += 1
                else:
                    break
            if at < stop:
                scratch = scratch or _scratch(segment)
                parts.append(scratch[at - start : stop - start])
            indices.append(chunk)
            parts_of.append(parts)
    return indices, parts_of


def _scratch(segment: Segment) -> memoryview:
    """Memory for the bytes of a fetched chunk of ``segment`` that no wanted leaf takes
    (not zeroed): a chunk's payload, or the whole segment if it is smaller (a sharded
    push's stage reads fetch segments of a few dozen bytes)."""
    return np.empty(min(segment.payload, segment.total), np.uint8).data


def _spans(payload: int, wanted: list[tuple[int, memoryview]]) -> list[tuple[int, int]]:
    """The first and last chunk index of each non-empty wanted range."""
    return [(offset // payload, (offset + len(target) - 1) // payload) for offset, target in wanted]


def leaf_versions_of(where: str, head: TableHead) -> list[int] | None:
    """Each leaf's leaf version from a composed head's map (``None``: the head's version
    is one whole segment, every leaf of its version)."""
    if not composed(head):
        return None
    entries = (head.leaves or "").partition("|")[2]
    return [  # the last link's version, else the anchor's
        _digits(where, "leaf map", item.rpartition("~")[2].partition(".")[0])
        for item in (entries.split(",") if entries else [])
    ]


def placed(
    name: str, leaves: Mapping[int, np.ndarray], specs: Sequence[Spec]
) -> tuple[list[np.ndarray], str]:
    """The arrays of a partial write in flat order, and the publish script's argument
    naming them: ``"+index.offset,..."`` (offsets into the segment's bytes)."""
    indices = sorted(leaves)
    for index in indices:
        if not 0 <= index < len(specs):
            raise IndexError(
                f"write_leaves on table {name!r}: leaf index {index} is outside the "
                f"table's {len(specs)} leaves"
            )
    offsets = np.cumsum([0] + [leaves[i].nbytes for i in indices]).tolist()
    return [leaves[i] for i in indices], "+" + ",".join(
        f"{i}.{o}" for i, o in zip(indices, offsets)
    )


def placed_patches(
    name: str,
    patches: Mapping[int, bytes],
    leaves: Mapping[int, np.ndarray],
    specs: Sequence[Spec],
    start: int,
) -> tuple[list[np.ndarray], str]:
    """The bytes of a push's element patches, in flat order after its whole ``leaves``
    (which end at byte ``start`` of its segment), and the publish script's argument
    naming them: ``"index.offset.length,..."``."""
    indices = sorted(patches)
    for index in indices:
        if not 0 <= index < len(specs):
            raise IndexError(
                f"write_patches on table {name!r}: leaf index {index} is outside the "
                f"table's {len(specs)} leaves"
            )
        if index in leaves:
            raise ValueError(
                f"write_patches on table {name!r}: leaf {index} is given both whole and as "
                "a patch; give it one way"
            )
        if not patches[index]:
            raise ValueError(
                f"write_patches on table {name!r}: the patch of leaf {index} is empty; "
                "give an element patch (varsync._elements) or the whole leaf"
            )
    arrays = [np.frombuffer(patches[i], np.uint8) for i in indices]
    offsets = np.cumsum([start] + [a.nbytes for a in arrays]).tolist()
    return arrays, ",".join(f"{i}.{o}.{a.nbytes}" for i, o, a in zip(indices, offsets, arrays))
