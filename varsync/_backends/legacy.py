"""The one door for backends written to the 0.2 protocol: an adapter applied once, when
the registry imports the class, that presents such a backend as a protocol-1 one.

A 0.2 backend has ``version(name)`` and no ``head``; its ``write``/``read`` take relative
timeouts and answer bare ints; it keeps its own memory of a table's history
(``history_of``, ``version_within(..., held)``) and sets its ``supports_*`` flags by hand.
:func:`adapted` wraps its class in a subclass of :class:`~varsync.backend.Backend` with the
abilities its flags declare, whose methods call the old ones and name each answer's epoch
with the old ``history_of``. The registry warns once, with a ``DeprecationWarning``
naming what to change (``docs/plugins.md``, "Porting a 0.2 backend"). Removed in 0.4.

Everything about the old shape is decided here, once per class: whether ``read`` takes
``specs`` (the 0.1 protocol's did not), whether ``version_within`` takes ``held``, whether
the backend blocks through ``block`` or (0.1) through its own ``wait``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from varsync._backends.base import (
    BLOCK_SLICE,
    POLL_MAX,
    POLL_START,
    Backend,
    Head,
    LeafRead,
    Read,
    SupportsBlockingWait,
    SupportsLeafVersions,
    SupportsReaderRegistry,
    deadline_after,
    is_legacy,
    remaining,
    request_timeout,
)
from varsync._errors import PullTimeoutError
from varsync._history import reset_error
from varsync._signature import Spec

__all__ = [
    "is_legacy",
    "adapted",
    "LegacyBackend",
    "PORTING",
    "Snapshot",
    "LeafSnapshot",
    "Histories",
    "read_snapshot",
    "wait_for_change",
]

#: What a 0.2 backend changes to speak protocol 1 (the registry's warning says it).
PORTING = (
    "rename version(name) to head(name, deadline) returning Head(version, epoch); give "
    "write/read/read_leaves/leaf_versions an absolute deadline and answer a Head with each "
    "version; drop history_of/version_within (the core compares epochs); declare "
    "abilities by subclassing SupportsBlockingWait/SupportsLeafVersions/"
    "SupportsReaderRegistry instead of setting supports_* flags (docs/plugins.md, "
    '"Porting a 0.2 backend")'
)

_FLAGS = (
    "supports_create_table",
    "shared_across_processes",
    "persistent",
    "max_push_bytes",
    "supports_concurrent_writers",
    "supported_ml_dtypes",
    "supports_blocking_wait",
    "supports_leaf_versions",
    "supports_reader_registry",
    "FORK_SAFE",
)


def _takes(function: Any, parameter: str, count: int) -> bool:
    """Whether ``function`` takes ``parameter`` by name, as its ``count``-th positional
    parameter (``self`` included), or through ``*args``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return True
    return (
        parameter in parameters
        or len(parameters) >= count
        or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
    )


class LegacyBackend(Backend):
    """A 0.2-protocol backend instance, speaking protocol 1. Made per class by
    :func:`adapted`, with the abilities the old class's flags declare."""

    _legacy_protocol = True
    #: The old class (set on each adapter class).
    legacy_class: type = object
    _read_takes_specs = True
    _within_takes_held = False
    _blocks_by_wait = False
    _own_write_unversioned = False

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any) -> None:
        made = _concrete(self.legacy_class)
        self.legacy = made(url, timeout=timeout, namespace=namespace, **options)
        self.url = getattr(self.legacy, "url", url)
        self.timeout = timeout
        self.namespace = namespace

    def __repr__(self) -> str:
        return repr(self.legacy)

    def _head(self, name: str, version: int) -> Head:
        history_of = getattr(self.legacy, "history_of", None)
        epoch: Hashable = None if history_of is None else history_of(name)
        return Head(version, epoch)

    def _seconds(self, deadline: float) -> float | None:
        return request_timeout(deadline, None)

    # -- tables, forwarded ------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        stored: str = self.legacy.create_table(name, signature, specs)
        return stored

    def signature(self, name: str) -> str | None:
        text: str | None = self.legacy.signature(name)
        return text

    def tables(self) -> list[str]:
        return list(self.legacy.tables())

    def details(self, name: str) -> dict[str, Any]:
        details = getattr(self.legacy, "details", None)
        return {} if details is None else dict(details(name))

    def describe_options(self) -> Mapping[str, Any]:
        describe = getattr(self.legacy, "describe_options", None)
        if describe is None:
            return super().describe_options()
        options: Mapping[str, Any] = describe()
        return options

    def close(self) -> None:
        close = getattr(self.legacy, "close", None)
        if close is not None:
            close()

    # -- data -------------------------------------------------------------------------

    def head(self, name: str, deadline: float) -> Head:
        within = getattr(self.legacy, "version_within", None)
        if within is None:
            return self._head(name, self.legacy.version(name))
        return self._head(name, within(name, self._seconds(deadline)))

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        return self._head(name, self.legacy.write(name, arrays, specs))

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> None:
        if self._own_write_unversioned:
            self.legacy.write_unversioned(name, arrays, specs)
        else:
            self.legacy.write(name, arrays, specs)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        seconds = self._seconds(deadline)
        if self._read_takes_specs:
            version, arrays = self.legacy.read(name, newer_than, seconds, specs)
        else:
            version, arrays = self.legacy.read(name, newer_than, seconds)
        return Read(self._head(name, version), None if arrays is None else list(arrays))


