"""The Backend protocol: the raw table surface one storage engine implements.

A backend never sees a nest. It stores, per table, a signature text (JSON made by the
core, opaque to the backend), a version (an int, 0 while empty, strictly increasing per
table) and one flat list of numpy arrays per version. The core has already checked every
array against the table's specs: each is C-contiguous, in native byte order and of
exactly its spec's dtype and shape. A backend must not modify the arrays it is given and
must copy what it keeps.

Required: :meth:`create_table`, :meth:`signature`, :meth:`tables`, :meth:`version`,
:meth:`write`, :meth:`read`. Optional: :meth:`block` (how to sleep until the table may
have changed; the default sleeps, so waits poll), :meth:`version_within`,
:meth:`details`, :meth:`describe_options`, :meth:`close`; with the ability
``supports_leaf_versions``, :meth:`write_leaves`, :meth:`read_leaves`,
:meth:`leaf_versions` and :meth:`history_of`; with ``supports_reader_registry``,
:meth:`report_reader` and :meth:`readers`.

The core owns the wait loop (:func:`wait_for_change`, behind :meth:`wait`): a backend
gives it the primitive, :meth:`block`, not a loop of its own. A backend written before
:meth:`block` existed may still override :meth:`wait`; the core calls it.

Capability flags (class attributes) tell the core and the conformance suite what the
engine can do; the suite checks each declared one and skips the tests of abilities a
backend does not declare.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import inspect
import math
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import (
    Any,
    ClassVar,
    Optional,
)

import numpy as np

from varsync.config import redact
from varsync.errors import ConfigurationError, PullTimeoutError
from varsync.signature import Spec

__all__ = [
    "Backend",
    "Snapshot",
    "LeafSnapshot",
    "remaining",
    "deadline_after",
    "wait_for_change",
    "deadline_scope",
    "current_deadline",
    "read_snapshot",
    "write_unversioned",
    "POLL_START",
    "POLL_MAX",
    "BLOCK_SLICE",
]

#: Seconds of the first and the longest sleep between two looks when :meth:`Backend.block`
#: cannot be woken by the engine (``supports_blocking_wait`` false): the interval doubles.
POLL_START = 0.001
POLL_MAX = 0.05

Snapshot = tuple[int, Optional[list[np.ndarray]]]
"""The table's current version and, when asked for, that one version's arrays."""


LeafSnapshot = tuple[int, Optional[list[int]], Optional[list[Optional[np.ndarray]]]]
"""What :meth:`Backend.read_leaves` answers: the table's current version, then, if it is
newer than asked, every leaf's leaf version and the arrays of the leaves changed since
(``None`` in the places of the leaves the caller holds already)."""


class Backend(abc.ABC):
    """Base class of every backend. Subclass it, then register ``"module:Class"``."""

    #: Clients can create tables (Reverb cannot: its tables are fixed at server start).
    supports_create_table: ClassVar[bool] = True
    #: Containers in other processes see this store (memory: no; a server: yes).
    shared_across_processes: ClassVar[bool] = True
    #: :meth:`block` is woken by the engine when the table changes, so the core's wait
    #: loop blocks once for all the time left; ``False``: :meth:`block` only sleeps, and
    #: the core polls with an interval growing from ``POLL_START`` to ``POLL_MAX``.
    supports_blocking_wait: ClassVar[bool] = False
    #: Tables outlive the process that wrote them, across server restarts.
    persistent: ClassVar[bool] = False
    #: Largest total bytes of one push the engine accepts, or ``None`` for no limit.
    max_push_bytes: ClassVar[int | None] = None
    #: Pushes from several writers at once each get their own version. ``False``: a push
    #: that raced another writer's may raise :class:`~varsync.ConcurrentPushError`
    #: (published, version unknown) instead, but never returns a number twice.
    supports_concurrent_writers: ClassVar[bool] = True
    #: The dtypes of :data:`~varsync.spec.ML_DTYPE_NAMES` (bfloat16, the float8 types)
    #: the engine stores bit-exactly, each by name: ``("bfloat16", "float8_e5m2")``.
    #: Default none: numpy knows such arrays only through ``ml_dtypes`` (``memoryview``
    #: refuses them, ``dtype.str`` calls every float8 type ``"<V1"``), so a backend not
    #: checked with them claims nothing; the suite round-trips the dtypes declared.
    supported_ml_dtypes: ClassVar[tuple[str, ...]] = ()
    #: The engine records, with every stored version, the version at which each leaf
    #: last changed, and implements :meth:`write_leaves`, :meth:`read_leaves` and
    #: :meth:`leaf_versions`: pushes send only the leaves that changed and pulls fetch
    #: only the leaves changed since what the caller holds (``docs/delta.md``). ``False``
    #: (the default, and every backend written before this ability): the core writes and
    #: reads whole versions, and ``push_leaves`` reads the current value to write a whole one.
    supports_leaf_versions: ClassVar[bool] = False
    #: The engine keeps, per table, records of the readers that report what they hold
    #: (:meth:`report_reader`, :meth:`readers`), each expiring unless reported again: the
    #: core's ``readers`` and ``wait_for_readers``. ``False``: those raise
    #: :class:`~varsync.UnsupportedError`.
    supports_reader_registry: ClassVar[bool] = False

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any) -> None:
        """``url``: the URL given to ``connect`` without its query string (parse
        credentials from this argument: ``self.url`` has them redacted); ``timeout``
        bounds every network wait (``None``: no bound); ``namespace`` isolates tables;
        ``options`` are this backend's own, from keyword arguments and the URL's query
        string."""
        self.url = redact(url)  # for messages and repr: never holds a password
        self.timeout = timeout
        self.namespace = namespace
        if options:
            raise ConfigurationError(
                f"{type(self).__name__} takes no option(s) {sorted(options)}; "
                "common options are: timeout, namespace"
            )

    # -- tables ----------------------------------------------------------------------

    @abc.abstractmethod
    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        """Create table ``name`` with this signature text unless it exists, atomically.

        Return the signature text the table has now: ``signature`` if this call created
        it, the stored one otherwise (the core compares them).
        """

    @abc.abstractmethod
    def signature(self, name: str) -> str | None:
        """The table's signature text, or ``None`` if there is no such table."""

    @abc.abstractmethod
    def tables(self) -> list[str]:
        """The names of the tables in this namespace."""

    def details(self, name: str) -> dict[str, Any]:
        """Engine-specific facts about a table, for ``table_info`` (JSON-friendly)."""
        return {}

    # -- data ------------------------------------------------------------------------

    @abc.abstractmethod
    def version(self, name: str) -> int:
        """The table's current version; 0 while nothing was written. Must cost one small
        request, whatever the size of the table."""

    @abc.abstractmethod
    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        """Store ``arrays`` as the table's new value; return its version.

        Readers must see either the previous value or this one, never a mix; a failed
        write must leave the previous value readable. (With ``supports_leaf_versions``:
        every leaf's leaf version becomes the new version.)
        """

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]
    ) -> None:
        """:meth:`write`, for a caller that drops the new version (TF-Agents' push returns
        none): the same value, version, atomicity and errors. Default: calls
        :meth:`write`. Override it only where learning the version costs a request of its
        own after the write (Reverb: a second table info), and skip that request."""
        self.write(name, arrays, specs)

    @abc.abstractmethod
    def read(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> Snapshot:
        """``(version, arrays)`` of the latest value if its version is greater than
        ``newer_than``, else ``(version, None)``.

        Must not wait for data: when nothing is newer, answer at once at the cost of one
        small request. ``timeout`` bounds the transfer itself, in seconds (``None``: no
        bound beyond the backend's own ``timeout``). ``specs`` are the table's, as
        :meth:`write` gets them: what to expect, or to read into. (A backend written
        before ``specs`` was passed, with ``read(name, newer_than, timeout)``, still
        works: the core passes only what its ``read`` takes.)
        """

    # -- leaf versions (optional: only with ``supports_leaf_versions``) ------------------

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: int | None = None,
    ) -> int:
        """Store a new version in which the leaf at each flat index of ``leaves`` takes
        that array, and every other leaf keeps the value and leaf version it has in the
        current version; return the new version (the given leaves' leaf version).

        ``base`` ``None``: on top of whatever version is current when the write lands,
        atomically (another writer's push lands wholly before or wholly after it). An
        int: only if the current version is ``base`` in the history this backend trusts
        (the one its last write or read saw); otherwise write nothing and return 0 (the
        core then writes the whole nest). The arrays are checked as for :meth:`write`;
        ``leaves`` may hold every index. Into an empty table (version 0) only a write of
        every leaf is possible: given fewer, write nothing and return 0 (the core checks
        first; this covers a table emptied since).
        Readers see the previous version or this one, never a mix; a failed write leaves
        the previous version readable; a leaf unchanged for any number of versions stays
        readable whatever the backend's retention.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support leaf versions")

    def read_leaves(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> LeafSnapshot:
        """``(version, leaf_versions, arrays)`` of the latest version if it is greater
        than ``newer_than``, else ``(version, None, None)`` at the cost of one small
        request, as :meth:`read`.

        ``leaf_versions[i]`` is the version at which leaf ``i`` last changed (at most
        ``version``); ``arrays[i]`` is its array if ``leaf_versions[i] > newer_than``,
        else ``None``: the caller holds it already. ``newer_than`` 0: every leaf. The
        caller holds version ``newer_than`` of the history this backend trusts: if the
        table's history restarted since (another epoch), raise
        :func:`~varsync.history.reset_error` (through :class:`Histories`), never answer
        with the leaves of another history. ``timeout`` as for :meth:`read`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support leaf versions")

    def history_of(self, name: str) -> Hashable:
        """The history (epoch) of table ``name`` this backend trusts now, as its last
        answer showed it: no request. With ``supports_leaf_versions`` the core keeps it
        beside every version it hands out and every write it skips leaves on, and moves
        only leaves of the same history: leaves held from one history are never
        combined with another's, even after another call of the same backend moved to
        the new one. Default ``None``: this store never starts a new history of a table
        (memory); a backend whose tables can restart must override it."""
        return None

    def current_history(self, name: str) -> Hashable:
        """The table's history (epoch) as the store holds it now, asked of the store (one
        small request) and remembered nowhere: the reader registry counts only the
        reports of this history (``readers``, ``wait_for_readers``), and a reporter stops
        reporting a version of a history the table has left. ``None`` for a table that
        is gone. Default: :meth:`history_of` (right for a store whose tables never start
        a new history, such as memory; a backend whose tables can restart overrides it).
        Added in 0.3."""
        return self.history_of(name)

    def leaf_versions(self, name: str) -> tuple[int, list[int]]:
        """The table's current version and each leaf's leaf version, in one small
        request; no data is moved. An empty table answers version 0 (its list, ``[]`` or
        zeros, is not looked at)."""
        raise NotImplementedError(f"{type(self).__name__} does not support leaf versions")

    # -- the reader registry (optional: only with ``supports_reader_registry``) ----------

    def report_reader(self, name: str, reader: str, record: str, ttl: float) -> None:
        """Store ``record`` (JSON text made by the core, opaque here) as reader
        ``reader``'s entry for table ``name``, replacing its previous one; it expires
        ``ttl`` seconds from now unless reported again. One small request; it never
        touches the table's data or version."""
        raise NotImplementedError(f"{type(self).__name__} has no reader registry")

    def readers(self, name: str) -> dict[str, str]:
        """The table's unexpired reader entries: reader id -> record text. One small
        request (a few, for many readers); expired entries are never returned."""
        raise NotImplementedError(f"{type(self).__name__} has no reader registry")

    def block(self, name: str, newer_than: int, seconds: float) -> None:
        """Return after at most ``seconds``, or earlier once the table's version may
        differ from ``newer_than``: the primitive the core's wait loop sleeps on.

        A backend that can be notified arms its notification first, then returns at once
        if the version already differs, else sleeps until notified or ``seconds`` pass;
        it sets ``supports_blocking_wait``. Returning early is always allowed (the core
        looks at the version again); never sleep past ``seconds``. The default sleeps.
        """
        time.sleep(seconds)

    def wait(self, name: str, newer_than: int, timeout: float | None) -> int:
        """Block while the table's version equals ``newer_than``; return the version.

        (A version below ``newer_than`` returns at once: the core reports the reset.)
        Raise :class:`PullTimeoutError` once ``timeout`` seconds pass (``None``: wait as
        long as it takes). This is the core's loop, :func:`wait_for_change`, over
        :meth:`version_within` and :meth:`block`: implement those rather than this.
        """
        return wait_for_change(self, name, newer_than, timeout)

    def version_within(self, name: str, timeout: float | None, held: int = 0) -> int:
        """:meth:`version`, its request bounded by ``timeout`` seconds (``None``: the
        backend's own ``timeout``); the core's wait loop looks through it, so that a hung
        server cannot hold a wait past its bound. ``held`` is the version the waiting
        caller holds (0: none): a backend whose numbers mean something only with an epoch
        checks each answer against it (:class:`~varsync.history.Histories`), so a new
        history at or past ``held`` is a reset, not "no change" or "newer". Optional:
        this default calls :meth:`version`, bounded by the backend's timeout only; a
        ``version_within(name, timeout)`` without ``held`` is called without it."""
        return self.version(name)

    def close(self) -> None:
        """Release connections. The container calls it once."""

    def describe_options(self) -> Mapping[str, Any]:
        """The options in force, without secrets, for ``table_info``."""
        return {"timeout": self.timeout, "namespace": self.namespace}


