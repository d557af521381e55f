"""Mappings of segment files kept between pushes and pulls, by inode.

Mapping a 400 MB file costs little, but the first touch of each of its 100,000 pages
costs a page fault: reading or writing through a fresh mapping runs at about half the
speed of a memory copy. A table's segments are few and reused (the current one and a
spare alternate), so each process keeps the mappings of the last two segments it used
per table and mode, and later pushes and pulls of those run at memory-copy speed.

A cached mapping is made from its own open file description, never from a locked one:
Python's ``mmap`` keeps a duplicate of the descriptor it maps, and a duplicate shares
flock locks, so mapping a locked descriptor would hold its lock as long as the cache
holds the mapping. Mappings of deleted segments are dropped at the next use, so a cache
never keeps a deleted segment's memory alive for long.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
from typing import Dict, Optional, Tuple

__all__ = ["Mappings", "KEEP"]

KEEP = 2
"""Mappings kept per table and mode (read-only, writable)."""

_Key = Tuple[int, int, int]  # st_dev, st_ino, size


class Mappings:
    """The mappings one backend keeps; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: Dict[Tuple[str, bool], "collections.OrderedDict[_Key, Tuple[int, mmap.mmap]]"] = {}

    def get(self, table: str, path: str, fd: int, size: int, writable: bool) -> Optional[mmap.mmap]:
        """A shared mapping of the file open as ``fd`` (and named ``path``) of ``size``
        bytes; ``None`` if ``path`` no longer names that file."""
        status = os.fstat(fd)
        key = (status.st_dev, status.st_ino, size)
        with self._lock:
            cached = self._tables.setdefault((table, writable), collections.OrderedDict())
            for old_key, (old_fd, _) in list(cached.items()):
                if os.fstat(old_fd).st_nlink == 0:  # deleted: let its memory go
                    del cached[old_key]
                    os.close(old_fd)
            if key in cached:
                cached.move_to_end(key)
                return cached[key][1]
        try:
            own_fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            mine = os.fstat(own_fd)
            if (mine.st_dev, mine.st_ino) != key[:2]:
                os.close(own_fd)
                return None
            if writable:  # a writer will touch every page: map them all now, in one go
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapping = mmap.mmap(own_fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
            else:  # a reader may touch only some leaves: let pages fault in as used
                mapping = mmap.mmap(own_fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(own_fd)
            raise
        with self._lock:
            cached = self._tables.setdefault((table, writable), collections.OrderedDict())
            if key in cached:  # another thread mapped it meanwhile
                os.close(own_fd)
                return cached[key][1]
            cached[key] = (own_fd, mapping)
            while len(cached) > KEEP:
                _, (old_fd, _) = cached.popitem(last=False)
                os.close(old_fd)
        return mapping

    def clear(self) -> None:
        """Forget every mapping (arrays still using one keep it alive)."""
        with self._lock:
            tables, self._tables = self._tables, {}
        for cached in tables.values():
            for own_fd, _ in cached.values():
                os.close(own_fd)
