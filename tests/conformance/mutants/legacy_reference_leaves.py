# The 0.2-protocol reference, kept as it was (git show 952cb1a~1:tests/conformance/mutants/reference_leaves.py)
# but for the import of its base class: what tests/conformance/test_legacy_protocol.py runs the suite on
# through varsync.backends.legacy's adapter.
"""``vsqlite-leaves:///path/to/store.db``: the reference backend with leaf versions
(``supports_leaf_versions``), written from docs/plugins.md and the protocol's docstrings
as a third party would; the mutation tests break it on purpose (``mutants.broken_leaves``).

Its own schema beside the reference's: table ``tables`` gains a history token per created
table (``epoch``, random) and the current version's leaf-version map (JSON, one int per
leaf); table ``leaves`` holds one row per leaf and version at which that leaf was
written. A write, whole or partial, is one ``BEGIN IMMEDIATE`` transaction: it reads the
map, inserts the rows of the leaves given, sets the version and the new map, and deletes
the rows of those leaves that the new map no longer names (retention: a leaf unchanged
for any number of versions keeps its one row). A read is one transaction of several
statements (the head, then the rows it names), so it sees one version. A read for a
caller holding a version checks the epoch through :class:`varsync.backend.Histories`:
after :func:`start_new_history`, versions count from 1 again and a holder gets
:class:`~varsync.TableResetError`, never leaves of two histories.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

import numpy as np

from mutants.legacy_reference import SqliteBackend
from varsync import Spec
from varsync.backend import Histories, LeafSnapshot, Snapshot
from varsync.errors import CorruptDataError, TableNotFoundError

SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    namespace TEXT NOT NULL, name TEXT NOT NULL, signature TEXT NOT NULL,
    specs TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    epoch TEXT NOT NULL, leaf_versions TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS leaves (
    namespace TEXT NOT NULL, name TEXT NOT NULL, leaf INTEGER NOT NULL,
    version INTEGER NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (namespace, name, leaf, version));
"""

#: A table's head: its version, epoch and leaf-version map.
Head = Tuple[int, str, List[int]]


