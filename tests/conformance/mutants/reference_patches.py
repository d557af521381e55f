"""``vsqlite-patches:///path/to/store.db``: the leaf-version reference
(``mutants.reference_leaves``) with element deltas
(:class:`~varsync.backend.SupportsElementDeltas`), written from docs/plugins.md and the
protocol's docstrings as a third party would, to Backend protocol 1; the mutation tests
break it on purpose (``mutants.broken_patches``, subclasses of :class:`SqlitePatchStore`).

Per leaf the file keeps an *anchor* (its whole value, a row of table ``leaves``, at the
leaf version it was last written whole) and the *chain* of patch rows written since
(table ``links``: base, version, the patch's bytes, opaque here). A whole write of a leaf
replaces its anchor and deletes its chain; a patch adds a link whose base is the leaf's
leaf version in the base head. Each write is one ``BEGIN IMMEDIATE`` transaction that
refuses a ``base`` other than the head, epoch included (retention: the anchor and chain of
every leaf's current value stay, nothing else). Reads are one transaction too:
:meth:`read_patches` gives a leaf's links alone when they reach back to a leaf version the
reader holds, else its anchor and links; :meth:`read`, :meth:`read_leaves` and
:meth:`read_leaf_subset` (the chosen leaves' rows alone) rebuild whole values with :func:`~varsync.backend.rebuilt_leaf`, which verifies each link.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Union, final

import numpy as np

from mutants.reference_leaves import SCHEMA as LEAF_SCHEMA
from mutants.reference_leaves import SqliteLeafStore
from varsync.backend import (
    CorruptDataError,
    Head,
    LeafChain,
    LeafRead,
    PatchLink,
    PatchRead,
    Read,
    Spec,
    SupportsElementDeltas,
    leaf_subset,
    rebuilt_leaf,
)

SCHEMA = LEAF_SCHEMA + """
CREATE TABLE IF NOT EXISTS links (
    namespace TEXT NOT NULL, name TEXT NOT NULL, leaf INTEGER NOT NULL,
    base INTEGER NOT NULL, version INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (namespace, name, leaf, version));
