"""What a Reverb insert count means: which run of the server it counts in, and which
insert was this client's.

Reverb's version is a table's count of completed inserts, and the count restarts with the
server. Two questions follow, answered here:

- **Restarts.** A server run is told apart by its insert count (it never goes down within
  one run) and by when its table worker started (its age, subtracted from the time it
  was asked). The start is an estimate, not a token: the age is reported in whole
  milliseconds and the answer takes time to arrive, so two runs are compared with a
  slack, and an answer asked for before the remembered one arrived proves nothing. That
  is why this is not a :class:`varsync.backend.Histories` (which compares epochs for
  equality); the message is the core's (:func:`varsync.backend.reset_error`).
- **Ownership.** Reverb does not say which insert was ours, only how many there were.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from varsync.backend import ConcurrentPushError
from varsync.backends.reverb.tables import age_seconds, insert_count

__all__ = ["RESTART_SLACK", "Incarnations", "own_version"]

#: Seconds a table worker's start may seem to move before it counts as a restart: its six
#: state times are reported in whole milliseconds, and a restarted server started (at
#: least) the old one's lifetime later.
RESTART_SLACK = 0.01


class Incarnations:
    """The server run each purpose (``("read" | "write", server table)``) last saw.

    Thread-safe. Readers and writers keep apart: a writer moves on to a restarted server
    (its next push must go through), while a reader's held version stays tied to the run
    it came from until the reader resynchronises.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> (latest start time of the server, insert count, when that was answered)
        self._seen: dict[tuple[str, str], tuple[float, int, float]] = {}

    def restarted(
        self, key: tuple[str, str], info: Any, asked_at: float, remember: bool = True
    ) -> str | None:
        """How ``info`` shows the server behind ``key`` is not the run last remembered
        for it (``None``: it is the same, or this is the first look): its insert count
        went down, or its table worker started later. ``info`` was asked for at
        ``asked_at``, so the worker started between ``asked_at - age`` and now ``- age``,
        however slow the answer. ``remember``: adopt this run (also when it is new)."""
        age = age_seconds(info)
        answered_at = time.monotonic()
        earliest, latest = asked_at - age, answered_at - age
        count = insert_count(info)
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and asked_at < seen[2]:
                # Asked before the remembered answer arrived (another thread's): it may be
                # the older of the two, so a lower count or later start proves nothing.
                return None
            if remember or seen is None:
                self._seen[key] = (latest, count, answered_at)
        if seen is None:
            return None
        if count < seen[1]:
            return f"its insert count went down from {seen[1]} to {count}"
        if earliest - seen[0] > RESTART_SLACK:
            return f"its table worker started {earliest - seen[0]:.3f} s after the one seen before"
        return None


def own_version(table: str, before: Any, after: Any, restarted: bool) -> int:
    """The version of the push made between the table infos ``before`` and ``after``.

    The count rose by exactly one, or (the server restarted in between) is 1, or another
    writer pushed too and any of the new numbers may be ours. Then
    :class:`~varsync.ConcurrentPushError`, rather than a number another writer may be
    given as well.
    """
    low, high = insert_count(before) + 1, insert_count(after)
    if high == low or (restarted and high == 1):
        return high
    raise ConcurrentPushError(
        f"the push to Reverb table {table!r} was published, but another writer pushed to "
        f"it at the same time, so its version is one of {low}..{high}. Reverb cannot tell "
        "whose insert was whose: give each writer its own table (or use a backend with "
        "supports_concurrent_writers, such as redis://) if you need exact versions.",
        low=low,
        high=high,
    )
