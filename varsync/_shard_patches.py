"""Element deltas for a sharded table's part tables (``docs/sharded.md``, "Element
deltas per block"): a rank sends, per changed block, the elements that changed since
its previous step, and readers holding that step fetch those alone.

A rank's part of step ``t`` goes into the slot the published version does not use,
which holds the rank's part of an earlier step. The two slots alternate, so that slot
is usually two steps behind: a patch onto it would hold two steps' changes, and readers
(who hold the step before) could not apply it. So before writing step ``t`` into a slot
holding the step before the rank's last one, the rank *catches it up*: it writes its
last step's patches there again (the same bytes, kept from that push) as a version of
its own, and then step ``t``'s patches onto it. Each slot's history thus holds every
step, each link one step's changes, and a reader holding step ``h`` asks a part table
for the patches since the version that held ``h`` (:data:`~varsync._shard_layout.HELD_KEY`
names the recent versions and their steps).

The rank keeps one copy of its part (the values it pushed last: what it diffs against,
and the whole leaves a catch-up sends), the last push's patch bytes, and per slot its
head; a leaf a catch-up cannot send (no copy kept: a small leaf, or one whose patch
gave up) is *stale* in that slot, and the next write there sends it whole. Every
write but a whole one is onto exactly the slot's head the rank knows (the backend's
compare-and-swap), so a write whose outcome is unknown (an interrupt, a lost reply)
only makes the next one there whole, as is every write of a process that did not make
the previous push.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from varsync import _patches as patches_lib
from varsync import _shard_layout as layout_lib
from varsync._backends.base import Backend, Head, SupportsElementDeltas
from varsync._signature import Spec

__all__ = ["PartPatches"]

NOTHING = -1
#: A leaf written whole without a copy kept (one below ``MIN_BYTES``, or whose patch
#: gave up) is copied for the catch-up if it is at most this big; else it is stale in
#: the other slot, and goes whole to it with the next step.
SMALL = 64 * 1024


class _Slot(NamedTuple):
    """What this rank knows of one slot's part table: the head of its last write there
    that landed, the step it holds, the ``~held`` rows up to it, and the leaves not
    caught up to that step (sent whole by the next write there)."""

    head: Head
    step: int
    rows: tuple[tuple[int, int], ...]
    stale: frozenset[int]


@dataclass
class _Replay:
    """What took the part from the step before to the last step: leaves as patches
    (their bytes), and leaves written whole (their values are the copies', or for a
    small leaf without one, ``small``'s)."""

    patches: dict[int, bytes]
    whole: list[int]
    small: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class _State:
    keys: list[str]
    bases: patches_lib.Bases
    step: int = NOTHING  # the step ``bases`` holds: the last push, landed
    prev: int = NOTHING  # the push before it
    replay: _Replay | None = None
    slots: dict[int, _Slot] = field(default_factory=dict)


class PartPatches:
    """Per table and rank of this process, the state its part pushes with element deltas
    need (:class:`_State`); one push at a time per rank (``ShardedTables`` locks)."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, int], _State] = {}

    def forget(self, name: str, rank: int) -> None:
        """The rank's part was pushed another way: its copies and slots are of no use."""
        self._states.pop((name, rank), None)

    def push(
        self,
        backend: Backend,
        key: tuple[str, int],
        part: str,
        slot: int,
        keys: list[str],
        flat: list[np.ndarray],
        specs: Sequence[Spec],
        changed_at: np.ndarray,
        hashes: Sequence[bytes | None],
        step: int,
    ) -> int:
        """Write ``flat`` (the part's leaves in flat order: its blocks, ``~changed``,
        then ``~held``, whose value is made here) into ``part`` (slot ``slot``) as step
        ``step``; return the part version. ``changed_at``: per block the step of its
        last change (``BlockChanges``: a block at most a step this rank pushed in this
        process holds what it held then)."""
        assert isinstance(backend, SupportsElementDeltas)  # the caller's choice
        held = len(flat) - 1
        state = self._states.get(key)
        if state is None or state.keys != keys or not state.step < step:
            state = _State(keys, patches_lib.Bases.empty(len(flat)))
            self._states[key] = state
        moved = [i for i, at in enumerate(changed_at.tolist()) if at > state.step]
        if moved:
            moved.append(held - 1)  # ~changed names a later step for them
        # every write below but a whole one is onto exactly the head known: one whose
        # outcome is unknown (an interrupt, a lost reply) makes the next one whole
        known = state.slots.get(slot)
        base: _Slot | None = None
        if known is not None and state.step != NOTHING:
            if known.step == state.step:
                base = known
            elif known.step == state.prev and state.replay is not None:
                base = self._catch_up(backend, part, specs, state, known, held)
                if base is not None:  # a retry of this step after an interrupt starts here
                    state.slots[slot] = base
        plan = patches_lib.Plan({}, {})
        if state.step != NOTHING:  # the copies hold state.step: diff against them
            todo = sorted(set(moved) | (base.stale if base is not None else set()))
            plan = patches_lib.plan_patches(state.bases, flat, todo, hashes)
        head: Head | None = None
        if base is not None:
            rows = ((base.head.version + 1, step), *base.rows)
            flat[held] = plan.whole[held] = layout_lib.held_rows(rows)
            head = backend.write_patches(part, plan.whole, plan.patches, specs, base.head, math.inf)
        if head is None:  # no base known, or it moved: every leaf whole
            flat[held] = layout_lib.held_rows(())
            head = backend.write(part, flat, specs, math.inf)
            rows = ((head.version, step),)
        if state.step == NOTHING:
            patches_lib.after_whole(state.bases, flat)
        else:
            patches_lib.after_push(state.bases, flat, plan)
        whole = [i for i in moved if i not in plan.patches]
        small = {
            i: np.array(flat[i], copy=True)
            for i in whole
            if state.bases.values[i] is None and flat[i].nbytes <= SMALL
        }
        replay = _Replay(plan.patches, whole, small)
        state.prev, state.step, state.replay = state.step, step, replay
        state.slots[slot] = _Slot(head, step, rows, frozenset())
        return head.version

    def _catch_up(
        self,
        backend: SupportsElementDeltas,
        part: str,
        specs: Sequence[Spec],
        state: _State,
        known: _Slot,
        held: int,
    ) -> _Slot | None:
        """Write the rank's last step into a slot that holds the step before it (the
        last push's patches again, its whole leaves from the copies); the slot as it is
        then, or ``None`` if the write was refused."""
        replay = state.replay
        assert replay is not None
        values = state.bases.values
        leaves: dict[int, np.ndarray] = {}
        patches: dict[int, bytes] = {}
        stale: set[int] = set()
        for index, data in replay.patches.items():
            if index in known.stale:  # not the value the patch was made against
                leaves[index] = values[index]  # type: ignore[assignment]  # patched: kept
            else:
                patches[index] = data
        for index in [*replay.whole, *(known.stale - set(replay.patches))]:
            kept = values[index] if values[index] is not None else replay.small.get(index)
            if kept is None:
                stale.add(index)
            else:
                leaves[index] = kept
        if not leaves and not patches:  # nothing it can send: the next write sends it
            return _Slot(known.head, state.step, known.rows, frozenset(stale))
        rows = ((known.head.version + 1, state.step), *known.rows)
        leaves[held] = layout_lib.held_rows(rows)
        head = backend.write_patches(part, leaves, patches, specs, known.head, math.inf)
        if head is None:
            return None
        return _Slot(head, state.step, rows, frozenset(stale))
