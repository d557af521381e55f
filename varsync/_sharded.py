"""Sharded tables: one version from many writer ranks, readers that fetch only the
blocks they need (``docs/sharded.md``). Built once, in the core, from protocol v1 and
:class:`~varsync.backend.SupportsLeafVersions`; no backend knows about it.

Tables, in the store, for a sharded table ``name`` of ``world`` ranks:

- ``name``: the *manifest*, ``{"varsync.sharded": {"parts", "slot", "step"}}``: the last
  committed training step, which of two slots holds its parts, and the version each
  rank's part table had in it. One manifest version per committed step; the table's
  version as users see it is the manifest's minus one (the creator writes version 1:
  "nothing yet", so that every commit after it is a compare-and-swap).
- ``name/meta``: the full nest's signature and ``world``, written once by the one
  process whose ``create_table`` of it stored its own nonce.
- ``name/parts/{slot}/{rank}``: rank ``rank``'s blocks (``varsync._shard_layout``).
- ``name/stage/{slot}``: per rank, ``(step, part version)`` its part of ``step`` is at in
  that slot (part version ``-1``: withdrawn), and the *seal* ``(step, part versions...)``.

A step is built in the slot the manifest does not use, so the visible version is never
touched. The decision to publish it is the seal: written by compare-and-swap on the stage
table's head when every rank's entry shows the step, so no rank can withdraw or replace
its part between the look and the seal. Anyone who sees a seal newer than the manifest
copies it into the manifest (compare-and-swap on the manifest's head): a committer that
dies after sealing delays the version, never loses or splits it. A rank overwrites its
part of a slot only after withdrawing its entry there and finding no seal for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from varsync import _delta as delta
from varsync import _nest as nest_lib
from varsync import _shard_layout as layout_lib
from varsync import _signature as sig
from varsync._backends.base import (
    POLL_MAX,
    POLL_START,
    Backend,
    Head,
    SupportsLeafVersions,
    deadline_after,
    remaining,
)
from varsync._errors import (
    ConfigurationError,
    CorruptDataError,
    PullTimeoutError,
    ShardTimeoutError,
    TableExistsError,
    UnsupportedError,
)
from varsync._history import UNKNOWN
from varsync._shard_layout import Block, Ranges
from varsync._signature import Spec
from varsync._waiting import wait_for_change

__all__ = ["ShardedTables", "is_manifest", "MARKER"]

#: The manifest signature's one top-level key: what marks a table as sharded.
MARKER = "varsync.sharded"
_I64 = np.dtype(np.int64)
_NOTHING = -1  # the step of a manifest, stage entry or seal that holds none
#: The part version of a rank that holds no block of any leaf (a stage entry's -1:
#: withdrawn).
NO_PART = 0


def is_manifest(signature: Any) -> bool:
    return isinstance(signature, Mapping) and list(signature) == [MARKER]


def _manifest_signature(world: int) -> Any:
    return {MARKER: {"parts": Spec([world], _I64), "slot": Spec([], _I64), "step": Spec([], _I64)}}


def _stage_signature(world: int) -> Any:
    return {"ranks": [Spec([2], _I64)] * world, "seal": Spec([1 + world], _I64)}


def meta_name(name: str) -> str:
    return f"{name}/meta"


def stage_name(name: str, slot: int) -> str:
    return f"{name}/stage/{slot}"


def part_name(name: str, slot: int, rank: int) -> str:
    return f"{name}/parts/{slot}/{rank}"


class Meta(NamedTuple):
    signature: Any
    specs: list[Spec]
    world: int


class Manifest(NamedTuple):
    head: Head
    step: int
    slot: int
    parts: list[int]

    @property
    def version(self) -> int:
        """The version users see."""
        return max(self.head.version - 1, 0)


class Stage(NamedTuple):
    head: Head
    entries: list[tuple[int, int]]  # per rank (step, part version)
    seal: list[int]  # (step, part versions...)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=_I64)


class ShardedTables:
    """The sharded tables of one container: ``create``, ``push``, ``read``. It uses the
    container's backend, and the container's ``create_table`` and ``push`` for the part
    tables (so their pushes send only what changed, as any push does)."""

    def __init__(
        self,
        backend: Backend,
        create_table: Callable[[str, Any], Any],
        push: Callable[..., int],
    ) -> None:
        self._backend = backend
        self._create_table = create_table
        self._push = push
        self._metas: dict[str, Meta] = {}
        self._layouts: dict[str, tuple[list[Block], list[Spec]]] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # -- tables ----------------------------------------------------------------------

    def create(self, name: str, signature: Any, world: int, deadline: float) -> Any:
        backend = self._backend
        if not isinstance(backend, SupportsLeafVersions):
            raise UnsupportedError(
                f"{type(backend).__name__} ({backend.url}) has no leaf versions, which "
                "sharded tables are built on; use memory://, redis:// or shm:// "
                "(docs/sharded.md)"
            )
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ConfigurationError(f"world must be an int >= 1 (the ranks), got {world!r}")
        wanted = sig.signature_of(signature)
        if backend.signature(name) is None:
            nonce = os.urandom(8).hex()
            text = sig.to_json(wanted).encode()
            meta_sig = {
                "creator": {nonce: Spec([1], np.uint8)},
                "signature": Spec([len(text)], np.uint8),
                "world": Spec([], _I64),
            }
            meta_text = sig.to_json(meta_sig)
            meta_specs = sig.flat_specs(meta_sig)
            if backend.create_table(meta_name(name), meta_text, meta_specs) == meta_text:
                # this process made it: it alone writes the first versions
                values = [np.zeros(1, np.uint8), np.frombuffer(text, np.uint8), _i64(world)[0]]
                backend.write(
                    meta_name(name), [np.asarray(v) for v in values], meta_specs, deadline
                )
                for slot in (0, 1):
                    stage_sig = _stage_signature(world)
                    self._create_table(stage_name(name, slot), stage_sig)
                    empty = [_i64(_NOTHING, 0)] * world + [_i64(_NOTHING, *[0] * world)]
                    backend.write(
                        stage_name(name, slot), empty, sig.flat_specs(stage_sig), deadline
                    )
                manifest_sig = _manifest_signature(world)
                self._create_table(name, manifest_sig)
                first = [_i64(*[0] * world), _i64(1)[0], _i64(_NOTHING)[0]]
                backend.write(
                    name, [np.asarray(v) for v in first], sig.flat_specs(manifest_sig), deadline
                )
        meta = self._meta(name, deadline)
        if meta.world != world or not sig.same_structure(meta.signature, wanted):
            raise TableExistsError(
                f"sharded table {name!r} already exists for {meta.world} ranks with the "
                f"signature:\n{sig.describe(meta.signature)}\nasked for {world} ranks and:\n"
                f"{sig.describe(wanted)}\nUse another table name."
            )
        return meta.signature

    def meta(self, name: str) -> Meta:
        return self._meta(name, deadline_after(self._backend.timeout))

    def _meta(self, name: str, deadline: float) -> Meta:
        """The table's full signature and world, once the creator has written them all
        (its manifest's first version is its last write)."""
        known = self._metas.get(name)
        if known is not None:
            return known
        backend = self._backend
        interval = POLL_START
        while True:
            text = backend.signature(name)
            if text is not None and backend.head(name, deadline).version >= 1:
                break
            if remaining(deadline) <= 0:
                raise PullTimeoutError(
                    f"sharded table {name!r} at {backend.url} is still being created by "
                    "another process (its manifest has no first version); if that process "
                    "died, create the table under another name"
                )
            time.sleep(min(interval, max(remaining(deadline), 0)))
            interval = min(interval * 2, POLL_MAX)
        if not is_manifest(sig.from_json(text)):
            raise ConfigurationError(
                f"table {name!r} at {backend.url} is not a sharded table; use push/pull"
            )
        meta_text = backend.signature(meta_name(name))
        if meta_text is None:
            raise CorruptDataError(f"sharded table {name!r} has no table {meta_name(name)!r}")
        meta_specs = sig.flat_specs(sig.from_json(meta_text))
        arrays = backend.read(meta_name(name), 0, deadline, meta_specs).arrays
        if arrays is None or len(arrays) != 3:
            raise CorruptDataError(f"sharded table {name!r}: {meta_name(name)!r} holds no value")
        signature = sig.from_json(np.asarray(arrays[1]).tobytes().decode())
        meta = Meta(signature, sig.flat_specs(signature), int(arrays[2]))
        self._metas[name] = meta
        return meta

    def _layout(self, part: str) -> tuple[list[Block], list[Spec]]:
        known = self._layouts.get(part)
        if known is None:
            text = self._backend.signature(part)
            if text is None:
                raise CorruptDataError(f"sharded table: part table {part!r} does not exist")
            signature = sig.from_json(text)
            known = (layout_lib.layout_of(signature, part), sig.flat_specs(signature))
            self._layouts[part] = known
        return known

    # -- the manifest and the stage -----------------------------------------------------

    def manifest(self, name: str, deadline: float) -> Manifest:
        world = self.meta(name).world
        specs = sig.flat_specs(_manifest_signature(world))
        head, arrays = self._backend.read(name, 0, deadline, specs)
        if arrays is None:
            return Manifest(head, _NOTHING, 1, [0] * world)
        parts, slot, step = (np.asarray(a) for a in arrays)
        return Manifest(head, int(step), int(slot), [int(p) for p in parts])

    def _stage(self, name: str, slot: int, world: int, deadline: float) -> Stage:
        specs = sig.flat_specs(_stage_signature(world))
        head, arrays = self._backend.read(stage_name(name, slot), 0, deadline, specs)
        if arrays is None:
            raise CorruptDataError(f"sharded table {name!r}: its stage {slot} holds no value")
        entries = [(int(a[0]), int(a[1])) for a in arrays[:world]]
        return Stage(head, entries, [int(x) for x in arrays[world]])

    def _mark(self, name: str, slot: int, world: int, rank: int, entry: tuple[int, int]) -> None:
        """Write rank ``rank``'s stage entry, atomically beside the other ranks'."""
        specs = sig.flat_specs(_stage_signature(world))
        written = self._backend_leaves().write_leaves(
            stage_name(name, slot), {rank: _i64(*entry)}, specs, None, math.inf
        )
        if written is None:
            raise CorruptDataError(f"sharded table {name!r}: its stage {slot} holds no value")

    def _roll_forward(self, name: str, slot: int, seal: list[int], deadline: float) -> Manifest:
        """Publish the sealed step ``seal[0]`` (parts in ``slot``) unless the manifest
        shows it already; return the manifest that shows it."""
        world = self.meta(name).world
        specs = sig.flat_specs(_manifest_signature(world))
        values = {0: _i64(*seal[1:]), 1: _i64(slot)[0], 2: _i64(seal[0])[0]}
        while True:
            manifest = self.manifest(name, deadline)
            if manifest.step >= seal[0]:
                return manifest
            written = self._backend_leaves().write_leaves(
                name, {i: np.asarray(v) for i, v in values.items()}, specs, manifest.head, math.inf
            )
            if written is not None:
                return Manifest(written, seal[0], slot, list(seal[1:]))

    def _backend_leaves(self) -> SupportsLeafVersions:
        backend = self._backend
        assert isinstance(backend, SupportsLeafVersions)  # checked by every entry point
        return backend

    # -- writing -------------------------------------------------------------------------

    def push(
        self, name: str, parts: Any, rank: int, step: int, deadline: float, limit: float | None
    ) -> int:
        meta = self._meta(name, deadline)
        world = meta.world
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ConfigurationError(f"rank must be an int in 0..{world - 1}, got {rank!r}")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ConfigurationError(f"step must be an int >= 0 (the training step), got {step!r}")
        step = int(step)
        blocks = layout_lib.part_blocks(meta.signature, parts) if parts else {}
        part_sig = {layout_lib.block_key(b): Spec(a.shape, a.dtype) for b, a in blocks.items()}
        values = {layout_lib.block_key(b): a for b, a in blocks.items()}
        lock = self._rank_lock(name, rank)
        if not lock.acquire(timeout=max(min(remaining(deadline), threading.TIMEOUT_MAX), 0)):
            raise ShardTimeoutError(
                f"sharded table {name!r}: rank {rank} of this process is still pushing an "
                f"earlier step; one step at a time per rank (step {step} not pushed)",
                step=step,
                missing=[rank],
            )
        try:
            if blocks:
                for slot in (0, 1):
                    self._create_table(part_name(name, slot, rank), part_sig)
            manifest, slot = self._claim(name, world, rank, step, deadline)
            if manifest.step == step:  # published already (a retry after a lost reply)
                return manifest.version
            part = part_name(name, slot, rank)
            # whole elements: a slot's base is two steps old (twice the patch, a copy per
            # slot in this rank's memory), and readers read part tables whole, where a
            # patched leaf costs its anchor and its chain
            version = self._push(values, part, element_deltas=False) if blocks else NO_PART
            self._mark(name, slot, world, rank, (step, version))
            return self._commit(name, meta, rank, step, slot, deadline, limit)
        finally:
            lock.release()

    def _rank_lock(self, name: str, rank: int) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault((name, rank), threading.Lock())

    def _claim(
        self, name: str, world: int, rank: int, step: int, deadline: float
    ) -> tuple[Manifest, int]:
        """The manifest and the slot this rank may write its part of ``step`` into: the
        one the manifest does not use, once no seal there is pending and this rank's own
        earlier entry there, if any, is withdrawn."""
        while True:
            manifest = self.manifest(name, deadline)
            if manifest.step >= step:
                if manifest.step == step:
                    return manifest, manifest.slot
                raise ConfigurationError(
                    f"sharded table {name!r}: step {step} is not after the published step "
                    f"{manifest.step}; steps must increase"
                )
            slot = 1 - manifest.slot
            stage = self._stage(name, slot, world, deadline)
            if stage.seal[0] > manifest.step:  # sealed, not yet in the manifest
                self._roll_forward(name, slot, stage.seal, deadline)
                continue
            mine_step, mine_version = stage.entries[rank]
            if mine_step > manifest.step and mine_version >= 0:
                self._mark(name, slot, world, rank, (mine_step, -1))
                continue  # a seal may have come first: look again
            return manifest, slot

    def _commit(
        self,
        name: str,
        meta: Meta,
        rank: int,
        step: int,
        slot: int,
        deadline: float,
        limit: float | None,
    ) -> int:
        """Seal ``step`` once every rank's part is staged, publish it, return its version;
        at ``deadline`` withdraw this rank's part and raise, unless it was sealed."""
        world = meta.world
        backend = self._backend_leaves()
        specs = sig.flat_specs(_stage_signature(world))
        while True:
            stage = self._stage(name, slot, world, deadline)
            if stage.seal[0] == step:
                return self._roll_forward(name, slot, stage.seal, deadline).version
            ready = [r for r, (s, v) in enumerate(stage.entries) if s == step and v >= 0]
            if len(ready) == world:
                self._check_cover(name, meta, slot, stage.entries)
                seal = _i64(step, *[v for _, v in stage.entries])
                if backend.write_leaves(
                    stage_name(name, slot), {world: seal}, specs, stage.head, math.inf
                ):
                    return self._roll_forward(name, slot, [int(x) for x in seal], deadline).version
                continue  # the stage changed under the look: look again
            try:
                if remaining(deadline) <= 0:
                    raise PullTimeoutError("no time left")
                wait_for_change(
                    self._backend,
                    stage_name(name, slot),
                    stage.head.version,
                    UNKNOWN,
                    deadline,
                    deadline,
                    limit,
                )
            except PullTimeoutError:
                return self._abandon(name, world, rank, step, slot, limit)

    def _abandon(
        self, name: str, world: int, rank: int, step: int, slot: int, limit: float | None
    ) -> int:
        self._mark(name, slot, world, rank, (step, -1))
        stage = self._stage(name, slot, world, deadline_after(self._backend.timeout))
        if stage.seal[0] == step:  # sealed before the withdrawal: published after all
            return self._roll_forward(name, slot, stage.seal, math.inf).version
        missing = [r for r, (s, _) in enumerate(stage.entries) if r != rank and s != step]
        others = {r: s for r, (s, _) in enumerate(stage.entries) if r in missing and s > step}
        raise ShardTimeoutError(
            f"sharded table {name!r}: step {step} was not published within {limit:g} s: "
            f"rank(s) {missing} did not push their part"
            + (f" (at steps {others})" if others else "")
            + ". Nothing was published: readers keep the previous version; this rank's "
            "part is withdrawn and the next step's overwrites it.",
            step=step,
            missing=missing,
        )

    def _check_cover(
        self, name: str, meta: Meta, slot: int, entries: list[tuple[int, int]]
    ) -> None:
        layouts = {
            r: self._layout(part_name(name, slot, r))[0] if version != NO_PART else []
            for r, (_, version) in enumerate(entries)
        }
        layout_lib.check_cover(name, meta.specs, layouts)

    # -- reading -------------------------------------------------------------------------

    def read(
        self,
        name: str,
        wanted: Mapping[int, Ranges] | None,
        newer_than: int,
        deadline: float,
        limit: float | None,
        *,
        wait_until: float | None,
    ) -> tuple[Manifest, dict[int, np.ndarray]] | None:
        """The blocks ``wanted`` (flat leaf index -> ranges; ``None``: every leaf whole)
        of the latest published version, if it is newer than ``newer_than`` (else
        ``None``; before a first version, wait until ``wait_until`` if given, else
        ``None``), fetching only the part tables that hold some of them. Every block
        comes from the one version the manifest read names: a part table found at another
        version than the manifest says (a later step overwrote the slot) means reading
        the manifest again."""
        meta = self._meta(name, deadline)
        if wanted is None:
            wanted = {i: layout_lib.full_ranges(s) for i, s in enumerate(meta.specs)}
        backend = self._backend
        while True:
            manifest = self.manifest(name, deadline)
            if manifest.step == _NOTHING:
                if wait_until is None:
                    return None
                self._wait_for_first(name, manifest, wait_until, limit)
                continue
            if manifest.version <= newer_than:
                return None
            out = {
                leaf: np.empty([b - a for a, b in ranges], meta.specs[leaf].dtype)
                for leaf, ranges in wanted.items()
            }
            copied = dict.fromkeys(wanted, 0)
            stale = None
            for rank in range(meta.world):
                if manifest.parts[rank] == NO_PART:
                    continue
                part = part_name(name, manifest.slot, rank)
                blocks, specs = self._layout(part)
                needed = any(
                    b.leaf in wanted
                    and layout_lib.intersection(b.ranges, wanted[b.leaf]) is not None
                    for b in blocks
                )
                if not needed:
                    continue
                head, arrays = backend.read(part, 0, deadline, specs)
                if head.version != manifest.parts[rank] or arrays is None:
                    stale = (part, head.version, manifest.parts[rank])
                    break
                for block, array in zip(blocks, arrays):
                    if block.leaf in wanted:
                        copied[block.leaf] += layout_lib.copy_block(
                            out[block.leaf], wanted[block.leaf], np.asarray(array), block.ranges
                        )
            if stale is None:
                for leaf, count in copied.items():
                    if count != layout_lib.volume(wanted[leaf]):
                        raise CorruptDataError(
                            f"sharded table {name!r} version {manifest.version}: its parts "
                            f"hold {count} of the {layout_lib.volume(wanted[leaf])} elements "
                            f"asked for of leaf {leaf}"
                        )
                return manifest, out
            if remaining(deadline) <= 0:
                raise PullTimeoutError(
                    f"sharded table {name!r}: part table {stale[0]!r} was at version "
                    f"{stale[1]}, not the {stale[2]} of the manifest, until the timeout "
                    f"({limit:g} s): newer steps kept overwriting the slot being read"
                )
            # a part behind the manifest (a replica that lags): wait for the part; one
            # ahead of it (a later step overwrote the slot): for the manifest to move on
            table, version = (
                (stale[0], stale[1]) if stale[1] < stale[2] else (name, manifest.head.version)
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
        meta = self.meta(name)
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