class _LeafVersions(SupportsLeafVersions):
    legacy: Any
    _head: Callable[[str, int], Head]  # LegacyBackend's

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        if base is not None and base != self._head(name, base.version):
            return None  # a base of another history than the one the old backend trusts
        version = self.legacy.write_leaves(
            name, leaves, specs, None if base is None else base.version
        )
        return self._head(name, version) if version else None

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        seconds = request_timeout(deadline, None)
        version, numbers, arrays = self.legacy.read_leaves(name, newer_than, seconds, specs)
        return LeafRead(self._head(name, version), numbers, arrays)

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        version, numbers = self.legacy.leaf_versions(name)
        return self._head(name, version), list(numbers)


class _ReaderRegistry(SupportsReaderRegistry):
    legacy: Any

    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        self.legacy.report_reader(name, reader, record, ttl)

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        return dict(self.legacy.readers(name))


class _BlockingWait(SupportsBlockingWait):
    legacy: Any
    _blocks_by_wait: bool

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        seconds = max(remaining(deadline), 0.0)
        if math.isinf(seconds):
            seconds = 5.0
        if not self._blocks_by_wait:
            self.legacy.block(name, newer_than, seconds)
            return
        with contextlib.suppress(PullTimeoutError):  # a 0.1 backend's own wait
            self.legacy.wait(name, newer_than, seconds)


_ADAPTERS: dict[type, type[LegacyBackend]] = {}


def adapted(cls: type) -> type[LegacyBackend]:
    """The protocol-1 class of the 0.2-protocol backend class ``cls`` (made once)."""
    made = _ADAPTERS.get(cls)
    if made is not None:
        return made
    blocks_by_wait = _overrides(cls, "wait") and not _overrides(cls, "block")
    bases: list[type] = [LegacyBackend]
    if getattr(cls, "supports_leaf_versions", False):
        bases.append(_LeafVersions)
    if getattr(cls, "supports_reader_registry", False):
        bases.append(_ReaderRegistry)
    if getattr(cls, "supports_blocking_wait", False) or blocks_by_wait:
        bases.append(_BlockingWait)
    namespace: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "legacy_class": cls,
        "_read_takes_specs": _takes(getattr(cls, "read", None), "specs", 5),
        "_blocks_by_wait": blocks_by_wait,
        "_own_write_unversioned": _overrides(cls, "write_unversioned"),
    }
    for flag in _FLAGS:
        if hasattr(cls, flag):
            namespace[flag] = getattr(cls, flag)
    if blocks_by_wait:
        namespace["supports_blocking_wait"] = True
    made = type(cls.__name__, tuple(bases), namespace)
    _ADAPTERS[cls] = made
    return made


def _overrides(cls: type, method: str) -> bool:
    """Whether ``cls`` defines ``method`` itself (not :class:`Backend`'s, nor none)."""
    for klass in cls.__mro__:
        if klass is Backend or klass is object:
            return False
        if method in klass.__dict__:
            return True
    return False


