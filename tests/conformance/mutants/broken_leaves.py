"""Broken variants of the leaf-version reference (``mutants.reference_leaves``), one
defect each, as a hurried plugin author might write them to Backend protocol 1. The
conformance suite must fail every one of them (tests/conformance/test_suite_catches_broken_backends.py);
each docstring says what is wrong."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Type

import numpy as np

from mutants.broken import ROUND_TRIP
from mutants.reference_leaves import SqliteLeafStore
from varsync.backend import Head, LeafRead, Spec


class IgnoresBase(SqliteLeafStore):
    """``write_leaves`` ignores ``base``: a push that skips unchanged leaves lands on top
    of another writer's version and keeps that writer's leaves."""

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Optional[Head],
        deadline: float,
    ) -> Optional[Head]:
        return super().write_leaves(name, leaves, specs, None, deadline)


class IgnoresTheEpochOfBase(SqliteLeafStore):
    """``write_leaves`` compares ``base``'s version with the table's, not its epoch: a
    base of another history with the same number is taken for the current head, and the
    new version keeps leaves the writer never saw."""

    def _may_write(self, current: Head, base: Optional[Head], whole: bool) -> bool:
        same_number = None if base is None else Head(base.version, current.epoch)
        return super()._may_write(current, same_number, whole)


class WritesLeavesIntoAnEmptyTable(SqliteLeafStore):
    """``write_leaves`` into an empty table writes the leaves given: the version it
    publishes has leaves without a value."""

    def _may_write(self, current: Head, base: Optional[Head], whole: bool) -> bool:
        return super()._may_write(current, base, True)


class ReadsTheLatestChangeOnly(SqliteLeafStore):
    """``read_leaves`` returns the leaves the latest version changed, not every leaf
    changed since ``newer_than``: a reader that skipped versions misses leaves."""

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        head, numbers, arrays = super().read_leaves(name, newer_than, deadline, specs)
        if numbers is None or arrays is None or newer_than == 0:
            return LeafRead(head, numbers, arrays)
        return LeafRead(
            head, numbers, [a if n == head.version else None for a, n in zip(arrays, numbers)]
        )


class KeepsRecentVersionsOnly(SqliteLeafStore):
    """Retention deletes every leaf row more than 1,000 versions old, the rows the
    current version still names included: a leaf left unchanged that long is lost."""

    KEPT = 1000

    def _retain(self, conn: sqlite3.Connection, name: str, numbers: List[int]) -> None:
        conn.execute(
            "DELETE FROM leaves WHERE namespace = ? AND name = ? AND version <= ?",
            (self._ns, name, max(numbers) - self.KEPT),
        )


class ReusesTheEpoch(SqliteLeafStore):
    """Names a table's epoch after the table (the same token in every history), rather
    than minting one when the table is made: after the table is lost and made again,
    variables updated from the old history take only the new one's changes since."""

    def _head_of(self, conn: sqlite3.Connection, name: str) -> Head:
        return Head(super()._head_of(conn, name).version, f"{self._ns}/{name}")

    def _leaf_head(self, conn: sqlite3.Connection, name: str) -> Tuple[Head, List[int]]:
        head, numbers = super()._leaf_head(conn, name)
        return Head(head.version, f"{self._ns}/{name}"), numbers


class ComposesOutsideTheTransaction(SqliteLeafStore):
    """``write_leaves`` reads the head in one transaction and writes the new version in
    another: of two writers' partial pushes at once, one overwrites the other's."""

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Optional[Head],
        deadline: float,
    ) -> Optional[Head]:
        if len(leaves) == len(specs):
            return self.write(name, [leaves[i] for i in range(len(specs))], specs, deadline)
        with self._connection(deadline) as conn:
            current, numbers = self._leaf_head(conn, name)
        if not self._may_write(current, base, False):
            return None
        version = current.version + 1
        with self._connection(deadline) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for index, array in leaves.items():
                    numbers[index] = version
                    conn.execute(
                        "INSERT OR REPLACE INTO leaves VALUES (?, ?, ?, ?, ?)",
                        (self._ns, name, index, version, array.tobytes()),
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


class TornLeafReads(SqliteLeafStore):
    """``read_leaves`` reads the head, then (a round trip later, :data:`ROUND_TRIP`) each
    leaf's newest row, each statement on its own (no transaction around them): a write
    landing in between mixes two versions."""

    def _read(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec], every: bool
    ) -> LeafRead:
        with self._connection(deadline) as conn:
            head, numbers = self._leaf_head(conn, name)
            if head.version <= newer_than:
                return LeafRead(head, None, None)
            time.sleep(ROUND_TRIP)
            arrays: List[Optional[np.ndarray]] = []
            for index, (spec, number) in enumerate(zip(specs, numbers)):
                if number <= newer_than and not every:
                    arrays.append(None)
                    continue
                (payload,), = conn.execute(
                    "SELECT payload FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? "
                    "ORDER BY version DESC LIMIT 1",
                    (self._ns, name, index),
                ).fetchall()
                arrays.append(np.frombuffer(bytes(payload), spec.dtype).reshape(spec.shape))
        return LeafRead(head, numbers, arrays)


