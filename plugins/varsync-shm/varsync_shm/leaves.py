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
- **Leaf versions** (:func:`versions_of`) read one segment's head: a few system calls.

A leaf unchanged for any number of versions is in every segment, so reclaiming segments
never loses it. The functions here return the bytes they copied or read, which
``details()`` counts per table (``leaf_bytes_written``, ``leaf_bytes_read``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from varsync.backend import CorruptDataError, Head, Spec
from varsync_shm import layout, segment, writing
from varsync_shm._fds import Descriptors
from varsync_shm._files import open_regular, unlink_all
from varsync_shm.mappings import Mappings
from varsync_shm.reading import MAP_ABOVE, open_locked
from varsync_shm.store import TableDir

#: A delta read (``newer_than`` > 0) copies changed leaves up to this size rather than
#: mapping them: 16 MiB copies in a few ms, and a held copy pins no segment.
DELTA_MAP_ABOVE = 16 << 20

__all__ = ["write_leaves", "open_leaves", "versions_of", "DELTA_MAP_ABOVE"]

Arrays = list[Optional[np.ndarray]]


def write_leaves(
    table: TableDir,
    leaves: Mapping[int, np.ndarray],
    specs: Sequence[Spec],
    base: Head | None,
    mappings: Mappings,
    checked: writing.Checked,
) -> tuple[Head, int] | None:
    """Publish the current version with ``leaves`` replaced as the next version: its head
    and the bytes copied. ``None`` (and nothing written) if the table is empty, or its
    head is not ``base``."""
    plan = segment.plan(specs)
    for index in leaves:
        if not 0 <= index < len(plan.leaves):
            raise IndexError(
                f"write_leaves: leaf index {index} of table {table.name!r} is not in 0..."
                f"{len(plan.leaves) - 1} (its signature has {len(plan.leaves)} leaves)"
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
        writing.reclaim(table, pointer)
        fd, fresh, old = writing.claim(table, plan.size, fds, made, len(plan.head))
        held = _held(old, plan, where)  # what the spare holds already, leaf by leaf
        new = version + 1
        wanted = [new if i in leaves else now[i] for i in range(len(plan.leaves))]
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
            elif held is None or held[i] != now[i]:
                start = current.leaves[i].offset
                raw = from_current[start : start + leaf.nbytes]
            else:
                continue  # the spare holds this leaf's current value
            _put(fd, target, leaf.offset, raw)
            copied += leaf.nbytes
        segment.pwrite_all(fd, memoryview(segment.head_with(plan, wanted, new)), 0)
        writing.publish(table, fd, new, made)
        return Head(new, epoch), copied
    finally:
        fds.close()  # first: it releases the writers' lock and the segments' locks
        unlink_all(table.store, made)


def _kinds(leaves: Sequence[segment.Leaf]) -> list[tuple[Any, tuple[int, ...]]]:
    return [(leaf.dtype, leaf.shape) for leaf in leaves]


def _held(old: bytes, plan: segment.Plan, where: str) -> list[int] | None:
    """The leaf versions of the retired version a claimed spare held, if its bytes are
    where ``plan`` puts them; ``None``: nothing in it is reused."""
    if not old:
        return None
    try:
        parsed = segment.parse_head(old, plan.size, where)
        if parsed.version == 0 or parsed.leaves != plan.leaves:
            return None
        return segment.leaf_versions(old, parsed, where)
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
) -> tuple[list[int], Arrays, int] | None:
    """Leaf versions, the arrays of the leaves changed since ``newer_than`` and the bytes
    read, of segment ``pointer`` if it still holds ``version``; else ``None`` (it was
    retired and reused: read the link again)."""
    opened = _locked(table, pointer, version, fds)
    if opened is None:
        return None
    fd, size, head, parsed, where = opened
    numbers = segment.leaf_versions(head, parsed, where)
    arrays: Arrays = [None] * len(numbers)
    changed = [i for i, n in enumerate(numbers) if n > newer_than]
    # A whole read maps what a pull maps; a delta read copies up to DELTA_MAP_ABOVE: the
    # caller keeps its other leaves, views pinning the segments where each last changed,
    # and with a view per changed leaf too no segment would be left for a push to refill.
    map_above = MAP_ABOVE if newer_than == 0 else DELTA_MAP_ABOVE
    mapped: np.ndarray | None = None
    run: list[int] = []  # neighbouring small leaves, read in one pread
    read = 0
    for i in changed + [-1]:
        leaf = parsed.leaves[i] if i >= 0 else None
        if run and (leaf is None or i != run[-1] + 1 or leaf.nbytes > map_above):
            read += _copy_run(fd, parsed.leaves, run, arrays)
            run = []
        if leaf is None:
            break
        if leaf.nbytes > map_above:  # a view that keeps fd's shared lock while it lives
            if mapped is None:
                mapped = mappings.pinned(table.rel, fd, size, version)
            arrays[i] = segment.arrays_of(mapped, [leaf])[0]
            read += leaf.nbytes
        else:
            run.append(i)
    return numbers, arrays, read


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
    if opened is None:
        return None
    _, _, head, parsed, where = opened
    return segment.leaf_versions(head, parsed, where)


def _locked(
    table: TableDir, pointer: str, version: int, fds: Descriptors
) -> tuple[int, int, bytes, segment.Parsed, str] | None:
    """Segment ``pointer`` open, shared-locked and holding ``version``: ``(fd, size, head,
    parsed head, path)``; ``None`` if it no longer holds it."""
    where = table.where(pointer)
    fd = open_locked(table, pointer, fds)
    if fd is None:
        return None
    size = os.fstat(fd).st_size
    head = segment.read_head(fd, size)
    if len(head) >= segment.HEADER_SIZE and segment.version_in(head) != version:
        return None
    return fd, size, head, segment.parse_head(head, size, where), where
