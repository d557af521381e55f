"""How a push fills, publishes and reclaims segments (see :mod:`varsync_shm.backend`).

- **Writers never wait for readers.** Writers only ever *try* to lock a retired segment
  (``LOCK_NB``); one a reader holds is left alone and a new file is used instead. Writers
  wait for each other only for the few system calls of claiming and publishing.
- **A crashed reader leaves nothing locked.** Readers hold no lock but their flocks, which
  the kernel drops with the process.
- **A crashed or interrupted writer leaves the last complete version readable**, and no
  file: ``current`` only ever points at complete segments; a push removes the
  ``.fill-*`` and temporary names it made unless it renamed them, and the next writer
  deletes those of writers that died (their flock is gone). A fill file is created and
  locked only under the writers' lock, the one under which others are reclaimed, so no
  writer ever deletes a file another live writer fills.
- **Old versions are reclaimed.** After each push a retired segment no reader holds is
  kept as the one spare (its pages are reused: a push then costs a memory copy, not an
  allocation) or deleted. Deleted files a reader still maps are freed by the kernel when
  the reader drops them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Sequence

import numpy as np

from varsync.backend import BackendConnectionError, ItemTooLargeError, Spec
from varsync_shm import chains, layout, segment
from varsync_shm._fds import Descriptors
from varsync_shm._files import token, try_lock, unlink_all
from varsync_shm.mappings import Mappings
from varsync_shm.store import Epoch, TableDir

__all__ = ["write", "locked", "claim", "allocate", "publish", "reclaim", "pointer", "SPARES"]

SPARES = 1
"""Retired segments kept per table for reuse (besides the current one)."""

#: The table's epoch after checking its signature (the caller's own check); called under
#: the writers' lock, it raises if the table is gone or made again with another signature.
Checked = Callable[[TableDir], Epoch]


def locked(table: TableDir, fds: Descriptors) -> int:
    """The writers' lock, open (owned by ``fds``: closing it releases the lock) and held."""
    lock = fds.open(table.file(layout.LOCK), os.O_RDWR | os.O_CREAT, 0o600, dir_fd=table.store)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def write(
    table: TableDir,
    arrays: Sequence[np.ndarray],
    specs: Sequence[Spec],
    mappings: Mappings,
    checked: Checked,
) -> tuple[int, Epoch]:
    """Fill a segment with ``arrays`` and publish it as the table's next version: that
    version, and the epoch it was published in."""
    plan = segment.plan(specs)
    fds = Descriptors()
    made: list[str] = []  # names this push created: removed at the end unless renamed
    try:
        lock = locked(table, fds)
        checked(table)
        reclaim(table, pointer(table))
        fd, fresh, _ = claim(table, plan.size, fds, made)
        fcntl.flock(lock, fcntl.LOCK_UN)  # copy without it: writers fill in parallel
        if fresh:  # pages to allocate anyway: pwrite beats faulting them in
            allocate(fd, plan.size, table)
            segment.write(fd, plan, arrays)
        else:  # a spare: through a mapping kept from earlier, at memcpy speed
            segment.fill(mappings.get(table.rel, fd, plan.size, writable=True), plan, arrays)
        fcntl.flock(lock, fcntl.LOCK_EX)
        epoch = checked(table)  # it may have been made again meanwhile
        version = layout.version_named(pointer(table), table.path) + 1
        publish(table, fd, version, made)
        return version, epoch
    finally:
        # First (an interrupt may land in anything after it): the writers' lock and the
        # segment's go with their descriptors. A name left by an interrupt below is no
        # longer locked, so the next push deletes it.
        fds.close()
        unlink_all(table.store, made)


def publish(table: TableDir, fd: int, version: int, made: list[str]) -> None:
    """Publish the filled file ``fd`` (named ``made[0]``) as ``version`` and reclaim what
    it retires. Call under the writers' lock, with ``fd`` locked LOCK_EX."""
    # Readers may take their shared lock as soon as the link is renamed; only
    # writers, all excluded by the writers' lock, wanted LOCK_EX.
    store = table.store
    fcntl.flock(fd, fcntl.LOCK_SH)
    segment.set_version(fd, version)
    published = f"{layout.SEGMENT}{version}"
    os.rename(made[0], table.file(published), src_dir_fd=store, dst_dir_fd=store)
    link = table.file(f".link-{token()}")
    made.append(link)
    os.symlink(published, link, dir_fd=store)
    os.rename(link, table.file(layout.CURRENT), src_dir_fd=store, dst_dir_fd=store)
    reclaim(table, published)