class SubsetOfTwoVersions(SqliteLeafStore):
    """``read_leaf_subset`` reads the head, then (a round trip later) each chosen leaf's
    newest row, each statement on its own (no transaction around them): a write landing
    in between gives a chosen leaf of a newer version than the head names."""

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        with self._connection(deadline) as conn:
            head, numbers = self._leaf_head(conn, name)
            if head.version <= newer_than:
                return LeafRead(head, None, None)
            time.sleep(ROUND_TRIP)
            arrays: List[Optional[np.ndarray]] = [None] * len(specs)
            for index in sorted(set(indices)):
                if numbers[index] <= newer_than:
                    continue
                spec = specs[index]
                (payload,), = conn.execute(
                    "SELECT payload FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? "
                    "ORDER BY version DESC LIMIT 1",
                    (self._ns, name, index),
                ).fetchall()
                arrays[index] = np.frombuffer(bytes(payload), spec.dtype).reshape(spec.shape)
        return LeafRead(head, numbers, arrays)


class SubsetIgnoresIndices(SqliteLeafStore):
    """``read_leaf_subset`` answers ``read_leaves``: every leaf changed since, chosen or
    not (a reader of some blocks moves the whole part again)."""

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        return self.read_leaves(name, newer_than, deadline, specs)


class SubsetInOrderGiven(SqliteLeafStore):
    """``read_leaf_subset`` puts the chosen leaves' arrays first, in the order of
    ``indices``, not at their flat indices: a chosen leaf is dropped and another's array
    lands in its neighbour's place."""

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        head, numbers, arrays = super().read_leaf_subset(
            name, indices, newer_than, deadline, specs
        )
        if arrays is None:
            return LeafRead(head, numbers, arrays)
        packed = [arrays[i] for i in indices if arrays[i] is not None]
        return LeafRead(head, numbers, packed + [None] * (len(arrays) - len(packed)))


class SubsetIgnoresNewerThan(SqliteLeafStore):
    """``read_leaf_subset`` gives every chosen leaf of a newer version, changed since
    ``newer_than`` or not."""

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        head = self.head(name, deadline)
        if head.version <= newer_than:
            return LeafRead(head, None, None)
        return super().read_leaf_subset(name, indices, 0, deadline, specs)


LEAF_VARIANTS: Dict[str, Type[SqliteLeafStore]] = {
    "vsqlite-leaves-ignores-base": IgnoresBase,
    "vsqlite-leaves-ignores-epoch-of-base": IgnoresTheEpochOfBase,
    "vsqlite-leaves-into-empty": WritesLeavesIntoAnEmptyTable,
    "vsqlite-leaves-latest-change-only": ReadsTheLatestChangeOnly,
    "vsqlite-leaves-keeps-recent-only": KeepsRecentVersionsOnly,
    "vsqlite-leaves-reuses-epoch": ReusesTheEpoch,
    "vsqlite-leaves-torn-reads": TornLeafReads,
    "vsqlite-leaves-subset-of-two-versions": SubsetOfTwoVersions,
    "vsqlite-leaves-subset-ignores-indices": SubsetIgnoresIndices,
    "vsqlite-leaves-subset-in-order-given": SubsetInOrderGiven,
    "vsqlite-leaves-subset-ignores-newer-than": SubsetIgnoresNewerThan,
}
"""Scheme -> broken variant."""

#: Broken variants the suite does not fail every time: registered (to run by hand), but
#: not in the mutation tests, which must not depend on luck. Each is a gap in the suite.
NOT_ALWAYS_CAUGHT: Dict[str, Type[SqliteLeafStore]] = {
    # test_partial_pushes_from_two_writers_lose_no_leaf fails it in about half the runs:
    # a leaf is lost only when one writer's push lands between the other's read of the
    # map and its write (microseconds of a push of some milliseconds), and the two
    # writers, started without a barrier, overlap for part of their 120 pushes only
    "vsqlite-leaves-composes-outside": ComposesOutsideTheTransaction,
}
