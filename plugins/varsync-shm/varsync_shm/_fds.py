"""File descriptors owned so that an interrupt can neither leak one nor close one twice.

A ``KeyboardInterrupt`` from a signal is raised only between bytecodes, at a few points:
entering a Python function, jumping backwards, and right after a call returns. So in
``fd = os.open(...)`` it can land after the descriptor exists and before anything holds
it, and in ``os.close(fd); fds.remove(fd)`` between the two. :class:`Descriptors` does
both steps inside one call into C, where no interrupt is raised: :meth:`open` makes the
descriptor and records it in the same C call (``list.extend`` consuming ``starmap``), and
:attr:`close` pops and closes each one in a single C call too. The owner is created
before the ``try`` whose ``finally`` calls ``close``, so whatever is recorded is released
exactly once, and nothing else ever calls ``os.close`` on it.

Descriptors that must outlive a call belong to objects that close them when they are
freed, in C (``mmap.mmap`` keeps a duplicate of the descriptor it maps; ``io.FileIO``):
no Python finalizer runs, so none can be skipped by an interrupt either.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import os
from typing import Any, Callable

__all__ = ["Descriptors"]

_END: Any = None  # the first item of every list: where close() stops popping
_VALID = functools.partial(operator.le, 0)  # 0 <= fd: a failed C call's -1 is skipped


class Descriptors:
    """The descriptors one call (or one backend) opened; ``close()`` releases them all,
    exactly once, and may be called any number of times."""

    __slots__ = ("_fds", "close")

    def __init__(self) -> None:
        fds: list[int | None] = [_END]
        self._fds = fds
        closing = map(os.close, filter(_VALID, iter(fds.pop, _END)))
        #: Close every descriptor recorded (a C callable: nothing between pop and close).
        self.close: Callable[[], Any] = functools.partial(collections.deque, closing, 0)

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        """``os.open(path, flags | O_CLOEXEC, mode, dir_fd=dir_fd)``, owned by this object."""
        opener = functools.partial(os.open, dir_fd=dir_fd)
        self._fds.extend(itertools.starmap(opener, ((path, flags | os.O_CLOEXEC, mode),)))
        return self._fds[-1]  # type: ignore[return-value]

    def take(self, function: Callable[..., int], *args: Any) -> int:
        """The descriptor ``function(*args)`` returns (a C function, e.g. a ``ctypes``
        one; -1 for failure is recorded but never closed), owned by this object."""
        self._fds.extend(itertools.starmap(function, (args,)))
        return self._fds[-1]  # type: ignore[return-value]

    def give(self, fd: int, other: Descriptors) -> None:
        """Hand ``fd`` over to ``other`` (in one C call: it is always owned by one)."""
        index = self._fds.index(fd)
        other._fds.extend(map(self._fds.pop, (index,)))

    def __len__(self) -> int:
        return len(self._fds) - (1 if self._fds and self._fds[0] is _END else 0)