def pointer(table: TableDir) -> str | None:
    """The segment ``current`` names (``None`` before the first push)."""
    try:
        return os.readlink(table.file(layout.CURRENT), dir_fd=table.store)
    except FileNotFoundError:
        return None


def claim(
    table: TableDir, size: int, fds: Descriptors, made: list[str], keep: int = 0
) -> tuple[int, bool, bytes]:
    """A file to fill, locked LOCK_EX and named ``made[0]`` (``.fill-*``): a spare if one
    is free, else a new one. Returns ``(fd, fresh, head)``: ``head``, the first ``keep``
    bytes a spare held before it was claimed (the retired version's header, index and
    leaf versions; ``b""`` for a new file). Call under the writers' lock."""
    store = table.store
    filling = table.file(f"{layout.FILL}{token()}")
    made.append(filling)  # before it exists: an interrupt after rename or open leaves none
    for entry in sorted(_list(table)):
        if not entry.startswith(layout.SPARE):
            continue
        try:
            os.rename(table.file(entry), filling, src_dir_fd=store, dst_dir_fd=store)
        except FileNotFoundError:
            continue
        candidate = Descriptors()
        try:
            fd = candidate.open(filling, os.O_RDWR | os.O_NOFOLLOW, dir_fd=store)
            if try_lock(fd, fcntl.LOCK_EX) and os.fstat(fd).st_size == size:
                head = os.pread(fd, keep, 0) if keep else b""
                segment.set_version(fd, 0)  # before any byte of the new version
                candidate.give(fd, fds)
                return fd, False, head
        finally:
            candidate.close()
        # A late reader still holds it: let the kernel free it when the reader is done.
        os.unlink(filling, dir_fd=store)
    fd = fds.open(filling, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=store)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, True, b""


def allocate(fd: int, size: int, table: TableDir) -> None:
    """Reserve the file's pages now, so a full /dev/shm is an error here and never a
    SIGBUS in a reader later."""
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:  # pragma: no cover - not Linux
            os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG):
            free = os.fstatvfs(fd)
            raise ItemTooLargeError(
                f"the file system of {table.path} has no room for a {size}-byte segment "
                f"of table {table.name!r} ({free.f_bavail * free.f_frsize} bytes free); "
                "nothing was published. "
                "Free space there (old stores: varsync_shm.remove_store), or enlarge "
                "the tmpfs."
            ) from None
        raise


def reclaim(table: TableDir, current: str | None) -> None:
    """Keep at most :data:`SPARES` free retired segments, delete the rest, what dead
    writers left behind and the patch files no segment left needs
    (:func:`varsync_shm.chains.reclaim`). Call under the writers' lock."""
    store = table.store
    spares = 0
    retired = []
    entries = _list(table)
    held = [] if current is None else [current]  # segments left: their chains stay
    for entry in sorted(entries):
        path = table.file(entry)
        if entry.startswith(layout.FILL):
            if _unused(store, path):  # its writer died: nobody holds its lock
                _unlink(store, path)
        elif entry.startswith(layout.TEMPORARY):
            _unlink(store, path)
        elif entry.startswith(layout.SPARE):
            spares += 1
        elif entry.startswith(layout.SEGMENT) and entry != current:
            retired.append(path)
    for path in retired:
        fds = Descriptors()
        try:
            try:  # non-blocking: a FIFO must not block
                fd = fds.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=store)
            except OSError:  # gone, or a link: not ours to lock
                continue
            if not try_lock(fd, fcntl.LOCK_EX):
                held.append(path.rpartition("/")[2])
                continue  # a reader holds it; a later push reclaims it
            if spares < SPARES:
                spare = table.file(f"{layout.SPARE}{token()}")
                os.rename(path, spare, src_dir_fd=store, dst_dir_fd=store)
                spares += 1
            else:
                os.unlink(path, dir_fd=store)
        finally:
            fds.close()
    chains.reclaim(table, entries, held)


def _list(table: TableDir) -> list[str]:
    fds = Descriptors()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.listdir(fds.open(table.rel, flags, dir_fd=table.store))
    except FileNotFoundError:
        raise BackendConnectionError(
            f"{table.path} was deleted during a push; create_table() it again"
        ) from None
    finally:
        fds.close()


def _unused(store: int, path: str) -> bool:
    fds = Descriptors()
    try:
        try:  # non-blocking: a FIFO must not block
            fd = fds.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=store)
        except OSError:  # gone, or a link: not ours to lock
            return False
        return try_lock(fd, fcntl.LOCK_EX)
    finally:
        fds.close()


def _unlink(store: int, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path, dir_fd=store)
