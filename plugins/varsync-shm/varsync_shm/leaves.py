"""Leaf versions (delta sync): partial pushes, pulls of what changed, each leaf's version.

Every version is still one complete segment (:mod:`varsync_shm.segment`), so whole pulls,
readers' locks and reclamation are those of whole pushes. What is added is, in each
segment's head, the version at which each leaf last changed (its *leaf versions*).

- **A partial push** (:func:`write_leaves`) holds the writers' lock from reading the
  current version's leaf versions to publishing, so two writers never lose each other's
  leaves. It refills the spare when there is one: the spare holds an older complete
  version, whose leaf versions say which of its leaves still hold the current value (a
  leaf version names one value within a history, and a table's segments are all of one
  history: a table made again is a new directory). It copies the given leaves and, from
  the current segment, only the leaves whose leaf version differs from the spare's: as a
  rule, what changed since the spare's version. With no free spare (readers hold the
  retired versions) it fills a new file: the given leaves, and every other leaf copied
  from the current segment, one whole copy.
  With ``base``, it writes only if the table's head (version and epoch) is ``base``.
- **A delta pull** (:func:`open_leaves`) reads, under the segment's shared lock and after
  checking its version as a whole pull does, the head and only the leaves changed since
  the version the caller holds: leaves over :data:`DELTA_MAP_ABOVE` bytes (over
  :data:`~varsync_shm.reading.MAP_ABOVE` for a read of every leaf, as a pull) as read-only
  views of the mapped segment (which keep its shared lock while they live), the others
  copied, neighbours in one ``pread``: a held nest then pins no segment per changed
  leaf. The backend answers it with the epoch it checked before and after (one history).
- **A read of chosen leaves** (``read_leaf_subset``): :func:`open_leaves` given
  ``chosen`` reads those of the changed leaves alone, under the same lock and checks.
- **Leaf versions** (:func:`versions_of`) read one segment's head: a few system calls.
- **Element deltas** (:mod:`varsync_shm.chains`): :func:`write_leaves` given
  ``patches`` keeps a patched leaf's bytes in the segment (its anchor) and writes its
  link in the version's patch file, so the spare's copy of it, holding the same anchor,
  is reused and the push writes the patch alone. What decides a copy is each leaf's
  *content version* (its anchor's, else its leaf version). :func:`open_leaves` rebuilds
  a patched leaf whole (a copy); :func:`open_patches` gives it as links or anchor and
  links.

A leaf unchanged for any number of versions is in every segment, so reclaiming segments
never loses it. The functions here return the bytes they copied or read, which
``details()`` counts per table (``leaf_bytes_written``, ``patch_bytes_written``,
``leaf_bytes_read``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from varsync.backend import CorruptDataError, Head, LeafChain, Spec
from varsync_shm import chains, layout, segment, writing
from varsync_shm._fds import Descriptors
from varsync_shm._files import open_regular, token, unlink_all
from varsync_shm.mappings import Mappings
from varsync_shm.reading import MAP_ABOVE, open_locked, retired_or_corrupt
from varsync_shm.store import TableDir

#: A delta read (``newer_than`` > 0) copies changed leaves up to this size rather than
#: mapping them: 16 MiB copies in a few ms, and a held copy pins no segment.
DELTA_MAP_ABOVE = 16 << 20

__all__ = [
    "Written",
    "write_leaves",
    "open_leaves",
    "open_patches",
    "versions_of",
    "DELTA_MAP_ABOVE",
]

Arrays = list[Optional[np.ndarray]]
Leaves = list[Union[np.ndarray, LeafChain, None]]


class Written(NamedTuple):
    """A partial push that landed: its head, the leaf bytes it copied into the segment
    and the patch bytes it wrote."""

    head: Head
    copied: int
    patched: int


def write_leaves(
    table: TableDir,
    leaves: Mapping[int, np.ndarray],
    specs: Sequence[Spec],
    base: Head | None,
    mappings: Mappings,
    checked: writing.Checked,
    patches: Mapping[int, bytes] | None = None,
) -> Written | None:
    """Publish the current version with ``leaves`` replaced and ``patches`` (leaf index
    -> element patch against its current value) applied as the next version. ``None``
    (and nothing written) if the table is empty, or its head is not ``base``."""
    plan = segment.plan(specs)
    patches = patches or {}
    for index in (*leaves, *patches):
        if not 0 <= index < len(plan.leaves):
            raise IndexError(
                f"write_leaves: leaf index {index} of table {table.name!r} is not in 0..."
                f"{len(plan.leaves) - 1} (its signature has {len(plan.leaves)} leaves)"
            )
    both = sorted(set(leaves) & set(patches))
    if both:
        raise ValueError(
            f"write_patches: leaves {both} of table {table.name!r} are given both whole and "
            "as patches; give each leaf one way"
        )
    fds = Descriptors()
    made: list[str] = []  # names this push created: removed at the end unless renamed
    try:
        writing.locked(table, fds)  # held to the publish: see the module docstring
        epoch = checked(table)
        pointer = writing.pointer(table)
        version = layout.version_named(pointer, table.path)
        if version == 0 or (base is not None and base != Head(version, epoch)):
            return None
        assert pointer is not None
        where = table.where(pointer)
        source = open_regular(
            table.file(pointer), os.O_RDONLY, fds, dir_fd=table.store, where=where
        )
        size = os.fstat(source).st_size
        head = segment.read_head(source, size)
        current = segment.parse_head(head, size, where)
        if current.version != version or _kinds(current.leaves) != _kinds(plan.leaves):
            raise CorruptDataError(
                f"{where} holds version {current.version} with {len(current.leaves)} leaves; "
                f"expected version {version} with the {len(plan.leaves)} of the signature"
            )
        now = segment.leaf_versions(head, current, where)
        anchors = segment.anchor_versions(head, current, where)
        new = version + 1
        chained = _chains_since(table, fds, patches, now, anchors)
        writing.reclaim(table, pointer)
        fd, fresh, old = writing.claim(table, plan.size, fds, made, len(plan.head))
        held = _held(old, plan, where)  # what the spare holds already, leaf by leaf
        wanted = [new if i in leaves or i in patches else now[i] for i in range(len(now))]
        # A patched leaf keeps its bytes: its anchor, or its current value as the anchor.
        kept = [
            0 if i in leaves else (anchors[i] or now[i]) if i in patches else anchors[i]
            for i in range(len(now))
        ]
        patched = _stage(table, new, chained, patches, fds, made) if patches else None
        if fresh:
            writing.allocate(fd, plan.size, table)
            target = None
        else:
            target = np.frombuffer(mappings.get(table.rel, fd, plan.size, writable=True), np.uint8)
        from_current = np.frombuffer(
            mappings.get(table.rel, source, size, writable=False), np.uint8
        )
        copied = 0
        for i, leaf in enumerate(plan.leaves):
            if not leaf.nbytes:
                continue
            if i in leaves:
                raw = np.ascontiguousarray(leaves[i]).reshape(-1).view(np.uint8)
            elif held is None or held[i] != (anchors[i] or now[i]):
                start = current.leaves[i].offset
                raw = from_current[start : start + leaf.nbytes]
            else:
                continue  # the spare holds this leaf's bytes already
            _put(fd, target, leaf.offset, raw)
            copied += leaf.nbytes
        segment.pwrite_all(fd, memoryview(segment.head_with(plan, wanted, new, kept)), 0)
        if patched is not None:  # first: readers of the new version find its patches
            store = table.store
            final = table.file(chains.patch_name(new))
            os.rename(patched[0], final, src_dir_fd=store, dst_dir_fd=store)
        writing.publish(table, fd, new, made)
        return Written(Head(new, epoch), copied, 0 if patched is None else patched[1])
    finally:
        fds.close()  # first: it releases the writers' lock and the segments' locks
        unlink_all(table.store, made)


def _chains_since(
    table: TableDir,
    fds: Descriptors,
    patches: Mapping[int, bytes],
    now: Sequence[int],
    anchors: Sequence[int],
) -> dict[int, tuple[list[chains.Row], int]]:
    """Per patched leaf, the links of its chain in the current version and its leaf
    version there (the new link's base)."""
    links = chains.Links(table, fds)
    try:
        return {
            i: (links.chain(i, now[i], anchors[i]) if anchors[i] else [], now[i]) for i in patches
        }
    except chains.Gone as gone:  # the current version's own: under the writers' lock
        raise CorruptDataError(
            f"{gone}, which the current version's chains name, is missing"
        ) from None


def _stage(
    table: TableDir,
    version: int,
    chained: Mapping[int, tuple[list[chains.Row], int]],
    patches: Mapping[int, bytes],
    fds: Descriptors,
    made: list[str],
) -> tuple[str, int]:
    """Write the patch file of ``version`` under a temporary name (in ``made``): that
    name, and the patch bytes written."""
    earlier = {i: rows for i, (rows, _) in chained.items()}
    given = {i: (chained[i][1], bytes(data)) for i, data in patches.items()}
    head, placed, size = chains.encode(version, earlier, given)
    staged = table.file(f".patch-{token()}")
    made.append(staged)  # before it exists: an interrupt after the open leaves none
    fd = fds.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=table.store)
    writing.allocate(fd, size, table)
    segment.pwrite_all(fd, memoryview(head), 0)
    for offset, data in placed:
        segment.pwrite_all(fd, memoryview(data), offset)
    return staged, sum(len(data) for _, data in placed)


