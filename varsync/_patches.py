"""Element deltas in push, pull and ``update``: the writer's copies and chains, and the
reader's checks and in-place application (``docs/delta.md``, "Element deltas").

Writer (:func:`push_patched`): on a backend with
:class:`~varsync.backend.SupportsElementDeltas` a push finds the changed leaves as
``varsync._delta`` does, then diffs each against this container's copy of the value it
last pushed (:class:`Bases`) and sends a patch where it fits the room left in the
leaf's chain (:data:`CHAIN_SHARE` of the leaf at most), the whole leaf otherwise. Per
leaf:

- the copy costs the leaf's bytes in the writer's memory; a leaf whose patch gave up
  (it changed nearly everywhere) keeps no copy for 2, 4, 8, ... up to
  :data:`BACKOFF_MAX` pushes, then a sample of it (:func:`varsync._elements.sample_of`)
  instead of a copy: only once the next push's sample shows that a patch could fit is a
  copy kept again, and the push after it patched. A model that changes everywhere thus
  pays no copy at all after its first give-up, and a leaf under :data:`MIN_BYTES` is
  always sent whole;
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

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varsync import _adapters as adapters
from varsync import _checks as checks
from varsync import _delta as delta
from varsync import _elements as elements
from varsync._backends.base import Backend, Head, LeafChain, SupportsElementDeltas
from varsync._errors import CorruptDataError
from varsync._prefault import Prefaulted
from varsync._signature import Spec

log = logging.getLogger("varsync.patches")

__all__ = [
    "Bases",
    "Plan",
    "push_patched",
    "plan_patches",
    "resolved",
    "assign_changed",
    "after_push",
    "after_whole",
    "check_chain",
    "checked_patches",
    "patch_into",
    "rebuilt_leaf",
    "element_patch",
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
    kept), the links and bytes of the leaf's chain since its last whole value, the
    pushes left before a copy is kept again after a patch gave up, the length of that
    wait, and, once it is over, a sample of the last pushed value (``samples``) or the
    sample's word that a patch could fit (``hopeful``: keep a copy)."""

    values: list[np.ndarray | None]
    links: list[int]
    chain_bytes: list[int]
    skip: list[int]
    backoff: list[int] = field(default_factory=list)
    samples: list[np.ndarray | None] = field(default_factory=list)
    hopeful: list[bool] = field(default_factory=list)

    @classmethod
    def empty(cls, count: int) -> Bases:
        return cls(
            [None] * count,
            [0] * count,
            [0] * count,
            [0] * count,
            [0] * count,
            [None] * count,
            [False] * count,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the copies: what element deltas cost the writer's memory."""
        return sum(v.nbytes for v in self.values if v is not None)

    def forget(self, index: int) -> None:
        """Leaf ``index`` was written another way: no copy, a fresh chain."""
        self.values[index] = self.samples[index] = None
        self.links[index] = self.chain_bytes[index] = 0

    def sent_whole(self, index: int, array: np.ndarray) -> None:
        """Leaf ``index`` went whole: its chain starts again, and a copy is kept unless
        it is backing off (or, at the end of a wait, a sample first)."""
        self.links[index] = self.chain_bytes[index] = 0
        self.samples[index] = None
        if array.nbytes < MIN_BYTES or self.skip[index] > 0:
            self.skip[index] = max(0, self.skip[index] - 1)
            self.values[index] = None
            return
        if self.backoff[index] > 0 and not self.hopeful[index]:
            # the end of a wait: a sample, not a copy (a leaf too small to sample gets a
            # copy below, which costs little)
            self.samples[index] = elements.sample_of(array)
            if self.samples[index] is not None:
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
        self.hopeful[index] = False

    def gave_up(self, index: int) -> None:
        """Leaf ``index`` changed too much for a patch: keep no copy for a while."""
        self.backoff[index] = min(max(2, 2 * self.backoff[index]), BACKOFF_MAX)
        self.skip[index] = self.backoff[index] + 1  # this push's sent_whole counts one
        self.values[index] = self.samples[index] = None
        self.hopeful[index] = False
        self.links[index] = self.chain_bytes[index] = 0


@dataclass
class Plan:
    """What one push sends: leaves whole and leaves as patches, by flat index."""

    whole: dict[int, np.ndarray]
    patches: dict[int, bytes]


def plan_patches(
    bases: Bases,
    arrays: Sequence[np.ndarray],
    changed: Sequence[int],
    hashes: Sequence[bytes | None] = (),
    *,
    compress: bool = False,
) -> Plan:
    """For each changed leaf, a patch against ``bases``' copy where one is kept, the
    chain has room and the patch is small enough; else the whole leaf. ``hashes``: the
    leaves' xxh3-128 where the push computed it already (``varsync._delta``'s, the
    patch's own digest: not computed twice). A leaf whose patch gave up is marked so
    (:meth:`Bases.gave_up`); ``bases`` is otherwise left for :func:`after_push` once
    the write landed."""
    plan = Plan({}, {})
    for index in changed:
        array = arrays[index]
        kept = bases.values[index]
        sample = bases.samples[index]
        if kept is None and sample is not None:  # a wait is over: does it look sparse?
            limit = min(elements.MAX_SHARE, CHAIN_SHARE)
            if elements.changed_too_much(sample, array, limit):
                bases.gave_up(index)
            else:
                bases.hopeful[index] = True  # this push keeps a copy, the next patches
            plan.whole[index] = array
            continue
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
        digest = hashes[index] if index < len(hashes) else None
        patch = (
            elements.diff(kept, array, limit=limit, compress=compress, digest=digest)
            if limit > 0
            else None
        )
        if patch is None:
            # too big alone, not for want of room in a chain: keep no copy for a while
            # (a leaf that changed everywhere after a chain shows it in a sample)
            if bases.links[index] == 0 or _too_much_alone(kept, array):
                bases.gave_up(index)
            plan.whole[index] = array
        else:
            plan.patches[index] = patch.to_bytes()
    return plan


def _too_much_alone(kept: np.ndarray, array: np.ndarray) -> bool:
    """Whether ``array`` changed from ``kept`` in clearly too many elements for a first
    link of a chain, as a sample of the two shows: the test a leaf whose wait is over
    takes (a leaf too small to sample is not given up on: its copy costs little)."""
    sample = elements.sample_of(kept)
    limit = min(elements.MAX_SHARE, CHAIN_SHARE)
    return sample is not None and elements.changed_too_much(sample, array, limit)


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


def push_patched(
    backend: Backend,
    table: str,
    arrays: list[np.ndarray],
    specs: Sequence[Spec],
    last: delta.Written | None,
) -> delta.Written:
    """:func:`varsync._delta.push_changed` with element deltas: the changed leaves as
    patches where they are small enough, written onto exactly ``last``'s head; the whole
    value when there is no ``last``, nothing could be patched and every leaf changed, or
    the table moved on since. The record of it, with the writer's copies."""
    assert isinstance(backend, SupportsElementDeltas)  # the container's choice
    changed, samples, hashes = delta.changed_leaves(last, arrays)
    bases = last.bases if last is not None and last.bases is not None else None
    bases = bases if bases is not None else Bases.empty(len(arrays))
    head: Head | None = None
    if last is not None:
        plan = plan_patches(bases, arrays, changed, hashes)
        if plan.patches or len(plan.whole) < len(arrays):
            head = backend.write_patches(
                table, plan.whole, plan.patches, specs, last.head, math.inf
            )
            if head is not None:
                after_push(bases, arrays, plan)
    if head is None:  # a first push, everything changed, or the table moved on
        head = backend.write(table, arrays, specs, math.inf)
        after_whole(bases, arrays)
    return delta.Written(head, samples, hashes, bases)


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


def checked_patches(
    table: str,
    version: int,
    leaf_versions: Sequence[int],
    leaves: Sequence[np.ndarray | LeafChain | None],
    newer_than: int,
    specs: Sequence[Spec],
) -> list[list[elements.Patch] | None]:
    """Every leaf of a :meth:`read_patches` answer checked before any is used: arrays
    and anchors against their specs, chains joined up; the parsed patches per chain."""
    plain = [leaf.anchor if isinstance(leaf, LeafChain) else leaf for leaf in leaves]
    checks.read_leaves(table, version, plain, specs)
    parsed: list[list[elements.Patch] | None] = []
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, LeafChain):
            parsed.append(None)
            continue
        where = f"table {table!r} version {version}, leaf {index}"
        patches = check_chain(where, leaf, newer_than, leaf_versions[index])
        spec = specs[index]
        for patch in patches:
            if patch.count != math.prod(spec.shape) or patch.itemsize != spec.dtype.itemsize:
                raise CorruptDataError(
                    f"{where}: a patch for {patch.count} elements of {patch.itemsize} bytes, "
                    f"the signature says {spec}; fetch the whole leaf"
                )
        parsed.append(patches)
    return parsed


