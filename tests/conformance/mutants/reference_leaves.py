"""``vsqlite-leaves:///path/to/store.db``: the reference backend with leaf versions
(:class:`~varsync.backend.SupportsLeafVersions`) and reads of chosen leaves
(:class:`~varsync.backend.SupportsLeafSubsets`), written from docs/plugins.md and the
protocol's docstrings as a third party would, to Backend protocol 1; the mutation tests
break it on purpose (``mutants.broken_leaves``, subclasses of :class:`SqliteLeafStore`).

Its own schema beside the reference's: table ``tables`` gains the current version's
leaf-version map (JSON, one int per leaf) beside the epoch SQLite mints per inserted row;
table ``leaves`` holds one row per leaf and version at which that leaf was written. A
write, whole or partial, is one ``BEGIN IMMEDIATE`` transaction: it reads the head and the
map, refuses a ``base`` that is not that head (epoch included), inserts the rows of the
leaves given, sets the version and the new map, and deletes the rows of those leaves that
the new map no longer names (retention: a leaf unchanged for any number of versions keeps
its one row). A read is one transaction of several statements (the head, then the rows it
names), so it sees one version and answers that version's head; a read of chosen leaves
is the same transaction, selecting the rows of those leaves alone. After
:func:`start_new_history`, versions count from 1 again under a new epoch: the core, which
compares epochs, tells a holder of the old history; this backend remembers nothing of what
a caller saw.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple, final
from urllib.parse import unquote, urlsplit

import numpy as np

from mutants.reference import SqliteStore
from varsync.backend import (
    CorruptDataError,
    Head,
    LeafRead,
    Read,
    Spec,
    SupportsLeafSubsets,
    TableNotFoundError,
    leaf_subset,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    namespace TEXT NOT NULL, name TEXT NOT NULL, signature TEXT NOT NULL,
    specs TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    epoch TEXT NOT NULL DEFAULT (lower(hex(randomblob(8)))),
    leaf_versions TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS leaves (
    namespace TEXT NOT NULL, name TEXT NOT NULL, leaf INTEGER NOT NULL,
    version INTEGER NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (namespace, name, leaf, version));
"""


