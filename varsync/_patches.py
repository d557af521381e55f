"""Element deltas in push, pull and ``update``: the writer's copies and chains, and the
reader's checks and in-place application (``docs/delta.md``, "Element deltas").

Writer (:func:`push_patched`): on a backend with
:class:`~varsync.backend.SupportsElementDeltas` a push finds the changed leaves as
``varsync._delta`` does, then diffs each against this container's copy of the value it
last pushed (:class:`Bases`) and sends a patch where it is at most
:data:`~varsync._elements.MAX_SHARE` of the leaf, the whole leaf otherwise. Per leaf:

- the copy costs the leaf's bytes in the writer's memory; a leaf whose patch gave up
  (it changed nearly everywhere) keeps no copy for 1, 2, 4, ... up to
  :data:`BACKOFF_MAX` pushes, so a model that changes everywhere pays a copy only that
  rarely, and a leaf under :data:`MIN_BYTES` is always sent whole;
- a chain of patches since the leaf's last whole value is at most :data:`MAX_CHAIN`
  links and :data:`CHAIN_SHARE` of the leaf's bytes; past either, the leaf goes whole,
  so a store that keeps an anchor and its links holds at most 1.5 times the leaf.

A patch is written only onto exactly the head this container wrote last (its version
and epoch): after another writer's push, or a reset, the push is whole.

Reader (:func:`check_chain`, :func:`patch_into`, :func:`rebuilt_leaf`): the links of a
:class:`~varsync.backend.LeafChain` must join up (each base the version before, the
first at most what the reader holds, the last the leaf's leaf version), and every
patched value's xxh3-128 must be the writer's, else :class:`CorruptDataError` and the
caller fetches the whole leaf (``VariableContainer`` does so at once, once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from varsync import _elements as elements
from varsync._backends.base import LeafChain
from varsync._errors import CorruptDataError

__all__ = [
    "Bases",
    "Plan",
    "plan_patches",
    "after_push",
    "after_whole",
    "check_chain",
    "patch_into",
    "rebuilt_leaf",
    "MAX_CHAIN",
    "CHAIN_SHARE",
    "MIN_BYTES",
    "BACKOFF_MAX",
]

#: Links in a leaf's chain since its last whole value, at most.
MAX_CHAIN = 16
#: Bytes of a leaf's chain since its last whole value, at most, as a share of the leaf.
CHAIN_SHARE = 0.5
#: Leaves smaller than this are sent whole: a patch's header and bookkeeping cost more.
MIN_BYTES = 1024
#: The most pushes a leaf whose patch gave up goes without a copy.
BACKOFF_MAX = 64


@dataclass
class Bases:
    """The writer's state per leaf: a copy of the value it last pushed (``None``: none
    kept), the links and bytes of the leaf's chain since its last whole value, and the
    pushes left before a copy is kept again after a patch gave up."""

    values: list[np.ndarray | None]
    links: list[int]
    chain_bytes: list[int]
    skip: list[int]
    backoff: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, count: int) -> Bases:
        return cls([None] * count, [0] * count, [0] * count, [0] * count, [0] * count)

    @property
    def nbytes(self) -> int:
        """Bytes held by the copies: what element deltas cost the writer's memory."""
        return sum(v.nbytes for v in self.values if v is not None)

    def forget(self, index: int) -> None:
        """Leaf ``index`` was written another way: no copy, a fresh chain."""
        self.values[index] = None
        self.links[index] = self.chain_bytes[index] = 0

    def sent_whole(self, index: int, array: np.ndarray) -> None:
        """Leaf ``index`` went whole: its chain starts again, and a copy is kept unless
        it is backing off."""
        self.links[index] = self.chain_bytes[index] = 0
        if array.nbytes < MIN_BYTES or self.skip[index] > 0:
            self.skip[index] = max(0, self.skip[index] - 1)
            self.values[index] = None
            return
        kept = self.values[index]
        if kept is None or kept.shape != array.shape or kept.dtype != array.dtype:
            self.values[index] = np.array(array, copy=True, order="C")
        else:
            np.copyto(kept, array)

    def sent_patch(self, index: int, array: np.ndarray, size: int) -> None:
        kept = self.values[index]
        assert kept is not None  # a patch is made against the copy
        np.copyto(kept, array)
        self.links[index] += 1
        self.chain_bytes[index] += size
        self.backoff[index] = 0

    def gave_up(self, index: int) -> None:
        """Leaf ``index`` changed too much for a patch: keep no copy for a while."""
        self.backoff[index] = min(max(1, 2 * self.backoff[index]), BACKOFF_MAX)
        self.skip[index] = self.backoff[index]
        self.values[index] = None
        self.links[index] = self.chain_bytes[index] = 0


