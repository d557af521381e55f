"""Moving only what changed: which leaves a push changed, which leaves a path names, and
what a container handed out or assigned (so a later pull or ``update`` can fetch only
the leaves changed since).

Three pieces, each the core's, none a backend's (``docs/delta.md``):

- :class:`Written`: what this container last wrote to a table, per leaf a *sample* of
  its bytes and, once a leaf's sample stopped changing, a 128-bit xxh3 hash of all of
  them. A push compares each leaf's sample first: a leaf whose sample differs changed,
  for the cost of gathering 64 bytes (a trained weight changes everywhere, so this is
  what a push where everything changed pays). A leaf whose sample is the same is hashed
  whole and skipped only if that hash equals the one of the last write: never skipped
  on a sample alone. A leaf of at most :data:`EXACT_BYTES` is compared byte for byte.
  A container's first push to a table hashes every leaf, so a leaf frozen from the
  start is skipped from the second push on. A leaf whose change showed in its sample is
  hashed only when such leaves hold at most a quarter of the push's bytes
  (:data:`HASH_CHANGED_SHARE`): then it is skipped from its first repeat; in a push
  where most bytes changed it is not, and once it stops changing it is sent once more.
  :func:`push_changed` makes such a push, :func:`written_after` keeps the record after a
  ``push_leaves``.
- :func:`leaf_indices`, :func:`given_leaves`: ``push_leaves``' paths to flat indices,
  with the nearest valid paths in the error for one the signature does not have;
  :class:`LeafPaths` walks the signature once for all of a push's paths.
- :class:`Assigned`: the variables an ``update`` last assigned, by identity (weak
  references), with the head (version and epoch) they hold. (The versions a container
  handed out, which a nest passed back as ``held=`` must be one of, are the history
  rule's: ``varsync._history``.)
"""

from __future__ import annotations

import difflib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from varsync import _nest as nest_lib
from varsync import _signature as sig
from varsync._backends.base import Backend, Head, SupportsLeafVersions
from varsync._errors import (
    ConfigurationError,
    LeafPathError,
    SignatureMismatchError,
    TableNotFoundError,
)
from varsync._signature import Spec

__all__ = [
    "Written",
    "changed_leaves",
    "push_changed",
    "written_after",
    "given_leaves",
    "nothing_to_keep",
    "leaf_indices",
    "LeafPaths",
    "Assigned",
    "EXACT_BYTES",
    "SAMPLE_POSITIONS",
    "HASH_CHANGED_SHARE",
]

#: Leaves of at most this many bytes are compared whole, byte for byte, not sampled.
EXACT_BYTES = 256
#: Bytes gathered from a larger leaf, evenly spread, as its sample.
SAMPLE_POSITIONS = 64
#: Changed leaves are hashed too when they hold at most this share of a push's bytes.
HASH_CHANGED_SHARE = 0.25