class SqliteLeafStore(SqliteStore, SupportsLeafSubsets):
    """Tables in one SQLite file, each leaf a row of the version that wrote it."""

    schema = SCHEMA

    # -- writes ----------------------------------------------------------------------

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        head = self._publish(name, dict(enumerate(arrays)), len(arrays), None, deadline)
        assert head is not None  # a whole write on no base always lands
        return head

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Optional[Head],
        deadline: float,
    ) -> Optional[Head]:
        return self._publish(name, leaves, len(specs), base, deadline)

    def _publish(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        count: int,
        base: Optional[Head],
        deadline: float,
    ) -> Optional[Head]:
        """One version in which the leaves given change and the rest keep theirs, or
        ``None`` (nothing written) if the head is not ``base`` or it would leave a leaf
        without a value."""
        payloads = {index: array.tobytes() for index, array in leaves.items()}  # copies
        whole = len(payloads) == count
        with self._connection(deadline) as conn:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time, in any process
            try:
                current, numbers = self._leaf_head(conn, name)
                if not self._may_write(current, base, whole):
                    conn.rollback()
                    return None
                version = current.version + 1
                numbers = [version] * count if whole else list(numbers)
                for index, payload in payloads.items():
                    numbers[index] = version
                    conn.execute(
                        "INSERT INTO leaves (namespace, name, leaf, version, payload) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (self._ns, name, index, version, payload),
                    )
                conn.execute(
                    "UPDATE tables SET version = ?, leaf_versions = ? "
                    "WHERE namespace = ? AND name = ?",
                    (version, json.dumps(numbers), self._ns, name),
                )
                self._retain(conn, name, numbers)
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return Head(version, current.epoch)

    def _may_write(self, current: Head, base: Optional[Head], whole: bool) -> bool:
        if current.version == 0 and not whole:
            return False  # an empty table: nothing to keep the other leaves of
        return base is None or current == base  # the version and the epoch

    def _retain(self, conn: sqlite3.Connection, name: str, numbers: List[int]) -> None:
        """Delete the rows the current map no longer names: older rows of rewritten leaves."""
        conn.executemany(
            "DELETE FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? AND version < ?",
            [(self._ns, name, index, number) for index, number in enumerate(numbers)],
        )

    # -- reads -----------------------------------------------------------------------

    def _leaf_head(self, conn: sqlite3.Connection, name: str) -> Tuple[Head, List[int]]:
        """The table's head and its leaf-version map, in one statement."""
        rows = conn.execute(
            "SELECT version, epoch, leaf_versions FROM tables WHERE namespace = ? AND name = ?",
            (self._ns, name),
        ).fetchall()
        if not rows:
            raise TableNotFoundError(f"{self.url}: table {name!r} is gone")
        version, epoch, numbers = rows[0]
        return Head(int(version), str(epoch)), [int(n) for n in json.loads(numbers)]

    def leaf_versions(self, name: str, deadline: float) -> Tuple[Head, List[int]]:
        with self._connection(deadline) as conn:
            return self._leaf_head(conn, name)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        head, _, arrays = self._read(name, newer_than, deadline, specs, every=True)
        if arrays is None:
            return Read(head, None)
        return Read(head, [a for a in arrays if a is not None])

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        return self._read(name, newer_than, deadline, specs, every=False)

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        chosen = leaf_subset(name, indices, len(specs))  # checked before any statement
        return self._read(name, newer_than, deadline, specs, every=False, chosen=chosen)

    def _read(
        self,
        name: str,
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
        every: bool,
        chosen: Optional[Collection[int]] = None,
    ) -> LeafRead:
        """The head and the rows it names (those changed since ``newer_than``, or
        ``every`` one; of the ``chosen`` leaves only, if given), in one transaction: one
        version, whatever writers do meanwhile."""
        with self._connection(deadline) as conn:
            conn.execute("BEGIN")
            try:
                head, numbers = self._leaf_head(conn, name)
                if head.version <= newer_than:
                    return LeafRead(head, None, None)
                since = 0 if every else newer_than
                rows = self._rows(conn, name, since, chosen)
            finally:
                conn.rollback()  # read only: nothing to keep
        arrays = self._arrays_of(name, head, numbers, since, rows, specs, chosen)
        return LeafRead(head, numbers, arrays)

    def _rows(
        self,
        conn: sqlite3.Connection,
        name: str,
        since: int,
        chosen: Optional[Collection[int]] = None,
    ) -> Dict[int, Tuple[int, bytes]]:
        """``{leaf: (version, payload)}`` of the rows written after version ``since``
        (of the ``chosen`` leaves only, if given)."""
        query = (
            "SELECT leaf, version, payload FROM leaves WHERE namespace = ? AND name = ? "
            "AND version > ?"
        )
        arguments: List[object] = [self._ns, name, since]
        if chosen is not None:
            query += f" AND leaf IN ({', '.join('?' * len(chosen))})"
            arguments += list(chosen)
        found: Dict[int, Tuple[int, bytes]] = {}
        for leaf, version, payload in conn.execute(query + " ORDER BY version", arguments):
            found[int(leaf)] = (int(version), bytes(payload))  # the newest row wins
        return found

    def _arrays_of(
        self, name: str, head: Head, numbers: List[int], since: int,
        rows: Dict[int, Tuple[int, bytes]], specs: Sequence[Spec],
        chosen: Optional[Collection[int]] = None,
    ) -> List[Optional[np.ndarray]]:
        if len(numbers) != len(specs):
            raise CorruptDataError(
                f"{self.url}: table {name!r} version {head.version} has {len(numbers)} leaf "
                f"versions for {len(specs)} leaves"
            )
        out: List[Optional[np.ndarray]] = []
        for index, (spec, number) in enumerate(zip(specs, numbers)):
            if number <= since or (chosen is not None and index not in chosen):
                out.append(None)
                continue
            got = rows.get(index)
            if got is None or got[0] != number or len(got[1]) != spec.nbytes:
                raise CorruptDataError(
                    f"{self.url}: table {name!r} version {head.version} has no row of "
                    f"{spec.nbytes} bytes for leaf {index} at version {number}"
                )
            out.append(np.frombuffer(got[1], spec.dtype).reshape(spec.shape))
        return out


@final
class SqliteLeafBackend(SqliteLeafStore):
    """``vsqlite-leaves://``: :class:`SqliteLeafStore` as registered (its broken variants
    subclass the store, not this)."""


def start_new_history(url: str, table: str, namespace: str = "") -> None:
    """The conformance suite's ``new_history``: delete ``table`` and its rows from the
    store's file, as a store that lost its data; ``create_table`` makes it again, with a
    new epoch, and its versions count from 1 again."""
    path = unquote(urlsplit(url).path)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        # every table of every reference's schema (tables, data, leaves, links) is keyed
        # by namespace and name
        kinds = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
        ).fetchall()
        for (kind,) in kinds:
            conn.execute(f"DELETE FROM {kind} WHERE namespace = ? AND name = ?", (namespace, table))
        conn.execute("COMMIT")
    finally:
        conn.close()
