# The 0.2-protocol reference, kept as it was (git show 952cb1a~1:tests/conformance/mutants/reference.py):
# what tests/conformance/test_legacy_protocol.py runs the suite on through varsync.backends.legacy's adapter.
"""``vsqlite:///path/to/store.db``: a small, correct varsync backend over one SQLite file,
written from docs/plugins.md alone, as a third party would.

It is the reference the mutation tests break on purpose (``mutants.broken``): the
conformance suite must pass it whole and fail every broken variant.

One file holds every namespace: table ``tables`` (namespace, name, signature text, flat
specs as JSON, current version) and table ``data`` (the current version's arrays, raw
bytes one after the other; never pickle). A write is one ``BEGIN IMMEDIATE`` transaction
(new data row, new version, old rows deleted), so writers in any thread or process get
distinct, increasing versions and readers see one whole version: a read of the data is a
single ``SELECT`` joining the version to its row. The file keeps SQLite's default
rollback journal, not WAL: in WAL mode every open connection holds a lock on the file, so
SQLite cannot close the files of a closed connection while another connection of the
process is open, and a closed container would seem to keep them.

Connections come from a pool: a call takes an idle one (or opens one) and gives it back,
so no connection is used by two threads at once and none is tied to a thread that may
end. ``close()`` closes every connection the backend opened.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set
from urllib.parse import unquote, urlsplit

import numpy as np

from varsync import Spec
from varsync.backend import Histories
from varsync.backends.base import Backend, Snapshot
from varsync.errors import (
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    TableNotFoundError,
    translate_errors,
)

# Subclasses first: the first entry the exception is an instance of wins.
ERRORS = {
    sqlite3.OperationalError: BackendConnectionError,  # locked past the timeout, disk gone
    sqlite3.DatabaseError: CorruptDataError,  # not a database, malformed file
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    namespace TEXT NOT NULL, name TEXT NOT NULL, signature TEXT NOT NULL,
    specs TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    epoch TEXT NOT NULL DEFAULT (lower(hex(randomblob(8)))),
    PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS data (
    namespace TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    payload BLOB NOT NULL, PRIMARY KEY (namespace, name, version));
"""

#: What a busy database may make a call wait when the container's timeout is None.
NO_BOUND = 24 * 3600.0