def _kinds(leaves: Sequence[segment.Leaf]) -> list[tuple[Any, tuple[int, ...]]]:
    return [(leaf.dtype, leaf.shape) for leaf in leaves]


def _held(old: bytes, plan: segment.Plan, where: str) -> list[int] | None:
    """The content versions (:func:`~varsync_shm.segment.content_versions`) of the
    retired version a claimed spare held, if its bytes are where ``plan`` puts them;
    ``None``: nothing in it is reused."""
    if not old:
        return None
    try:
        parsed = segment.parse_head(old, plan.size, where)
        if parsed.version == 0 or parsed.leaves != plan.leaves:
            return None
        return segment.content_versions(old, parsed, where)
    except CorruptDataError:
        return None


def _put(fd: int, target: np.ndarray | None, offset: int, raw: np.ndarray) -> None:
    if target is None:  # a new file: pwrite beats faulting its pages in through a mapping
        segment.pwrite_all(fd, raw.data, offset)
    else:  # a spare, through a mapping kept from earlier: at memcpy speed
        np.copyto(target[offset : offset + raw.size], raw)


def open_leaves(
    table: TableDir,
    pointer: str,
    version: int,
    newer_than: int,
    fds: Descriptors,
    mappings: Mappings,
    chosen: Collection[int] | None = None,
) -> tuple[list[int], Arrays, int] | None:
    """Leaf versions, the arrays of the leaves changed since ``newer_than`` (only those
    in ``chosen``, if given: ``read_leaf_subset``) and the bytes read, of segment
    ``pointer`` if it still holds ``version``; else ``None`` (it was retired and reused:
    read the link again). A leaf held as an anchor and its links is rebuilt whole (a
    copy)."""
    opened = _locked(table, pointer, version, fds)
    if opened is None:
        return None
    numbers, anchors = opened.numbers, opened.anchors
    changed = [
        i for i, n in enumerate(numbers) if n > newer_than and (chosen is None or i in chosen)
    ]
    arrays, read = _segment_leaves(table, opened, changed, newer_than, mappings)
    links = chains.Links(table, fds)
    try:
        for i in changed:
            if anchors[i]:
                held = arrays[i]
                assert held is not None
                arrays[i] = chains.rebuilt(links, i, numbers[i], anchors[i], held)
    except chains.Gone:
        retired_or_corrupt(table, pointer)
        return None
    return numbers, arrays, read + links.read


