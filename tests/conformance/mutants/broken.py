"""Broken variants of the reference backend, one defect each, as a hurried plugin author
might write them to Backend protocol 1. The conformance suite must fail every one of them
(tests/conformance/test_suite_catches_broken_backends.py); each docstring says what is wrong."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sqlite3
import time
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Type

import numpy as np

from mutants.reference import ERRORS, SqliteStore
from varsync.backend import (
    Head,
    PullTimeoutError,
    Read,
    Spec,
    SupportsBlockingWait,
    remaining,
    translate_errors,
)


class IgnoresNamespace(SqliteStore):
    """Every namespace reads and writes the same tables."""

    @property
    def _ns(self) -> str:
        return ""


class CreatesInTwoSteps(SqliteStore):
    """``create_table`` looks for the table, then inserts it, in two transactions: two
    processes creating a table at once may both find none, and the second insert
    replaces the first; both calls "succeed", with their own signatures."""

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        stored = self.signature(name)
        if stored is not None:
            return stored
        # The gap between the look and the insert, widened: the suite's racing processes
        # meet in it on every run, not only when a loaded machine happens to line them up
        # (a loaded CI run once did not).
        time.sleep(0.2)
        flat = json.dumps([{"dtype": s.dtype.name, "shape": list(s.shape)} for s in specs])
        with self._connection() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO tables (namespace, name, signature, specs) "
                "VALUES (?, ?, ?, ?)",
                (self._ns, name, signature, flat),
            )
        return signature


class SlowToSayNothingChanged(SqliteStore):
    """``read`` with nothing newer blocks for 3 s before answering (the protocol says: at
    once), and answers what it saw before blocking."""

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        answer = super().read(name, newer_than, deadline, specs)
        if answer.arrays is None:
            time.sleep(3)
        return answer


class ReadsTheDataToSayNothingChanged(SqliteStore):
    """``read`` fetches the current head with its data, then compares versions: an
    answer of "nothing newer" costs the transfer of the whole table (at once, though)."""

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        with self._connection(deadline) as conn:
            rows = conn.execute(
                "SELECT t.version, t.epoch, d.payload FROM tables t JOIN data d ON "
                "d.namespace = t.namespace AND d.name = t.name AND d.version = t.version "
                "WHERE t.namespace = ? AND t.name = ?",
                (self._ns, name),
            ).fetchall()
        if not rows:  # nothing pushed yet (or the table is gone): as the reference does
            return super().read(name, newer_than, deadline, specs)
        version, epoch, payload = rows[0]
        head = Head(int(version), str(epoch))
        if head.version <= newer_than:
            return Read(head, None)
        return Read(head, self._arrays(name, bytes(payload), specs))


class SharedConnection(SqliteStore):
    """One SQLite connection for every thread, without a lock: two threads' transactions
    interleave ("cannot start a transaction within a transaction")."""

    _shared: Optional[sqlite3.Connection] = None

    @contextlib.contextmanager
    def _connection(self, deadline: float = math.inf) -> Iterator[sqlite3.Connection]:
        with translate_errors(ERRORS, self.url):
            if self._shared is None:
                self._shared = self._open()
            yield _Unhurried(self._shared)  # type: ignore[misc]


class _Unhurried:
    """A connection that, having begun a transaction, lets other threads run for a
    millisecond: the race of a shared connection happens on every run of the suite's
    eight-thread test, not only when the scheduler happens to switch there (under a
    loaded CI machine it sometimes did not)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        cursor = self._conn.execute(sql, *args)
        if sql.lstrip().upper().startswith("BEGIN"):
            time.sleep(0.001)
        return cursor

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()