_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar(
    "varsync_deadline", default=math.inf
)


@contextlib.contextmanager
def deadline_scope(deadline: float) -> Iterator[None]:
    """Within the block, :func:`current_deadline` is ``deadline`` (or an enclosing scope's,
    if earlier): how the core hands a call's own deadline to the requests of backend
    methods that take none (``readers``, ``report_reader``, ``current_history``,
    ``leaf_versions``), as trio's cancel scopes do. Per thread (a context variable)."""
    token = _DEADLINE.set(min(deadline, _DEADLINE.get()))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float:
    """The ``time.monotonic()`` by which the caller's call must end (``inf``: none set):
    a backend bounds each request it sends by this as well as by its own timeout."""
    return _DEADLINE.get()


def deadline_after(timeout: float | None) -> float:
    """The ``time.monotonic()`` at which ``timeout`` runs out (``inf`` for ``None``)."""
    return math.inf if timeout is None else time.monotonic() + timeout


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (may be negative; ``inf`` for no deadline)."""
    return deadline - time.monotonic()


#: The longest single :meth:`Backend.block` of the wait loop, in seconds, even for a
#: backend woken by its engine: a lost notification costs at most this much.
BLOCK_SLICE = 5.0


def wait_for_change(backend: Backend, name: str, newer_than: int, timeout: float | None) -> int:
    """The one wait loop: look at the version, and while it equals ``newer_than`` block
    until the backend is notified, or poll, until ``timeout`` (``None``: no bound)."""
    deadline = deadline_after(timeout)
    interval = POLL_START
    takes_held = _takes(type(backend), "version_within", "held", 4)
    while True:
        left = remaining(deadline)
        # timeout=0: one look, bounded by the backend's own timeout, as a read is then by
        # the container's: "do not wait for a push" is not "give the server no time".
        bound = None if math.isinf(left) or timeout == 0 else max(left, 0.001)
        if takes_held:
            current = backend.version_within(name, bound, newer_than)
        else:
            current = backend.version_within(name, bound)
        if current != newer_than:
            return current
        left = remaining(deadline)
        if left <= 0:
            raise PullTimeoutError(
                f"table {name!r} at {backend.url} stayed at version {current} (waiting for "
                f"a version above {newer_than}) for {timeout:g} s"
            )
        if backend.supports_blocking_wait:
            backend.block(name, newer_than, min(left, BLOCK_SLICE))
        else:
            backend.block(name, newer_than, min(interval, left))
            interval = min(interval * 2, POLL_MAX)


_TAKES: dict[tuple[type[Any], str], bool] = {}


def _takes(cls: type[Any], method: str, parameter: str, count: int) -> bool:
    """Whether ``cls.method`` takes ``parameter``: by name, as its ``count``-th positional
    parameter (``self`` included), or through ``*args``. Decided once per class, so a
    backend written before ``parameter`` was added is called without it."""
    key = (cls, method)
    takes = _TAKES.get(key)
    if takes is None:
        try:
            parameters = inspect.signature(getattr(cls, method)).parameters
        except (TypeError, ValueError):  # no signature to inspect: assume the current one
            takes = True
        else:
            takes = (
                parameter in parameters
                or len(parameters) >= count
                or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
            )
        _TAKES[key] = takes
    return takes


def read_snapshot(
    backend: Backend,
    name: str,
    newer_than: int,
    timeout: float | None,
    specs: Sequence[Spec],
) -> Snapshot:
    """``backend.read(...)``, with ``specs`` where its ``read`` takes them (a backend of
    the first protocol's ``read(name, newer_than, timeout)`` is called without)."""
    if _takes(type(backend), "read", "specs", 5):
        return backend.read(name, newer_than, timeout, specs)
    return backend.read(name, newer_than, timeout)  # type: ignore[call-arg]


def write_unversioned(
    backend: Backend, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]
) -> None:
    """``backend.write_unversioned(...)``, or its ``write`` with the version dropped for a
    backend that has no such method (one not subclassing :class:`Backend`)."""
    unversioned = getattr(backend, "write_unversioned", None)
    if unversioned is None:
        backend.write(name, arrays, specs)
    else:
        unversioned(name, arrays, specs)