class SqliteBackend(Backend):
    """Tables in one SQLite file, shared by the processes of a host and kept on disk."""

    shared_across_processes = True
    persistent = True
    #: A limit of this backend's own (SQLite takes up to 1 GB per value), declared so the
    #: suite has one to check: the core refuses larger pushes before calling ``write``.
    max_push_bytes = 16 * 2**20
    #: The tables this backend's file holds, made if absent (a subclass may hold others).
    schema = SCHEMA

    def __init__(
        self, url: str, *, timeout: Optional[float], namespace: str, **options: Any
    ) -> None:
        super().__init__(url, timeout=timeout, namespace=namespace, **options)
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigurationError(
                f"{self.url!r} is not a vsqlite:// URL of this host; expected "
                "vsqlite:///absolute/path/to/store.db"
            )
        self.path = unquote(parts.path)
        self._lock = threading.Lock()
        self._idle: List[sqlite3.Connection] = []
        self._opened: Set[sqlite3.Connection] = set()
        self._closed = False
        self._specs: Dict[str, List[Spec]] = {}
        # Each table's history: a random epoch minted when its row is made (a table lost
        # and made again gets another); a reader holding a version of another is told.
        self._histories = Histories()
        with self._connection() as conn:
            conn.executescript(self.schema)

    # -- connections -----------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        busy = NO_BOUND if self.timeout is None else self.timeout
        conn = sqlite3.connect(
            self.path, timeout=busy, isolation_level=None, check_same_thread=False
        )
        try:
            # No fsync: tables outlive processes (the OS holds the writes), not a power cut;
            # and a push takes the same few milliseconds whatever else the disk is doing.
            conn.execute("PRAGMA synchronous=OFF")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """An idle connection, used by this thread alone until the block ends.

        Safe against an interrupt at any line: a connection is referenced by ``conn``
        before it leaves the idle list, and goes back to it unless it is there already.
        """
        conn: Optional[sqlite3.Connection] = None
        try:
            with translate_errors(ERRORS, self.url):
                with self._lock:
                    if self._closed:
                        raise ConfigurationError(f"{self.url}: the backend is closed")
                    if self._idle:
                        conn = self._idle[-1]
                        del self._idle[-1]
                if conn is None:
                    conn = self._open()
                    with self._lock:
                        self._opened.add(conn)
                if conn.in_transaction:  # left open by an interrupted call
                    conn.rollback()
                yield conn
        finally:
            if conn is not None:
                with self._lock:
                    keep = not self._closed
                    if keep and conn not in self._idle:
                        self._idle.append(conn)
                if not keep:
                    conn.close()

    @property
    def _ns(self) -> str:
        """The namespace every query is restricted to."""
        return self.namespace

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        flat = json.dumps([{"dtype": s.dtype.name, "shape": list(s.shape)} for s in specs])
        with self._connection() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO tables (namespace, name, signature, specs) "
                "VALUES (?, ?, ?, ?)",
                (self._ns, name, signature, flat),
            )
        stored = self.signature(name)
        assert stored is not None  # made above, and tables are never dropped
        return stored

    def signature(self, name: str) -> Optional[str]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT signature FROM tables WHERE namespace = ? AND name = ?",
                (self._ns, name),
            ).fetchall()
        return rows[0][0] if rows else None

    def tables(self) -> List[str]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT name FROM tables WHERE namespace = ? ORDER BY name", (self._ns,)
            ).fetchall()
        return [row[0] for row in rows]

    def details(self, name: str) -> Dict[str, Any]:
        return {"file": self.path}

    # -- data ------------------------------------------------------------------------

    def version(self, name: str) -> int:
        with self._connection() as conn:
            return self._version(conn, name)

    def _version(self, conn: sqlite3.Connection, name: str) -> int:
        rows = conn.execute(
            "SELECT version FROM tables WHERE namespace = ? AND name = ?", (self._ns, name)
        ).fetchall()
        if not rows:
            raise TableNotFoundError(f"{self.url}: table {name!r} is gone")
        return int(rows[0][0])

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        payload = b"".join(array.tobytes() for array in arrays)  # a copy: never keep theirs
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time, in any process
            try:
                version = self._next_version(self._version(conn, name))
                conn.execute(
                    "INSERT INTO data (namespace, name, version, payload) VALUES (?, ?, ?, ?)",
                    (self._ns, name, version, payload),
                )
                conn.execute(
                    "UPDATE tables SET version = ? WHERE namespace = ? AND name = ?",
                    (version, self._ns, name),
                )
                conn.execute(
                    "DELETE FROM data WHERE namespace = ? AND name = ? AND version < ?",
                    (self._ns, name, version),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return version

    def _next_version(self, current: int) -> int:
        return current + 1

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        with self._connection() as conn:
            version = self._version(conn, name)
            epoch = conn.execute(
                "SELECT epoch FROM tables WHERE namespace = ? AND name = ?", (self._ns, name)
            ).fetchone()[0]
            self._histories.check(name, epoch, newer_than, where=self.url, current=version)
            if version <= newer_than:
                return version, None
            rows = conn.execute(  # one statement: the version and its own data
                "SELECT t.version, d.payload FROM tables t JOIN data d ON d.namespace = "
                "t.namespace AND d.name = t.name AND d.version = t.version "
                "WHERE t.namespace = ? AND t.name = ?",
                (self._ns, name),
            ).fetchall()
        if not rows:
            raise CorruptDataError(f"{self.url}: table {name!r} has no data for its version")
        version, payload = rows[0]
        return int(version), self._arrays(name, bytes(payload))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._idle = self._opened | set(self._idle), []
            self._opened = set()
        for conn in opened:
            conn.close()

    def _flat_specs(self, name: str) -> List[Spec]:
        if name not in self._specs:
            with self._connection() as conn:
                rows = conn.execute(
                    "SELECT specs FROM tables WHERE namespace = ? AND name = ?",
                    (self._ns, name),
                ).fetchall()
            if not rows:
                raise TableNotFoundError(f"{self.url}: table {name!r} is gone")
            self._specs[name] = [Spec(s["shape"], s["dtype"]) for s in json.loads(rows[0][0])]
        return self._specs[name]

    def _arrays(self, name: str, payload: bytes) -> List[np.ndarray]:
        specs = self._flat_specs(name)
        expected = sum(s.nbytes for s in specs)
        if len(payload) != expected:
            raise CorruptDataError(
                f"{self.url}: table {name!r} holds {len(payload)} bytes, expected {expected}"
            )
        out, offset = [], 0
        for spec in specs:
            array = np.frombuffer(payload, spec.dtype, count=spec.size, offset=offset)
            out.append(array.reshape(spec.shape))
            offset += spec.nbytes
        return out
