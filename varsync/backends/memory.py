"""``memory://<name>``: an in-process store shared by every container of the process
that names it. Thread-safe; the embedded default is ``memory://default``.

Writes copy the caller's arrays into immutable ``bytes``, so later changes to them do not
reach the store, and reads hand out read-only views of those bytes: pulls cost no copy,
and no reader can make them writable (numpy refuses ``flags.writeable = True`` on memory
it does not own). A new version replaces the table's ``(version, arrays)`` pair in one
assignment under a lock, so a reader gets one version's arrays, never a mix.

Leaf versions (``supports_leaf_versions``): each stored version is its arrays and, per
leaf, the version at which it last changed. A partial write copies only the leaves it is
given and shares the other leaves' immutable arrays with the version before: nothing
unchanged is copied, and a leaf untouched for any number of versions stays readable
because every version that shows it holds a reference to it.

Every lock here is a plain ``threading.Lock`` used by ``with`` (whose ``__enter__`` is
C code), never a ``threading.Condition``, whose Python-level ``__enter__`` and ``wait``
can be interrupted (Ctrl-C) after taking the lock and leave it held for good. A waiter
sleeps on a lock of its own that the next push releases.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from varsync.backends.base import Backend, LeafSnapshot, Snapshot
from varsync.errors import ConfigurationError
from varsync.signature import Spec
from varsync.spec import ML_DTYPE_NAMES

__all__ = ["MemoryBackend"]


@dataclass
class _Table:
    signature: str
    #: ``(version, arrays, leaf versions)``, replaced whole: one assignment publishes a
    #: version.
    value: tuple[int, list[np.ndarray], list[int]] = (0, [], [])
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


class MemoryBackend(Backend):
    """Tables in this process's memory, under the store named by the URL."""

    shared_across_processes = False
    supports_blocking_wait = True
    supported_ml_dtypes = ML_DTYPE_NAMES  # bytes in, the spec's dtype out: any dtype
    supports_leaf_versions = True
    supports_reader_registry = True

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

    def version(self, name: str) -> int:
        return self._table(name).value[0]

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        return self._publish(name, dict(enumerate(arrays)), None, whole=True)

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: int | None = None,
    ) -> int:
        return self._publish(name, leaves, base, whole=len(leaves) == len(specs))

    def _publish(
        self, name: str, leaves: Mapping[int, np.ndarray], base: int | None, whole: bool
    ) -> int:
        copies = {index: _frozen(array) for index, array in leaves.items()}
        table = self._table(name)
        with self._store.lock:
            current, arrays, leaf_versions = table.value
            if (base is not None and current != base) or (current == 0 and not whole):
                return 0  # not on the version asked for, or nothing to keep the rest of
            version = current + 1
            if whole:
                arrays = [copies[i] for i in range(len(copies))]
                leaf_versions = [version] * len(arrays)
            else:
                arrays, leaf_versions = list(arrays), list(leaf_versions)
                for index, copy in copies.items():
                    arrays[index] = copy
                    leaf_versions[index] = version
            table.value = (version, arrays, leaf_versions)
            woken, table.waiters = table.waiters, []
        for waiter in woken:
            _release(waiter)
        return version

    def read(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> Snapshot:
        version, stored, _ = self._table(name).value
        if version <= newer_than:
            return version, None
        return version, [array.view() for array in stored]

    def read_leaves(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> LeafSnapshot:
        version, stored, leaf_versions = self._table(name).value
        if version <= newer_than:
            return version, None, None
        return (
            version,
            list(leaf_versions),
            [
                array.view() if changed > newer_than else None
                for array, changed in zip(stored, leaf_versions)
            ],
        )

    def leaf_versions(self, name: str) -> tuple[int, list[int]]:
        version, _, leaf_versions = self._table(name).value
        return version, list(leaf_versions)

    def report_reader(self, name: str, reader: str, record: str, ttl: float) -> None:
        table = self._table(name)
        with self._store.lock:
            table.readers[reader] = (record, time.monotonic() + ttl)

    def readers(self, name: str) -> dict[str, str]:
        table = self._table(name)
        now = time.monotonic()
        with self._store.lock:
            for gone in [r for r, (_, expires) in table.readers.items() if expires <= now]:
                del table.readers[gone]
            return {reader: record for reader, (record, _) in table.readers.items()}

    def block(self, name: str, newer_than: int, seconds: float) -> None:
        table = self._table(name)
        waiter = threading.Lock()
        waiter.acquire()
        try:
            with self._store.lock:
                if table.value[0] != newer_than:
                    return
                table.waiters.append(waiter)
            waiter.acquire(timeout=seconds)
        finally:
            with self._store.lock:
                if waiter in table.waiters:
                    table.waiters.remove(waiter)


def _release(waiter: Any) -> None:
    # RuntimeError: already released (its waiter gave up and was woken anyway)
    with contextlib.suppress(RuntimeError):
        waiter.release()
