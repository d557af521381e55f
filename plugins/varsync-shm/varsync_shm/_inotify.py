"""A blocking wait for "a file was renamed into this directory", with Linux inotify.

Publishing a version *is* a rename (of the ``current`` link), so the kernel's inotify
event is the notification: there is no separate wake-up a crashed writer could forget,
and a waiter sleeps in ``poll(2)`` without using a core. Called through ``ctypes`` (the
standard library has no inotify binding). Where inotify is missing (not Linux) or
exhausted (``fs.inotify.max_user_instances``, 128 per user by default), :meth:`Watch.open`
returns ``None`` and the backend falls back to polling with a growing interval.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import select
import sys
import threading
from typing import Any

from varsync_shm._fds import Descriptors

__all__ = ["Watch"]

IN_MOVED_TO = 0x00000080
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
_MAX_POLL_MS = 2**31 - 1

_lock = threading.Lock()
_libc: Any = None
_loaded = False


def _library() -> Any:
    global _libc, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            if sys.platform.startswith("linux"):
                try:
                    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                    lib.inotify_init1.argtypes = [ctypes.c_int]
                    lib.inotify_init1.restype = ctypes.c_int
                    lib.inotify_add_watch.argtypes = [
                        ctypes.c_int,
                        ctypes.c_char_p,
                        ctypes.c_uint32,
                    ]
                    lib.inotify_add_watch.restype = ctypes.c_int
                    _libc = lib
                except (OSError, AttributeError):
                    _libc = None
        return _libc


class Watch:
    """An inotify instance watching one directory for renames into it. Its descriptor
    belongs to the :class:`Descriptors` given to :meth:`open`, which closes it."""

    def __init__(self, fd: int, fds: Descriptors) -> None:
        self._fd = fd
        self._fds = fds
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    @classmethod
    def open(cls, directory: str, fds: Descriptors | None = None) -> Watch | None:
        """A watch on ``directory``, or ``None`` if inotify cannot be used here. Its
        descriptor is owned by ``fds`` (by default, by the watch: then call close())."""
        lib = _library()
        if lib is None:
            return None
        owner = Descriptors() if fds is None else fds
        fd = owner.take(lib.inotify_init1, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        mask = IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
        if lib.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            if fds is None:
                owner.close()
            return None
        return cls(fd, owner)

    def wait(self, timeout: float) -> bool:
        """Sleep until an event arrives or ``timeout`` seconds pass (``inf``: no bound);
        return whether an event arrived. Drains the events: the caller re-checks state."""
        ms = -1 if math.isinf(timeout) else min(_MAX_POLL_MS, max(0, math.ceil(timeout * 1000)))
        ready = self._poller.poll(ms)
        for _ in range(1024):  # bounded drain; the queue holds at most a few events
            try:
                if not os.read(self._fd, 65536):
                    break
            except BlockingIOError:
                break
        return bool(ready)

    def close(self) -> None:
        """Close the descriptor (and any other its owner holds)."""
        self._fds.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
