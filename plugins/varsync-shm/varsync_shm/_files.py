"""Small file operations every part of the plugin uses on the files varsync-shm makes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Sequence

from varsync.backend import CorruptDataError
from varsync_shm._fds import Descriptors

__all__ = ["open_regular", "try_lock", "token", "unlink_all", "write_all"]


def token() -> str:
    """A random name part, for files that must not collide."""
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
    """Take flock ``kind`` on ``fd`` without waiting; whether it was taken."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` at ``fd``'s position."""
    view = memoryview(data)
    while view:  # bounded: each pass writes at least one byte or raises
        view = view[os.write(fd, view) :]


def unlink_all(directory: int, names: Sequence[str]) -> None:
    """Remove what a call made and did not publish (names it renamed are gone already)."""
    for name in names:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, OSError):
            os.unlink(name, dir_fd=directory)
