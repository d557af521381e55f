"""The two primitives of the core's wait loop for a redis table, on the server reads go to
(:mod:`.topology`): a look at the head, checked against the version the caller holds, and
an ``XREAD BLOCK`` on the table's events stream that a push wakes."""

from __future__ import annotations

from typing import Any

from redis import exceptions as rx

from varsync.backend import deadline_after

__all__ = ["Waits", "WAIT_SLICE", "WAIT_GRACE"]

WAIT_SLICE = 1.0  # seconds per XREAD BLOCK: a vanished table is noticed this fast
WAIT_GRACE = 0.1  # seconds a wait's XREAD, and the look after it, may outlast its deadline


class Waits:
    """Mixed into :class:`~varsync.backends.redis.backend.RedisBackend` (its ``_head``,
    ``_trusted``, ``_routed``, ``_read_client``, ``_keys``, ``_errors``), which declares
    ``supports_blocking_wait``."""

    def version_within(self: Any, name: str, timeout: float | None, held: int = 0) -> int:
        # The core's wait loop looks through this: the head's epoch is checked against the
        # version the caller holds (a version of another history is a reset, whatever its
        # number), and the look may outlast the wait's deadline by WAIT_GRACE.
        deadline = deadline_after(timeout) + WAIT_GRACE

        def look() -> int:
            head = self._head(name, deadline=deadline)
            if head is None:
                return 0  # vanished: reads as empty; for a holder the core reports the reset
            self._trusted(name, head, held, deadline)
            return head.version

        with self._errors(f"waiting on table {name!r}"):
            return self._routed(name, look)

    def block(self: Any, name: str, newer_than: int, seconds: float) -> None:
        """``XREAD BLOCK`` on the table's stream after the entry of version
        ``newer_than``: it answers at once if a newer version is there already (the
        entry's id arms it), else when a push appends one, or after ``seconds``, at most
        ``WAIT_SLICE`` and half the ``socket_timeout``, so that the core's loop looks
        at the head (a vanished table) that often, and no XREAD outlasts its socket."""
        longest = WAIT_SLICE
        if self.socket_timeout is not None:
            longest = min(longest, self.socket_timeout / 2)
        milliseconds = max(1, int(min(seconds, longest) * 1000))
        deadline = deadline_after(seconds) + WAIT_GRACE

        def xread() -> None:
            try:
                self._read_client().call(
                    "XREAD",
                    "COUNT",
                    1,
                    "BLOCK",
                    milliseconds,
                    "STREAMS",
                    self._keys(name).events,
                    f"{newer_than}-1",
                    deadline=deadline,
                )
            except rx.ResponseError as exc:  # the server changed role (REPLICAOF, failover)
                if not str(exc).startswith("UNBLOCKED"):
                    raise

        with self._errors(f"waiting on table {name!r}"):
            self._routed(name, xread)