class TornWrites(SqliteStore):
    """Each leaf is its own row, written and read one statement at a time: a reader can
    get leaves of two versions."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        with self._connection() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS leaves (namespace TEXT, name TEXT, leaf INTEGER,"
                " payload BLOB, PRIMARY KEY (namespace, name, leaf))"
            )

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        with self._connection(deadline) as conn:
            for index, array in enumerate(arrays):
                conn.execute(
                    "INSERT OR REPLACE INTO leaves VALUES (?, ?, ?, ?)",
                    (self._ns, name, index, array.tobytes()),
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                current = self._head_of(conn, name)
                conn.execute(
                    "UPDATE tables SET version = ? WHERE namespace = ? AND name = ?",
                    (current.version + 1, self._ns, name),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return Head(current.version + 1, current.epoch)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        with self._connection(deadline) as conn:
            head = self._head_of(conn, name)
            if head.version <= newer_than:
                return Read(head, None)
            arrays: List[np.ndarray] = []
            for index, spec in enumerate(specs):
                (payload,), = conn.execute(
                    "SELECT payload FROM leaves WHERE namespace = ? AND name = ? AND leaf = ?",
                    (self._ns, name, index),
                ).fetchall()
                arrays.append(np.frombuffer(bytes(payload), spec.dtype).reshape(spec.shape))
        return Read(head, arrays)


class TornChunks(SqliteStore):
    """A value over 1 MiB is kept in rows of 1 MiB, written and then read one statement at
    a time, outside one transaction; smaller values stay whole in one row. A reader of a
    large value can get chunks of two versions."""

    CHUNK = 2**20

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        with self._connection() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS chunks (namespace TEXT, name TEXT, chunk INTEGER,"
                " payload BLOB, PRIMARY KEY (namespace, name, chunk))"
            )

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        payload = b"".join(array.tobytes() for array in arrays)
        if len(payload) <= self.CHUNK:
            return super().write(name, arrays, specs, deadline)
        with self._connection(deadline) as conn:
            for start in range(0, len(payload), self.CHUNK):
                conn.execute(
                    "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                    (self._ns, name, start // self.CHUNK, payload[start:start + self.CHUNK]),
                )
        # the version, and an empty row saying "in chunks", in one transaction
        return super().write(name, [], specs, deadline)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        head, arrays = super().read(name, newer_than, deadline, specs)
        if arrays is not None or head.version <= newer_than:
            return Read(head, arrays)
        size = sum(s.nbytes for s in specs)
        chunks = []
        with self._connection(deadline) as conn:
            for index in range(-(-size // self.CHUNK)):
                (payload,), = conn.execute(
                    "SELECT payload FROM chunks WHERE namespace = ? AND name = ? AND chunk = ?",
                    (self._ns, name, index),
                ).fetchall()
                chunks.append(bytes(payload))
        return Read(head, super()._arrays(name, b"".join(chunks), specs))

    def _arrays(self, name: str, payload: bytes, specs: Sequence[Spec]) -> List[np.ndarray]:
        if not payload:  # in chunks (or of no bytes at all): read() gathers them
            return None  # type: ignore[return-value]
        return super()._arrays(name, payload, specs)


class SkipsVersions(SqliteStore):
    """Now and then a push adds 2 to the version (from 7 to 9, 17 to 19, ...)."""

    def _next_version(self, current: int) -> int:
        return current + (2 if current % 10 == 7 else 1)


#: Seconds between a torn read's two statements, as a server's round trip would put
#: there: without it the window a push must land in is a few microseconds, and on a loaded
#: machine the suite's concurrency tests missed the variant once (CI, 2026-12-06).
ROUND_TRIP = 0.002


class ReadsTheHeadThenTheData(SqliteStore):
    """``read`` asks the head, then fetches the data of whatever version is current by a
    second statement, outside a transaction, a round trip later (:data:`ROUND_TRIP`): a
    push landing in between gives the arrays of a version newer than the head it answers
    (the protocol: of one version)."""

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        with self._connection(deadline) as conn:
            head = self._head_of(conn, name)
            if head.version <= newer_than:
                return Read(head, None)
            time.sleep(ROUND_TRIP)
            rows = conn.execute(
                "SELECT d.payload FROM tables t JOIN data d ON d.namespace = t.namespace "
                "AND d.name = t.name AND d.version = t.version "
                "WHERE t.namespace = ? AND t.name = ?",
                (self._ns, name),
            ).fetchall()
        return Read(head, self._arrays(name, bytes(rows[0][0]), specs))


class ReusesTheEpoch(SqliteStore):
    """Names a table's epoch after the table (the same token in every history), rather
    than minting one when the table is made: a table lost and made again, then pushed
    back to the version a reader holds, is to the core the same value."""

    def _head_of(self, conn: sqlite3.Connection, name: str) -> Head:
        return Head(super()._head_of(conn, name).version, f"{self._ns}/{name}")

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        head, arrays = super().read(name, newer_than, deadline, specs)
        return Read(Head(head.version, f"{self._ns}/{name}"), arrays)


class CachesTheEpoch(SqliteStore):
    """Reads a table's epoch once and keeps it ("an epoch never changes"): after the
    table is lost and made again, ``read`` answers the new history's version and arrays
    under the old history's epoch, a head whose epoch is not of its arrays' version."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._epochs: Dict[str, object] = {}

    def _head_of(self, conn: sqlite3.Connection, name: str) -> Head:
        head = super()._head_of(conn, name)
        return Head(head.version, self._epochs.setdefault(name, head.epoch))

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        head, arrays = super().read(name, newer_than, deadline, specs)
        return Read(Head(head.version, self._epochs.setdefault(name, head.epoch)), arrays)


