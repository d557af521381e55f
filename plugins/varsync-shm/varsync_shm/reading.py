"""What a pull reads of a table (see :mod:`varsync_shm.backend` for the files): its
``signature.json``, the segment ``current`` names, and that segment's arrays.

A segment is read only under a *shared* flock taken without waiting, and only if its
header still names the version the link named: a writer refills a segment only under an
exclusive flock and zeroes its version first, so what is read is exactly one version.
Segments larger than :data:`MAP_ABOVE` bytes are mapped, not copied
(:mod:`varsync_shm.mappings`).

``store`` is the descriptor of the store's checked directory, ``rel`` the table's
directory relative to it and ``store_path`` the store's path, for messages only.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Any

import numpy as np

from varsync.backend import CorruptDataError
from varsync_shm import segment
from varsync_shm._fds import Descriptors
from varsync_shm.mappings import Mappings
from varsync_shm.writing import CURRENT, SEGMENT, SIGNATURE, open_regular, try_lock

__all__ = [
    "MAP_ABOVE",
    "read_signature",
    "current_segment",
    "current_version",
    "version_of",
    "open_version",
    "READ_ATTEMPTS",
]

MAP_ABOVE = 1 << 20
"""Segments larger than this many bytes are mapped by pulls instead of copied."""
READ_ATTEMPTS = 1000
"""Looks at ``current`` a pull makes before it calls the table corrupt (a retry each time
the segment it named was retired and reused meanwhile)."""
_SIGNATURE_MAX = 64 << 20  # bytes: a signature.json larger than this is not one


def read_signature(store: int, rel: str, fds: Descriptors, store_path: str) -> str | None:
    """The text of the table's ``signature.json``, or ``None`` if there is none."""
    path = f"{store_path}/{rel}/{SIGNATURE}"  # for messages
    try:
        fd = open_regular(f"{rel}/{SIGNATURE}", os.O_RDONLY, fds, dir_fd=store, where=path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    size = os.fstat(fd).st_size
    if size > _SIGNATURE_MAX:
        raise CorruptDataError(f"{path} is {size} bytes, too large to be a signature")
    data = os.pread(fd, size + 1, 0)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptDataError(f"{path} is not text, so not a signature") from None


def current_segment(store: int, rel: str, store_path: str) -> str | None:
    """The segment ``current`` names, or ``None`` before the first push."""
    try:
        return os.readlink(f"{rel}/{CURRENT}", dir_fd=store)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link
            raise CorruptDataError(
                f"{store_path}/{rel}/{CURRENT} is not a varsync-shm link"
            ) from None
        raise


def current_version(store: int, rel: str, store_path: str) -> int:
    """The version ``current`` names; 0 before the first push."""
    return version_of(rel, current_segment(store, rel, store_path), store_path)


def version_of(rel: str, pointer: str | None, store_path: str) -> int:
    """The version segment name ``pointer`` names; 0 for ``None`` (no push yet)."""
    if pointer is None:
        return 0
    digits = pointer[len(SEGMENT) :]
    if not pointer.startswith(SEGMENT) or not digits.isdigit():
        raise CorruptDataError(f"{store_path}/{rel}/{CURRENT} points to {pointer!r}, not a segment")
    return int(digits)


def open_version(
    store: int,
    rel: str,
    pointer: str,
    version: int,
    fds: Descriptors,
    mappings: Mappings,
    store_path: str,
) -> list[np.ndarray] | None:
    """The arrays of segment ``pointer`` if it still holds ``version``, else ``None``
    (it was retired and reused meanwhile: the caller reads the link again)."""
    path = f"{store_path}/{rel}/{pointer}"  # for messages
    try:
        fd = open_regular(f"{rel}/{pointer}", os.O_RDONLY, fds, dir_fd=store, where=path)
    except FileNotFoundError:
        if current_segment(store, rel, store_path) == pointer:
            raise CorruptDataError(
                f"{store_path}/{rel}/{CURRENT} points to {pointer}, which is missing"
            ) from None
        return None
    if not try_lock(fd, fcntl.LOCK_SH):
        return None  # a writer is refilling it: it is no longer current
    if segment.read_version(fd) != version:
        return None
    size = os.fstat(fd).st_size
    buffer: Any
    if size > MAP_ABOVE:  # a view that keeps fd's shared lock (a pin) while it lives
        buffer = mappings.pinned(rel, fd, size, version)
        memory = buffer
    else:
        buffer = os.pread(fd, size, 0)
        memory = np.frombuffer(buffer, np.uint8, size)
    parsed = segment.parse(buffer, size, path)
    # Every pulled array is a view of `memory`: while one lives, so does its pin.
    return segment.arrays_of(memory, parsed.leaves)