def _patched(
    leaf: LeafChain, patches: Sequence[elements.Patch], held: Any, out: np.ndarray
) -> np.ndarray:
    """``out`` filled with the chain's anchor (or ``held``, the value the reader holds,
    where it has none), then ``patches`` applied and verified."""
    np.copyto(out, leaf.anchor if leaf.anchor is not None else adapters.to_numpy(held))
    patch_into(out, patches)
    return out


def resolved(
    table: str,
    version: int,
    leaf_versions: Sequence[int],
    leaves: Sequence[np.ndarray | LeafChain | None],
    newer_than: int,
    specs: Sequence[Spec],
    held: Sequence[Any],
) -> list[np.ndarray | None]:
    """A :meth:`read_patches` answer as :meth:`read_leaves` would give it: each chain as
    a new array, its links applied onto a copy of its anchor or of ``held[i]`` (the
    reader's value at ``newer_than``), checked and verified. ``held`` is not modified.
    Raises :class:`CorruptDataError`: fetch the whole value instead."""
    parsed = checked_patches(table, version, leaf_versions, leaves, newer_than, specs)
    chains = [i for i, leaf in enumerate(leaves) if isinstance(leaf, LeafChain)]
    # new memory for every copy first, faulted in beside the copies (a VM that hands
    # freed pages back faults them in again about 10x slower than it copies)
    copies = {i: np.empty(specs[i].shape, specs[i].dtype) for i in chains}
    out: list[np.ndarray | None] = list(leaves)  # type: ignore[arg-type]
    with Prefaulted(list(copies.values())):
        for index in chains:
            leaf, patches = leaves[index], parsed[index]
            assert isinstance(leaf, LeafChain)
            assert patches is not None
            out[index] = _patched(leaf, patches, held[index], copies[index])
    return out