"""

#: A changed leaf as read: its array, or a chain of patches (with or without its anchor).
Leaf = Union[np.ndarray, LeafChain]


class SqlitePatchStore(SqliteLeafStore, SupportsElementDeltas):
    """Tables in one SQLite file, each leaf an anchor row and the patch rows since."""

    schema = SCHEMA

    # -- writes ----------------------------------------------------------------------

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        head = self._commit(name, dict(enumerate(arrays)), {}, len(arrays), None, deadline)
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
        return self._commit(name, leaves, {}, len(specs), base, deadline)

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Optional[Head]:
        return self._commit(name, leaves, patches, len(specs), base, deadline)

    def _commit(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        count: int,
        base: Optional[Head],
        deadline: float,
    ) -> Optional[Head]:
        """One version in which the leaves given whole get new anchors and the patched
        ones a link each, or ``None`` (nothing written) if the head is not ``base`` or it
        would leave a leaf without a value."""
        payloads = {index: array.tobytes() for index, array in leaves.items()}  # copies
        data = {index: bytes(patch) for index, patch in patches.items()}
        whole = len(payloads) == count and not data
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
                    self._start_chain(conn, name, index, version)
                for index, patch in data.items():
                    self._add_link(conn, name, index, PatchLink(numbers[index], version, patch))
                    numbers[index] = version
                conn.execute(
                    "UPDATE tables SET version = ?, leaf_versions = ? "
                    "WHERE namespace = ? AND name = ?",
                    (version, json.dumps(numbers), self._ns, name),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return Head(version, current.epoch)

    def _start_chain(self, conn: sqlite3.Connection, name: str, leaf: int, version: int) -> None:
        """Leaf ``leaf`` was written whole at ``version``: its older anchors and every
        link go (retention)."""
        conn.execute(
            "DELETE FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? AND version < ?",
            (self._ns, name, leaf, version),
        )
        conn.execute(
            "DELETE FROM links WHERE namespace = ? AND name = ? AND leaf = ?",
            (self._ns, name, leaf),
        )

    def _add_link(self, conn: sqlite3.Connection, name: str, leaf: int, link: PatchLink) -> None:
        conn.execute(
            "INSERT INTO links (namespace, name, leaf, base, version, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._ns, name, leaf, link.base, link.version, link.data),
        )

    # -- reads -----------------------------------------------------------------------

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        head, _, leaves = self._read_chains(name, newer_than, 0, deadline, specs, False)
        if leaves is None:
            return Read(head, None)
        return Read(head, [self._whole(leaf) for leaf in leaves if leaf is not None])

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        head, numbers, leaves = self._read_chains(
            name, newer_than, newer_than, deadline, specs, False
        )
        if leaves is None:
            return LeafRead(head, None, None)
        return LeafRead(head, numbers, [None if a is None else self._whole(a) for a in leaves])

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        chosen = leaf_subset(name, indices, len(specs))
        head, numbers, leaves = self._read_chains(
            name, newer_than, newer_than, deadline, specs, False, chosen
        )
        if leaves is None:
            return LeafRead(head, None, None)
        return LeafRead(head, numbers, [None if a is None else self._whole(a) for a in leaves])

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        return self._read_chains(name, newer_than, newer_than, deadline, specs, True)

    @staticmethod
    def _whole(leaf: Leaf) -> np.ndarray:
        return rebuilt_leaf(leaf) if isinstance(leaf, LeafChain) else leaf

    def _read_chains(
        self,
        name: str,
        newer_than: int,
        since: int,
        deadline: float,
        specs: Sequence[Spec],
        links_alone: bool,
        chosen: Optional[Collection[int]] = None,
    ) -> PatchRead:
        """The head (answering nothing if it is not newer than ``newer_than``) and each
        leaf changed since ``since`` (the version the reader holds; 0: none; of the
        ``chosen`` leaves only, if given): its links alone where ``links_alone`` and they
        reach back to ``since``, else its anchor and links, or its anchor; in one
        transaction, so of one version."""
        with self._connection(deadline) as conn:
            conn.execute("BEGIN")
            try:
                head, numbers = self._leaf_head(conn, name)
                if head.version <= newer_than:
                    return PatchRead(head, None, None)
                if len(numbers) != len(specs):
                    raise CorruptDataError(
                        f"{self.url}: table {name!r} version {head.version} has "
                        f"{len(numbers)} leaf versions for {len(specs)} leaves"
                    )
                # links after `since`: every link since the anchor of a leaf anchored later
                chains = self._links(conn, name, since if links_alone else 0)
                leaves: List[Optional[Leaf]] = []
                for index, (spec, number) in enumerate(zip(specs, numbers)):
                    links = chains.get(index, [])
                    if number <= since or (chosen is not None and index not in chosen):
                        leaves.append(None)
                    elif links_alone and since and links and links[0].base <= since:
                        leaves.append(LeafChain(None, 0, links))
                    else:
                        leaves.append(self._anchored(conn, name, index, spec, number, links))
            finally:
                conn.rollback()  # read only: nothing to keep
        return PatchRead(head, numbers, leaves)

    def _links(self, conn: sqlite3.Connection, name: str, since: int) -> Dict[int, List[PatchLink]]:
        """Per leaf, its links that give a version after ``since``, oldest first."""
        found: Dict[int, List[PatchLink]] = {}
        for leaf, base, version, data in conn.execute(
            "SELECT leaf, base, version, data FROM links WHERE namespace = ? AND name = ? "
            "AND version > ? ORDER BY leaf, version",
            (self._ns, name, since),
        ):
            found.setdefault(int(leaf), []).append(PatchLink(int(base), int(version), bytes(data)))
        return found

    def _anchored(
        self,
        conn: sqlite3.Connection,
        name: str,
        leaf: int,
        spec: Spec,
        number: int,
        links: List[PatchLink],
    ) -> Leaf:
        """Leaf ``leaf`` from its anchor: the array, or the anchor and the links after it."""
        rows = conn.execute(
            "SELECT version, payload FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? "
            "ORDER BY version DESC LIMIT 1",
            (self._ns, name, leaf),
        ).fetchall()
        if not rows or len(rows[0][1]) != spec.nbytes:
            raise CorruptDataError(
                f"{self.url}: table {name!r} has no anchor of {spec.nbytes} bytes for leaf "
                f"{leaf} at version {number}"
            )
        version, payload = int(rows[0][0]), bytes(rows[0][1])
        links = [link for link in links if link.version > version]
        if (links[-1].version if links else version) != number:
            raise CorruptDataError(
                f"{self.url}: table {name!r} leaf {leaf} changed at version {number}, but its "
                f"anchor and links end at {links[-1].version if links else version}"
            )
        anchor = np.frombuffer(payload, spec.dtype).reshape(spec.shape)
        return LeafChain(anchor, version, links) if links else anchor


@final
class SqlitePatchBackend(SqlitePatchStore):
    """``vsqlite-patches://``: :class:`SqlitePatchStore` as registered (its broken
    variants subclass the store, not this)."""
