"""Broken variants of the element-delta reference (``mutants.reference_patches``), one
defect each, as a hurried plugin author might write them to Backend protocol 1. The
conformance suite must fail every one of them
(tests/conformance/test_suite_catches_broken_backends.py); each docstring says what is
wrong."""

from __future__ import annotations

import sqlite3
from typing import Dict, Mapping, Optional, Sequence, Type

import numpy as np

from mutants.reference_patches import SqlitePatchStore
from varsync.backend import Head, LeafChain, PatchLink, PatchRead, Spec


class PatchesOntoAnyHead(SqlitePatchStore):
    """``write_patches`` ignores ``base``: a patch made against the writer's last version
    lands on whatever head is current, another writer's included, and the leaf it gives
    is neither writer's value."""

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Optional[Head]:
        return self._commit(name, leaves, patches, len(specs), None, deadline)


class IgnoresTheEpochOfBase(SqlitePatchStore):
    """``write_patches`` compares ``base``'s version with the head's, not its epoch: a
    patch against a version of a lost history lands on the new history's version of the
    same number."""

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Optional[Head]:
        current = self.head(name, deadline)
        if base.version == current.version:
            base = current
        return super().write_patches(name, leaves, patches, specs, base, deadline)


class KeepsTheLatestLinkOnly(SqlitePatchStore):
    """Its links are keyed by leaf, not by leaf and version: each patch replaces the
    leaf's previous link, so the chain since the anchor has a gap (a reader one version
    behind still gets the one link it needs; a reader further behind, and every whole
    read, does not)."""

    def _add_link(self, conn: sqlite3.Connection, name: str, leaf: int, link: PatchLink) -> None:
        conn.execute(
            "DELETE FROM links WHERE namespace = ? AND name = ? AND leaf = ?",
            (self._ns, name, leaf),
        )
        super()._add_link(conn, name, leaf, link)


class LinksEveryPatchToTheAnchor(SqlitePatchStore):
    """``write_patches`` stores each link under the leaf's anchor version instead of its
    leaf version in ``base``: the patches apply in order all the same (whole reads are
    right), but the links a reader gets do not join up."""

    def _add_link(self, conn: sqlite3.Connection, name: str, leaf: int, link: PatchLink) -> None:
        ((anchor,),) = conn.execute(
            "SELECT max(version) FROM leaves WHERE namespace = ? AND name = ? AND leaf = ?",
            (self._ns, name, leaf),
        ).fetchall()
        super()._add_link(conn, name, leaf, link._replace(base=int(anchor)))


class LeavesOutAMiddleLink(SqlitePatchStore):
    """``read_patches`` leaves out the second link of every chain of three or more (a
    slice off by one): the reader's chain has a gap."""

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        head, numbers, leaves = super().read_patches(name, newer_than, deadline, specs)
        if leaves is None:
            return PatchRead(head, numbers, leaves)
        return PatchRead(
            head,
            numbers,
            [
                leaf._replace(links=[leaf.links[0], *leaf.links[2:]])
                if isinstance(leaf, LeafChain) and len(leaf.links) >= 3
                else leaf
                for leaf in leaves
            ],
        )


class FlipsAPatchByte(SqlitePatchStore):
    """Stores each patch with its last byte (one of the new values) flipped, as a
    faulty encoder might: the value the patches build is not the one whose xxh3 the
    writer put in them."""

    def _add_link(self, conn: sqlite3.Connection, name: str, leaf: int, link: PatchLink) -> None:
        data = link.data[:-1] + bytes([link.data[-1] ^ 0x01])
        super()._add_link(conn, name, leaf, link._replace(data=data))


class LinksAcrossAWholeWrite(SqlitePatchStore):
    """A whole write of a leaf replaces its anchor but keeps its links (whole reads
    skip them, being older than the anchor), and ``read_patches`` hands a reader that
    held a version before the whole write the links since, as if they joined up
    across it."""

    def _start_chain(self, conn: sqlite3.Connection, name: str, leaf: int, version: int) -> None:
        conn.execute(
            "DELETE FROM leaves WHERE namespace = ? AND name = ? AND leaf = ? AND version < ?",
            (self._ns, name, leaf, version),
        )


PATCH_VARIANTS: Dict[str, Type[SqlitePatchStore]] = {
    "vsqlite-patches-onto-any-head": PatchesOntoAnyHead,
    "vsqlite-patches-ignores-epoch-of-base": IgnoresTheEpochOfBase,
    "vsqlite-patches-latest-link-only": KeepsTheLatestLinkOnly,
    "vsqlite-patches-links-to-anchor": LinksEveryPatchToTheAnchor,
    "vsqlite-patches-gap-on-read": LeavesOutAMiddleLink,
    "vsqlite-patches-flips-a-byte": FlipsAPatchByte,
    "vsqlite-patches-across-whole-write": LinksAcrossAWholeWrite,
}
"""Scheme -> broken variant."""
