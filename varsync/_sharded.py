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
- ``name/parts/{slot}/{rank}``: rank ``rank``'s blocks (``varsync._shard_layout``),
  per block the step at which its content last changed across this rank's pushes
  (:class:`BlockChanges`), for readers that fetch only changed blocks
  (``varsync._sharded_reads``), and its slot's recent versions and the step each holds
  (``~held``), for readers that fetch element patches (``varsync._shard_patches``).
- ``name/stage/{slot}``: per rank, ``(step, part version)`` its part of ``step`` is at in
  that slot (part version ``-1``: withdrawn), and the *seal* ``(step, part versions...)``.

A step is built in the slot the manifest does not use, so the visible version is never
touched. The decision to publish it is the seal: written by compare-and-swap on the stage
table's head when every rank's entry shows the step, so no rank can withdraw or replace
its part between the look and the seal. Anyone who sees a seal newer than the manifest
copies it into the manifest (compare-and-swap on the manifest's head): a committer that
dies after sealing delays the version, never loses or splits it. A rank overwrites its
part of a slot only after withdrawing its entry there and finding no seal for it.

Reading is in ``varsync._sharded_reads``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from varsync import _elements as elements
from varsync import _shard_layout as layout_lib
from varsync import _signature as sig
from varsync._backends.base import (
    POLL_MAX,
    POLL_START,
    Backend,
    Head,
    SupportsElementDeltas,
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
from varsync._shard_layout import Block
from varsync._shard_patches import PartPatches
from varsync._signature import Spec
from varsync._waiting import wait_for_change

__all__ = [
    "ShardedTables",
    "BlockChanges",
    "Manifest",
    "Meta",
    "PartLayout",
    "is_manifest",
    "part_name",
    "MARKER",
    "NO_PART",
    "NOTHING",
]

#: The manifest signature's one top-level key: what marks a table as sharded.
MARKER = "varsync.sharded"
_I64 = np.dtype(np.int64)
#: The step of a manifest, stage entry or seal that holds none.
NOTHING = -1
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


class PartLayout(NamedTuple):
    """A part table's blocks, its flat specs, and the flat indices of its
    :data:`~varsync._shard_layout.CHANGES_KEY` and
    :data:`~varsync._shard_layout.HELD_KEY` leaves (``None``: it has none)."""

    blocks: list[Block]
    specs: list[Spec]
    changes: int | None
    held: int | None = None


class Stage(NamedTuple):
    head: Head
    entries: list[tuple[int, int]]  # per rank (step, part version)
    seal: list[int]  # (step, part versions...)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=_I64)


class _Pushed(NamedTuple):
    step: int
    keys: list[str]
    hashes: list[bytes]
    changed: np.ndarray


class BlockChanges:
    """Per table and rank of this process, the xxh3-128 of each block of its last push
    and the step at which each block's content last changed: the part table's
    ``CHANGES_KEY`` leaf. Only hashes are kept, never copies.

    ``changed[b] <= s`` promises that block ``b`` holds what it held at step ``s``, for
    every step ``s`` this rank pushed in this process; so the record is taken before
    the part is written (a write whose reply was lost counts as landed), and a process
    that pushes for the first time, a new layout or a step below the last says every
    block changed now."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], _Pushed] = {}

    def of(self, name: str, rank: int, step: int, blocks: Mapping[Block, np.ndarray]) -> _Pushed:
        """The record of a push of ``blocks`` at ``step``: its ``changed`` is the leaf."""
        ordered = sorted(blocks.items(), key=lambda item: layout_lib.block_key(item[0]))
        keys = [layout_lib.block_key(b) for b, _ in ordered]
        hashes = [elements.leaf_hash(np.ascontiguousarray(a)) for _, a in ordered]
        last = self._last.get((name, rank))
        if last is None or last.keys != keys or last.step > step:
            changed = np.full(len(keys), step, _I64)
        else:
            changed = np.array(
                [c if h == old else step for h, old, c in zip(hashes, last.hashes, last.changed)],
                _I64,
            )
        return _Pushed(step, keys, hashes, changed)

    def pushing(self, name: str, rank: int, pushed: _Pushed) -> None:
        """The part of ``pushed`` is about to be written: later pushes compare with it."""
        self._last[(name, rank)] = pushed


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
        self._layouts: dict[str, PartLayout] = {}
        self._changes = BlockChanges()
        self._patches = PartPatches()
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
                    empty = [_i64(NOTHING, 0)] * world + [_i64(NOTHING, *[0] * world)]
                    backend.write(
                        stage_name(name, slot), empty, sig.flat_specs(stage_sig), deadline
                    )
                manifest_sig = _manifest_signature(world)
                self._create_table(name, manifest_sig)
                first = [_i64(*[0] * world), _i64(1)[0], _i64(NOTHING)[0]]
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

    def layout(self, part: str) -> PartLayout:
        """Part table ``part``'s layout, from its signature (asked once)."""
        known = self._layouts.get(part)
        if known is None:
            text = self._backend.signature(part)
            if text is None:
                raise CorruptDataError(f"sharded table: part table {part!r} does not exist")
            signature = sig.from_json(text)
            mapping = isinstance(signature, Mapping)
            known = PartLayout(
                layout_lib.layout_of(signature, part),
                sig.flat_specs(signature),
                layout_lib.changes_index(signature) if mapping else None,
                layout_lib.held_index(signature) if mapping else None,
            )
            self._layouts[part] = known
        return known

    # -- the manifest and the stage -----------------------------------------------------

    def manifest(self, name: str, deadline: float) -> Manifest:
        world = self.meta(name).world
        specs = sig.flat_specs(_manifest_signature(world))
        head, arrays = self._backend.read(name, 0, deadline, specs)
        if arrays is None:
            return Manifest(head, NOTHING, 1, [0] * world)
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
        self,
        name: str,
        parts: Any,
        rank: int,
        step: int,
        deadline: float,
        limit: float | None,
        tiles: Any = 1,
        element_deltas: bool = False,
    ) -> int:
        meta = self._meta(name, deadline)
        world = meta.world
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ConfigurationError(f"rank must be an int in 0..{world - 1}, got {rank!r}")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ConfigurationError(f"step must be an int >= 0 (the training step), got {step!r}")
        step = int(step)
        blocks = layout_lib.part_blocks(meta.signature, parts) if parts else {}
        blocks = layout_lib.tiled(blocks, tiles)
        part_sig = layout_lib.part_signature(blocks)
        values: dict[str, Any] = {layout_lib.block_key(b): a for b, a in blocks.items()}
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
            version = NO_PART
            if blocks:
                version = self._push_part(name, rank, slot, step, values, blocks, element_deltas)
            self._mark(name, slot, world, rank, (step, version))
            return self._commit(name, meta, rank, step, slot, deadline, limit)
        finally:
            lock.release()

    def _push_part(
        self,
        name: str,
        rank: int,
        slot: int,
        step: int,
        values: dict[str, Any],
        blocks: Mapping[Block, np.ndarray],
        element_deltas: bool,
    ) -> int:
        """Write this rank's part of ``step`` into its table in ``slot``: with element
        deltas (``varsync._shard_patches``) where asked for and the backend has them,
        else with the container's push (changed blocks whole); the part version."""
        part = part_name(name, slot, rank)
        pushed = self._changes.of(name, rank, step, blocks)
        values[layout_lib.CHANGES_KEY] = pushed.changed
        self._changes.pushing(name, rank, pushed)
        backend = self._backend
        if not element_deltas or not isinstance(backend, SupportsElementDeltas):
            self._patches.forget(name, rank)
            # no version to patch from (0), and the step: a new value each push, so that
            # it is written beside ~changed, never left alone in an older write (a Redis
            # read of it would fetch that write's chunk)
            values[layout_lib.HELD_KEY] = layout_lib.held_rows(((0, step),))
            return self._push(values, part, element_deltas=False)
        keys = [*pushed.keys, layout_lib.CHANGES_KEY, layout_lib.HELD_KEY]
        flat = [np.asarray(values[k]) for k in pushed.keys]
        flat += [pushed.changed, layout_lib.held_rows(())]
        specs = self.layout(part).specs
        changed, hashes = pushed.changed, pushed.hashes
        return self._patches.push(
            backend, (name, rank), part, slot, keys, flat, specs, changed, hashes, step
        )

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
            r: self.layout(part_name(name, slot, r)).blocks if version != NO_PART else []
            for r, (_, version) in enumerate(entries)
        }
        layout_lib.check_cover(name, meta.specs, layouts)
