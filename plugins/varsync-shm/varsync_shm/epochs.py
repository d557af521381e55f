"""What identifies one history of a table: its ``signature.json`` file.

That file is written once, by rename, when the table is made; a table made again (its
directory deleted and made anew) has another one. Its identity is the *epoch* the
backend keeps in a :class:`~varsync.backend.Histories`, and the one a partial push
(:mod:`varsync_shm.leaves`) checks it composes on.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple, Optional

from varsync_shm.writing import SIGNATURE

__all__ = ["Identity", "identity_of", "epoch_now", "table_exists"]


class Identity(NamedTuple):
    """Device, inode and modification time of one ``signature.json``."""

    device: int
    inode: int
    mtime_ns: int

    def __str__(self) -> str:  # for reset messages
        return f"signature.json inode {self.inode}"


def identity_of(status: os.stat_result) -> Identity:
    return Identity(status.st_dev, status.st_ino, status.st_mtime_ns)


def epoch_now(store: int, rel: str) -> Optional[Identity]:
    """The identity of the table's ``signature.json`` now (``None``: there is none)."""
    try:
        return identity_of(os.stat(f"{rel}/{SIGNATURE}", dir_fd=store, follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return None


def table_exists(store: int, rel: str) -> bool:
    """Whether the table's directory exists (a push into a deleted one is an error)."""
    try:
        return stat.S_ISDIR(os.stat(rel, dir_fd=store, follow_symlinks=False).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
