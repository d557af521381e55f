"""``memory://<name>``: an in-process store shared by every container of the process
that names it. Thread-safe; the embedded default is ``memory://default``.

Writes copy the caller's arrays into immutable ``bytes``, so later changes to them do not
reach the store, and reads hand out read-only views of those bytes: pulls cost no copy,
and no reader can make them writable (numpy refuses ``flags.writeable = True`` on memory
it does not own). A new version replaces the table's ``(version, arrays)`` pair in one
assignment under a lock, so a reader gets one version's arrays, never a mix.

Each table's epoch is minted when it is made; a memory table never starts another history
(nothing can replace it but the process ending).

Leaf versions (:class:`~varsync.backend.SupportsLeafVersions`): each stored version is
its arrays and, per leaf, the version at which it last changed. A partial write copies
only the leaves it is given and shares the other leaves' immutable arrays with the
version before: nothing unchanged is copied, and a leaf untouched for any number of
versions stays readable because every version that shows it holds a reference to it.

Leaf subsets (:class:`~varsync.backend.SupportsLeafSubsets`): a read of chosen leaves
hands out views of those leaves of the one ``(version, ...)`` tuple it took, as
``read_leaves`` does: free, and of one version.

Element deltas (:class:`~varsync.backend.SupportsElementDeltas`), off unless a table or a
push turns them on (``element_deltas_default``: in one process a whole leaf costs one
copy, less than diffing it; on for the conformance suite): a patched leaf's new
value is built from the current one when the patch is written (a copy of the leaf,
verified against the writer's hash), so reads stay whole and free; each leaf also keeps
the links of its chain since it was last written whole (the writer bounds them to half
the leaf's bytes), for updates that apply only those into their variables.

Every lock here is a plain ``threading.Lock`` used by ``with`` (whose ``__enter__`` is
C code), never a ``threading.Condition``, whose Python-level ``__enter__`` and ``wait``
can be interrupted (Ctrl-C) after taking the lock and leave it held for good. A waiter
sleeps on a lock of its own that the next push releases.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, final
from urllib.parse import urlsplit

import numpy as np

from varsync._backends.base import (
    Backend,
    Head,
    LeafChain,
    LeafRead,
    PatchLink,
    PatchRead,
    Read,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
    leaf_subset,
    remaining,
)
from varsync._elements import Patch, apply
from varsync._errors import ConfigurationError
from varsync._signature import Spec
from varsync._spec import ML_DTYPE_NAMES

__all__ = ["MemoryBackend"]


@dataclass
class _Table:
    signature: str
    #: This table's history: minted when it was made, never another.
    epoch: str = field(default_factory=lambda: os.urandom(8).hex())
    #: ``(version, arrays, leaf versions, links)``, replaced whole: one assignment
    #: publishes a version. ``links[i]``: leaf i's patches since it was last written
    #: whole, oldest first.
    value: tuple[int, list[np.ndarray], list[int], list[tuple[PatchLink, ...]]] = (0, [], [], [])
    #: One held lock per blocked waiter; a push releases them all.
    waiters: list[Any] = field(default_factory=list)
    #: The reader registry: reader id -> (record text, ``time.monotonic()`` it expires).
    readers: dict[str, tuple[str, float]] = field(default_factory=dict)


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tables: dict[tuple[str, str], _Table] = {}


_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()


def _store(name: str) -> _Store:
    with _STORES_LOCK:
        if name not in _STORES:
            _STORES[name] = _Store()
        return _STORES[name]


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array`` over immutable bytes, which no view can unlock."""
    return np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)