class CachesTheHead(SqliteStore):
    """``head`` answers the head this backend last saw (its own writes and reads update
    it) and asks the store only for a table it has not seen: another container's push is
    never seen by a wait, which looks at the head."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._heads: Dict[str, Head] = {}

    def head(self, name: str, deadline: float) -> Head:
        if name not in self._heads:
            self._heads[name] = super().head(name, deadline)
        return self._heads[name]

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        self._heads[name] = super().write(name, arrays, specs, deadline)
        return self._heads[name]

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        answer = super().read(name, newer_than, deadline, specs)
        self._heads[name] = answer.head
        return answer


class BlockGivesUpEarly(SqliteStore, SupportsBlockingWait):
    """``block`` waits for a change for a quarter of the time left, then raises
    :class:`PullTimeoutError` (returning early is allowed: the core looks again; ending
    the wait is not)."""

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        until = time.monotonic() + remaining(deadline) / 4
        while self.head(name, deadline).version == newer_than:
            if time.monotonic() >= until:
                raise PullTimeoutError(f"{self.url}: table {name!r} did not change")
            time.sleep(0.005)


class BlockIgnoresItsDeadline(SqliteStore, SupportsBlockingWait):
    """``block`` waits until the table changes, however long that takes."""

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        while self.head(name, math.inf).version == newer_than:
            time.sleep(0.005)


class PollsButClaimsBlocking(SqliteStore, SupportsBlockingWait):
    """Subclasses ``SupportsBlockingWait``, but its ``block`` sleeps a millisecond and
    returns: the core's wait loop, trusting it, asks the head again and again."""

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        time.sleep(min(0.001, max(remaining(deadline), 0.0)))


class LeaksConnections(SqliteStore):
    """``close()`` forgets to close the connections."""

    def close(self) -> None:
        self._kept = list(self._opened)  # still referenced: nothing closes them


class OverstatesPushLimit(SqliteStore):
    """Declares 16 MiB pushes, but its SQLite connections refuse values over 4 MiB."""

    def _open(self) -> sqlite3.Connection:
        conn = super()._open()
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4 * 2**20)
        return conn


class ProcessLocal(SqliteStore):
    """Declares ``shared_across_processes`` and ``persistent``, but each process has a
    file of its own."""

    def __init__(self, url: str, **kwargs: object) -> None:
        super().__init__(f"{url}.pid{os.getpid()}", **kwargs)  # type: ignore[arg-type]


class ClosesInAForkedChild(SqliteStore):
    """Resets its state in a forked child by closing itself (``os.register_at_fork``),
    where plugins.md says to drop what was inherited and connect anew: a container used
    before a fork refuses every call in the child. (Keeping the parent's idle SQLite
    connections, as the reference does, works: SQLite minds only a connection holding a
    lock or a transaction across the fork, which the pool never lends out.)"""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        os.register_at_fork(after_in_child=functools.partial(_close, weakref.ref(self)))


def _close(backend: weakref.ref[SqliteStore]) -> None:
    alive = backend()
    if alive is not None:
        alive.close()


VARIANTS: Dict[str, Type[SqliteStore]] = {
    "vsqlite-ignores-namespace": IgnoresNamespace,
    "vsqlite-creates-in-two-steps": CreatesInTwoSteps,
    "vsqlite-slow-nothing-newer": SlowToSayNothingChanged,
    "vsqlite-reads-to-say-nothing-newer": ReadsTheDataToSayNothingChanged,
    "vsqlite-shared-connection": SharedConnection,
    "vsqlite-torn-writes": TornWrites,
    "vsqlite-torn-chunks": TornChunks,
    "vsqlite-skips-versions": SkipsVersions,
    "vsqlite-head-then-data": ReadsTheHeadThenTheData,
    "vsqlite-reuses-epoch": ReusesTheEpoch,
    "vsqlite-caches-epoch": CachesTheEpoch,
    "vsqlite-caches-head": CachesTheHead,
    "vsqlite-block-gives-up-early": BlockGivesUpEarly,
    "vsqlite-block-ignores-deadline": BlockIgnoresItsDeadline,
    "vsqlite-polls-but-claims-blocking": PollsButClaimsBlocking,
    "vsqlite-leaks-connections": LeaksConnections,
    "vsqlite-overstates-push-limit": OverstatesPushLimit,
    "vsqlite-process-local": ProcessLocal,
    "vsqlite-closes-in-forked-child": ClosesInAForkedChild,
}
"""Scheme -> broken variant."""
