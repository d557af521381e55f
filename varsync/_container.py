"""The VariableContainer: nests in, nests out, checked and versioned, over any backend."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varsync import _adapters as adapters
from varsync import _checks as checks
from varsync import _delta as delta
from varsync import _nest as nest_lib
from varsync import _patches as patches_lib
from varsync import _readers as readers_lib
from varsync import _sharded as sharded_lib
from varsync import _sharded_reads as shard_reads_lib
from varsync import _signature as sig
from varsync._backends.base import (
    Backend,
    Head,
    LeafChain,
    SupportsElementDeltas,
    SupportsLeafVersions,
    deadline_after,
    remaining,
)
from varsync._errors import (
    ConfigurationError,
    CorruptDataError,
    PullTimeoutError,
    TableExistsError,
    TableNotFoundError,
    UnsupportedError,
)
from varsync._history import UNKNOWN, Histories
from varsync._options import parse_timeout
from varsync._waiting import wait_for_change

__all__ = ["VariableContainer", "TableInfo", "DEFAULT_TABLE"]

DEFAULT_TABLE = "variables"


@dataclass(frozen=True)
class TableInfo:
    """What ``table_info`` reports about one table."""

    name: str
    signature: Any
    version: int
    nbytes: int
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"table {self.name!r}: version {self.version}, {self.nbytes} bytes\n" + sig.describe(
            self.signature
        )


class VariableContainer:
    """Publishes and fetches the latest value of nests of variables, one per table.

    Made by :func:`varsync.connect`. Thread-safe when its backend is (every built-in
    backend is). ``timeout`` is the default bound, in seconds, on every wait; ``None``
    waits as long as it takes.
    """

    def __init__(self, backend: Backend, *, timeout: float | None) -> None:
        self._backend = backend
        self.timeout = timeout
        self._signatures: dict[str, tuple[Any, list[sig.Spec]]] = {}
        # per table, the structure keys (a JAX treedef) of like= nests already checked
        self._likes_checked: dict[str, collections.OrderedDict[Any, None]] = {}
        self._lock = threading.Lock()
        self._closed = False
        # the one judge of "same history / new history / went back" (varsync._history):
        # the epoch seen last per table, and those of the versions handed out
        self._histories = Histories(backend.url)
        # delta sync (docs/delta.md): what this container last wrote per table, the
        # variables its updates assigned, tables not skipping
        self._written: dict[str, delta.Written] = {}
        self._assigned = delta.Assigned()
        self._whole_pushes: dict[str, bool] = {}
        self._element_deltas: dict[str, bool] = {}
        self._reporter: readers_lib.Reporter | None = None
        self._shards = sharded_lib.ShardedTables(backend, self.create_table, self.push)
        self._shard_reads = shard_reads_lib.ShardedReads(self._shards, backend)

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: Any) -> Any:
        """Create table ``name`` from a nest of specs or example values; return its
        signature. Creating an existing table with an equal signature is a no-op; with a
        different one it raises :class:`TableExistsError`."""
        checks.table_name(name)
        wanted = sig.signature_of(signature)
        stored_text = self._backend_call().create_table(
            name, sig.to_json(wanted), sig.flat_specs(wanted)
        )
        stored = sig.from_json(stored_text)
        if not sig.same_structure(stored, wanted):
            raise TableExistsError(
                f"table {name!r} already exists with another signature:\n"
                f"{sig.describe(stored)}\nasked for:\n{sig.describe(wanted)}\n"
                "Use another table name, or connect with the existing signature."
            )
        self._remember(name, stored)
        return stored

    def tables(self) -> list[str]:
        """The names of the tables this container can see."""
        return sorted(self._backend_call().tables())

    def signature(self, table: str = DEFAULT_TABLE) -> Any:
        """The table's signature: a nest of :class:`~varsync.Spec` (of a sharded table:
        the full nest's)."""
        if self._is_sharded(table):
            return self._shards.meta(table).signature
        return self._table(table)[0]

    def table_info(self, name: str = DEFAULT_TABLE) -> TableInfo:
        """The table's signature, current version, size in bytes and backend details."""
        signature, specs = self._table(name)
        backend = self._backend_call()
        return TableInfo(
            name=name,
            signature=signature,
            version=self._head(name).version,
            nbytes=sum(s.nbytes for s in specs),
            details={**backend.details(name), "options": dict(backend.describe_options())},
        )

    # -- publishing ------------------------------------------------------------------

    def push(
        self,
        values: Any,
        table: str = DEFAULT_TABLE,
        *,
        skip_unchanged: bool | None = None,
        element_deltas: bool | None = None,
    ) -> int:
        """Publish ``values`` (a nest matching the table's signature); return the new
        version. Everything is checked first: on any mismatch nothing is written and the
        table keeps its previous value and version.

        On a backend with leaf versions, leaves bit-identical to this container's last
        push to the table are not sent (the new version keeps them); ``skip_unchanged``
        ``False`` sends every leaf (default: the table's setting, see
        :meth:`configure_table`; on by default). On a backend with element deltas, a
        changed leaf is sent as the elements that changed when that is smaller
        (``docs/delta.md``); ``element_deltas=False`` sends changed leaves whole and
        drops this container's copies of the table's values (default: the table's
        setting: on for ``redis://``, off on ``memory://`` and ``shm://``, where a whole
        leaf is one copy)."""
        backend, arrays, specs, whole = self._to_push(values, table, skip_unchanged)
        last = self._written.pop(table, None)
        if whole:
            return self._seen(table, backend.write(table, arrays, specs, math.inf))
        written = self._push_delta(backend, table, arrays, specs, last, element_deltas)
        self._written[table] = written
        return self._seen(table, written.head)

    def _push_delta(
        self,
        backend: Backend,
        table: str,
        arrays: list[np.ndarray],
        specs: list[sig.Spec],
        last: delta.Written | None,
        element_deltas: bool | None,
    ) -> delta.Written:
        if self._with_element_deltas(table, backend, element_deltas):
            return patches_lib.push_patched(backend, table, arrays, specs, last)
        if last is not None:
            last.bases = None  # the copies are of no use to a push without patches
        return delta.push_changed(backend, table, arrays, specs, last)

    def _with_element_deltas(
        self, table: str, backend: Backend, element_deltas: bool | None
    ) -> bool:
        """Whether a push to ``table`` sends element patches: as asked, else the table's
        setting, else the backend's default; never on a backend without them."""
        if element_deltas is None:
            default = getattr(backend, "element_deltas_default", False)
            element_deltas = self._element_deltas.get(table, default)
        return bool(element_deltas) and isinstance(backend, SupportsElementDeltas)

    def _push_unversioned(self, values: Any, table: str = DEFAULT_TABLE) -> None:
        """:meth:`push` for a caller that drops the new version (the TF-Agents drop-in,
        whose push returns none): a whole write goes through the backend's
        ``write_unversioned``, which may skip the request that only numbers it (Reverb)."""
        backend, arrays, specs, whole = self._to_push(values, table, None)
        last = self._written.pop(table, None)
        if whole:
            backend.write_unversioned(table, arrays, specs, math.inf)
        else:
            written = self._push_delta(backend, table, arrays, specs, last, None)
            self._written[table] = written
            self._seen(table, written.head)

    def _to_push(
        self, values: Any, table: str, skip_unchanged: bool | None
    ) -> tuple[Backend, list[np.ndarray], list[sig.Spec], bool]:
        """The backend, the checked arrays and the specs of a push of ``values``, and
        whether it writes them whole (else only the leaves changed since the last)."""
        _, specs = self._table(table)
        arrays = sig.flatten_values(self.signature(table), values)
        backend = self._backend_call()
        checks.push_size(table, backend, arrays)
        if skip_unchanged is None:
            skip_unchanged = not self._whole_pushes.get(table, False)
        with_leaves = isinstance(backend, SupportsLeafVersions)
        return backend, arrays, specs, not (skip_unchanged and with_leaves)

    def push_leaves(self, leaves: Mapping[Any, Any], table: str = DEFAULT_TABLE) -> int:
        """Publish a new version that changes only the leaves given; every other leaf
        keeps its current value. ``leaves``: ``{path: value}``, a path being a tuple of
        keys, list indices and field names from the root (``("obs_norm", "mean")``), or
        one top-level key; a path to an inner node takes a nest of that node's
        structure. Each value is checked against its specs first, as :meth:`push`
        checks a nest; a path not in the signature raises :class:`LeafPathError` naming
        the nearest valid ones. Returns the new version.

        The table must hold a value already (a first push gives every leaf). On a
        backend without leaf versions this reads the current value and writes a whole
        new one: a push by another writer in between is overwritten (``docs/delta.md``)."""
        signature, specs = self._table(table)
        given = delta.given_leaves(signature, leaves)
        if len(given) == len(specs):  # every leaf: a push, compared with the last as one
            return self.push(
                nest_lib.unflatten(signature, [given[i] for i in range(len(specs))]), table
            )
        backend = self._backend_call()
        checks.push_size(table, backend, list(given.values()))
        last = self._written.pop(table, None)
        if not isinstance(backend, SupportsLeafVersions):
            return self._push_leaves_whole(table, given, specs)
        head = None
        if self._head(table).version:
            head = backend.write_leaves(table, given, specs, None, math.inf)
        if head is None:
            raise delta.nothing_to_keep(table, backend.url, signature, given)
        written = delta.written_after(last, given, head)
        if written is not None:  # the rest is still ours
            self._written[table] = written
        return self._seen(table, head)

    def configure_table(
        self,
        table: str = DEFAULT_TABLE,
        *,
        skip_unchanged: bool | None = None,
        element_deltas: bool | None = None,
    ) -> None:
        """This container's settings for its pushes to ``table`` (``None``: unchanged):
        ``skip_unchanged`` ``False`` sends every leaf of every push (the default,
        ``True``, skips leaves bit-identical to this container's last push, on a backend
        with leaf versions); ``element_deltas`` ``False`` sends changed leaves whole and
        keeps no copy of the values pushed (``True`` sends the elements that changed
        where that is smaller, on a backend with element deltas: the default on
        ``redis://``, not on ``memory://`` and ``shm://``, where a whole leaf is one
        copy)."""
        self._table(table)
        if skip_unchanged is None and element_deltas is None:
            raise ConfigurationError(
                "configure_table needs a setting: skip_unchanged=... and/or element_deltas=..."
            )
        if skip_unchanged is not None:
            self._whole_pushes[table] = not skip_unchanged
            if not skip_unchanged:
                self._written.pop(table, None)
        if element_deltas is not None:
            self._element_deltas[table] = bool(element_deltas)
            written = self._written.get(table)
            if not element_deltas and written is not None:
                written.bases = None

    def leaf_versions(self, table: str = DEFAULT_TABLE, *, timeout: Any = None) -> tuple[int, Any]:
        """``(version, nest)``: the table's version and, in its signature's structure,
        the version at which each leaf last changed (0 everywhere while empty). One
        small request, bounded by ``timeout`` (default: the container's). Raises
        :class:`UnsupportedError` on a backend without leaf versions."""
        deadline = deadline_after(self._timeout(timeout))
        signature, specs = self._table(table)
        backend = self._backend_call()
        if not isinstance(backend, SupportsLeafVersions):
            raise UnsupportedError(
                f"{type(backend).__name__} ({backend.url}) does not record leaf versions: "
                "its every push writes every leaf. Use version(table), or a backend with "
                "leaf versions (memory://, redis://, shm://; docs/delta.md)."
            )
        head, numbers = backend.leaf_versions(table, deadline)
        version = self._seen(table, head)
        if version == 0:
            numbers = [0] * len(specs)
        elif len(numbers) != len(specs) or any(not 0 < n <= version for n in numbers):
            raise CorruptDataError(
                f"table {table!r} at {backend.url}: version {version} has leaf versions "
                f"{list(numbers)[:8]!r} for a signature of {len(specs)} leaves"
            )
        return version, nest_lib.unflatten(signature, [int(n) for n in numbers])

    # -- fetching --------------------------------------------------------------------

    def version(self, table: str = DEFAULT_TABLE) -> int:
        """The table's current version: 0 while empty, then 1, 2, ... per push (of a
        sharded table: per published step)."""
        self._table(table)
        version = self._head(table).version
        return max(version - 1, 0) if self._is_sharded(table) else version

    def pull(self, table: str = DEFAULT_TABLE, *, timeout: Any = None, like: Any = None) -> Any:
        """The table's latest value as a nest of numpy arrays in its signature's
        structure. On an empty table, waits up to ``timeout`` seconds (default: the
        container's) for a first push, then raises :class:`PullTimeoutError`.

        ``like``: a nest of the table's structure whose leaves say what to return (a
        torch module or ``state_dict``: an ``OrderedDict`` of tensors on its devices; a
        JAX pytree: the same pytree type with ``jax.Array`` leaves; numpy leaves: numpy).
        It is checked before anything is fetched and never modified."""
        if self._is_sharded(table):
            pulled = self._pull_sharded(table, 0, timeout, like, wait=True)
            assert pulled is not None  # waited for a first version, or raised
            return pulled[1]
        shaped = None if like is None else self._like(table, like)
        return self._nest(table, self._pull_flat(table, timeout)[1], like, shaped)

    def pull_if_newer(
        self,
        version: int,
        table: str = DEFAULT_TABLE,
        *,
        timeout: Any = None,
        like: Any = None,
        held: Any = None,
    ) -> tuple[int, Any] | None:
        """``(new_version, nest)`` if the table holds a version greater than ``version``,
        else ``None`` at once. Learning that nothing changed costs one small request,
        whatever the size of the table. ``timeout`` bounds the whole call, every request
        included (0: the container's timeout bounds the transfer of a newer value).
        ``like`` as for :meth:`pull`.

        ``held``: the nest this container returned with ``version`` (by a pull or a
        ``pull_if_newer``). On a backend with leaf versions only the leaves changed
        since are fetched; the others in the nest returned are ``held``'s own leaves, not
        copies. Without it (or for a ``version`` this container did not hand out) every
        leaf is fetched."""
        version = checks.version(version)
        if self._is_sharded(table):
            return self._pull_sharded(table, version, timeout, like, wait=False, held=held)
        signature, specs = self._table(table)
        shaped = None if like is None else self._like(table, like)
        transfer = self._deadlines(timeout)[2]
        backend = self._backend_call()
        if held is not None and version and isinstance(backend, SupportsLeafVersions):
            epoch = self._histories.handed_epoch(table, version)
            if epoch is not UNKNOWN:  # a nest this container handed out: fetch what changed
                held_leaves = sig.flatten_like(signature, held)[1]
                head, leaf_versions, answer = self._read_changed(backend, table, version, transfer)
                self._histories.check(table, version, head, epoch=epoch)
                if answer is None:
                    return None
                try:
                    changed = patches_lib.resolved(
                        table,
                        head.version,
                        leaf_versions or [],
                        answer,
                        version,
                        specs,
                        held_leaves,
                    )
                except CorruptDataError as error:  # a patch that does not verify: whole
                    patches_lib.log.warning("table %r: %s; pulling it whole", table, error)
                    return self._pull_newer_whole(table, version, transfer, like, shaped)
                fetched = [i for i, array in enumerate(changed) if array is not None]
                if shaped is not None:
                    made = adapters.from_numpy_all(
                        [changed[i] for i in fetched],  # type: ignore[misc]
                        [shaped[1][i] for i in fetched],
                    )
                    for index, leaf in zip(fetched, made):
                        changed[index] = leaf
                leaves = [held_leaves[i] if a is None else a for i, a in enumerate(changed)]
                self._handed(table, head)
                if shaped is None:
                    return head.version, nest_lib.unflatten(signature, leaves)
                return head.version, adapters.rebuild(like, shaped[0], leaves)
        return self._pull_newer_whole(table, version, transfer, like, shaped)

    def _pull_newer_whole(
        self, table: str, version: int, transfer: float, like: Any, shaped: Any
    ) -> tuple[int, Any] | None:
        head, arrays = self._backend_call().read(table, version, transfer, self._table(table)[1])
        self._histories.check(table, version, head)
        if arrays is None:
            return None
        arrays = self._checked(table, head, arrays)
        return head.version, self._nest(table, arrays, like, shaped)

    def _read_changed(
        self, backend: Backend, table: str, newer_than: int, transfer: float
    ) -> tuple[Head, list[int] | None, list[np.ndarray | LeafChain | None] | None]:
        """The leaves changed since ``newer_than``: as patches where the backend has
        element deltas (``read_patches``), else whole (``read_leaves``)."""
        specs = self._table(table)[1]
        if isinstance(backend, SupportsElementDeltas):
            return backend.read_patches(table, newer_than, transfer, specs)
        assert isinstance(backend, SupportsLeafVersions)  # the caller's choice
        head, leaf_versions, arrays = backend.read_leaves(table, newer_than, transfer, specs)
        return head, leaf_versions, None if arrays is None else list(arrays)

    def wait_for(self, version: int, table: str = DEFAULT_TABLE, *, timeout: Any = None) -> int:
        """Block until the table's version is greater than ``version``; return it.
        Raises :class:`PullTimeoutError` after ``timeout`` seconds (``None``: the
        container's timeout; ``math.inf`` to wait without bound)."""
        version = checks.version(version)
        self._table(table)
        if self._is_sharded(table):  # the manifest's version is one more
            limit, deadline, transfer = self._deadlines(timeout)
            backend = self._backend_call()
            head = wait_for_change(backend, table, version + 1, UNKNOWN, deadline, transfer, limit)
            return max(head.version - 1, 0)
        head = self._wait(table, version, timeout)
        self._histories.check(table, version, head)
        return head.version

    def update(
        self,
        variables: Any,
        table: str = DEFAULT_TABLE,
        *,
        timeout: Any = None,
        delta_only: bool = True,
    ) -> int:
        """Pull the table and assign the values into ``variables`` in place; return the
        version. ``variables``: writable numpy arrays, ``tf.Variable``s, torch tensors or a
        ``torch.nn.Module`` (its parameters and buffers, under ``torch.no_grad()``). The
        variables are all checked before any is assigned. ``timeout`` as for :meth:`pull`.

        On a backend with leaf versions, an update into the very variables this
        container's last update of the table assigned fetches and assigns only the
        leaves changed since (none if nothing did): it assumes they still hold what it
        assigned. ``delta_only=False`` fetches and assigns every leaf, e.g. after
        changing the variables some other way."""
        if self._is_sharded(table):
            return self._update_sharded(table, variables, timeout, delta_only)
        signature, specs = self._table(table)
        targets = sig.flatten_targets(signature, variables)
        backend = self._backend_call()
        if not isinstance(backend, SupportsLeafVersions):
            head, arrays = self._pull_flat(table, timeout)
            sig.assign_all(targets, arrays)
            return head.version
        holds = self._assigned.head_of(table, targets) if delta_only else None
        self._assigned.forget(table, targets)  # until this assignment is complete
        changed: list[np.ndarray | LeafChain | None] | None = None
        if holds is not None:
            transfer = self._deadlines(timeout)[2]
            head, leaf_versions, changed = self._read_changed(
                backend, table, holds.version, transfer
            )
            if not Histories.continues(holds, head):
                holds = None  # another history: these variables hold nothing of it
            elif changed is None:  # nothing newer: nothing to do
                self._assigned.assigned(table, targets, holds)
                return self._seen(table, head)
        if holds is not None and changed is not None:
            try:  # checked first; patches go into the variables' own memory
                patches_lib.assign_changed(
                    table, head.version, leaf_versions or [], changed, holds.version, specs, targets
                )
                self._handed(table, head)
            except CorruptDataError as error:  # a patch that does not verify: whole
                patches_lib.log.warning("table %r: %s; updating it whole", table, error)
                holds = None
        if holds is None or changed is None:  # a first update, the table was reset, a bad patch
            head, arrays = self._pull_flat(table, timeout)
            sig.assign_all(targets, arrays)
        self._assigned.assigned(table, targets, head)
        return head.version

    # -- sharded tables (docs/sharded.md) -----------------------------------------------

    def create_sharded_table(
        self, name: str, signature: Any, world: int, *, timeout: Any = None
    ) -> Any:
        """Create table ``name`` to be pushed by ``world`` ranks, each its own part of
        each version (:meth:`push_shard`); return its signature (the full nest's). Any
        rank, or all, may call it: one creates, the others wait for it (bounded by
        ``timeout``) and check that they asked for the same signature and world, else
        :class:`TableExistsError`. Needs a backend with leaf versions."""
        checks.table_name(name)
        deadline = deadline_after(self._timeout(timeout))
        return self._shards.create(name, signature, world, deadline)

    def push_shard(
        self,
        table: str,
        parts: Mapping[Any, Any],
        *,
        rank: int,
        step: int,
        timeout: Any = None,
        tiles: Any = 1,
        element_deltas: bool | None = None,
    ) -> int:
        """Push rank ``rank``'s part of training step ``step``; return the version the
        step was published as, once every rank's part of it has arrived.

        ``parts``: ``{path: value}`` for whole leaves this rank holds, ``{path:
        (index_ranges, value)}`` for a block of a leaf (one ``(start, stop)`` per
        dimension); together, the ranks' parts must hold every element of every leaf
        exactly once. ``step`` names the version the ranks build, with no collective
        of their own: it must be greater than the last published step. Raises
        :class:`ShardTimeoutError` naming the missing ranks if the step is not complete
        within ``timeout`` (default: the container's); nothing is published then and
        readers keep the previous version. A retry of a step already published returns
        its version.

        ``tiles``: store each block cut into tiles, so that readers sharded another way
        fetch only the tiles they intersect (on a backend that reads chosen leaves): an
        int cuts each block along its last dimension, a sequence gives the pieces per
        dimension from the first. A rank's tiling must stay the same for the table.

        ``element_deltas``: send each changed block as the elements that changed since
        this rank's previous step, where that is smaller (the rank keeps a copy of its
        part to diff against); default: the table's setting (:meth:`configure_table`),
        as for :meth:`push`: on for ``redis://``, off on ``memory://`` and ``shm://``."""
        limit, deadline, _ = self._deadlines(timeout)
        self._require_sharded(table)
        wanted = self._with_element_deltas(table, self._backend, element_deltas)
        return self._shards.push(table, parts, rank, step, deadline, limit, tiles, wanted)

    def pull_slices(
        self,
        table: str,
        slices: Mapping[Any, Any],
        *,
        timeout: Any = None,
        held: tuple[int, Mapping[Any, Any]] | None = None,
    ) -> tuple[int, dict[Any, np.ndarray]]:
        """``(version, {path: array})``: the blocks ``slices`` names (``{path:
        index_ranges}``, one ``(start, stop)`` per dimension) of a sharded table's latest
        version, all of that one version, fetching only the ranks' parts that hold some
        of them. Waits for a first version as :meth:`pull` does.

        ``held``: a ``(version, arrays)`` this container's ``pull_slices`` of the same
        slices returned: only the blocks changed since are fetched (as element patches
        where a rank pushed them so and a block lies inside a slice), the arrays of
        slices that did not change are ``held``'s own, changed ones new arrays (``held``
        is never modified); if nothing is newer, ``held``'s version and arrays."""
        self._require_sharded(table)
        wanted = self._shard_reads.wanted_blocks(table, slices)
        limit, deadline, transfer = self._deadlines(timeout)
        paths = dict(zip(wanted, slices))
        if held is not None:
            newer = self._pull_slices_since(table, wanted, paths, held, transfer, limit)
            if newer is not None:
                return newer
        manifest, blocks = self._shard_reads.read(
            table, wanted, 0, transfer, limit, wait_until=deadline
        )
        assert blocks is not None  # newer than 0: waited for, or raised
        self._handed(table, self._shard_reads.handed(table, manifest))
        return manifest.version, {paths[leaf]: array for leaf, array in blocks.items()}

    def _pull_slices_since(
        self,
        table: str,
        wanted: Mapping[int, Any],
        paths: Mapping[int, Any],
        held: Any,
        transfer: float,
        limit: float | None,
    ) -> tuple[int, dict[Any, np.ndarray]] | None:
        """``pull_slices(held=)``'s delta read; ``None``: read whole (a ``held`` this
        container cannot vouch for, another history, a patch that does not verify)."""
        if not (isinstance(held, tuple) and len(held) == 2 and isinstance(held[1], Mapping)):
            raise ConfigurationError(
                f"pull_slices: held must be the (version, arrays) a pull_slices returned, "
                f"got {held!r:.80}"
            )
        version, arrays = held
        holds = self._shard_reads.held(table, version)
        if holds is None or any(path not in arrays for path in paths.values()):
            return None
        manifest, pieces = self._shard_reads.read_changed(table, holds, transfer, limit, wanted)
        if pieces is None:
            return version, dict(arrays)
        if pieces is shard_reads_lib.OTHER_HISTORY:
            return None
        specs = self._shards.meta(table).specs
        mine = {leaf: arrays[path] for leaf, path in paths.items()}
        try:
            changed = shard_reads_lib.sliced_leaves(specs, wanted, pieces, mine)
        except CorruptDataError as exc:  # a patch that does not verify: read whole
            shard_reads_lib.log.warning("sharded table %r: %s; read whole", table, exc)
            return None
        if changed is None:
            return None
        self._handed(table, self._shard_reads.handed(table, manifest))
        return manifest.version, {
            path: changed[leaf] if leaf in changed else mine[leaf] for leaf, path in paths.items()
        }

    def _is_sharded(self, table: str) -> bool:
        return sharded_lib.is_manifest(self._table(table)[0])

    def _require_sharded(self, table: str) -> None:
        if not self._is_sharded(table):
            raise ConfigurationError(
                f"table {table!r} is not sharded; create it with create_sharded_table, or "
                "use push and pull"
            )

    def _pull_sharded(
        self, table: str, newer_than: int, timeout: Any, like: Any, *, wait: bool, held: Any = None
    ) -> tuple[int, Any] | None:
        """``pull`` and ``pull_if_newer`` of a sharded table: with ``held`` (the nest this
        container handed out with ``newer_than``), only the blocks changed since."""
        limit, deadline, transfer = self._deadlines(timeout)
        signature, specs = self.signature(table), self._shards.meta(table).specs
        plain, like_leaves = (None, None) if like is None else sig.flatten_like(signature, like)
        holds = None if held is None else self._shard_reads.held(table, newer_than)
        changed: dict[int, np.ndarray] | None = None
        if holds is not None:
            held_leaves = sig.flatten_like(signature, held)[1]
            manifest, pieces = self._shard_reads.read_changed(table, holds, transfer, limit)
            self._histories.check(
                table, newer_than, Head(manifest.version, manifest.head.epoch), epoch=holds.epoch
            )
            if pieces is None:
                return None
            try:
                changed = shard_reads_lib.patched_leaves(specs, pieces, held_leaves)
            except CorruptDataError as exc:  # a patch that does not verify: read whole
                shard_reads_lib.log.warning("sharded table %r: %s; read whole", table, exc)
                changed = None
        if changed is None:  # no held value, or one not of its specs: whole
            manifest, blocks = self._shard_reads.read(
                table, None, newer_than, transfer, limit, wait_until=deadline if wait else None
            )
            self._histories.check(table, newer_than, Head(manifest.version, manifest.head.epoch))
            if blocks is None:
                return None
            changed, held_leaves = blocks, []
        self._handed(table, self._shard_reads.handed(table, manifest))
        if like_leaves is not None:
            made = adapters.from_numpy_all(
                list(changed.values()), [like_leaves[i] for i in changed]
            )
            changed = dict(zip(changed, made))
        leaves = [changed[i] if i in changed else held_leaves[i] for i in range(len(specs))]
        if plain is None:
            return manifest.version, nest_lib.unflatten(signature, leaves)
        return manifest.version, adapters.rebuild(like, plain, leaves)

    def _update_sharded(self, table: str, variables: Any, timeout: Any, delta_only: bool) -> int:
        """``update`` of a sharded table: into the variables this container's last update
        of it assigned, only the blocks changed since."""
        targets = sig.flatten_targets(self.signature(table), variables)
        specs = self._shards.meta(table).specs
        limit, deadline, transfer = self._deadlines(timeout)
        holds = self._assigned.head_of(table, targets) if delta_only else None
        self._assigned.forget(table, targets)  # until this assignment is complete
        held = None if holds is None else self._shard_reads.held(table, *holds)
        if held is not None:
            manifest, pieces = self._shard_reads.read_changed(table, held, transfer, limit)
            if pieces is None:  # nothing newer: nothing to do
                self._assigned.assigned(table, targets, Head(held.version, held.epoch))
                return held.version
            try:
                if pieces is not shard_reads_lib.OTHER_HISTORY:
                    shard_reads_lib.assign_pieces(specs, pieces, targets)
                    head = self._shard_reads.handed(table, manifest)
                    self._handed(table, head)
                    self._assigned.assigned(table, targets, head)
                    return head.version
            except CorruptDataError as exc:  # targets partly written: assign them whole
                shard_reads_lib.log.warning("sharded table %r: %s; read whole", table, exc)
        manifest, blocks = self._shard_reads.read(
            table, None, 0, transfer, limit, wait_until=deadline
        )
        assert blocks is not None  # waited for a first version, or raised
        sig.assign_all(targets, [blocks[i] for i in range(len(targets))])
        head = self._shard_reads.handed(table, manifest)
        self._handed(table, head)
        self._assigned.assigned(table, targets, head)
        return head.version

    # -- who holds which version -------------------------------------------------------

    def report_as(self, reader: str | None = None, *, ttl: float = readers_lib.DEFAULT_TTL) -> None:
        """Report, from now on, the version of each table this container hands out (by
        ``pull``, ``pull_if_newer`` and ``update``) under the id ``reader`` (default:
        ``host:pid``), for ``readers`` and ``wait_for_readers`` anywhere. Reports go out
        from a background thread, so pulls never wait for them; an entry expires ``ttl``
        seconds after this container stops (closed, killed or cut off). Raises
        :class:`UnsupportedError` on a backend without a reader registry."""
        backend = self._backend_call()
        readers_lib.require_registry(backend)
        reporter = readers_lib.Reporter(backend, reader or readers_lib.reader_id(), ttl)
        with self._lock:
            previous, self._reporter = self._reporter, reporter
        if previous is not None:
            previous.close()

    def readers(
        self, table: str = DEFAULT_TABLE, *, timeout: Any = None
    ) -> list[readers_lib.ReaderInfo]:
        """The readers of ``table`` whose reports have not expired and are of the table's
        current history: id, host, pid, the version each holds, since when, and when its
        entry expires (sorted by id). A report of a version of an earlier history (the
        store lost or replaced the table since) is not listed. ``timeout`` bounds the
        requests (default: the container's).
        ``info.lag(container.version(table))`` is how many versions one is behind."""
        return self._readers(table, deadline_after(self._timeout(timeout)))

    def _readers(self, table: str, deadline: float) -> list[readers_lib.ReaderInfo]:
        self._table(table)
        backend = self._backend_call()
        registry = readers_lib.require_registry(backend)
        listed = readers_lib.parse_records(table, registry.readers(table, deadline))
        if not listed:
            return listed
        return readers_lib.of_history(listed, backend.head(table, deadline).epoch)

    def wait_for_readers(
        self, version: int, count: int, table: str = DEFAULT_TABLE, *, timeout: Any = None
    ) -> list[readers_lib.ReaderInfo]:
        """Block until at least ``count`` readers report holding ``version`` or newer;
        return them. Raises :class:`PullTimeoutError` after ``timeout`` seconds (default:
        the container's), naming the readers that do report and what they hold."""
        version = checks.version(version)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"count must be an int >= 1, got {count!r}")
        return readers_lib.wait_until_held(
            lambda deadline: self._readers(table, deadline),
            table,
            version,
            count,
            self._timeout(timeout),
        )

    def _handed(self, table: str, head: Head) -> None:
        """This container handed out ``head``'s version of ``table``: noted for the
        history rule, and for the reporter."""
        self._histories.handed(table, head)
        reporter = self._reporter
        if reporter is not None:
            reporter.held(table, head.version, head.epoch)

    # -- life cycle ------------------------------------------------------------------

    def close(self) -> None:
        """Release the backend's connections. Further calls raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close()
        self._backend.close()

    def __enter__(self) -> VariableContainer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"timeout={self.timeout}"
        namespace = f", namespace={self._backend.namespace!r}" if self._backend.namespace else ""
        return f"<VariableContainer {self._backend.url}{namespace} {state}>"

    @property
    def backend(self) -> Backend:
        """The backend instance (for engine-specific needs; most code never needs it)."""
        return self._backend

    # -- internals -------------------------------------------------------------------

    def _backend_call(self) -> Backend:
        if self._closed:
            raise ConfigurationError(f"{self!r} is closed; connect again to use it")
        return self._backend

    def _table(self, name: str) -> tuple[Any, list[sig.Spec]]:
        self._backend_call()  # a closed container answers nothing, cached or not
        known = self._signatures.get(name)
        if known is not None:
            return known
        checks.table_name(name)
        text = self._backend_call().signature(name)
        if text is None:
            existing = self.tables()
            raise TableNotFoundError(
                f"no table {name!r} at {self._backend.url}"
                + (f" in namespace {self._backend.namespace!r}" if self._backend.namespace else "")
                + f"; existing tables: {existing or 'none'}. Create it with "
                "create_table(name, signature)."
            )
        return self._remember(name, sig.from_json(text))

    def _remember(self, name: str, signature: Any) -> tuple[Any, list[sig.Spec]]:
        entry = (signature, sig.flat_specs(signature))
        self._likes_checked.pop(name, None)
        self._signatures[name] = entry
        return entry

    def _timeout(self, timeout: Any) -> float | None:
        return self.timeout if timeout is None else parse_timeout(timeout, "timeout")

    def _deadlines(self, timeout: Any) -> tuple[float | None, float, float]:
        """A call's ``timeout`` (``None``: the container's), the deadline by which its
        waits end, and the deadline of its transfers: the same, except that
        ``timeout=0`` means "do not wait for a push", not "move no bytes", so the data
        already there comes within the container's timeout. The one place that says so."""
        limit = self._timeout(timeout)
        deadline = deadline_after(limit)
        return limit, deadline, deadline_after(self.timeout) if limit == 0 else deadline

    def _seen(self, table: str, head: Head) -> int:
        """An answer about ``table`` for no held version: its epoch is the one seen."""
        self._histories.check(table, 0, head)
        return head.version

    def _head(self, table: str) -> Head:
        """The table's head, each request bounded by the backend's own timeout."""
        head = self._backend_call().head(table, math.inf)
        self._seen(table, head)
        return head

    def _wait(self, table: str, newer_than: int, timeout: Any, *, epoch: Any = UNKNOWN) -> Head:
        """The table's head once its version is no longer ``newer_than`` (or its epoch no
        longer that of the version held), within ``timeout``."""
        limit, deadline, transfer = self._deadlines(timeout)
        if epoch is UNKNOWN and newer_than:
            epoch = self._histories.epoch_of(table, newer_than)
        return wait_for_change(
            self._backend_call(), table, newer_than, epoch, deadline, transfer, limit
        )

    def _pull_flat(self, table: str, timeout: Any) -> tuple[Head, list[np.ndarray]]:
        """The latest head and arrays, waiting up to ``timeout`` for a first push. The
        whole call, waits and transfers, ends within ``timeout`` (0: no wait)."""
        specs = self._table(table)[1]
        limit, deadline, transfer = self._deadlines(timeout)
        backend = self._backend_call()
        while True:
            head, arrays = backend.read(table, 0, transfer, specs)
            self._seen(table, head)
            if arrays is not None:
                return head, self._checked(table, head, arrays)
            try:
                if remaining(deadline) <= 0:
                    raise PullTimeoutError("no time left")
                wait_for_change(backend, table, 0, UNKNOWN, deadline, transfer, limit)
            except PullTimeoutError:
                empty = PullTimeoutError(
                    f"table {table!r} at {backend.url} is still empty after {limit:g} s; "
                    "push to it first, or pull with a longer timeout"
                )
                empty.still_empty = True
                raise empty from None

    def _like(self, table: str, like: Any) -> tuple[Any, list[Any]]:
        """``like`` checked against the table's structure: its plain form and its leaves.
        A nest whose adapter gives a structure key (a JAX treedef) is checked once per
        key; later pulls take its leaves straight from the framework (a tree walk in
        Python cost 14 % of a 50-leaf JAX pull)."""
        fast = adapters.leaves_and_key(like)
        if fast is None:
            flat: tuple[Any, list[Any]] = sig.flatten_like(self._table(table)[0], like)
            return flat
        key, leaves = fast
        checked = self._likes_checked.setdefault(table, collections.OrderedDict())
        if key in checked:
            return None, leaves
        plain, leaves = sig.flatten_like(self._table(table)[0], like)
        checked[key] = None
        if len(checked) > 16:
            checked.popitem(last=False)
        return plain, leaves

    def _nest(
        self, table: str, arrays: list[np.ndarray], like: Any = None, shaped: Any = None
    ) -> Any:
        if shaped is None:
            return nest_lib.unflatten(self._table(table)[0], arrays)
        plain_like, like_leaves = shaped
        leaves = adapters.from_numpy_all(arrays, like_leaves)
        return adapters.rebuild(like, plain_like, leaves)

    def _checked(self, table: str, head: Head, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The backend's arrays of ``head``'s version, verified against the table's
        specs, now handed out."""
        checks.read_leaves(table, head.version, arrays, self._table(table)[1], whole=True)
        self._handed(table, head)
        return list(arrays)

    def _push_leaves_whole(
        self, table: str, given: dict[int, np.ndarray], specs: list[sig.Spec]
    ) -> int:
        """``push_leaves`` on a backend without leaf versions: the current value with the
        given leaves replaced, written whole."""
        backend = self._backend_call()
        head, arrays = backend.read(table, 0, deadline_after(self.timeout), specs)
        self._seen(table, head)
        if arrays is None:
            raise delta.nothing_to_keep(table, backend.url, self._table(table)[0], given)
        arrays = self._checked(table, head, arrays)
        for index, array in given.items():
            arrays[index] = array
        return self._seen(table, backend.write(table, arrays, specs, math.inf))
