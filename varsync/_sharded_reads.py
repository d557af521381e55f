"""Reading sharded tables (``docs/sharded.md``): the latest version whole, or the blocks
a caller asks for, all of the one version a manifest read names; and the delta reads of
``pull_if_newer(held=)`` and ``update``, which fetch only the blocks changed since the
version the caller holds.

Delta reads. Each part table holds, beside its blocks, the step at which each block's
content last changed (``~changed``, written by ``varsync._sharded.BlockChanges``). A
caller holding step ``h`` needs block ``b`` only where ``changed[b] > h``. A part
table's own leaf versions cannot tell that: the two slots alternate, so its previous
version is two steps old. They serve to fetch few leaves: per part table, this
container remembers the version it last read and that version's ``~changed``, and asks
(``read_leaves``) for the leaves changed since. What comes back and is not needed is
dropped (blocks changed since this reader last read *that slot*, not since the step it
holds); a block needed that does not come back (it changed and changed back) is asked
for again with a lower ``newer_than``, at worst the whole part table.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from varsync import _adapters as adapters
from varsync import _checks as checks
from varsync import _delta as delta
from varsync import _elements as elements
from varsync import _nest as nest_lib
from varsync import _patches as patches_lib
from varsync import _shard_layout as layout_lib
from varsync._backends.base import (
    Backend,
    Head,
    LeafChain,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsLeafVersions,
    reads_leaf_subsets,
    remaining,
)
from varsync._errors import ConfigurationError, CorruptDataError, PullTimeoutError
from varsync._history import UNKNOWN
from varsync._shard_layout import Block, Ranges
from varsync._sharded import NO_PART, NOTHING, Manifest, PartLayout, ShardedTables, part_name
from varsync._signature import Spec
from varsync._waiting import wait_for_change

__all__ = [
    "ShardedReads",
    "Held",
    "Patches",
    "Piece",
    "OTHER_HISTORY",
    "patched_leaves",
    "sliced_leaves",
    "assign_pieces",
]

log = logging.getLogger("varsync.sharded")


class Patches(NamedTuple):
    """A changed block given as element patches, checked to join up, to be applied in
    order onto the block's value in what the caller holds (each verified as applied)."""

    patches: list[elements.Patch]


#: One changed block of a leaf: its index ranges and its values, or its patches.
Piece = tuple[Ranges, "np.ndarray | Patches"]
#: :meth:`ShardedReads.read_changed`'s answer for a version of another history than the
#: table's now: nothing was fetched.
OTHER_HISTORY: Any = object()
_T = TypeVar("_T")


class Held(NamedTuple):
    """A version of a sharded table a caller holds: as users see it, its history (the
    manifest's epoch), and the training step it was published for."""

    version: int
    epoch: Hashable
    step: int


class _Seen(NamedTuple):
    head: Head  # a part table's version (and history) this container last read
    changed: np.ndarray  # its ~changed leaf at that version


class _Stale(NamedTuple):
    part: str
    found: int
    expected: int