def assign_changed(
    table: str,
    version: int,
    leaf_versions: Sequence[int],
    leaves: Sequence[np.ndarray | LeafChain | None],
    newer_than: int,
    specs: Sequence[Spec],
    targets: Sequence[Any],
) -> int:
    """Assign a :meth:`read_patches` answer into ``targets`` (which hold ``newer_than``): whole
    arrays copied in, chains without an anchor applied in place into the target's own
    memory where its adapter gives it (numpy arrays, CPU tensors), else onto a host copy
    of the target, verified, of which only the changed elements are then written into
    the target where its adapter can (``assign_elements``: a CUDA tensor, a
    ``tf.Variable``), the whole copy where it cannot. Everything is checked before any
    target is touched; a hash mismatch raises :class:`CorruptDataError` with the targets
    partly updated (the caller then assigns the whole value). Returns the bytes of
    patches applied in place."""
    parsed = checked_patches(table, version, leaf_versions, leaves, newer_than, specs)
    assign: list[tuple[Any, np.ndarray]] = []
    in_place: list[tuple[Any, np.ndarray, list[elements.Patch]]] = []
    elementwise: list[tuple[Any, np.ndarray, list[elements.Patch]]] = []
    for index, (leaf, patches) in enumerate(zip(leaves, parsed)):
        if leaf is None:
            continue
        if not isinstance(leaf, LeafChain):
            assign.append((targets[index], leaf))
            continue
        assert patches is not None
        view = adapters.patch_view(targets[index]) if leaf.anchor is None else None
        if view is not None and view.dtype == specs[index].dtype:
            in_place.append((targets[index], view, patches))
            continue
        spec = specs[index]
        value = _patched(leaf, patches, targets[index], np.empty(spec.shape, spec.dtype))
        if leaf.anchor is None and adapters.assign_elements_of(targets[index]) is not None:
            elementwise.append((targets[index], value, patches))
        else:
            assign.append((targets[index], value))
    for target, value, patches in elementwise:  # only the changed elements go in
        changed = np.unique(np.concatenate([elements.positions_of(p) for p in patches]))
        assign_elements = adapters.assign_elements_of(target)
        assert assign_elements is not None
        assign_elements(target, changed, value)
    if assign:
        adapters.assign_all([t for t, _ in assign], [a for _, a in assign])
    moved = 0
    for target, view, patches in in_place:
        patch_into(view, patches)
        adapters.patched(target)
        moved += sum(p.nbytes for p in patches)
    return moved


def element_patch(old: np.ndarray, new: np.ndarray, *, always: bool = False) -> bytes | None:
    """The patch a push would send for a leaf that was ``old`` and is ``new`` (its wire
    form, as ``write_patches`` gets it), or ``None`` where the leaf would go whole
    (``always``: a patch however large): for a plugin's own tests of
    :class:`~varsync.backend.SupportsElementDeltas`."""
    patch = elements.diff(old, new, limit=None if always else elements.MAX_SHARE)
    return None if patch is None else patch.to_bytes()