@dataclass
class Plan:
    """What one push sends: leaves whole and leaves as patches, by flat index."""

    whole: dict[int, np.ndarray]
    patches: dict[int, bytes]


def plan_patches(
    bases: Bases, arrays: Sequence[np.ndarray], changed: Sequence[int], *, compress: bool = False
) -> Plan:
    """For each changed leaf, a patch against ``bases``' copy where one is kept, the
    chain has room and the patch is small enough; else the whole leaf. A leaf whose
    patch gave up is marked so (:meth:`Bases.gave_up`); ``bases`` is otherwise left for
    :func:`after_push` once the write landed."""
    plan = Plan({}, {})
    for index in changed:
        array = arrays[index]
        kept = bases.values[index]
        if (
            kept is None
            or array.nbytes < MIN_BYTES
            or bases.links[index] >= MAX_CHAIN
            or kept.shape != array.shape
            or kept.dtype != array.dtype
        ):
            plan.whole[index] = array
            continue
        room = CHAIN_SHARE * array.nbytes - bases.chain_bytes[index]
        limit = min(elements.MAX_SHARE, room / array.nbytes)
        patch = elements.diff(kept, array, limit=limit, compress=compress) if limit > 0 else None
        if patch is None:
            if room >= elements.MAX_SHARE * array.nbytes:  # it changed nearly everywhere
                bases.gave_up(index)
            plan.whole[index] = array
        else:
            plan.patches[index] = patch.to_bytes()
    return plan


def after_push(bases: Bases, arrays: Sequence[np.ndarray], plan: Plan) -> None:
    """Record a write of ``plan`` that landed."""
    for index, data in plan.patches.items():
        bases.sent_patch(index, arrays[index], len(data))
    for index in plan.whole:
        bases.sent_whole(index, arrays[index])


def after_whole(bases: Bases, arrays: Sequence[np.ndarray]) -> None:
    """Record a write of every leaf whole."""
    for index, array in enumerate(arrays):
        bases.sent_whole(index, array)


# -- reading -----------------------------------------------------------------------------


def check_chain(
    where: str, chain: LeafChain, newer_than: int, leaf_version: int
) -> list[elements.Patch]:
    """The parsed patches of ``chain``, after checking that its links join up: from the
    anchor's version (or, without one, from a base at most ``newer_than``, the version
    the reader holds), each link's base the version before it, the last at
    ``leaf_version``. Raises :class:`CorruptDataError` naming the break."""
    links = chain.links
    if not links:
        raise CorruptDataError(f"{where}: a chain of no patches; fetch the whole leaf")
    first = links[0]
    if chain.anchor is not None:
        if first.base != chain.anchor_version:
            raise CorruptDataError(
                f"{where}: the first patch is against version {first.base}, the anchor is "
                f"version {chain.anchor_version}; fetch the whole leaf"
            )
    elif not first.base <= newer_than < first.version:
        raise CorruptDataError(
            f"{where}: the first patch turns version {first.base} into {first.version}, "
            f"but the reader holds version {newer_than}; fetch the whole leaf"
        )
    for before, link in zip(links, links[1:]):
        if link.base != before.version or link.version <= link.base:
            raise CorruptDataError(
                f"{where}: patches do not join up: version {before.version}, then a patch "
                f"against {link.base} (a lost patch?); fetch the whole leaf"
            )
    if links[-1].version != leaf_version:
        raise CorruptDataError(
            f"{where}: the patches end at version {links[-1].version}, the leaf changed at "
            f"{leaf_version}; fetch the whole leaf"
        )
    return [elements.Patch.from_bytes(link.data) for link in links]


def patch_into(target: np.ndarray, patches: Sequence[elements.Patch]) -> None:
    """Apply ``patches`` in order into ``target`` (writable, C-contiguous), each result
    checked against its writer's hash. On a mismatch the patch that failed is undone and
    :class:`CorruptDataError` raised: ``target`` then holds an earlier link's value, so
    the caller must not hand it out as any version."""
    for patch in patches:
        elements.apply(target, patch)


def rebuilt_leaf(chain: LeafChain, held: np.ndarray | None = None) -> np.ndarray:
    """A new array: the chain's anchor (or ``held``, the reader's own value, when the
    chain has none) with every link applied and verified. For a backend that keeps an
    anchor and its links, this is how its ``read`` answers a whole value. Links are not
    checked for joining up here (:func:`check_chain` is the core's)."""
    base = chain.anchor if chain.anchor is not None else held
    if base is None:
        raise CorruptDataError("a chain without an anchor, and no value held to apply it to")
    out = np.array(base, copy=True, order="C")
    patch_into(out, [elements.Patch.from_bytes(link.data) for link in chain.links])
    return out