_CONCRETE: dict[type, type] = {}


def _concrete(cls: type) -> type:
    """``cls`` made instantiable: a 0.2 backend subclassing today's :class:`Backend`
    lacks its abstract ``head``, which nothing calls on it."""
    if not getattr(cls, "__abstractmethods__", None):
        return cls
    made = _CONCRETE.get(cls)
    if made is None:
        namespace: dict[str, Any] = {"_legacy_protocol": True, "__module__": cls.__module__}
        for method in getattr(cls, "__abstractmethods__", ()):
            namespace[method] = _not_called(method)
        made = _CONCRETE[cls] = type(cls.__name__, (cls,), namespace)
    return made


def _not_called(method: str) -> Any:
    def never(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.{method} (a 0.2-protocol backend)")

    never.__name__ = method
    return never


# -- the 0.2 protocol's names, kept for one release (varsync.backend warns on use) ---------

Snapshot = tuple[int, Optional[list[np.ndarray]]]
"""0.2: what ``read`` answered. Protocol 1: :class:`~varsync.backend.Read`."""

LeafSnapshot = tuple[int, Optional[list[int]], Optional[list[Optional[np.ndarray]]]]
"""0.2: what ``read_leaves`` answered. Protocol 1: :class:`~varsync.backend.LeafRead`."""


def read_snapshot(
    backend: Any, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
) -> Snapshot:
    """0.2: a 0.2 backend's ``read``, with ``specs`` where it takes them."""
    if _takes(getattr(type(backend), "read", None), "specs", 5):
        snapshot: Snapshot = backend.read(name, newer_than, timeout, specs)
    else:
        snapshot = backend.read(name, newer_than, timeout)
    return snapshot


def wait_for_change(backend: Any, name: str, newer_than: int, timeout: float | None) -> int:
    """0.2: the wait loop over a 0.2 backend's ``version`` and ``block``."""
    deadline = deadline_after(timeout)
    interval = POLL_START
    while True:
        current: int = backend.version(name)
        if current != newer_than:
            return current
        left = remaining(deadline)
        if left <= 0:
            raise PullTimeoutError(
                f"table {name!r} at {backend.url} stayed at version {current} (waiting for "
                f"a version above {newer_than}) for {timeout:g} s"
            )
        if getattr(backend, "supports_blocking_wait", False):
            backend.block(name, newer_than, min(left, BLOCK_SLICE))
        else:
            time.sleep(min(interval, left))
            interval = min(interval * 2, POLL_MAX)


class Histories:
    """0.2: the epoch a 0.2 backend trusts for each table, and the rule for a new one
    (protocol 1: the backend answers epochs, the core compares them).

    Thread-safe. An epoch is any hashable the engine returns with its answers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[str, Hashable] = {}

    def trusted(self, table: str) -> Hashable | None:
        """The epoch last adopted for ``table``, or ``None`` if none was."""
        with self._lock:
            return self._epochs.get(table)

    def check(
        self, table: str, epoch: Hashable, held: int, *, where: str, current: int | None = None
    ) -> bool:
        """Whether ``epoch`` is new for ``table``, adopting it.

        The first epoch seen is adopted. A different one is adopted too, unless the caller
        holds a version of the old history (``held > 0``): then :func:`reset_error` is
        raised and the old epoch stays trusted, so every holder of an old version hears of
        the restart, not just the first to ask.
        """
        with self._lock:
            known = self._epochs.get(table)
            if known == epoch:
                return False
            if known is not None and held > 0:
                raise reset_error(
                    table, where, held, current=current, why=f"epoch {known} -> {epoch}"
                )
            self._epochs[table] = epoch
            return known is not None

    def adopt(self, table: str, epoch: Hashable) -> None:
        """Trust ``epoch`` for ``table`` from now on (e.g. after this client created it)."""
        with self._lock:
            self._epochs[table] = epoch

    def forget(self, table: str | None = None) -> None:
        """Trust nothing for ``table`` (``None``: for every table)."""
        with self._lock:
            if table is None:
                self._epochs.clear()
            else:
                self._epochs.pop(table, None)
