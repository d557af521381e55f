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
- **A delta pull** (:func:`read_leaves`) reads, under the segment's shared lock and after
  checking its version as a whole pull does, the head and only the leaves changed since
  the version the caller holds: leaves over :data:`DELTA_MAP_ABOVE` bytes (over
  :data:`~varsync_shm.reading.MAP_ABOVE` for a read of every leaf, as a pull) as read-only
  views of the mapped segment (which keep its shared lock while they live), the others
  copied, neighbours in one ``pread``: a held nest then pins no segment per changed
  leaf. It checks afterwards that the table's ``signature.json`` is still the one it
  checked first: a table made again meanwhile is
  looked at again (and is a reset for a holder), never answered from.
- **Leaf versions** (:func:`leaf_versions`) read one segment's head: a few system calls.

A leaf unchanged for any number of versions is in every segment, so reclaiming segments
never loses it. ``details()`` counts the bytes this backend's partial pushes copied and
its delta pulls read, per table (``leaf_bytes_written``, ``leaf_bytes_read``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from varsync.backend import (
    CorruptDataError,
    LeafSnapshot,
    PullTimeoutError,
    Spec,
    deadline_after,
    remaining,
    reset_error,
)
from varsync_shm import layout, segment, writing
from varsync_shm._fds import Descriptors
from varsync_shm.epochs import epoch_now
from varsync_shm.reading import MAP_ABOVE, READ_ATTEMPTS, current_segment, version_of
from varsync_shm.writing import LOCK, open_regular, try_lock

#: A delta read (``newer_than`` > 0) copies changed leaves up to this size rather than
#: mapping them: 16 MiB copies in a few ms, and a held copy pins no segment.
DELTA_MAP_ABOVE = 16 << 20

if TYPE_CHECKING:  # pragma: no cover
    from varsync_shm.backend import ShmBackend

__all__ = ["write_leaves", "read_leaves", "leaf_versions", "DELTA_MAP_ABOVE"]

Arrays = list[Optional[np.ndarray]]


def write_leaves(
    backend: ShmBackend,
    name: str,
    store: int,
    rel: str,
    leaves: Mapping[int, np.ndarray],
    specs: Sequence[Spec],
    base: int | None,
) -> int:
    """Publish the current version with ``leaves`` replaced as the next version; 0 (and
    nothing written) if the table is empty, or ``base`` is not its current version in the
    history this backend last wrote or read."""
    plan = segment.plan(specs)
    for index in leaves:
        if not 0 <= index < len(plan.leaves):
            raise IndexError(
                f"write_leaves: leaf index {index} of table {name!r} is not in 0..."
                f"{len(plan.leaves) - 1} (its signature has {len(plan.leaves)} leaves)"
            )
    fds = Descriptors()
    made: list[str] = []  # names this push created: removed at the end unless renamed
    try:
        lock = fds.open(f"{rel}/{LOCK}", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=store)
        fcntl.flock(lock, fcntl.LOCK_EX)  # held to the publish: see the module docstring
        epoch = backend.check_signature(name, store, rel)
        pointer = writing.pointer(store, rel)
        version = writing.version_named(rel, pointer)
        handed = backend.handed.get(name)
        trusted = None if handed is None else handed.epoch
        if version == 0 or (base is not None and (base != version or trusted != epoch)):
            return 0
        assert pointer is not None
        where = f"{layout.table_path(backend.path, name)}/{pointer}"
        source = open_regular(f"{rel}/{pointer}", os.O_RDONLY, fds, dir_fd=store, where=where)
        size = os.fstat(source).st_size
        head = segment.read_head(source, size)
        current = segment.parse_head(head, size, where)
        if current.version != version or _kinds(current.leaves) != _kinds(plan.leaves):
            raise CorruptDataError(
                f"{where} holds version {current.version} with {len(current.leaves)} leaves; "
                f"expected version {version} with the {len(plan.leaves)} of the signature"
            )
        now = segment.leaf_versions(head, current, where)
        writing.reclaim(store, rel, pointer)
        fd, fresh, old = writing.claim(store, rel, plan.size, fds, made, len(plan.head))
        held = _held(old, plan, where)  # what the spare holds already, leaf by leaf
        new = version + 1
        wanted = [new if i in leaves else now[i] for i in range(len(plan.leaves))]
        if fresh:
            writing.allocate(fd, plan.size, backend.root, rel)
            target = None
        else:
            target = np.frombuffer(backend.writable_mapping(rel, fd, plan.size), np.uint8)
        mapping = backend.mappings.get(rel, source, size, writable=False)
        from_current = np.frombuffer(mapping, np.uint8)
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
        writing.publish(store, rel, fd, new, made)
        backend.saw(name, epoch, new)
        _count(backend, name, "leaf_bytes_written", copied)
        return new
    finally:
        fds.close()  # first: it releases the writers' lock and the segments' locks
        writing.unlink_all(store, made)


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


def read_leaves(
    backend: ShmBackend, name: str, newer_than: int, timeout: float | None
) -> LeafSnapshot:
    """``(version, leaf versions, arrays changed since newer_than)``, as the protocol says."""
    deadline = deadline_after(timeout)
    for _ in range(READ_ATTEMPTS):  # a retry when the segment was being replaced
        store, rel, epoch = backend.table_epoch(name, held=newer_than)
        if store < 0:
            return 0, None, None  # vanished: reads as empty; holders get TableResetError
        handed = backend.handed.get(name)
        if handed is not None and epoch is not None and handed.older(epoch, newer_than):
            raise reset_error(
                name,
                backend.url,
                newer_than,
                why="this container read or wrote version "
                f"{newer_than} of the table's earlier history, not of its current one",
            )
        pointer = current_segment(store, rel, backend.store_path)
        version = version_of(rel, pointer, backend.store_path)
        if version <= newer_than:
            backend.saw(name, epoch)
            return version, None, None
        assert pointer is not None
        fds = Descriptors()
        try:
            got = _open(backend, rel, store, pointer, version, newer_than, fds)
        finally:
            fds.close()
        if got is not None and epoch_now(store, rel) == epoch:
            numbers, arrays, read = got
            backend.saw(name, epoch, version)
            _count(backend, name, "leaf_bytes_read", read)
            return version, numbers, arrays
        if remaining(deadline) <= 0:
            raise PullTimeoutError(
                f"table {name!r} in {backend.url}: no stable copy of version {version} "
                f"within {timeout} s (it was being replaced); pull again"
            )
    raise _unstable(backend, name)


def _open(
    backend: ShmBackend,
    rel: str,
    store: int,
    pointer: str,
    version: int,
    newer_than: int,
    fds: Descriptors,
) -> tuple[list[int], Arrays, int] | None:
    """Leaf versions, changed arrays and bytes read of segment ``pointer`` if it still
    holds ``version``, else ``None`` (it was retired and reused: read the link again)."""
    opened = _locked(backend, rel, store, pointer, version, fds)
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
                mapped = backend.mappings.pinned(rel, fd, size, version)
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


def _locked(
    backend: ShmBackend, rel: str, store: int, pointer: str, version: int, fds: Descriptors
) -> tuple[int, int, bytes, segment.Parsed, str] | None:
    """Segment ``pointer`` open, shared-locked and holding ``version``: ``(fd, size, head,
    parsed head, path)``; ``None`` if it no longer holds it."""
    where = f"{backend.store_path}/{rel}/{pointer}"  # for messages
    try:
        fd = open_regular(f"{rel}/{pointer}", os.O_RDONLY, fds, dir_fd=store, where=where)
    except FileNotFoundError:
        if current_segment(store, rel, backend.store_path) == pointer:
            raise CorruptDataError(f"{where} is named by current but missing") from None
        return None
    if not try_lock(fd, fcntl.LOCK_SH):
        return None  # a writer is refilling it: it is no longer current
    size = os.fstat(fd).st_size
    head = segment.read_head(fd, size)
    if len(head) >= segment.HEADER_SIZE and segment.version_in(head) != version:
        return None
    return fd, size, head, segment.parse_head(head, size, where), where


def leaf_versions(backend: ShmBackend, name: str) -> tuple[int, list[int]]:
    """The current version and its leaf versions, from its segment's head."""
    for _ in range(READ_ATTEMPTS):  # a retry when the segment was being replaced
        store, rel, _ = backend.table_epoch(name)
        pointer = None if store < 0 else current_segment(store, rel, backend.store_path)
        if pointer is None:
            return 0, []  # empty (the core knows how many leaves: all at 0)
        version = version_of(rel, pointer, backend.store_path)
        fds = Descriptors()
        try:
            opened = _locked(backend, rel, store, pointer, version, fds)
            if opened is not None:
                _, _, head, parsed, where = opened
                return version, segment.leaf_versions(head, parsed, where)
        finally:
            fds.close()
    raise _unstable(backend, name)


def _unstable(backend: ShmBackend, name: str) -> CorruptDataError:
    return CorruptDataError(
        f"table {name!r} at {layout.table_path(backend.path, name)}: {READ_ATTEMPTS} "
        "attempts found no stable segment; is a foreign process locking its files?"
    )


def _count(backend: ShmBackend, name: str, counter: str, nbytes: int) -> None:
    backend.leaf_bytes.setdefault(name, counters())[counter] += nbytes


def counters() -> dict[str, int]:
    """The byte counters ``details()`` shows, before any partial push or delta pull."""
    return {"leaf_bytes_written": 0, "leaf_bytes_read": 0}