class ShardedReads:
    """The reads of one container's sharded tables. It keeps, per table, the steps of
    the versions it handed out (the last :attr:`KEEP`), and per part table the version
    it last read with its ``~changed`` leaf: a few integers per block, no values."""

    KEEP = 64

    def __init__(self, tables: ShardedTables, backend: Backend) -> None:
        self._tables = tables
        self._backend = backend
        self._lock = threading.Lock()
        self._steps: dict[str, collections.OrderedDict[int, tuple[Hashable, int]]] = {}
        self._seen: dict[str, _Seen] = {}
        self._element_parts: dict[str, bool] = {}

    # -- what callers hold ---------------------------------------------------------------

    def handed(self, name: str, manifest: Manifest) -> Head:
        """The container hands out ``manifest``'s version: its head as users see it."""
        with self._lock:
            steps = self._steps.setdefault(name, collections.OrderedDict())
            steps[manifest.version] = (manifest.head.epoch, manifest.step)
            steps.move_to_end(manifest.version)
            while len(steps) > self.KEEP:
                steps.popitem(last=False)
        return Head(manifest.version, manifest.head.epoch)

    def held(self, name: str, version: int, epoch: Any = UNKNOWN) -> Held | None:
        """What a caller holding ``version`` (of history ``epoch``, if given) holds, if
        this container handed it out (recently); else ``None``: read whole."""
        with self._lock:
            steps = self._steps.get(name)
            known = None if steps is None else steps.get(version)
        if known is None or (epoch is not UNKNOWN and known[0] != epoch):
            return None
        return Held(version, known[0], known[1])

    # -- reads ---------------------------------------------------------------------------

    def read(
        self,
        name: str,
        wanted: Mapping[int, Ranges] | None,
        newer_than: int,
        deadline: float,
        limit: float | None,
        *,
        wait_until: float | None,
    ) -> tuple[Manifest, dict[int, np.ndarray] | None]:
        """The manifest, and the blocks ``wanted`` (flat leaf index -> ranges; ``None``:
        every leaf whole) of its version if it is newer than ``newer_than`` (else
        ``None``; before a first version, wait until ``wait_until`` if given, else
        ``None``), fetching only the part tables that hold some of them."""
        meta = self._tables.meta(name)
        if wanted is None:
            wanted = {i: layout_lib.full_ranges(s) for i, s in enumerate(meta.specs)}
        chosen = wanted

        def attempt(manifest: Manifest) -> dict[int, np.ndarray] | _Stale:
            out = {
                leaf: np.empty([b - a for a, b in ranges], meta.specs[leaf].dtype)
                for leaf, ranges in chosen.items()
            }
            copied = dict.fromkeys(chosen, 0)
            for rank in range(meta.world):
                expected = manifest.parts[rank]
                if expected == NO_PART:
                    continue
                part = part_name(name, manifest.slot, rank)
                layout = self._tables.layout(part)
                needed = sorted(_within(layout, chosen)[0])
                if not needed:
                    continue
                got = self._blocks_of(part, layout, needed, expected, deadline)
                if isinstance(got, _Stale):
                    return got
                head, arrays = got
                if layout.changes is not None and arrays[layout.changes] is not None:
                    self._remember(part, head, arrays[layout.changes])  # a whole read's
                for i in needed:
                    block = layout.blocks[i]
                    copied[block.leaf] += layout_lib.copy_block(
                        out[block.leaf], chosen[block.leaf], np.asarray(arrays[i]), block.ranges
                    )
            for leaf, count in copied.items():
                if count != layout_lib.volume(chosen[leaf]):
                    raise CorruptDataError(
                        f"sharded table {name!r} version {manifest.version}: its parts "
                        f"hold {count} of the {layout_lib.volume(chosen[leaf])} elements "
                        f"asked for of leaf {leaf}"
                    )
            return out

        return self._consistent(name, newer_than, deadline, limit, wait_until, attempt)

    def _blocks_of(
        self, part: str, layout: PartLayout, needed: Sequence[int], expected: int, deadline: float
    ) -> tuple[Head, list[np.ndarray | None]] | _Stale:
        """Part table ``part`` at its version ``expected`` (else :class:`_Stale`), with
        at least its blocks ``needed``: those alone where the backend reads chosen leaves
        (:class:`~varsync.backend.SupportsLeafSubsets`), else every leaf, ``~changed``
        included (remembered for the ``read_leaves`` delta path; the path of a backend
        that reads chosen leaves asks for ``~changed`` itself)."""
        backend = self._backend
        if not reads_leaf_subsets(backend) or len(needed) == len(layout.blocks):
            head, whole = backend.read(part, 0, deadline, layout.specs)
            if head.version != expected or whole is None:
                return _Stale(part, head.version, expected)
            checks.read_leaves(part, head.version, whole, layout.specs, whole=True)
            every: list[np.ndarray | None] = list(whole)
            return head, every
        assert isinstance(backend, SupportsLeafSubsets)
        head, _, arrays = backend.read_leaf_subset(part, needed, 0, deadline, layout.specs)
        if head.version != expected or arrays is None:
            return _Stale(part, head.version, expected)
        checks.read_leaves(part, head.version, arrays, layout.specs)
        absent = [i for i in needed if arrays[i] is None]
        if absent:
            raise CorruptDataError(
                f"part table {part!r} version {head.version}: leaves {absent} were asked "
                "for and did not come"
            )
        return head, list(arrays)

    def read_changed(
        self,
        name: str,
        held: Held,
        deadline: float,
        limit: float | None,
        wanted: Mapping[int, Ranges] | None = None,
    ) -> tuple[Manifest, Any]:
        """The manifest, and per flat leaf the blocks that changed since ``held`` (a
        ``dict[int, list[Piece]]``; leaves absent: unchanged), if it is newer; ``None``
        if not; :data:`OTHER_HISTORY` if the table's history is not ``held``'s. With
        ``wanted`` (flat leaf index -> ranges: ``pull_slices``'), only the blocks that
        intersect it, as patches only where a block lies inside it."""
        world = self._tables.meta(name).world

        def attempt(manifest: Manifest) -> Any:
            if manifest.head.epoch != held.epoch:
                return OTHER_HISTORY
            pieces: dict[int, list[Piece]] = {}
            for rank in range(world):
                expected = manifest.parts[rank]
                if expected == NO_PART:
                    continue
                part = part_name(name, manifest.slot, rank)
                within = None if wanted is None else _within(self._tables.layout(part), wanted)
                if within is not None and not within[0]:
                    continue  # none of its blocks is wanted
                got = self._changed_blocks(part, expected, held.step, deadline, within)
                if isinstance(got, _Stale):
                    return got
                for block, array in got:
                    pieces.setdefault(block.leaf, []).append((block.ranges, array))
            return pieces

        manifest, answer = self._consistent(name, held.version, deadline, limit, None, attempt)
        if manifest.head.epoch != held.epoch or manifest.version < held.version:
            return manifest, OTHER_HISTORY
        return manifest, answer

    def _changed_blocks(
        self,
        part: str,
        expected: int,
        held_step: int,
        deadline: float,
        within: _Within | None = None,
    ) -> list[tuple[Block, np.ndarray | Patches]] | _Stale:
        """Part table ``part``'s blocks that changed after step ``held_step``, at its
        version ``expected`` (else :class:`_Stale`); of those ``within`` names, if
        given."""
        layout = self._tables.layout(part)
        if layout.changes is None:  # no ~changed: every block, whole
            every = range(len(layout.blocks)) if within is None else sorted(within[0])
            got = self._blocks_of(part, layout, every, expected, deadline)
            if isinstance(got, _Stale):
                return got
            return [(layout.blocks[i], _present(got[1][i])) for i in every]
        backend = self._backend
        assert isinstance(backend, SupportsLeafVersions)  # sharded tables need it
        if reads_leaf_subsets(backend):
            return self._changed_blocks_alone(part, layout, expected, held_step, deadline, within)
        with self._lock:
            seen = self._seen.get(part)
        newer_than = expected - 1 if seen is None else min(seen.head.version, expected - 1)
        answer: dict[int, np.ndarray] = {}
        while True:
            head, leaf_versions, arrays = backend.read_leaves(
                part, max(newer_than, 0), deadline, layout.specs
            )
            if head.version != expected or arrays is None or leaf_versions is None:
                return _Stale(part, head.version, expected)
            checks.read_leaves(part, head.version, arrays, layout.specs)
            if len(leaf_versions) != len(layout.specs):
                raise CorruptDataError(
                    f"part table {part!r} version {head.version}: {len(leaf_versions)} leaf "
                    f"versions for {len(layout.specs)} leaves"
                )
            answer.update((i, a) for i, a in enumerate(arrays) if a is not None)
            if seen is not None and seen.head.epoch != head.epoch:
                seen = None  # another history: its numbers and its ~changed mean nothing
            changed = answer.get(layout.changes)
            if (
                changed is None
                and seen is not None
                and leaf_versions[layout.changes] <= seen.head.version  # the same since
            ):
                changed = seen.changed
            if changed is None:
                needed: list[int] = []
                missing = [layout.changes]
            else:
                needed = [i for i, step in enumerate(changed.tolist()) if step > held_step]
                needed = [i for i in needed if within is None or i in within[0]]
                missing = [i for i in needed if i not in answer]
            if not missing:
                assert changed is not None
                self._remember(part, head, changed)
                return [(layout.blocks[i], answer[i]) for i in needed]
            lowest = min(int(leaf_versions[i]) for i in missing)
            if lowest > newer_than:
                raise CorruptDataError(
                    f"part table {part!r} version {head.version}: leaf versions "
                    f"{[int(leaf_versions[i]) for i in missing]} are newer than {newer_than}, "
                    "and those leaves did not come"
                )
            newer_than = lowest - 1  # rare: a block that changed and changed back

    def _changed_blocks_alone(
        self,
        part: str,
        layout: PartLayout,
        expected: int,
        held_step: int,
        deadline: float,
        within: _Within | None = None,
    ) -> list[tuple[Block, np.ndarray | Patches]] | _Stale:
        """:meth:`_changed_blocks` on a backend that reads chosen leaves: the
        ``~changed`` leaf first (with ``~held``), then exactly the blocks changed after
        ``held_step``, both of the part's version ``expected`` (two small requests
        instead of the blocks changed since this reader last read the slot); as element
        patches where the part table names a version that held ``held_step``
        (:meth:`_patched_blocks`). Where this reader saw that part table written with
        element deltas before, it asks for the patches since ``expected - 1`` first (the
        version a rank's catch-up wrote): one request where the guess holds."""
        assert layout.changes is not None
        backend = self._backend
        assert isinstance(backend, SupportsLeafSubsets)
        patched = layout.held is not None and isinstance(backend, SupportsElementDeltas)
        with self._lock:
            guess = patched and self._element_parts.get(_rank_of(part), False)
        if guess:
            first = self._patched_blocks(part, layout, expected, expected - 1, held_step, deadline)
            if first is not None:
                return self._restricted(part, layout, expected, first, within, deadline)
        small = [layout.changes] if layout.held is None else [layout.changes, layout.held]
        head, _, arrays = backend.read_leaf_subset(part, small, 0, deadline, layout.specs)
        if head.version != expected or arrays is None:
            return _Stale(part, head.version, expected)
        checks.read_leaves(part, head.version, arrays, layout.specs)
        changed = arrays[layout.changes]
        if changed is None:
            raise CorruptDataError(f"part table {part!r} version {head.version}: no ~changed")
        needed = [i for i, step in enumerate(np.asarray(changed).tolist()) if step > held_step]
        needed = [i for i in needed if within is None or i in within[0]]
        if patched:
            assert layout.held is not None
            rows = arrays[layout.held]
            self._saw_rows(part, rows)
            base = _version_holding(rows, held_step, expected)
            if needed and base is not None:
                since = self._patched_blocks(part, layout, expected, base, held_step, deadline)
                if since is not None:
                    return self._restricted(part, layout, expected, since, within, deadline)
        blocks: list[np.ndarray | None] = []
        if needed:
            got = self._blocks_of(part, layout, needed, expected, deadline)
            if isinstance(got, _Stale):
                return got
            if got[0] != head:  # another history under the same number: read again
                return _Stale(part, expected, expected)
            blocks = got[1]
        return [(layout.blocks[i], _present(blocks[i])) for i in needed]

    def _patched_blocks(
        self,
        part: str,
        layout: PartLayout,
        expected: int,
        base: int,
        held_step: int,
        deadline: float,
    ) -> list[tuple[Block, np.ndarray | Patches]] | _Stale | None:
        """The blocks of part table ``part`` at version ``expected`` changed since its
        version ``base``, each as the element patches since (or whole where the store
        answers so), if that version's ``~held`` says ``base`` held ``held_step``:
        exactly the blocks the caller needs. ``None`` where it does not say so, or the
        answer does not fit (links that do not join up): read as blocks."""
        backend = self._backend
        assert isinstance(backend, SupportsElementDeltas)
        assert layout.held is not None
        answer = backend.read_patches(part, base, deadline, layout.specs)
        if answer.head.version != expected:
            return _Stale(part, answer.head.version, expected)
        leaves, versions = answer.leaves, answer.leaf_versions
        if leaves is None or versions is None:
            return None
        rows = leaves[layout.held]
        self._saw_rows(part, rows)
        if rows is None or isinstance(rows, LeafChain):
            return None
        if _version_holding(rows, held_step, expected) != base:
            return None  # the guess was wrong, or no version held the step
        try:
            parsed = patches_lib.checked_patches(
                part, expected, versions, leaves, base, layout.specs
            )
            out: list[tuple[Block, np.ndarray | Patches]] = []
            for index, block in enumerate(layout.blocks):
                leaf = leaves[index]
                if leaf is None:  # not changed since a version that held the step
                    continue
                if not isinstance(leaf, LeafChain):
                    out.append((block, leaf))
                elif leaf.anchor is None:
                    out.append((block, Patches(parsed[index] or [])))
                else:
                    out.append((block, patches_lib.rebuilt_leaf(leaf)))
        except CorruptDataError as exc:
            log.warning("part table %r: %s; fetching its changed blocks whole", part, exc)
            return None
        return out

    def _restricted(
        self,
        part: str,
        layout: PartLayout,
        expected: int,
        got: list[tuple[Block, np.ndarray | Patches]] | _Stale,
        within: _Within | None,
        deadline: float,
    ) -> list[tuple[Block, np.ndarray | Patches]] | _Stale:
        """:meth:`_patched_blocks`' answer, of the blocks ``within`` names if given;
        a block given as patches that does not lie inside the caller's ranges (which
        hold only part of it) fetched whole instead."""
        if within is None or isinstance(got, _Stale):
            return got
        index = {block: i for i, block in enumerate(layout.blocks)}
        chosen, inside = within
        kept = [(b, v) for b, v in got if index[b] in chosen]
        whole = [index[b] for b, v in kept if isinstance(v, Patches) and index[b] not in inside]
        if not whole:
            return kept
        fetched = self._blocks_of(part, layout, whole, expected, deadline)
        if isinstance(fetched, _Stale):
            return fetched
        arrays = fetched[1]
        return [(b, _present(arrays[index[b]]) if index[b] in whole else v) for b, v in kept]

    def _saw_rows(self, part: str, rows: Any) -> None:
        """Whether part table ``part``'s last ``~held`` seen names versions: it was
        written with element deltas, and so is its rank's other slot, most likely (the
        next read of either guesses its base)."""
        written = isinstance(rows, np.ndarray) and bool((rows.reshape(-1, 2)[:, 0] > 0).any())
        with self._lock:
            self._element_parts[_rank_of(part)] = written

    def _remember(self, part: str, head: Head, changed: Any) -> None:
        array = np.array(changed, dtype=np.int64)  # a copy: a store's buffer may be reused
        with self._lock:
            self._seen[part] = _Seen(head, array)

    def _consistent(
        self,
        name: str,
        newer_than: int,
        deadline: float,
        limit: float | None,
        wait_until: float | None,
        attempt: Callable[[Manifest], _T | _Stale],
    ) -> tuple[Manifest, _T | None]:
        """The manifest, and ``attempt(manifest)`` if its version is newer than
        ``newer_than``; a part table found at another version than the manifest says
        (a later step overwrote the slot, a replica lags) means reading the manifest
        again, bounded by ``deadline``."""
        backend = self._backend
        while True:
            manifest = self._tables.manifest(name, deadline)
            if manifest.step == NOTHING:
                if wait_until is None:
                    return manifest, None
                self._wait_for_first(name, manifest, wait_until, limit)
                continue
            if manifest.version <= newer_than:
                return manifest, None
            result = attempt(manifest)
            if not isinstance(result, _Stale):
                return manifest, result
            if remaining(deadline) <= 0:
                raise PullTimeoutError(
                    f"sharded table {name!r}: part table {result.part!r} was at version "
                    f"{result.found}, not the {result.expected} of the manifest, until the "
                    f"timeout ({limit:g} s): newer steps kept overwriting the slot being read"
                )
            # a part behind the manifest (a replica that lags): wait for the part; one
            # ahead of it (a later step overwrote the slot): for the manifest to move on
            table, version = (
                (result.part, result.found)
                if result.found < result.expected
                else (name, manifest.head.version)
            )
            with contextlib.suppress(PullTimeoutError):  # the loop raises it
                wait_for_change(backend, table, version, UNKNOWN, deadline, deadline, limit)

    def _wait_for_first(
        self, name: str, manifest: Manifest, deadline: float, limit: float | None
    ) -> None:
        try:
            if remaining(deadline) <= 0:
                raise PullTimeoutError("no time left")
            wait_for_change(
                self._backend, name, manifest.head.version, UNKNOWN, deadline, deadline, limit
            )
        except PullTimeoutError:
            empty = PullTimeoutError(
                f"sharded table {name!r} at {self._backend.url} has no published version "
                f"after {limit:g} s; every rank must push_shard a step first"
            )
            empty.still_empty = True
            raise empty from None

    def wanted_blocks(self, name: str, slices: Mapping[Any, Any]) -> dict[int, Ranges]:
        """``pull_slices``' ``{path: index_ranges}`` as flat leaf index -> checked ranges."""
        meta = self._tables.meta(name)
        if not isinstance(slices, Mapping) or not slices:
            raise ConfigurationError(
                f"pull_slices takes a non-empty mapping of leaf paths to index ranges, "
                f"got {slices!r:.80}"
            )
        paths = delta.LeafPaths(meta.signature)
        wanted: dict[int, Ranges] = {}
        for path, ranges in slices.items():
            node, indices, walked = paths.leaf_indices(path)
            if len(indices) != 1:
                raise ConfigurationError(
                    f"pull_slices: {nest_lib.format_path(walked)} names an inner node of "
                    f"{len(indices)} leaves; name each leaf"
                )
            wanted[indices[0]] = layout_lib.checked_ranges(ranges, node, path)
        return wanted


