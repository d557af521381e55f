"""Mappings of segment files kept between pushes and pulls, and the pins of mapped pulls.

Mapping a 400 MB file costs little, but the first touch of each of its 100,000 pages
costs a page fault: reading or writing through a fresh mapping runs at about half the
speed of a memory copy. A table's segments are few and reused (the current one and a
spare alternate), so each process keeps the mappings of the last two segments it used
per table and mode, and later pushes and pulls of those run at memory-copy speed.

A cached mapping is made from its own open file description (the file reopened through
``/proc/self/fd``), never from a locked one: ``mmap`` keeps a duplicate of the descriptor
it maps, and a duplicate shares flock locks, so mapping a locked descriptor would hold its
lock as long as the cache holds the mapping. Mappings of deleted segments are dropped at
the next use, so a cache never keeps a deleted segment's memory alive for long.

A mapped pull reads through the cached mapping and holds the segment's shared lock with
a **pin**: a one-byte mapping of the reader's locked descriptor, whose duplicate (taken by
``mmap``, in C) keeps the lock. Pulls of one version share its pin, so a process holds one
descriptor per version it holds, however many pulls of it it keeps. The pulled arrays are
views of an array whose base owns the pin; when the last of them is freed, the pin is too,
and the kernel drops the lock with its descriptor. Every descriptor here belongs to an
``mmap`` or ``io.FileIO`` object, which closes it when freed: no Python finalizer that an
interrupt could skip.
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import threading
import weakref

import numpy as np

__all__ = ["Mappings", "KEEP"]

KEEP = 2
"""Mappings kept per table and mode (read-only, writable)."""

_Key = tuple[int, int, int]  # st_dev, st_ino, size


class _Cached:
    __slots__ = ("file", "mapping")

    def __init__(self, file: io.FileIO, mapping: mmap.mmap) -> None:
        self.file = file  # its descriptor tells whether the segment was deleted
        self.mapping = mapping


class _Pinned:
    """What a mapped pull's arrays view: the cached mapping's bytes, plus the pin that
    holds the segment's shared lock for as long as any of those arrays lives."""

    __slots__ = ("__array_interface__", "__weakref__", "pin", "view")

    def __init__(self, view: np.ndarray, pin: mmap.mmap) -> None:
        self.view = view
        self.pin = pin
        self.__array_interface__ = {
            "data": (view.__array_interface__["data"][0], True),  # read-only
            "shape": view.shape,
            "typestr": "|u1",
            "version": 3,
        }


class Mappings:
    """The mappings and pins one backend keeps; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, bool], collections.OrderedDict[_Key, _Cached]] = {}
        self._pins: dict[tuple[int, int, int], weakref.ref[_Pinned]] = {}

    def get(self, table: str, fd: int, size: int, writable: bool) -> mmap.mmap:
        """A shared mapping of ``size`` bytes of the file open as ``fd``."""
        status = os.fstat(fd)
        key = (status.st_dev, status.st_ino, size)
        with self._lock:
            cached = self._tables.setdefault((table, writable), collections.OrderedDict())
            deleted = [k for k, c in cached.items() if os.fstat(c.file.fileno()).st_nlink == 0]
            dropped = [cached.pop(k) for k in deleted]  # let their memory go
            hit = cached.get(key)
            if hit is not None:
                cached.move_to_end(key)
        _close(dropped)
        if hit is not None:
            return hit.mapping
        # The same file, through a new open file description: none of fd's locks.
        file = io.FileIO(f"/proc/self/fd/{fd}", "r+b" if writable else "rb")
        if writable:  # a writer will touch every page: map them all now, in one go
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapping = mmap.mmap(file.fileno(), size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        else:  # a reader may touch only some leaves: let pages fault in as used
            mapping = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
        with self._lock:
            cached = self._tables.setdefault((table, writable), collections.OrderedDict())
            hit = cached.get(key)
            if hit is None:
                cached[key] = _Cached(file, mapping)
                dropped = [cached.popitem(last=False)[1] for _ in range(len(cached) - KEEP)]
            else:  # another thread mapped it meanwhile
                dropped = [_Cached(file, mapping)]
        _close(dropped)
        return mapping if hit is None else hit.mapping

    def pinned(self, table: str, fd: int, size: int, version: int) -> np.ndarray:
        """A read-only uint8 array over the whole segment open as ``fd``, which holds
        ``fd``'s shared lock (and so ``version``'s bytes) for as long as it, or any view
        of it, lives. ``fd`` must hold that lock; the caller still closes it."""
        status = os.fstat(fd)
        key = (status.st_dev, status.st_ino, version)
        with self._lock:
            known = self._pins.get(key)
            holder = known() if known is not None else None
        if holder is None:
            pin = mmap.mmap(fd, 1, access=mmap.ACCESS_READ)  # its duplicate holds the lock
            view = np.frombuffer(self.get(table, fd, size, writable=False), np.uint8, size)
            holder = _Pinned(view, pin)
            with self._lock:
                for dead in [k for k, ref in self._pins.items() if ref() is None]:
                    del self._pins[dead]
                self._pins[key] = weakref.ref(holder)
        return np.asarray(holder)

    def clear(self) -> None:
        """Forget every mapping (arrays still using one keep it alive)."""
        with self._lock:
            tables, self._tables, self._pins = self._tables, {}, {}
        _close([cached for table in tables.values() for cached in table.values()])


def _close(dropped: list[_Cached]) -> None:
    """Close the files of dropped mappings now (freeing them would too, with a warning);
    their mappings live on while arrays use them."""
    for cached in dropped:
        cached.file.close()