def open_patches(
    table: TableDir,
    pointer: str,
    version: int,
    newer_than: int,
    fds: Descriptors,
    mappings: Mappings,
) -> tuple[list[int], Leaves, int] | None:
    """:func:`open_leaves`, where a leaf held as an anchor and its links is given as a
    :class:`~varsync.backend.LeafChain`: its links since ``newer_than`` alone if the
    caller holds its anchor's version or later, else its anchor and every link."""
    opened = _locked(table, pointer, version, fds)
    if opened is None:
        return None
    numbers, anchors = opened.numbers, opened.anchors
    changed = [i for i, n in enumerate(numbers) if n > newer_than]
    behind = [i for i in changed if newer_than < anchors[i] or not anchors[i]]
    arrays, read = _segment_leaves(table, opened, behind, newer_than, mappings)
    leaves: Leaves = list(arrays)
    links = chains.Links(table, fds)
    try:
        for i in changed:
            if not anchors[i]:
                continue  # held whole: its array
            rows = links.chain(i, numbers[i], anchors[i])
            if newer_than < anchors[i]:  # behind its anchor
                leaves[i] = LeafChain(arrays[i], anchors[i], links.links(rows))
            else:
                since = [row for row in rows if row.version > newer_than]
                leaves[i] = LeafChain(None, 0, links.links(since))
    except chains.Gone:
        retired_or_corrupt(table, pointer)
        return None
    return numbers, leaves, read + links.read


