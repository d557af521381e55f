"""The physical floor of a networked backend (issue 15.4): the nest's bytes over a raw
loopback TCP socket pair, timed in the Redis group's rounds.

The sender ``sendall``s each leaf's memory (no copy); a receiver thread ``recv_into``s
arrays allocated once, of the leaves' sizes (the group's copy targets: no memory of its
own, which at 1 GB matters on a 24 GiB machine). One transfer returns when the receiver
holds every byte, so it is what any client-server protocol on loopback pays at least, in
either direction.
"""

from __future__ import annotations

import socket
import threading
from typing import Dict, Optional

import numpy as np

TIMEOUT = 300.0  # seconds any one transfer may take before it is an error


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array).data).cast("B")


class LoopbackFloor:
    """A connected pair of loopback TCP sockets and a receiver thread, for ``nest``'s bytes,
    received into ``into`` (arrays of the same names and sizes, written by every transfer).
    ``transfer()`` sends them once and waits until they all arrived; ``close()`` stops the
    thread and closes both sockets."""

    def __init__(self, nest: Dict[str, np.ndarray], into: Dict[str, np.ndarray]) -> None:
        self.views = [_bytes_of(leaf) for leaf in nest.values()]
        self.buffers = [_bytes_of(into[name]) for name in nest]
        if [v.nbytes for v in self.views] != [b.nbytes for b in self.buffers]:
            raise ValueError("LoopbackFloor: `into` must hold arrays of the nest's sizes")
        self.total = sum(view.nbytes for view in self.views)
        self.error: Optional[BaseException] = None
        self._arrived = threading.Semaphore(0)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(listener.getsockname()[:2], timeout=TIMEOUT)
            try:
                self.receiver, _ = listener.accept()
            except BaseException:
                self.sender.close()
                raise
        self.receiver.settimeout(None)  # the thread blocks until bytes come or close()
        self._thread = threading.Thread(target=self._receive, name="bench-tcp-floor",
                                        daemon=True)
        self._thread.start()

    def transfer(self) -> None:
        for view in self.views:
            self.sender.sendall(view)
        if not self._arrived.acquire(timeout=TIMEOUT):
            raise TimeoutError(f"the loopback receiver did not get {self.total} bytes "
                               f"within {TIMEOUT:.0f} s")
        if self.error is not None:
            raise RuntimeError("the loopback receiver failed") from self.error

    def _receive(self) -> None:
        try:
            while True:
                for buffer in self.buffers:
                    got = 0
                    while got < buffer.nbytes:
                        n = self.receiver.recv_into(buffer[got:])
                        if n == 0:  # close(): the sender shut down
                            return
                        got += n
                self._arrived.release()
        except OSError as exc:
            self.error = exc
            self._arrived.release()

    def close(self) -> None:
        try:
            self.sender.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._thread.join(30)
        for sock in (self.sender, self.receiver):
            sock.close()