class SqliteLeafBackend(SqliteBackend):
    """Tables in one SQLite file, each leaf a row of the version that wrote it."""

    supports_leaf_versions = True
    schema = SCHEMA

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._histories = Histories()
        super().__init__(url, **kwargs)

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        flat = json.dumps([{"dtype": s.dtype.name, "shape": list(s.shape)} for s in specs])
        epoch = secrets.token_hex(8)
        with self._connection() as conn:
            made = conn.execute(
                "INSERT OR IGNORE INTO tables (namespace, name, signature, specs, epoch) "
                "VALUES (?, ?, ?, ?, ?)",
                (self._ns, name, signature, flat, epoch),
            ).rowcount
        if made:
            self._histories.adopt(name, epoch)
        self._specs.pop(name, None)  # a table made again may have other specs
        stored = self.signature(name)
        assert stored is not None  # made above; only start_new_history drops one
        return stored

    # -- writes ----------------------------------------------------------------------

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        return self._publish(name, dict(enumerate(arrays)), len(arrays), None)

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Optional[int] = None,
    ) -> int:
        return self._publish(name, leaves, len(specs), base)

    def _publish(
        self, name: str, leaves: Mapping[int, np.ndarray], count: int, base: Optional[int]
    ) -> int:
        """One version in which the leaves given change and the rest keep theirs, or 0
        (nothing written) if it is not on ``base`` or would leave a leaf without a value."""
        payloads = {index: array.tobytes() for index, array in leaves.items()}  # copies
        whole = len(payloads) == count
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time, in any process
            try:
                current, epoch, numbers = self._head(conn, name)
                if not self._may_write(name, current, epoch, base, whole):
                    conn.rollback()
                    return 0
                version = current + 1
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
        self._histories.adopt(name, epoch)  # this write's history is the one it saw
        return version

    def _may_write(
        self, name: str, current: int, epoch: str, base: Optional[int], whole: bool
    ) -> bool:
        if current == 0 and not whole:
            return False  # an empty table: nothing to keep the other leaves of
        if base is None:
            return True
        return current == base and epoch == self._histories.trusted(name)

    def _retain(self, conn: sqlite3.Connection, name: str, numbers: List[int]) -> None:
        """Delete the rows the current map no longer names: older rows of rewritten leaves."""
        conn.executemany(
            "DELETE FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? AND version < ?",
            [(self._ns, name, index, number) for index, number in enumerate(numbers)],
        )

    # -- reads -----------------------------------------------------------------------

    def _head(self, conn: sqlite3.Connection, name: str) -> Head:
        rows = conn.execute(
            "SELECT version, epoch, leaf_versions FROM tables WHERE namespace = ? AND name = ?",
            (self._ns, name),
        ).fetchall()
        if not rows:
            raise TableNotFoundError(f"{self.url}: table {name!r} is gone")
        version, epoch, numbers = rows[0]
        return int(version), str(epoch), [int(n) for n in json.loads(numbers)]

    def history_of(self, name: str) -> Optional[Hashable]:
        return self._histories.trusted(name)

    def leaf_versions(self, name: str) -> Tuple[int, List[int]]:
        with self._connection() as conn:
            version, _, numbers = self._head(conn, name)
        return version, numbers

    def read(
        self, name: str, newer_than: int, timeout: Optional[float],
        specs: Optional[Sequence[Spec]] = None,
    ) -> Snapshot:
        version, _, arrays = self._read(name, newer_than, every=True)
        if arrays is None:
            return version, None
        return version, [a for a in arrays if a is not None]

    def read_leaves(
        self, name: str, newer_than: int, timeout: Optional[float], specs: Sequence[Spec]
    ) -> LeafSnapshot:
        return self._read(name, newer_than, every=False)

    def _read(self, name: str, newer_than: int, every: bool) -> LeafSnapshot:
        """The head and the rows it names (those changed since ``newer_than``, or
        ``every`` one), in one transaction: one version, whatever writers do meanwhile."""
        specs = self._flat_specs(name)
        with self._connection() as conn:
            conn.execute("BEGIN")
            try:
                version, epoch, numbers = self._head(conn, name)
                self._check_history(name, epoch, newer_than, version)
                if version <= newer_than:
                    return version, None, None
                since = 0 if every else newer_than
                rows = self._rows(conn, name, since)
            finally:
                conn.rollback()  # read only: nothing to keep
        return version, numbers, self._arrays_of(name, version, numbers, since, rows, specs)

    def _check_history(self, name: str, epoch: str, held: int, version: int) -> None:
        self._histories.check(name, epoch, held, where=self.url, current=version)

    def _rows(
        self, conn: sqlite3.Connection, name: str, since: int
    ) -> Dict[int, Tuple[int, bytes]]:
        """``{leaf: (version, payload)}`` of the rows written after version ``since``."""
        found: Dict[int, Tuple[int, bytes]] = {}
        for leaf, version, payload in conn.execute(
            "SELECT leaf, version, payload FROM leaves WHERE namespace = ? AND name = ? "
            "AND version > ? ORDER BY version",
            (self._ns, name, since),
        ):
            found[int(leaf)] = (int(version), bytes(payload))  # the newest row wins
        return found

    def _arrays_of(
        self, name: str, version: int, numbers: List[int], since: int,
        rows: Dict[int, Tuple[int, bytes]], specs: Sequence[Spec],
    ) -> List[Optional[np.ndarray]]:
        if len(numbers) != len(specs):
            raise CorruptDataError(
                f"{self.url}: table {name!r} version {version} has {len(numbers)} leaf "
                f"versions for {len(specs)} leaves"
            )
        out: List[Optional[np.ndarray]] = []
        for index, (spec, number) in enumerate(zip(specs, numbers)):
            if number <= since:
                out.append(None)
                continue
            got = rows.get(index)
            if got is None or got[0] != number or len(got[1]) != spec.nbytes:
                raise CorruptDataError(
                    f"{self.url}: table {name!r} version {version} has no row of "
                    f"{spec.nbytes} bytes for leaf {index} at version {number}"
                )
            out.append(np.frombuffer(got[1], spec.dtype).reshape(spec.shape))
        return out


def start_new_history(url: str, table: str, namespace: str = "") -> None:
    """The conformance suite's ``new_history``: delete ``table`` and its rows from the
    store's file, as a store that lost its data; ``create_table`` makes it again (for
    ``vsqlite-leaves://``, with a new epoch) and its versions count from 1 again."""
    path = unquote(urlsplit(url).path)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for kind in ("tables", "data", "leaves"):
            if conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (kind,)
            ).fetchall():
                conn.execute(
                    f"DELETE FROM {kind} WHERE namespace = ? AND name = ?", (namespace, table)
                )
        conn.execute("COMMIT")
    finally:
        conn.close()
