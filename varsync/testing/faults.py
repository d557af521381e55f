"""Fault injection for the conformance suite: interrupts at random points, and a loopback
proxy that loses or delays a server's replies after the request reached it.

Both are public so that a backend author can aim them at engine-specific cases too::

    with Interrupter(seed=7) as interrupter:
        for _ in range(200):
            interrupter.arm(after=interrupter.random.uniform(0, 0.01))
            try:
                container.push(values)
            except KeyboardInterrupt:
                pass
            finally:
                interrupter.disarm()

    with Proxy("127.0.0.1", server_port) as proxy:   # connect to proxy.port instead
        proxy.lose_replies(probability=0.2, seed=3)  # or proxy.delay_replies(2.0)
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import signal
import socket
import threading
import time
from typing import Any, Callable, TypeVar

__all__ = [
    "Interrupter",
    "Proxy",
    "open_fds",
    "settled_fds",
    "settle",
    "resource_counts",
    "grown",
    "fd_targets",
    "call_within",
]

T = TypeVar("T")


def open_fds() -> int:
    """How many file descriptors this process has open (Linux: ``/proc/self/fd``)."""
    return len(os.listdir("/proc/self/fd"))


def settle(
    measure: Callable[[], T], settled: Callable[[T], bool], seconds: float, pause: float = 0.05
) -> T:
    """``measure()`` once ``settled`` holds for it, re-measured every ``pause`` seconds for
    up to ``seconds``; else the last measure. For counts that other threads of a long test
    session move for a moment (a client reconnecting in the background, a connection being
    dropped, a thread ending), where a leak stays."""
    deadline = time.monotonic() + seconds
    while True:
        value = measure()
        if settled(value) or time.monotonic() > deadline:
            return value
        time.sleep(pause)  # re-measure: not a stand-in for synchronisation


def resource_counts(extra: Callable[[], dict[str, int]] = dict) -> dict[str, int]:
    """Open fds and live threads of this process (after a garbage collection), plus what
    ``extra()`` counts (server connections, files, ...)."""
    gc.collect()
    return {"open fds": open_fds(), "threads": threading.active_count(), **extra()}


def grown(
    before: dict[str, int], after: dict[str, int], allowance: int = 0
) -> dict[str, tuple[int, int]]:
    """``{name: (before, after)}`` of the counts that grew by more than ``allowance``."""
    return {k: (before.get(k, 0), v) for k, v in after.items() if v > before.get(k, 0) + allowance}


def settled_fds(at_most: int, seconds: float = 2.0) -> int:
    """The open-fd count once it is ``at_most`` or less (after a garbage collection),
    re-measured for up to ``seconds``; else the last count (see :func:`settle`)."""

    def count() -> int:
        gc.collect()
        return open_fds()

    return settle(count, lambda n: n <= at_most, seconds)


def fd_targets() -> dict[int, str]:
    """What each open file descriptor points at (``socket:[…]``, a path, …)."""
    targets = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return targets


def call_within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a daemon thread; its result, or its exception re-raised. If it runs
    longer than ``seconds``, :class:`AssertionError`: the call hung (a lock left held, a
    wait that ignores its timeout). The hung thread is left behind, as it must be."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="varsync-call-within", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"the call did not return within {seconds:g} s: it hung")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class Interrupter:
    """Raises :class:`KeyboardInterrupt` in the main thread at a chosen moment, as Ctrl-C
    does: from a signal handler, so blocking system calls are interrupted too.

    The signal is the kernel's interval timer (``SIGALRM`` from ``setitimer``), precise to
    microseconds, so interrupts land anywhere in calls that take only microseconds (a
    thread sending SIGINT waits for the GIL and lands 0.2-5 ms late). Only an armed
    interrupter raises, once per arming. Use it from the main thread, as a context
    manager: it takes over SIGALRM and hands back any timer already running on it (such
    as pytest-timeout's), less the time spent.
    """

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self.fired = 0
        self._armed = False
        self._previous: Any = None
        self._previous_timer: tuple[float, float] = (0.0, 0.0)
        self._entered = 0.0

    def __enter__(self) -> Interrupter:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("an Interrupter works from the main thread only")
        self._entered = time.monotonic()
        self._previous_timer = signal.setitimer(signal.ITIMER_REAL, 0)
        self._previous = signal.signal(signal.SIGALRM, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.disarm()
        signal.signal(signal.SIGALRM, self._previous)
        delay, interval = self._previous_timer
        if delay:
            spent = time.monotonic() - self._entered
            signal.setitimer(signal.ITIMER_REAL, max(delay - spent, 0.001), interval)

    def arm(self, after: float) -> None:
        """Raise KeyboardInterrupt in the main thread ``after`` seconds from now."""
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, max(after, 1e-6))

    def disarm(self) -> None:
        """No interrupt from now on, including one already sent but not yet handled."""
        self._armed = False  # read by the handler, which runs in this (the main) thread
        signal.setitimer(signal.ITIMER_REAL, 0)

    def call(self, fn: Callable[[], Any], after: float) -> tuple[bool, Any]:
        """``(True, fn())``, or ``(False, None)`` if the interrupt due ``after`` seconds
        from now came first. The interrupt is disarmed when this returns, however it ends,
        so it can never escape into the caller's own code."""
        try:
            try:
                self.arm(after)
                return True, fn()
            finally:
                self.disarm()
        except KeyboardInterrupt:
            return False, None

    def _handle(self, signum: int, frame: Any) -> None:
        if self._armed:
            self._armed = False
            self.fired += 1
            raise KeyboardInterrupt("varsync.testing.faults.Interrupter")


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``host:port``, with faults on the way back.

    Requests always reach the server whole. Replies pass untouched until a fault is set:
    ``lose_replies`` closes both sides of a connection instead of forwarding a reply (the
    server did the work; the client never hears of it), ``delay_replies`` holds each reply
    back for a while (a slow or hung server, seen from the client). ``heal()`` ends both.
    It listens on ``listen_port`` if given (a port a client was pointed at before anything
    listened there), else on a free one.
    """

    def __init__(self, host: str, port: int, listen_port: int = 0) -> None:
        self.target: tuple[str, int] = (host, port)
        self.lost = 0
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self._listener.settimeout(0.2)  # accept() looks at _closed this often
        self.port: int = self._listener.getsockname()[1]
        self.host = "127.0.0.1"
        self._lock = threading.Lock()
        self._loss = 0.0
        self._random = random.Random(0)
        self._delay = 0.0
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._accepter = threading.Thread(target=self._accept, name="varsync-proxy", daemon=True)
        self._accepter.start()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def lose_replies(self, probability: float, seed: int = 0) -> None:
        """From now on, each reply is lost with this probability (seeded)."""
        with self._lock:
            self._loss = probability
            self._random = random.Random(seed)

    def delay_replies(self, seconds: float) -> None:
        """From now on, each reply reaches the client ``seconds`` late."""
        with self._lock:
            self._delay = seconds

    def heal(self) -> None:
        """Replies pass untouched again (connections cut meanwhile stay cut)."""
        with self._lock:
            self._loss = 0.0
            self._delay = 0.0

    def drop_connections(self) -> None:
        """Cut every connection now; clients must reconnect."""
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        """Stop accepting, cut every connection and join every thread."""
        self._closed.set()
        _close(self._listener)
        self.drop_connections()
        self._accepter.join(10)
        for thread in self._threads:
            thread.join(10)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            for sock in (client, server):
                # Blocking, bounded: close() and a cut connection wake them by shutdown().
                sock.settimeout(60)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open += [client, server]
            pair = (client, server)
            asked = threading.Event()  # a request went by since the last reply began
            for source, sink, replies in ((client, server, False), (server, client, True)):
                thread = threading.Thread(
                    target=self._pump,
                    args=(source, sink, replies, pair, asked),
                    daemon=True,
                    name="varsync-proxy-pump",
                )
                self._threads.append(thread)
                thread.start()
            self._threads = [t for t in self._threads if t.is_alive()]

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        replies: bool,
        pair: tuple[socket.socket, socket.socket],
        asked: threading.Event,
    ) -> None:
        try:
            while not self._closed.is_set():
                data = source.recv(1 << 16)
                if not data:
                    break
                if not replies:
                    asked.set()
                elif asked.is_set():  # the first bytes of the answer to a request
                    asked.clear()
                    with self._lock:
                        lose = self._loss > 0 and self._random.random() < self._loss
                        delay = self._delay
                    if lose:
                        self.lost += 1
                        break
                    if delay:
                        self._closed.wait(delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open = [s for s in self._open if s not in pair]
            for sock in pair:
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
