"""What identifies one history of a table: its ``signature.json`` file.

That file is written once, by rename, when the table is made; a table made again (its
directory deleted and made anew) has another one. Its identity is the *epoch* the
backend keeps in a :class:`~varsync.backend.Histories`, and the one a partial push
(:mod:`varsync_shm.leaves`) checks it composes on.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from varsync_shm.writing import SIGNATURE

__all__ = ["Identity", "identity_of", "epoch_now", "table_exists", "Handed", "record"]


class Identity(NamedTuple):
    """Device, inode and modification time of one ``signature.json``."""

    device: int
    inode: int
    mtime_ns: int

    def __str__(self) -> str:  # for reset messages
        return f"signature.json inode {self.inode}"


def identity_of(status: os.stat_result) -> Identity:
    return Identity(status.st_dev, status.st_ino, status.st_mtime_ns)


def epoch_now(store: int, rel: str) -> Identity | None:
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


class Handed:
    """What one backend handed out of one table: the history (``epoch``) it last wrote or
    read, the highest version it returned in it (``top``), the highest it returned in any
    earlier history (``retired``), and which versions up to ``retired`` it returned in
    this one (``low``: a version below ``retired`` not in it is of an earlier history).

    :class:`~varsync.backend.Histories` tells a holder of an old version that the table
    restarted only until this backend adopts the new history (a pull from version 0 does):
    after that a holder of version 3 of the old one asks with a number that also means
    something in the new one. A whole value is still never a mix, but a delta pull would
    assemble leaves of two histories, so :func:`varsync_shm.leaves.read_leaves` asks
    :meth:`older` first.
    """

    __slots__ = ("epoch", "low", "retired", "top")

    def __init__(self, epoch: Identity, retired: int = 0) -> None:
        self.epoch = epoch
        self.top = 0
        self.retired = retired
        self.low: set[int] = set()

    def older(self, epoch: Identity | None, held: int) -> bool:
        """Whether a caller holding version ``held`` (> 0) holds it of an earlier history
        than ``epoch``, the table's now: this backend returned ``held`` in an earlier one
        and never in this one."""
        if epoch != self.epoch:
            return held > 0
        return 0 < held <= self.retired and held not in self.low


def record(handed: dict[str, Handed], name: str, epoch: Identity | None, version: int) -> None:
    """Note that a write or read of table ``name`` returned ``version`` (0: none) of the
    history ``epoch``."""
    if epoch is None:
        return
    state = handed.get(name)
    if state is None or state.epoch != epoch:
        retired = 0 if state is None else max(state.retired, state.top)
        state = handed[name] = Handed(epoch, retired)
    state.top = max(state.top, version)
    if 0 < version <= state.retired:
        state.low.add(version)