#: A part table's blocks a slice read wants: those that intersect its ranges, and those
#: of them inside its ranges (flat block indices).
_Within = tuple[set[int], set[int]]


def _within(layout: PartLayout, wanted: Mapping[int, Ranges]) -> _Within:
    """The blocks of ``layout`` that ``wanted`` intersects, and those inside it."""
    chosen, inside = set(), set()
    for i, block in enumerate(layout.blocks):
        ranges = wanted.get(block.leaf)
        common = None if ranges is None else layout_lib.intersection(block.ranges, ranges)
        if common is not None:
            chosen.add(i)
            if common == block.ranges:
                inside.add(i)
    return chosen, inside


def _rank_of(part: str) -> str:
    """A part table's name without its slot: ``name/parts/{slot}/{rank}`` ->
    ``name/parts/{rank}``."""
    head, _, rank = part.rpartition("/")
    return f"{head.rpartition('/')[0]}/{rank}"


def _version_holding(rows: Any, step: int, below: int) -> int | None:
    """The part version below ``below`` that a part table's ``~held`` rows say held
    ``step``, if any."""
    if rows is None:
        return None
    for version, held in np.asarray(rows).reshape(-1, 2).tolist():
        if held == step and 0 < version < below:
            return int(version)
    return None


def _present(array: np.ndarray | None) -> np.ndarray:
    """A block :meth:`ShardedReads._blocks_of` returned: it checked that each came."""
    assert array is not None
    return array


