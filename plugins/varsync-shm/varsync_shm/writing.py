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
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from varsync.backend import BackendConnectionError, CorruptDataError, ItemTooLargeError, Spec
from varsync_shm import segment
from varsync_shm._fds import Descriptors

if TYPE_CHECKING:  # pragma: no cover
    from varsync_shm.backend import ShmBackend

__all__ = [
    "write",
    "claim",
    "allocate",
    "publish",
    "reclaim",
    "pointer",
    "version_named",
    "open_regular",
    "try_lock",
    "token",
    "unlink_all",
    "SPARES",
]

SPARES = 1
"""Retired segments kept per table for reuse (besides the current one)."""

SIGNATURE = "signature.json"
LOCK = "lock"
CURRENT = "current"
SEGMENT = "seg-"
SPARE = "spare-"
FILL = ".fill-"
SEGMENTS = (SEGMENT, SPARE, FILL)
_TEMPORARY = (".link-", ".sig-")  # made and renamed only under the writers' lock


def token() -> str:
    return os.urandom(8).hex()


def open_regular(path: str, flags: int, fds: Descriptors, *, dir_fd: int, where: str = "") -> int:
    """Open a file varsync-shm made (owned by ``fds``): anything else in its place (a
    link, a directory, a FIFO, which would block the open) is ``CorruptDataError``."""
    try:
        fd = fds.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        raise CorruptDataError(
            f"{where or path} is not a regular file; is something else writing in this store?"
        )
    return fd


def try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlink_all(store: int, names: Sequence[str]) -> None:
    """Remove what a call made and did not publish (names it renamed are gone already)."""
    for name in names:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, OSError):
            os.unlink(name, dir_fd=store)


def write(
    backend: ShmBackend,
    name: str,
    store: int,
    rel: str,
    arrays: Sequence[np.ndarray],
    specs: Sequence[Spec],
) -> int:
    """Fill a segment with ``arrays`` and publish it as the table's next version."""
    plan = segment.plan(specs)
    fds = Descriptors()
    made: list[str] = []  # names this push created: removed at the end unless renamed
    try:
        lock = fds.open(f"{rel}/{LOCK}", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=store)
        fcntl.flock(lock, fcntl.LOCK_EX)
        backend.check_signature(name, store, rel)
        reclaim(store, rel, pointer(store, rel))
        fd, fresh, _ = claim(store, rel, plan.size, fds, made)
        fcntl.flock(lock, fcntl.LOCK_UN)  # copy without it: writers fill in parallel
        if fresh:  # pages to allocate anyway: pwrite beats faulting them in
            allocate(fd, plan.size, backend.root, rel)
            segment.write(fd, plan, arrays)
        else:  # a spare: through a mapping kept from earlier, at memcpy speed
            segment.fill(backend.writable_mapping(rel, fd, plan.size), plan, arrays)
        fcntl.flock(lock, fcntl.LOCK_EX)
        epoch = backend.check_signature(name, store, rel)  # it may have been made again
        version = version_named(rel, pointer(store, rel)) + 1
        publish(store, rel, fd, version, made)
        backend.saw(name, epoch, version)
        return version
    finally:
        # First (an interrupt may land in anything after it): the writers' lock and the
        # segment's go with their descriptors. A name left by an interrupt below is no
        # longer locked, so the next push deletes it.
        fds.close()
        unlink_all(store, made)


def publish(store: int, rel: str, fd: int, version: int, made: list[str]) -> None:
    """Publish the filled file ``fd`` (named ``made[0]``) as ``version`` and reclaim what
    it retires. Call under the writers' lock, with ``fd`` locked LOCK_EX."""
    # Readers may take their shared lock as soon as the link is renamed; only
    # writers, all excluded by the writers' lock, wanted LOCK_EX.
    fcntl.flock(fd, fcntl.LOCK_SH)
    segment.set_version(fd, version)
    published = f"{SEGMENT}{version}"
    os.rename(made[0], f"{rel}/{published}", src_dir_fd=store, dst_dir_fd=store)
    link = f"{rel}/.link-{token()}"
    made.append(link)
    os.symlink(published, link, dir_fd=store)
    os.rename(link, f"{rel}/{CURRENT}", src_dir_fd=store, dst_dir_fd=store)
    reclaim(store, rel, published)


def pointer(store: int, rel: str) -> str | None:
    """The segment ``current`` names (``None`` before the first push)."""
    try:
        return os.readlink(f"{rel}/{CURRENT}", dir_fd=store)
    except FileNotFoundError:
        return None


def version_named(rel: str, entry: str | None) -> int:
    """The version a segment's name says (0 for ``None``)."""
    if entry is None:
        return 0
    digits = entry[len(SEGMENT) :]
    if not entry.startswith(SEGMENT) or not digits.isdigit():
        raise CorruptDataError(f"{rel}/{CURRENT} points to {entry!r}, not a segment")
    return int(digits)


def claim(
    store: int, rel: str, size: int, fds: Descriptors, made: list[str], keep: int = 0
) -> tuple[int, bool, bytes]:
    """A file to fill, locked LOCK_EX and named ``made[0]`` (``.fill-*``): a spare if one
    is free, else a new one. Returns ``(fd, fresh, head)``: ``head``, the first ``keep``
    bytes a spare held before it was claimed (the retired version's header, index and
    leaf versions; ``b""`` for a new file). Call under the writers' lock."""
    filling = f"{rel}/{FILL}{token()}"
    made.append(filling)  # before it exists: an interrupt after rename or open leaves none
    for entry in sorted(_list(store, rel)):
        if not entry.startswith(SPARE):
            continue
        try:
            os.rename(f"{rel}/{entry}", filling, src_dir_fd=store, dst_dir_fd=store)
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


def allocate(fd: int, size: int, root: str, rel: str) -> None:
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
                f"{root} has no room for a {size}-byte segment of {rel} "
                f"({free.f_bavail * free.f_frsize} bytes free); nothing was published. "
                "Free space there (old stores: varsync_shm.remove_store), or enlarge "
                "the tmpfs."
            ) from None
        raise


def reclaim(store: int, rel: str, current: str | None) -> None:
    """Keep at most :data:`SPARES` free retired segments, delete the rest and what
    dead writers left behind. Call under the writers' lock."""
    spares = 0
    retired = []
    for entry in sorted(_list(store, rel)):
        path = f"{rel}/{entry}"
        if entry.startswith(FILL):
            if _unused(store, path):  # its writer died: nobody holds its lock
                _unlink(store, path)
        elif entry.startswith(_TEMPORARY):
            _unlink(store, path)
        elif entry.startswith(SPARE):
            spares += 1
        elif entry.startswith(SEGMENT) and entry != current:
            retired.append(path)
    for path in retired:
        fds = Descriptors()
        try:
            try:  # non-blocking: a FIFO must not block
                fd = fds.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=store)
            except OSError:  # gone, or a link: not ours to lock
                continue
            if not try_lock(fd, fcntl.LOCK_EX):
                continue  # a reader holds it; a later push reclaims it
            if spares < SPARES:
                os.rename(path, f"{rel}/{SPARE}{token()}", src_dir_fd=store, dst_dir_fd=store)
                spares += 1
            else:
                os.unlink(path, dir_fd=store)
        finally:
            fds.close()


def _list(store: int, rel: str) -> list[str]:
    fds = Descriptors()
    try:
        return os.listdir(fds.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=store))
    except FileNotFoundError:
        raise BackendConnectionError(
            f"{rel} was deleted during a push; create_table() it again"
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
