"""What a pull reads of a table (:class:`~varsync_shm.store.TableDir`): the segment
``current`` names, and that segment's arrays.

A segment is read only under a *shared* flock taken without waiting, and only if its
header still names the version the link named: a writer refills a segment only under an
exclusive flock and zeroes its version first, so what is read is exactly one version.
Segments larger than :data:`MAP_ABOVE` bytes are mapped, not copied
(:mod:`varsync_shm.mappings`). A leaf the segment holds as an anchor and its links
(:mod:`varsync_shm.chains`) is rebuilt whole: a copy, until the next whole write of it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Any

import numpy as np

from varsync.backend import CorruptDataError
from varsync_shm import chains, layout, segment
from varsync_shm._fds import Descriptors
from varsync_shm._files import open_regular, try_lock
from varsync_shm.mappings import Mappings
from varsync_shm.store import TableDir

__all__ = [
    "MAP_ABOVE",
    "READ_ATTEMPTS",
    "current_segment",
    "current_version",
    "open_locked",
    "open_version",
    "retired_or_corrupt",
]

MAP_ABOVE = 1 << 20
"""Segments larger than this many bytes are mapped by pulls instead of copied."""
READ_ATTEMPTS = 1000
"""Looks at ``current`` a pull makes before it calls the table corrupt (a retry each time
the segment it named was retired and reused meanwhile)."""


def current_segment(table: TableDir) -> str | None:
    """The segment ``current`` names, or ``None`` before the first push."""
    try:
        return os.readlink(table.file(layout.CURRENT), dir_fd=table.store)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link
            raise CorruptDataError(
                f"{table.where(layout.CURRENT)} is not a varsync-shm link"
            ) from None
        raise


def current_version(table: TableDir) -> int:
    """The version ``current`` names; 0 before the first push."""
    return layout.version_named(current_segment(table), table.path)


def open_locked(table: TableDir, pointer: str, fds: Descriptors) -> int | None:
    """Segment ``pointer`` open (owned by ``fds``) and shared-locked; ``None`` if it is
    gone or a writer is refilling it (it was retired meanwhile: the caller reads the link
    again). The caller checks that it holds the version the link named."""
    where = table.where(pointer)
    try:
        fd = open_regular(table.file(pointer), os.O_RDONLY, fds, dir_fd=table.store, where=where)
    except FileNotFoundError:
        if current_segment(table) == pointer:
            raise CorruptDataError(f"{where} is named by current but missing") from None
        return None
    if not try_lock(fd, fcntl.LOCK_SH):
        return None  # a writer is refilling it: it is no longer current
    return fd


def open_version(
    table: TableDir, pointer: str, version: int, fds: Descriptors, mappings: Mappings
) -> list[np.ndarray] | None:
    """The arrays of segment ``pointer`` if it still holds ``version``, else ``None``."""
    fd = open_locked(table, pointer, fds)
    if fd is None or segment.read_version(fd) != version:
        return None
    size = os.fstat(fd).st_size
    buffer: Any
    if size > MAP_ABOVE:  # a view that keeps fd's shared lock (a pin) while it lives
        buffer = mappings.pinned(table.rel, fd, size, version)
        memory = buffer
    else:
        buffer = os.pread(fd, size, 0)
        memory = np.frombuffer(buffer, np.uint8, size)
    where = table.where(pointer)
    parsed = segment.parse(buffer, size, where)
    # Every pulled array is a view of `memory`: while one lives, so does its pin.
    arrays = segment.arrays_of(memory, parsed.leaves)
    anchors = segment.anchor_versions(buffer, parsed, where)
    if any(anchors):
        numbers = segment.leaf_versions(buffer, parsed, where)
        links = chains.Links(table, fds)
        try:
            for i, anchor in enumerate(anchors):
                if anchor:
                    arrays[i] = chains.rebuilt(links, i, numbers[i], anchor, arrays[i])
        except chains.Gone:
            retired_or_corrupt(table, pointer)
            return None
    return arrays


def retired_or_corrupt(table: TableDir, pointer: str) -> None:
    """For a read that found a patch file of segment ``pointer`` gone: nothing if the
    segment is no longer current (it was retired and its patch files reclaimed: read the
    link again); else :class:`CorruptDataError`."""
    if current_segment(table) == pointer:
        raise CorruptDataError(
            f"{table.where(pointer)} is current, but a patch file its chains name is missing"
        )
