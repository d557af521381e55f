"""What a Reverb insert count means: which run of the server it counts in (the epoch of
a :class:`~varsync.backend.Head`), and which insert was this client's.

Reverb's version is a table's count of completed inserts, and the count restarts with the
server. Two questions follow, answered here:

- **Which run.** Reverb mints no token for a server run, so this client names one: a run
  is told apart by when its table worker started (its age, subtracted from the time it
  was asked). That start is an estimate, not a token: the age is reported in whole
  milliseconds and the answer takes time to arrive, so each answer places the start in
  an interval, and two answers are of one run unless one places it more than
  :data:`RESTART_SLACK` after the other. :class:`ServerRuns` keeps the runs seen, per
  server table, and names each by the start first estimated for it: the epoch, which
  compares by equality as every backend's does. It is knowledge about the server, not
  about what a caller saw; the core alone compares epochs and reports resets. An insert
  count that goes down within one run (a ``reset()`` of the table) is a version below
  the one held, which the core reports too.
- **Ownership.** Reverb does not say which insert was ours, only how many there were
  (:func:`own_version`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from varsync._backends.reverb.tables import age_seconds, insert_count
from varsync.backend import ConcurrentPushError

__all__ = ["RESTART_SLACK", "ServerRuns", "Followed", "own_version"]

#: Seconds a table worker's start may seem to move before it counts as another run: its
#: six state times are reported in whole milliseconds, and a restarted server started (at
#: least) the old one's lifetime later.
RESTART_SLACK = 0.01
#: Runs remembered per server table (the oldest is forgotten first).
_RUNS_KEPT = 8
#: Seconds the narrowest estimate of a run's start stands before a wider one replaces it:
#: far less than it takes two clocks to drift RESTART_SLACK apart.
_ESTIMATE_STANDS = 1.0


@dataclass
class _Run:
    token: str
    #: Its worker started between these two ``time.monotonic()`` values...
    earliest: float
    latest: float
    #: ...by the answer that arrived at this one.
    estimated_at: float


class ServerRuns:
    """The runs of one Reverb server this client has seen, per server table, each named
    by an epoch token. Thread-safe."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._lock = threading.Lock()
        self._runs: dict[str, list[_Run]] = {}

    def epoch(self, info: Any, asked_at: float, *, settle: bool = True) -> Hashable | None:
        """The epoch of the server run that answered ``info`` (a table info asked for at
        ``asked_at``, just arrived). A start unlike any run seen is a new run, named by
        its address and that start. ``None`` when the answer fits two runs (it took
        longer than the older one ran): ask again, or with ``settle`` take the later."""
        answered_at = time.monotonic()
        age = age_seconds(info)
        # The worker started after asked_at - age (less up to six truncated ms) and no
        # later than answered_at - age, however slow the answer.
        earliest, latest = asked_at - age - RESTART_SLACK, answered_at - age
        with self._lock:
            runs = self._runs.setdefault(info.name, [])
            fits = [r for r in runs if earliest <= r.latest and r.earliest <= latest]
            if len(fits) > 1 and not settle:
                return None
            if not fits:
                run = _Run(f"{self.address} run@{latest:.3f}", earliest, latest, answered_at)
                runs.append(run)
                del runs[:-_RUNS_KEPT]
                return run.token
            run = max(fits, key=lambda r: r.latest)
            narrower = latest - earliest <= run.latest - run.earliest
            if len(fits) == 1 and (narrower or answered_at - run.estimated_at > _ESTIMATE_STANDS):
                run.earliest, run.latest, run.estimated_at = earliest, latest, answered_at
            return run.token


class Followed:
    """Per key, the run and insert count one of this client's own resources (a table's
    trajectory writer, its kept samplers) last met. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> (epoch, insert count, when that answer arrived)
        self._met: dict[Any, tuple[Hashable, int, float]] = {}

    def moved(self, key: Any, epoch: Hashable, info: Any, asked_at: float) -> bool:
        """Whether the server restarted (another epoch) or the table was reset (a lower
        insert count) since the resource behind ``key`` last met it, by ``info`` (asked
        for at ``asked_at``); remembers this answer. An answer asked for before the
        remembered one arrived (another thread's) may be the older: it proves nothing."""
        count = insert_count(info)
        with self._lock:
            met = self._met.get(key)
            if met is not None and asked_at < met[2]:
                return False
            self._met[key] = (epoch, count, time.monotonic())
        return met is not None and (met[0] != epoch or count < met[1])


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