# -- the changed blocks into what the caller holds -----------------------------------------


def _whole(spec: Spec, pieces: Sequence[Piece]) -> np.ndarray | None:
    """The leaf's new value if ``pieces`` cover all of it (they never overlap) with
    values, else ``None``."""
    if any(isinstance(value, Patches) for _, value in pieces):
        return None
    if sum(layout_lib.volume(ranges) for ranges, _ in pieces) != spec.size:
        return None
    if len(pieces) == 1:
        return _values(pieces[0][1])
    out = np.empty(spec.shape, spec.dtype)
    for ranges, array in pieces:
        layout_lib.copy_block(out, layout_lib.full_ranges(spec), _values(array), ranges)
    return out


def _values(value: np.ndarray | Patches) -> np.ndarray:
    assert not isinstance(value, Patches)  # _whole and _into look first
    return value


def _into(target: np.ndarray, target_at: Ranges, pieces: Sequence[Piece]) -> None:
    """Write ``pieces`` into ``target`` (writable, holding the caller's value of the
    block ``target_at`` of the leaf: all of it, or a slice): values copied in where
    they meet it, patches (of blocks inside it) applied onto the block's values there
    (in place where the block is contiguous, else onto a copy of it written back), each
    verified. Raises :class:`CorruptDataError` on a patch that does not verify."""
    for ranges, value in pieces:
        if not isinstance(value, Patches):
            layout_lib.copy_block(target, target_at, value, ranges)
            continue
        region = target[tuple(slice(a - t, b - t) for (a, b), (t, _) in zip(ranges, target_at))]
        if region.flags.c_contiguous:
            patches_lib.patch_into(region, value.patches)
        else:
            block = np.ascontiguousarray(region)
            patches_lib.patch_into(block, value.patches)
            region[...] = block


