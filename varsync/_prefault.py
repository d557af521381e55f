"""A large pull's new arrays faulted in on a second thread while their bytes arrive (a
Redis pull's receive buffers; the copies of held leaves a ``pull_if_newer(held=)``
patches, ``varsync._patches``).

A pull receives into arrays it has just allocated, and the kernel faults their pages in
one by one as ``recv_into`` first writes them: the copy from the socket waits for every
fault. Faulting is the larger cost where memory is handed back to the host once freed
(free page reporting on a VM, measured about 10x slower to fault in again): a 1 GB pull
after a few seconds idle took 3.1-3.4 s, 1.6-1.8 s with the pages faulted in here
beside the receive; 40 MB 43 ms, 28 ms. With warm memory it is a wash (0.84-1.01x from
40 MB up, 1.07x at 10 MB: hence :data:`PREFAULT_FROM`).

``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14) maps the pages writable without writing
them, so it never races the bytes being received into the same pages. Elsewhere, or on
an older kernel, nothing is done and the receive faults the pages in itself.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import sys
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Pulls of fewer bytes fault their own pages: a thread beside them cost more than it saved.
PREFAULT_FROM = 32 << 20
_STEP = 2 << 20  # bytes populated per call: a stop waits for at most one of them
_MADV_POPULATE_WRITE = 23
_JOIN_SECONDS = 5.0  # past it the thread is left to finish (it writes nothing)

_madvise: Any | None = None
_usable = sys.platform.startswith("linux")


def _populate_call() -> Any | None:
    """libc's ``madvise``, or ``None`` where it cannot be had."""
    global _madvise, _usable
    if _madvise is None and _usable:
        try:
            call = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            _usable = False
            return None
        call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        call.restype = ctypes.c_int
        _madvise = call
    return _madvise if _usable else None


def _page_ranges(arrays: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    """The whole pages inside each array's memory, as (start address, end address)."""
    page = mmap.PAGESIZE
    ranges = []
    for array in arrays:
        address = array.ctypes.data
        start = -(-address // page) * page
        end = (address + array.nbytes) // page * page
        if end > start:
            ranges.append((start, end))
    return ranges


class Prefaulted:
    """``with Prefaulted(arrays): receive into them``: from :data:`PREFAULT_FROM` bytes
    on, a thread faults the arrays' pages in, in the order they are received, until
    every page is in or the block ends (its thread is then stopped and joined)."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self._ranges: list[tuple[int, int]] = []
        self._arrays = list(arrays)  # alive while the thread runs, whatever the caller drops
        self._stop = False
        self._thread: threading.Thread | None = None
        if sum(a.nbytes for a in self._arrays) >= PREFAULT_FROM and _populate_call():
            self._ranges = _page_ranges(self._arrays)

    def __enter__(self) -> Prefaulted:
        if self._ranges:
            self._thread = threading.Thread(target=self._run, name="varsync-prefault", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(_JOIN_SECONDS)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        global _usable
        call = _populate_call()
        for start, end in self._ranges:
            while start < end and not self._stop and call is not None:
                size = min(_STEP, end - start)
                if call(start, size, _MADV_POPULATE_WRITE) != 0:
                    code = ctypes.get_errno()
                    if code in (errno.EINVAL, errno.ENOSYS):  # before Linux 5.14
                        _usable = False
                        log.debug(
                            "madvise(MADV_POPULATE_WRITE) is not supported here; "
                            "pulls fault their pages in as they receive"
                        )
                    return  # ENOMEM and the like: the receive meets the same, and says so
                start += size
