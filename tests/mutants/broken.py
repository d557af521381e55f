"""Broken variants of the reference backend, one defect each, as a hurried plugin author
might write them. The conformance suite must fail every one of them
(tests/test_suite_catches_broken_backends.py); each docstring says what is wrong."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
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


class SlowToSayNothingChanged(SqliteBackend):
    """``read`` with nothing newer blocks for 3 s before answering (the protocol says: at
    once), and answers what it saw before blocking."""

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        version, arrays = super().read(name, newer_than, timeout)
        if arrays is None:
            time.sleep(3)
        return version, arrays


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


VARIANTS: Dict[str, Type[SqliteBackend]] = {
    "vsqlite-ignores-namespace": IgnoresNamespace,
    "vsqlite-slow-nothing-newer": SlowToSayNothingChanged,
    "vsqlite-shared-connection": SharedConnection,
    "vsqlite-torn-writes": TornWrites,
    "vsqlite-skips-versions": SkipsVersions,
    "vsqlite-gives-up-early": GivesUpEarly,
    "vsqlite-ignores-timeout": IgnoresTimeout,
    "vsqlite-returns-early": ReturnsEarly,
    "vsqlite-polls-but-claims-blocking": PollsButClaimsBlocking,
    "vsqlite-leaks-connections": LeaksConnections,
    "vsqlite-overstates-push-limit": OverstatesPushLimit,
    "vsqlite-process-local": ProcessLocal,
}
"""Scheme -> broken variant."""