@final
class MemoryBackend(
    Backend,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
    SupportsBlockingWait,
):
    """Tables in this process's memory, under the store named by the URL."""

    shared_across_processes = False
    # in-process: a whole leaf is one copy, cheaper than diffing it (turn them on per
    # table with configure_table(element_deltas=True), as the conformance suite does)
    element_deltas_default = False
    supported_ml_dtypes = ML_DTYPE_NAMES  # bytes in, the spec's dtype out: any dtype

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any):
        super().__init__(url, timeout=timeout, namespace=namespace, **options)
        parts = urlsplit(url)
        # Without any user-info: a store has no use for credentials, and must not show them.
        self.store_name = (parts.netloc.rpartition("@")[2] + parts.path).strip("/")
        if not self.store_name:
            raise ConfigurationError(
                f"memory URL {self.url!r} names no store; expected memory://<name>, "
                "e.g. memory://default"
            )
        self._store = _store(self.store_name)

    def _key(self, name: str) -> tuple[str, str]:
        return (self.namespace, name)

    def _table(self, name: str) -> _Table:
        with self._store.lock:
            return self._store.tables[self._key(name)]

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._store.lock:
            table = self._store.tables.setdefault(self._key(name), _Table(signature))
            return table.signature

    def signature(self, name: str) -> str | None:
        with self._store.lock:
            table = self._store.tables.get(self._key(name))
            return None if table is None else table.signature

    def tables(self) -> list[str]:
        with self._store.lock:
            return sorted(n for ns, n in self._store.tables if ns == self.namespace)

    def details(self, name: str) -> dict[str, Any]:
        arrays = self._table(name).value[1]
        return {"store": self.store_name, "stored_bytes": sum(a.nbytes for a in arrays)}

    def head(self, name: str, deadline: float) -> Head:
        table = self._table(name)
        return Head(table.value[0], table.epoch)

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        head = self._publish(name, dict(enumerate(arrays)), {}, None, whole=True)
        assert head is not None  # a whole write always lands
        return head

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        return self._publish(name, leaves, {}, base, whole=len(leaves) == len(specs))

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Head | None:
        table = self._table(name)
        version, stored, leaf_versions, _ = table.value
        if Head(version, table.epoch) != base or version == 0:
            return None
        built: dict[int, tuple[np.ndarray, PatchLink]] = {}
        for index, data in patches.items():
            new = np.empty_like(stored[index])
            apply(stored[index], Patch.from_bytes(data), out=new)  # verified: the writer's hash
            new.flags.writeable = False
            built[index] = (new, PatchLink(leaf_versions[index], version + 1, bytes(data)))
        return self._publish(name, leaves, built, base, whole=False)

    def _publish(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patched: Mapping[int, tuple[np.ndarray, PatchLink]],
        base: Head | None,
        whole: bool,
    ) -> Head | None:
        copies = {index: _frozen(array) for index, array in leaves.items()}
        table = self._table(name)
        with self._store.lock:
            current, arrays, leaf_versions, links = table.value
            if base is not None and base != Head(current, table.epoch):
                return None  # not on the head asked for
            if current == 0 and not whole:
                return None  # nothing to keep the rest of
            version = current + 1
            if whole:
                arrays = [copies[i] for i in range(len(copies))]
                leaf_versions = [version] * len(arrays)
                links = [()] * len(arrays)
            else:
                arrays, leaf_versions, links = list(arrays), list(leaf_versions), list(links)
                for index, copy in copies.items():
                    arrays[index], leaf_versions[index], links[index] = copy, version, ()
                for index, (new, link) in patched.items():
                    arrays[index], leaf_versions[index] = new, version
                    links[index] = (*links[index], link)
            table.value = (version, arrays, leaf_versions, links)
            woken, table.waiters = table.waiters, []
        for waiter in woken:
            _release(waiter)
        return Head(version, table.epoch)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        table = self._table(name)
        version, stored, _, _ = table.value
        if version <= newer_than:
            return Read(Head(version, table.epoch), None)
        return Read(Head(version, table.epoch), [array.view() for array in stored])

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        return self.read_leaf_subset(name, range(len(specs)), newer_than, deadline, specs)

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        chosen = set(leaf_subset(name, indices, len(specs)))
        table = self._table(name)
        version, stored, leaf_versions, _ = table.value  # one version: one assignment
        head = Head(version, table.epoch)
        if version <= newer_than:
            return LeafRead(head, None, None)
        return LeafRead(
            head,
            list(leaf_versions),
            [
                array.view() if index in chosen and changed > newer_than else None
                for index, (array, changed) in enumerate(zip(stored, leaf_versions))
            ],
        )

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        table = self._table(name)
        version, stored, leaf_versions, links = table.value
        head = Head(version, table.epoch)
        if version <= newer_than:
            return PatchRead(head, None, None)
        leaves: list[np.ndarray | LeafChain | None] = []
        for array, changed, chain in zip(stored, leaf_versions, links):
            since = [link for link in chain if link.version > newer_than]
            if changed <= newer_than:
                leaves.append(None)
            elif newer_than and since and since[0].base <= newer_than:
                leaves.append(LeafChain(None, 0, since))
            else:
                leaves.append(array.view())
        return PatchRead(head, list(leaf_versions), leaves)

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        table = self._table(name)
        version, _, leaf_versions, _ = table.value
        return Head(version, table.epoch), list(leaf_versions)

    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        table = self._table(name)
        with self._store.lock:
            table.readers[reader] = (record, time.monotonic() + ttl)

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        table = self._table(name)
        now = time.monotonic()
        with self._store.lock:
            for gone in [r for r, (_, expires) in table.readers.items() if expires <= now]:
                del table.readers[gone]
            return {reader: record for reader, (record, _) in table.readers.items()}

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        table = self._table(name)
        waiter = threading.Lock()
        waiter.acquire()
        try:
            with self._store.lock:
                if table.value[0] != newer_than:
                    return
                table.waiters.append(waiter)
            left = remaining(deadline)
            waiter.acquire(timeout=-1 if math.isinf(left) else max(left, 0.0))
        finally:
            with self._store.lock:
                if waiter in table.waiters:
                    table.waiters.remove(waiter)


def _release(waiter: Any) -> None:
    # RuntimeError: already released (its waiter gave up and was woken anyway)
    with contextlib.suppress(RuntimeError):
        waiter.release()