def patched_leaves(
    specs: Sequence[Spec], pieces: Mapping[int, Sequence[Piece]], held: Sequence[Any]
) -> dict[int, np.ndarray] | None:
    """Per changed leaf, its new value: the pieces over a copy of ``held``'s leaf (which
    is not modified), or the pieces alone where they cover it. ``None`` if a held leaf
    is not of its spec's shape and dtype (not what was handed out): read whole.
    :class:`CorruptDataError` if a patch does not verify: read whole."""
    out: dict[int, np.ndarray] = {}
    for leaf, leaf_pieces in pieces.items():
        spec = specs[leaf]
        whole = _whole(spec, leaf_pieces)
        if whole is None:
            base = adapters.to_numpy(held[leaf])
            if base.shape != spec.shape or base.dtype != spec.dtype:
                return None
            whole = np.array(base, copy=True, order="C")
            _into(whole, layout_lib.full_ranges(spec), leaf_pieces)
        out[leaf] = whole
    return out


def sliced_leaves(
    specs: Sequence[Spec],
    wanted: Mapping[int, Ranges],
    pieces: Mapping[int, Sequence[Piece]],
    held: Mapping[int, Any],
) -> dict[int, np.ndarray] | None:
    """``pull_slices(held=)``: per wanted leaf with changed pieces, its new slice: a
    copy of ``held[leaf]`` (the slice the caller holds, not modified) with the pieces
    written in. ``None`` if a held slice is not of the shape and dtype asked for: read
    whole. :class:`CorruptDataError` if a patch does not verify: read whole."""
    out: dict[int, np.ndarray] = {}
    for leaf, leaf_pieces in pieces.items():
        ranges = wanted[leaf]
        base = np.asarray(held.get(leaf))
        if base.shape != tuple(b - a for a, b in ranges) or base.dtype != specs[leaf].dtype:
            return None
        new = np.array(base, copy=True, order="C")
        _into(new, ranges, leaf_pieces)
        out[leaf] = new
    return out


