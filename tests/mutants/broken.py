"""Broken variants of the reference backend, one defect each, as a hurried plugin author
might write them. The conformance suite must fail every one of them
(tests/test_suite_catches_broken_backends.py); each docstring says what is wrong."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import time
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Type

import numpy as np

from mutants.reference import ERRORS, SqliteBackend
from varsync import Spec
from varsync.backends.base import Snapshot
from varsync.errors import translate_errors


class IgnoresNamespace(SqliteBackend):
    """Every namespace reads and writes the same tables."""

    @property
    def _ns(self) -> str:
        return ""


class CreatesInTwoSteps(SqliteBackend):
    """``create_table`` looks for the table, then inserts it, in two transactions: two
    processes creating a table at once may both find none, and the second insert
    replaces the first; both calls "succeed", with their own signatures."""

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        stored = self.signature(name)
        if stored is not None:
            return stored
        flat = json.dumps([{"dtype": s.dtype.name, "shape": list(s.shape)} for s in specs])
        with self._connection() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO tables (namespace, name, signature, specs) "
                "VALUES (?, ?, ?, ?)",
                (self._ns, name, signature, flat),
            )
        return signature


class SlowToSayNothingChanged(SqliteBackend):
    """``read`` with nothing newer blocks for 3 s before answering (the protocol says: at
    once), and answers what it saw before blocking."""

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        version, arrays = super().read(name, newer_than, timeout)
        if arrays is None:
            time.sleep(3)
        return version, arrays


class ReadsTheDataToSayNothingChanged(SqliteBackend):
    """``read`` fetches the current version with its data, then compares versions: an
    answer of "nothing newer" costs the transfer of the whole table (at once, though)."""

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT t.version, d.payload FROM tables t JOIN data d ON d.namespace = "
                "t.namespace AND d.name = t.name AND d.version = t.version "
                "WHERE t.namespace = ? AND t.name = ?",
                (self._ns, name),
            ).fetchall()
        if not rows:  # nothing pushed yet (or the table is gone): as the reference does
            return super().read(name, newer_than, timeout)
        version, payload = rows[0]
        if version <= newer_than:
            return int(version), None
        return int(version), self._arrays(name, bytes(payload))


class SharedConnection(SqliteBackend):
    """One SQLite connection for every thread, without a lock: two threads' transactions
    interleave ("cannot start a transaction within a transaction")."""

    _shared: Optional[sqlite3.Connection] = None

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with translate_errors(ERRORS, self.url):
            if self._shared is None:
                self._shared = self._open()
            yield self._shared

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()


class TornWrites(SqliteBackend):
    """Each leaf is its own row, written and read one statement at a time: a reader can
    get leaves of two versions."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        with self._connection() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS leaves (namespace TEXT, name TEXT, leaf INTEGER,"
                " payload BLOB, PRIMARY KEY (namespace, name, leaf))"
            )

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        with self._connection() as conn:
            for index, array in enumerate(arrays):
                conn.execute(
                    "INSERT OR REPLACE INTO leaves VALUES (?, ?, ?, ?)",
                    (self._ns, name, index, array.tobytes()),
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = self._version(conn, name) + 1
                conn.execute(
                    "UPDATE tables SET version = ? WHERE namespace = ? AND name = ?",
                    (version, self._ns, name),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return version

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        specs = self._flat_specs(name)
        with self._connection() as conn:
            version = self._version(conn, name)
            if version <= newer_than:
                return version, None
            arrays: List[np.ndarray] = []
            for index, spec in enumerate(specs):
                (payload,), = conn.execute(
                    "SELECT payload FROM leaves WHERE namespace = ? AND name = ? AND leaf = ?",
                    (self._ns, name, index),
                ).fetchall()
                arrays.append(np.frombuffer(bytes(payload), spec.dtype).reshape(spec.shape))
        return version, arrays


class TornChunks(SqliteBackend):
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

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        payload = b"".join(array.tobytes() for array in arrays)
        if len(payload) <= self.CHUNK:
            return super().write(name, arrays, specs)
        with self._connection() as conn:
            for start in range(0, len(payload), self.CHUNK):
                conn.execute(
                    "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                    (self._ns, name, start // self.CHUNK, payload[start:start + self.CHUNK]),
                )
        # the version, and an empty row saying "in chunks", in one transaction
        return super().write(name, [], specs)

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        version, arrays = super().read(name, newer_than, timeout)
        if arrays is not None or version <= newer_than:
            return version, arrays
        size = sum(s.nbytes for s in self._flat_specs(name))
        chunks = []
        with self._connection() as conn:
            for index in range(-(-size // self.CHUNK)):
                (payload,), = conn.execute(
                    "SELECT payload FROM chunks WHERE namespace = ? AND name = ? AND chunk = ?",
                    (self._ns, name, index),
                ).fetchall()
                chunks.append(bytes(payload))
        return version, super()._arrays(name, b"".join(chunks))

    def _arrays(self, name: str, payload: bytes) -> List[np.ndarray]:
        if not payload:  # in chunks (or of no bytes at all): read() gathers them
            return None  # type: ignore[return-value]
        return super()._arrays(name, payload)


class SkipsVersions(SqliteBackend):
    """Now and then a push adds 2 to the version (from 7 to 9, 17 to 19, ...)."""

    def _next_version(self, current: int) -> int:
        return current + (2 if current % 10 == 7 else 1)


class GivesUpEarly(SqliteBackend):
    """``wait`` gives up after a quarter of its timeout."""

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        return super().wait(name, newer_than, None if timeout is None else timeout / 4)


class IgnoresTimeout(SqliteBackend):
    """``wait`` ignores its timeout and waits as long as it takes."""

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        return super().wait(name, newer_than, None)


class ReturnsEarly(SqliteBackend):
    """``wait`` returns the current version at once, whether or not it is newer."""

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        return self.version(name)


class PollsButClaimsBlocking(SqliteBackend):
    """Declares ``supports_blocking_wait`` but keeps the base class's polling wait."""

    supports_blocking_wait = True


class LeaksConnections(SqliteBackend):
    """``close()`` forgets to close the connections."""

    def close(self) -> None:
        self._kept = list(self._opened)  # still referenced: nothing closes them


class OverstatesPushLimit(SqliteBackend):
    """Declares 16 MiB pushes, but its SQLite connections refuse values over 4 MiB."""

    def _open(self) -> sqlite3.Connection:
        conn = super()._open()
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4 * 2**20)
        return conn


class ProcessLocal(SqliteBackend):
    """Declares ``shared_across_processes`` and ``persistent``, but each process has a
    file of its own."""

    def __init__(self, url: str, **kwargs: object) -> None:
        super().__init__(f"{url}.pid{os.getpid()}", **kwargs)  # type: ignore[arg-type]


class ClosesInAForkedChild(SqliteBackend):
    """Resets its state in a forked child by closing itself (``os.register_at_fork``),
    where plugins.md says to drop what was inherited and connect anew: a container used
    before a fork refuses every call in the child. (Keeping the parent's idle SQLite
    connections, as the reference does, works: SQLite minds only a connection holding a
    lock or a transaction across the fork, which the pool never lends out.)"""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        os.register_at_fork(after_in_child=functools.partial(_close, weakref.ref(self)))


def _close(backend: "weakref.ref[SqliteBackend]") -> None:
    alive = backend()
    if alive is not None:
        alive.close()


VARIANTS: Dict[str, Type[SqliteBackend]] = {
    "vsqlite-ignores-namespace": IgnoresNamespace,
    "vsqlite-creates-in-two-steps": CreatesInTwoSteps,
    "vsqlite-slow-nothing-newer": SlowToSayNothingChanged,
    "vsqlite-reads-to-say-nothing-newer": ReadsTheDataToSayNothingChanged,
    "vsqlite-shared-connection": SharedConnection,
    "vsqlite-torn-writes": TornWrites,
    "vsqlite-torn-chunks": TornChunks,
    "vsqlite-skips-versions": SkipsVersions,
    "vsqlite-gives-up-early": GivesUpEarly,
    "vsqlite-ignores-timeout": IgnoresTimeout,
    "vsqlite-returns-early": ReturnsEarly,
    "vsqlite-polls-but-claims-blocking": PollsButClaimsBlocking,
    "vsqlite-leaks-connections": LeaksConnections,
    "vsqlite-overstates-push-limit": OverstatesPushLimit,
    "vsqlite-process-local": ProcessLocal,
    "vsqlite-closes-in-forked-child": ClosesInAForkedChild,
}
"""Scheme -> broken variant."""
