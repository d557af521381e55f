"""``memory://<name>``: an in-process store shared by every container of the process
that names it. Thread-safe; the embedded default is ``memory://default``.

Writes copy the caller's arrays, so later changes to them do not reach the store. Stored
arrays are read-only and reads hand out read-only views of them: pulls cost no copy, and a
reader cannot change what other readers see. A new version replaces the whole list of
arrays under a lock, so a reader gets one version's arrays, never a mix.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import numpy as np

from varsync.backends.base import Backend, Snapshot, deadline_after, remaining
from varsync.errors import ConfigurationError, PullTimeoutError
from varsync.signature import Spec

__all__ = ["MemoryBackend"]


@dataclass
class _Table:
    signature: str
    version: int = 0
    arrays: List[np.ndarray] = field(default_factory=list)


class _Store:
    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.tables: Dict[Tuple[str, str], _Table] = {}


_STORES: Dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()


def _store(name: str) -> _Store:
    with _STORES_LOCK:
        if name not in _STORES:
            _STORES[name] = _Store()
        return _STORES[name]


class MemoryBackend(Backend):
    """Tables in this process's memory, under the store named by the URL."""

    shared_across_processes = False
    supports_blocking_wait = True

    def __init__(self, url: str, *, timeout: Optional[float], namespace: str, **options: Any):
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

    def _key(self, name: str) -> Tuple[str, str]:
        return (self.namespace, name)

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._store.changed:
            table = self._store.tables.setdefault(self._key(name), _Table(signature))
            return table.signature

    def signature(self, name: str) -> Optional[str]:
        with self._store.changed:
            table = self._store.tables.get(self._key(name))
            return None if table is None else table.signature

    def tables(self) -> List[str]:
        with self._store.changed:
            return sorted(n for ns, n in self._store.tables if ns == self.namespace)

    def details(self, name: str) -> Dict[str, Any]:
        with self._store.changed:
            table = self._store.tables[self._key(name)]
            return {
                "store": self.store_name,
                "stored_bytes": sum(a.nbytes for a in table.arrays),
            }

    def version(self, name: str) -> int:
        with self._store.changed:
            return self._store.tables[self._key(name)].version

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        copies = []
        for array in arrays:
            copy = np.array(array, copy=True, order="C")
            copy.flags.writeable = False
            copies.append(copy)
        with self._store.changed:
            table = self._store.tables[self._key(name)]
            table.version += 1
            table.arrays = copies
            self._store.changed.notify_all()
            return table.version

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        with self._store.changed:
            table = self._store.tables[self._key(name)]
            if table.version <= newer_than:
                return table.version, None
            version, stored = table.version, table.arrays
        return version, [array.view() for array in stored]

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        deadline = deadline_after(timeout)
        key = self._key(name)
        with self._store.changed:
            while self._store.tables[key].version == newer_than:
                left = remaining(deadline)
                if left <= 0:
                    raise PullTimeoutError(
                        f"table {name!r} in {self.url} stayed at version "
                        f"{self._store.tables[key].version} for {timeout:g} s"
                    )
                self._store.changed.wait(None if left == float("inf") else left)
            return self._store.tables[key].version