def assign_pieces(
    specs: Sequence[Spec], pieces: Mapping[int, Sequence[Piece]], targets: Sequence[Any]
) -> None:
    """Write the changed pieces into ``targets`` (checked by ``flatten_targets``): into
    their own memory where it can be reached (numpy arrays, CPU tensors), else onto a
    host copy of the target, assigned whole (a CUDA tensor, a ``tf.Variable``).
    :class:`CorruptDataError` if a patch does not verify, with the targets partly
    written: assign the whole value then."""
    whole_targets: list[Any] = []
    whole_arrays: list[np.ndarray] = []
    for leaf, leaf_pieces in pieces.items():
        spec, target = specs[leaf], targets[leaf]
        full = layout_lib.full_ranges(spec)
        whole = _whole(spec, leaf_pieces)
        if whole is not None:
            whole_targets.append(target)
            whole_arrays.append(whole)
            continue
        view = target if isinstance(target, np.ndarray) else adapters.patch_view(target)
        if view is not None and view.dtype == spec.dtype and view.shape == spec.shape:
            try:
                _into(view, full, leaf_pieces)
            finally:
                adapters.patched(target)
            continue
        host = np.array(adapters.to_numpy(target), dtype=spec.dtype, copy=True, order="C")
        _into(host, full, leaf_pieces)
        whole_targets.append(target)
        whole_arrays.append(host)
    adapters.assign_all(whole_targets, whole_arrays)