def _segment_leaves(
    table: TableDir, opened: _Opened, indices: Sequence[int], newer_than: int, mappings: Mappings
) -> tuple[Arrays, int]:
    """The segment's bytes of the leaves at ``indices`` (ascending) as arrays, and the
    bytes read: views of the mapped segment over the mapping threshold, else copies."""
    leaves = opened.parsed.leaves
    arrays: Arrays = [None] * len(leaves)
    # A whole read maps what a pull maps; a delta read copies up to DELTA_MAP_ABOVE: the
    # caller keeps its other leaves, views pinning the segments where each last changed,
    # and with a view per changed leaf too no segment would be left for a push to refill.
    map_above = MAP_ABOVE if newer_than == 0 else DELTA_MAP_ABOVE
    mapped: np.ndarray | None = None
    run: list[int] = []  # neighbouring small leaves, read in one pread
    read = 0
    for i in [*indices, -1]:
        leaf = leaves[i] if i >= 0 else None
        if run and (leaf is None or i != run[-1] + 1 or leaf.nbytes > map_above):
            read += _copy_run(opened.fd, leaves, run, arrays)
            run = []
        if leaf is None:
            break
        if leaf.nbytes > map_above:  # a view that keeps fd's shared lock while it lives
            if mapped is None:
                mapped = mappings.pinned(table.rel, opened.fd, opened.size, opened.version)
            arrays[i] = segment.arrays_of(mapped, [leaf])[0]
            read += leaf.nbytes
        else:
            run.append(i)
    return arrays, read


def _copy_run(fd: int, leaves: Sequence[segment.Leaf], run: list[int], arrays: Arrays) -> int:
    first, last = leaves[run[0]], leaves[run[-1]]
    length = last.offset + last.nbytes - first.offset
    data = os.pread(fd, length, first.offset) if length else b""
    if len(data) != length:
        raise CorruptDataError(f"a segment ended {length - len(data)} bytes early")
    memory = np.frombuffer(data, np.uint8)
    for i in run:
        leaf = leaves[i]
        start = leaf.offset - first.offset
        moved = segment.Leaf(leaf.dtype, leaf.shape, start)
        arrays[i] = segment.arrays_of(memory, [moved])[0]
    return length


def versions_of(table: TableDir, pointer: str, version: int, fds: Descriptors) -> list[int] | None:
    """The leaf versions of segment ``pointer`` if it still holds ``version``."""
    opened = _locked(table, pointer, version, fds)
    return None if opened is None else opened.numbers


class _Opened(NamedTuple):
    fd: int
    size: int
    version: int
    parsed: segment.Parsed
    numbers: list[int]  # leaf versions
    anchors: list[int]  # anchor versions (0: held whole)


def _locked(table: TableDir, pointer: str, version: int, fds: Descriptors) -> _Opened | None:
    """Segment ``pointer`` open, shared-locked and holding ``version``, its head parsed;
    ``None`` if it no longer holds it."""
    where = table.where(pointer)
    fd = open_locked(table, pointer, fds)
    if fd is None:
        return None
    size = os.fstat(fd).st_size
    head = segment.read_head(fd, size)
    if len(head) >= segment.HEADER_SIZE and segment.version_in(head) != version:
        return None
    parsed = segment.parse_head(head, size, where)
    numbers = segment.leaf_versions(head, parsed, where)
    return _Opened(fd, size, version, parsed, numbers, segment.anchor_versions(head, parsed, where))