_POSITIONS: dict[int, np.ndarray] = {}


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat ``uint8`` view (the core's arrays are C-contiguous)."""
    return array.reshape(-1).view(np.uint8)


def _sample(raw: np.ndarray) -> bytes:
    size = raw.size
    if size <= EXACT_BYTES:
        return raw.tobytes()
    positions = _POSITIONS.get(size)
    if positions is None:
        positions = np.linspace(0, size - 1, SAMPLE_POSITIONS).astype(np.intp)
        if len(_POSITIONS) < 4096:
            _POSITIONS[size] = positions
    sample: bytes = raw[positions].tobytes()
    return sample


def _hash(raw: np.ndarray) -> bytes:
    import xxhash  # a core dependency; imported on a push that needs a hash

    return bytes(xxhash.xxh3_128_digest(raw.data))


@dataclass
class Written:
    """What this container's last write to a table held: its head (version and epoch),
    and per leaf the sample of its bytes and their hash (``None`` until a push found the
    sample unchanged)."""

    head: Head
    samples: list[bytes]
    hashes: list[bytes | None]
    #: with element deltas, the writer's copies and chains (``varsync._patches.Bases``)
    bases: Any = None

    @property
    def version(self) -> int:
        return self.head.version


def changed_leaves(
    last: Written | None, arrays: Sequence[np.ndarray]
) -> tuple[list[int], list[bytes], list[bytes | None]]:
    """The flat indices of ``arrays`` that differ from ``last`` (all of them without
    one), and the samples and hashes of ``arrays`` for the next comparison.

    A leaf whose change showed in its sample is hashed too when the leaves changed
    this way hold at most :data:`HASH_CHANGED_SHARE` of the nest's bytes: then a leaf
    that stops changing is skipped from its first repeat (not sent once more), for a
    hash of at most that share; a push where most bytes changed hashes none of them."""
    samples: list[bytes] = []
    hashes: list[bytes | None] = []
    changed: list[int] = []
    unhashed: list[np.ndarray] = []  # changed leaves, seen in their samples
    total = 0
    for index, array in enumerate(arrays):
        raw = _bytes_of(array)
        total += raw.size
        sample = _sample(raw)
        samples.append(sample)
        if last is None:  # a first push: every leaf is sent, and hashed for the next
            hashes.append(None if raw.size <= EXACT_BYTES else _hash(raw))
            changed.append(index)
        elif last.samples[index] != sample:
            hashes.append(None)
            changed.append(index)
            if raw.size > EXACT_BYTES:
                unhashed.append(raw)
        elif raw.size <= EXACT_BYTES:  # the sample is the whole leaf
            hashes.append(None)
        else:
            digest = _hash(raw)
            hashes.append(digest)
            if last.hashes[index] != digest:
                changed.append(index)
    if unhashed and sum(r.size for r in unhashed) <= HASH_CHANGED_SHARE * total:
        for index in changed:
            if hashes[index] is None and arrays[index].nbytes > EXACT_BYTES:
                hashes[index] = _hash(_bytes_of(arrays[index]))
    return changed, samples, hashes


def push_changed(
    backend: Backend,
    table: str,
    arrays: list[np.ndarray],
    specs: Sequence[Spec],
    last: Written | None,
) -> Written:
    """A push through a backend with leaf versions: only the leaves changed since
    ``last`` (this container's last write to the table), written on that version; every
    leaf if there is none, all changed, or another writer pushed since. The record of it
    for the next push."""
    changed, samples, hashes = changed_leaves(last, arrays)
    head = None
    if last is not None and len(changed) < len(arrays):
        assert isinstance(backend, SupportsLeafVersions)  # the container's choice
        # only on exactly the head last written, epoch included: not after another
        # writer's push, nor onto a table that started a new history since
        leaves = {index: arrays[index] for index in changed}
        head = backend.write_leaves(table, leaves, specs, last.head, math.inf)
    if head is None:  # everything changed, a first push, or the table moved on
        head = backend.write(table, arrays, specs, math.inf)
    return Written(head, samples, hashes)


def written_after(last: Written | None, given: dict[int, np.ndarray], head: Head) -> Written | None:
    """The record of a ``push_leaves`` that published ``head``, if the rest of it is
    still ``last``'s (it was the version before, in the same history): its samples with
    the given leaves', their hashes left to the next push."""
    if last is None or last.head != Head(head.version - 1, head.epoch):
        return None
    for index, array in given.items():
        last.samples[index], last.hashes[index] = _sample(_bytes_of(array)), None
        if last.bases is not None:  # written whole: no copy of it, a fresh chain
            last.bases.forget(index)
    last.head = head
    return last


# -- paths ---------------------------------------------------------------------------------


def given_leaves(signature: Any, leaves: Any) -> dict[int, np.ndarray]:
    """``push_leaves``' ``{path: value}`` as flat index -> array, each value checked
    against the specs its path names (a nest for an inner node). The signature is walked
    once, not once per path (:class:`LeafPaths`)."""
    if not isinstance(leaves, Mapping) or not leaves:
        raise ConfigurationError(
            f"push_leaves takes a non-empty mapping of leaf paths to values, got {leaves!r:.80}"
        )
    paths = LeafPaths(signature)
    given: dict[int, np.ndarray] = {}
    for path, value in leaves.items():
        node, indices, walked = paths.leaf_indices(path)
        try:
            arrays = sig.flatten_values(node, value)
        except SignatureMismatchError as exc:
            raise SignatureMismatchError(
                f"push_leaves, path {nest_lib.format_path(walked)}: {exc}"
            ) from None
        for index, array in zip(indices, arrays):
            if index in given:
                raise ConfigurationError(
                    f"push_leaves names the leaf at {path!r} twice (paths overlap)"
                )
            given[index] = array
    return given


def nothing_to_keep(
    table: str, url: str, signature: Any, given: dict[int, np.ndarray]
) -> TableNotFoundError:
    """The error of a ``push_leaves`` into a table that holds no value yet."""
    missing = [
        nest_lib.format_path(path)
        for index, (path, _) in enumerate(nest_lib.flatten_with_paths(signature))
        if index not in given
    ]
    return TableNotFoundError(
        f"table {table!r} at {url} holds no value yet, so push_leaves has nothing to keep "
        f"for the leaves not given ({', '.join(missing[:5])}"
        f"{', ...' if len(missing) > 5 else ''}): a first push gives every leaf, with "
        "push(values)"
    )


def _items(path: nest_lib.Path) -> tuple[Any, ...]:
    return tuple(item for _, item in path)


def leaf_indices(signature: Any, path: Any) -> tuple[Any, list[int], nest_lib.Path]:
    """What ``path`` names in ``signature``: the signature's node there (a spec, or a
    nest of them), the flat indices of its leaves (consecutive), and the path in the
    nest library's form. ``path``: a tuple of keys, indices and field names from the
    root (``("obs_norm", "mean")``, ``("policy", 0)``), or one key of the top level.
    Raises :class:`LeafPathError` naming the nearest valid paths. For many paths into
    one signature, build one :class:`LeafPaths`."""
    return LeafPaths(signature).leaf_indices(path)


class _Node:
    """One node of a signature with the flat indices of its leaves (``start`` up to
    ``stop``) and, for a nest, its children in flat order."""

    __slots__ = ("_lookup", "children", "start", "stop", "value")

    def __init__(
        self,
        value: Any,
        start: int,
        stop: int,
        children: list[tuple[nest_lib.PathEntry, _Node]] | None,
    ) -> None:
        self.value, self.start, self.stop, self.children = value, start, stop, children
        self._lookup: dict[tuple[bool, Any], int] | None = None

    def child(self, step: Any) -> tuple[nest_lib.PathEntry, _Node] | None:
        """The first child ``step`` names (:func:`_matches`), or ``None``; by a dict
        lookup where ``step`` hashes like the child's key, else by trying each child."""
        children = self.children or []
        if self._lookup is None:
            self._lookup = {}
            for number, (entry, _) in enumerate(children):
                self._lookup.setdefault(_lookup_key(entry[1]), number)
        try:
            position = self._lookup.get(_lookup_key(step))
        except Exception:  # an unhashable step, or one whose == raises: tried one by one
            position = None
        if position is not None and _matches(children[position][0], step):
            return children[position]
        for entry, node in children:
            if _matches(entry, step):
                return entry, node
        return None


def _lookup_key(item: Any) -> tuple[bool, Any]:
    # True equals and hashes like 1, but _matches tells a bool from an int
    return isinstance(item, bool), item


class LeafPaths:
    """A signature's nodes, walked once, for :meth:`leaf_indices` to look paths up in:
    a ``push_leaves`` of k paths into n leaves costs O(n + k), not O(n k)."""

    def __init__(self, signature: Any) -> None:
        self.signature = signature
        self._root = _walk(signature, 0)

    def leaf_indices(self, path: Any) -> tuple[Any, list[int], nest_lib.Path]:
        """:func:`leaf_indices` of this signature."""
        wanted = path if isinstance(path, tuple) else (path,)
        node: _Node = self._root
        walked: nest_lib.Path = ()
        for step in wanted:
            found = None if node.children is None else node.child(step)
            if found is None:
                raise _no_such_path(self.signature, wanted)
            walked, node = walked + (found[0],), found[1]
        if node.start == node.stop:  # an empty node: no leaf to push
            raise _no_such_path(self.signature, wanted, empty=True)
        return node.value, list(range(node.start, node.stop)), walked


def _walk(value: Any, start: int) -> _Node:
    """``value``'s node, its first leaf at flat index ``start`` (``nest.flatten``'s order)."""
    if not nest_lib.is_nested(value):
        return _Node(value, start, start + 1, None)
    children: list[tuple[nest_lib.PathEntry, _Node]] = []
    stop = start
    for entry, child in nest_lib.children(value):
        node = _walk(child, stop)
        children.append((entry, node))
        stop = node.stop
    return _Node(value, start, stop, children)


def _matches(entry: nest_lib.PathEntry, step: Any) -> bool:
    kind, item = entry
    if isinstance(step, bool) or isinstance(item, bool):
        return type(step) is type(item) and step == item
    if kind == "index":
        return isinstance(step, (int, np.integer)) and item == step
    try:
        return bool(item == step)
    except Exception:  # a key that cannot compare with this step is not it
        return False


def _no_such_path(signature: Any, wanted: tuple[Any, ...], empty: bool = False) -> LeafPathError:
    leaf_paths = [_items(p) for p, _ in nest_lib.flatten_with_paths(signature)]
    inner = sorted({p[:n] for p in leaf_paths for n in range(1, len(p))}, key=repr)
    candidates = {repr(p): p for p in [*leaf_paths, *inner]}
    near = difflib.get_close_matches(repr(wanted), list(candidates), n=3, cutoff=0.3)
    shown = near or list(candidates)[:3]
    what = "names a node without leaves" if empty else "is not in the table's signature"
    return LeafPathError(
        f"leaf path {wanted!r} {what}; nearest valid path"
        f"{'s' if len(shown) != 1 else ''}: {', '.join(shown)}. A path is a tuple of keys, "
        "list indices and field names from the root, e.g. ('obs_norm', 'mean')"
    )


# -- what a container handed out and assigned ---------------------------------------------


@dataclass
class _Assignment:
    head: Head
    targets: list[weakref.ref[Any]]
    ids: frozenset[int]


class Assigned:
    """For each table, the variables the last ``update`` assigned in full or in part
    (by identity, through weak references) and the version they then held. An update
    into any of them from another table forgets the record: they no longer hold it."""

    def __init__(self) -> None:
        self._records: dict[str, _Assignment] = {}

    def head_of(self, table: str, targets: Sequence[Any]) -> Head | None:
        """The head (version and epoch) ``targets`` hold of ``table`` as the last update
        left them, or ``None`` if they are not exactly the variables it assigned (or one
        of them is gone)."""
        record = self._records.get(table)
        if record is None or len(record.targets) != len(targets):
            return None
        for ref, target in zip(record.targets, targets):
            if ref() is not target:
                return None
        return record.head

    def assigned(self, table: str, targets: Sequence[Any], head: Head) -> None:
        """``targets`` now hold ``head``'s version of ``table``; nothing else holds a
        record of any of them."""
        ids = frozenset(id(t) for t in targets)
        for other in [t for t, r in self._records.items() if r.ids & ids]:
            del self._records[other]
        try:
            refs = [weakref.ref(t) for t in targets]
        except TypeError:  # a variable without weak references: updates stay whole
            return
        self._records[table] = _Assignment(head, refs, ids)

    def forget(self, table: str, targets: Sequence[Any] | None = None) -> None:
        """Drop the record of ``table`` (and of any table whose variables overlap
        ``targets``): an assignment is under way or failed."""
        self._records.pop(table, None)
        if targets is not None:
            ids = {id(t) for t in targets}
            for other in [t for t, r in self._records.items() if r.ids & ids]:
                del self._records[other]
