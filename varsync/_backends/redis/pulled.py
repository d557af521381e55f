"""Memory for a pull's large arrays, used again once the caller has let go of them.

A pull receives into arrays it allocates, and a large array is memory fresh from the
kernel: its pages fault in one by one as the bytes arrive, and where freed memory goes
back to the host (free page reporting on a VM) faulting is a good part of the pull.
Measured on loopback (4 arrays; same rounds, turns rotating, 0.5 s idle between rounds),
a pull into new arrays against one into recycled memory: 10 MB 4.8 ms against 4.4 ms,
40 MB 14.8 ms against 14.5 ms (12.3 ms in a loop of ``params = pull()``), 100 MB 40 ms
against 34 ms, 1 GB 379 ms against 281 ms.

Each array of :data:`REUSE_FROM` bytes or more is a view of a buffer this keeps. A later
pull takes a buffer of the same size only when no view of it is left anywhere (its
reference count is back to this object's own): a buffer the caller, or anything made
from its arrays (views, tensors sharing their memory), still holds is never written.
Buffers handed out by the last two pulls are kept, older ones forgotten (freed as usual
when the caller drops them), and all of them on ``close``: beyond what the caller holds,
at most the arrays of two pulls stay allocated; in a loop of ``params = pull()``, one.
``reuse_pulled=0`` turns it off (every array new, as ``np.empty`` makes it).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np

from varsync._signature import Spec

#: Arrays below this take ``np.empty``: the allocator reuses freed memory of that size.
REUSE_FROM = 1 << 20

# CPython counts references; elsewhere nothing can tell an unreferenced buffer apart.
_COUNTED = hasattr(sys, "getrefcount")


class PulledMemory:
    """The buffers behind one backend's pulled arrays (see the module's docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and _COUNTED
        self._lock = threading.Lock()
        self._buffers: list[np.ndarray] = []  # uint8, each referenced here once
        self._last_pull: list[int] = []  # the number of the pull that last took each one
        self._pulls = 0

    def arrays(
        self, specs: Sequence[Spec], indices: Sequence[int] | None = None
    ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
        """Uninitialised arrays for ``specs`` (only at ``indices`` if given, ``None``
        elsewhere), and the ones among them whose memory is new (for the caller to fault
        in): one pull's worth."""
        wanted = range(len(specs)) if indices is None else indices
        out: list[np.ndarray | None] = [None] * len(specs)
        fresh: list[np.ndarray] = []
        with self._lock:
            self._pulls += 1
            for index in wanted:
                spec = specs[index]
                if not self.enabled or spec.nbytes < REUSE_FROM:
                    array = np.empty(spec.shape, spec.dtype)
                    out[index] = array
                    fresh.append(array)
                    continue
                buffer = self._idle(spec.nbytes)
                if buffer is None:
                    buffer = np.empty(spec.nbytes, np.uint8)
                    self._buffers.append(buffer)
                    self._last_pull.append(self._pulls)
                    fresh.append(buffer)
                out[index] = buffer.view(spec.dtype).reshape(spec.shape)
            self._forget_older()
        return out, fresh

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()
            self._last_pull.clear()

    def __len__(self) -> int:
        return len(self._buffers)

    def _idle(self, nbytes: int) -> np.ndarray | None:
        """A kept buffer of ``nbytes`` that nothing else references, now this pull's."""
        buffers = self._buffers
        for position in range(len(buffers)):
            # No name bound to the buffer while counting: its references are then this
            # list's and getrefcount's argument; any view of it holds one more.
            if buffers[position].nbytes == nbytes and sys.getrefcount(buffers[position]) == 2:
                self._last_pull[position] = self._pulls
                return buffers[position]
        return None

    def _forget_older(self) -> None:
        keep = [i for i, pull in enumerate(self._last_pull) if pull >= self._pulls - 1]
        if len(keep) < len(self._buffers):
            self._buffers[:] = [self._buffers[i] for i in keep]
            self._last_pull[:] = [self._last_pull[i] for i in keep]
