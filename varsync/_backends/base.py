"""The Backend protocol, version 1: the raw table surface one storage engine implements.

A backend never sees a nest. It stores, per table, a signature text (JSON made by the
core, opaque to the backend), a :class:`Head` (the version, 0 while empty and strictly
increasing within one history, and the *epoch*: a token the store mints for each history
of the table) and one flat list of numpy arrays per version. The core has already checked
every array against the table's specs: each is C-contiguous, in native byte order and of
exactly its spec's dtype and shape. A backend must not modify the arrays it is given and
must copy what it keeps.

Every answer that names a version names its epoch too: the core alone decides whether an
answer is of the history a caller holds a version of (``varsync._history``). A backend
keeps no memory of what a caller saw.

Time is given as absolute deadlines (``time.monotonic()`` values, ``math.inf`` for none),
as trio's cancel scopes give it: a backend bounds each request by the deadline and by its
own ``timeout``. "Do not wait for a push" is decided by the core, never by a backend.

Required: :meth:`create_table`, :meth:`signature`, :meth:`tables`, :meth:`head`,
:meth:`write`, :meth:`read`. Optional: :meth:`write_unversioned`, :meth:`details`,
:meth:`describe_options`, :meth:`close`. Without :class:`SupportsBlockingWait` the core's
wait loop polls :meth:`head` with a growing interval.

Abilities are types: a backend that can do more declares it by subclassing
:class:`SupportsBlockingWait`, :class:`SupportsLeafVersions` (and on it
:class:`SupportsElementDeltas` and :class:`SupportsLeafSubsets`) or
:class:`SupportsReaderRegistry` and implementing
their abstract methods. Declaring an ability without its methods is an error at
registration and, for a class marked ``@typing.final``, for mypy. The core and the
conformance suite ask ``isinstance``; the ``supports_*`` flags of these abilities are
derived from the types and read-only in spirit.
"""

from __future__ import annotations

import abc
import inspect
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from varsync._config import redact
from varsync._errors import ConfigurationError
from varsync._signature import Spec

__all__ = [
    "Backend",
    "Head",
    "Read",
    "LeafRead",
    "SupportsBlockingWait",
    "SupportsLeafVersions",
    "SupportsReaderRegistry",
    "SupportsElementDeltas",
    "SupportsLeafSubsets",
    "PatchLink",
    "LeafChain",
    "PatchRead",
    "ABILITIES",
    "is_legacy",
    "abilities_of",
    "missing_methods",
    "leaf_subset",
    "reads_leaf_subsets",
    "remaining",
    "deadline_after",
    "request_timeout",
    "POLL_START",
    "POLL_MAX",
    "BLOCK_SLICE",
]

#: Seconds of the first and the longest sleep between two looks of the core's wait loop
#: for a backend the engine cannot wake (no :class:`SupportsBlockingWait`): it doubles.
POLL_START = 0.001
POLL_MAX = 0.05

#: The longest single :meth:`SupportsBlockingWait.block` of the wait loop, in seconds:
#: a lost notification costs at most this much.
BLOCK_SLICE = 5.0


class Head(NamedTuple):
    """A table's current version and the history (epoch) it counts in.

    ``epoch`` is any hashable the store mints when a table's history starts (a table made,
    a store that lost its data) and keeps with it: equal epochs, same history. A store
    whose tables never start a new history may answer ``None``. ``Head(0, epoch)``: the
    table holds no value yet."""

    version: int
    epoch: Hashable = None


class Read(NamedTuple):
    """What :meth:`Backend.read` answers: the head and, if its version is greater than
    the one asked about, that version's arrays (else ``None``)."""

    head: Head
    arrays: list[np.ndarray] | None


class LeafRead(NamedTuple):
    """What :meth:`SupportsLeafVersions.read_leaves` answers: the head, then, if its
    version is greater than asked, every leaf's leaf version and the arrays of the leaves
    changed since (``None`` in the places of the leaves the caller holds already)."""

    head: Head
    leaf_versions: list[int] | None
    arrays: list[np.ndarray | None] | None


class PatchLink(NamedTuple):
    """One element patch of a leaf: made against the leaf's value at leaf version
    ``base`` (the version at which it changed before), it gives the value at ``version``.
    ``data`` is the patch's wire form (``varsync._elements``), opaque to a backend."""

    base: int
    version: int
    data: bytes


class LeafChain(NamedTuple):
    """A leaf given as patches instead of its whole value: ``links`` applied in order
    onto ``anchor`` (the leaf's whole value at leaf version ``anchor_version``), or,
    with ``anchor`` ``None``, onto the value the reader holds already (the first link's
    base is then at most the version the reader asked about)."""

    anchor: np.ndarray | None
    anchor_version: int
    links: list[PatchLink]


class PatchRead(NamedTuple):
    """What :meth:`SupportsElementDeltas.read_patches` answers: :class:`LeafRead`'s
    fields, each changed leaf given whole (an array) or as a :class:`LeafChain`."""

    head: Head
    leaf_versions: list[int] | None
    leaves: list[np.ndarray | LeafChain | None] | None


def deadline_after(timeout: float | None) -> float:
    """The ``time.monotonic()`` at which ``timeout`` seconds run out (``inf`` for ``None``)."""
    return math.inf if timeout is None else time.monotonic() + timeout


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (may be negative; ``inf`` for no deadline)."""
    return deadline - time.monotonic()


def request_timeout(deadline: float, own: float | None) -> float | None:
    """The seconds one request may take: until ``deadline``, and at most the backend's
    own ``timeout`` (``None``: no bound at all). Never below a millisecond, so that a
    request made at its deadline fails as a timeout, not as an invalid argument."""
    left = remaining(deadline)
    if own is not None:
        left = min(left, own)
    return None if math.isinf(left) else max(left, 0.001)


class Backend(abc.ABC):
    """Base class of every backend. Subclass it (and the abilities it has), then register
    ``"module:Class"``."""

    #: Clients can create tables (Reverb cannot: its tables are fixed at server start).
    supports_create_table: ClassVar[bool] = True
    #: Containers in other processes see this store (memory: no; a server: yes).
    shared_across_processes: ClassVar[bool] = True
    #: Tables outlive the process that wrote them, across server restarts.
    persistent: ClassVar[bool] = False
    #: Largest total bytes of one push the engine accepts, or ``None`` for no limit.
    max_push_bytes: ClassVar[int | None] = None
    #: Pushes from several writers at once each get their own version. ``False``: a push
    #: that raced another writer's may raise :class:`~varsync.ConcurrentPushError`
    #: (published, version unknown) instead, but never returns a number twice.
    supports_concurrent_writers: ClassVar[bool] = True
    #: The dtypes of :data:`~varsync._spec.ML_DTYPE_NAMES` (bfloat16, the float8 types)
    #: the engine stores bit-exactly, each by name: ``("bfloat16", "float8_e5m2")``.
    #: Default none: numpy knows such arrays only through ``ml_dtypes``, so a backend not
    #: checked with them claims nothing; the suite round-trips the dtypes declared.
    supported_ml_dtypes: ClassVar[tuple[str, ...]] = ()
    #: Derived from the abilities (the types this class subclasses); do not set them.
    supports_blocking_wait: ClassVar[bool] = False
    supports_leaf_versions: ClassVar[bool] = False
    supports_reader_registry: ClassVar[bool] = False
    supports_element_deltas: ClassVar[bool] = False
    supports_leaf_subsets: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "_legacy_protocol", False) or is_legacy(cls):
            return  # a 0.2-protocol class keeps its own flags (varsync._backends.legacy)
        for ability, flag in ABILITIES.items():
            has = issubclass(cls, ability)
            declared = cls.__dict__.get(flag)
            if declared is not None and bool(declared) != has:
                raise ConfigurationError(
                    f"{cls.__qualname__} sets {flag} = {declared!r}, but abilities are "
                    f"declared by type: {'subclass' if declared else 'do not subclass'} "
                    f"varsync.backend.{ability.__name__} (and drop the flag)"
                )
            setattr(cls, flag, has)

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any) -> None:
        """``url``: the URL given to ``connect`` without its query string (parse
        credentials from this argument: ``self.url`` has them redacted); ``timeout``
        bounds every request (``None``: no bound); ``namespace`` isolates tables;
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
        it, the stored one otherwise (the core compares them). A new table's history
        starts here: mint its epoch.
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
    def head(self, name: str, deadline: float) -> Head:
        """The table's :class:`Head`: its version (0 while nothing was written) and
        epoch. One small request, whatever the size of the table, ended by
        ``deadline``."""

    @abc.abstractmethod
    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        """Store ``arrays`` as the table's new value; return its head.

        Readers must see either the previous value or this one, never a mix; a failed
        write must leave the previous value readable. Bounded by ``deadline`` (a write
        the deadline cut off may have been published or not; never half). With
        :class:`SupportsLeafVersions`: every leaf's leaf version becomes the new version.
        """

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> None:
        """:meth:`write`, for a caller that drops the new head (TF-Agents' push returns
        none): the same value, version, atomicity and errors. Default: calls
        :meth:`write`. Override it only where learning the head costs a request of its
        own after the write (Reverb: a second table info), and skip that request."""
        self.write(name, arrays, specs, deadline)

    @abc.abstractmethod
    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        """``Read(head, arrays)``: the arrays of the latest value if its version is
        greater than ``newer_than``, else ``None``.

        Must not wait for data: when nothing is newer, answer at once at the cost of one
        small request, reading no data. ``deadline`` bounds the transfer. ``specs`` are
        the table's, as :meth:`write` gets them: what to expect, or to read into. The
        arrays and the head must be of one version.
        """

    def close(self) -> None:
        """Release connections. The container calls it once."""

    def describe_options(self) -> Mapping[str, Any]:
        """The options in force, without secrets, for ``table_info``."""
        return {"timeout": self.timeout, "namespace": self.namespace}


class SupportsBlockingWait(abc.ABC):
    """The ability to sleep until the engine says the table changed.

    :meth:`block` arms the engine's notification first, then returns at once if the
    version already differs from ``newer_than``, else sleeps until notified or
    ``deadline``. Returning early is always allowed (the core looks at the head again);
    never sleep past ``deadline``. The core's wait loop then blocks once for all the time
    left (up to :data:`BLOCK_SLICE`) instead of polling."""

    @abc.abstractmethod
    def block(self, name: str, newer_than: int, deadline: float) -> None:
        """See the class."""


class SupportsLeafVersions(abc.ABC):
    """The engine records, with every stored version, the version at which each leaf
    last changed: pushes send only the leaves that changed and pulls fetch only the
    leaves changed since what the caller holds (``docs/delta.md``).

    With this ability the core also calls :meth:`Backend.write` (whose every leaf's leaf
    version becomes the new version) and :meth:`Backend.read` as usual."""

    @abc.abstractmethod
    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        """Store a new version in which the leaf at each flat index of ``leaves`` takes
        that array, and every other leaf keeps the value and leaf version it has in the
        current version; return the new head (the given leaves' leaf version is its
        version).

        ``base`` ``None``: on top of whatever version is current when the write lands,
        atomically (another writer's push lands wholly before or wholly after it). A
        :class:`Head`: only if the table's head is exactly ``base``, epoch included;
        otherwise write nothing and return ``None`` (the core then writes the whole
        nest). Into an empty table (version 0) only a write of every leaf is possible:
        given fewer, write nothing and return ``None``. ``leaves`` may hold every index.
        Readers see the previous version or this one, never a mix; a failed write leaves
        the previous version readable; a leaf unchanged for any number of versions stays
        readable whatever the backend's retention.
        """

    @abc.abstractmethod
    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        """``LeafRead(head, leaf_versions, arrays)`` of the latest version if its version
        is greater than ``newer_than``, else ``LeafRead(head, None, None)`` at the cost of
        one small request, as :meth:`Backend.read`.

        ``leaf_versions[i]`` is the version at which leaf ``i`` last changed (at most the
        head's version); ``arrays[i]`` is its array if ``leaf_versions[i] > newer_than``,
        else ``None``. ``newer_than`` 0: every leaf. The core checks the head's epoch
        against the history of the version it holds and drops an answer of another
        history: answer what the store holds, and never compare epochs here.
        """

    @abc.abstractmethod
    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        """The table's head and each leaf's leaf version, in one small request; no data
        is moved. An empty table answers version 0 (its list, ``[]`` or zeros, is not
        looked at)."""


class SupportsElementDeltas(SupportsLeafVersions):
    """The engine stores a changed leaf as the elements that changed (an element patch
    the core made) and hands readers that hold a version close enough only the patches
    since (``docs/delta.md``, "Element deltas").

    Per leaf, the store keeps what it needs to give the leaf's current value whole to
    any reader (its own :meth:`Backend.read` and
    :meth:`~SupportsLeafVersions.read_leaves` still answer whole arrays; rebuild them
    with :func:`varsync.backend.rebuilt_leaf` where the store keeps an anchor and its
    links), and as many of the latest links as it likes. The writer bounds each leaf's
    chain since its last whole value (:data:`varsync._patches.MAX_CHAIN` links, at most
    half the leaf's bytes): a store that keeps anchor and links holds at most 1.5 times
    the leaf.

    :attr:`element_deltas_default` says whether pushes use the ability unless a table's
    setting or a push says otherwise: ``False`` for a store in the writer's own process
    (``memory://``), where a whole leaf costs one copy, less than finding its changed
    elements."""

    #: Pushes send patches unless told otherwise (``configure_table``, ``push``).
    element_deltas_default: ClassVar[bool] = True

    @abc.abstractmethod
    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Head | None:
        """:meth:`~SupportsLeafVersions.write_leaves` onto exactly ``base`` (epoch
        included; else write nothing and return ``None``), where each index of
        ``patches`` gives its leaf as a patch against the leaf's value in ``base``: its
        link is ``PatchLink(its leaf version in base, the new version, data)``. Leaves
        in ``leaves`` are given whole. Atomic like every write."""

    @abc.abstractmethod
    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        """:meth:`~SupportsLeafVersions.read_leaves`, where each leaf changed since
        ``newer_than`` may be given as a :class:`LeafChain` instead of its array: links
        alone when they reach back to a leaf version at most ``newer_than``, else an
        anchor and its links (or the whole array; either is always right). The core
        checks that the links join up and verifies each patched leaf's hash."""


class SupportsLeafSubsets(SupportsLeafVersions):
    """The engine reads only the leaves a caller chooses of a version, and skips the
    bytes of the others: a reader of some blocks of a sharded table's part (another
    sharding, some layers only) fetches those alone (``docs/sharded.md``).

    A subset of :meth:`~SupportsLeafVersions.read_leaves`, not a new kind of read: the
    answer is a :class:`LeafRead`, of one version, as every read's. Without the ability
    the core reads the leaves changed since with ``read_leaves`` and drops the rest."""

    @abc.abstractmethod
    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        """:meth:`~SupportsLeafVersions.read_leaves`, where ``arrays[i]`` is given only
        for the flat indices ``i`` in ``indices`` whose leaf version is greater than
        ``newer_than``, and is ``None`` for every other leaf.

        The head and every leaf's leaf version are answered as ``read_leaves`` answers
        them (nothing newer: ``LeafRead(head, None, None)``, one small request), and the
        arrays given are all of the version the head names, never a mix. A leaf held as
        a chain of element patches comes whole, rebuilt. ``indices`` is a set: order and
        repeats do not matter, and an empty one answers the head and leaf versions
        alone. Check them with :func:`leaf_subset` before any request: an index outside
        the table's leaves is a :class:`~varsync.ConfigurationError`, even when nothing
        is newer."""


class SupportsReaderRegistry(abc.ABC):
    """The engine keeps, per table, records of the readers that report what they hold,
    each expiring unless reported again: the core's ``report_as``, ``readers`` and
    ``wait_for_readers``. The core filters records by the table's epoch (its
    :meth:`Backend.head`)."""

    @abc.abstractmethod
    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        """Store ``record`` (JSON text made by the core, opaque here) as reader
        ``reader``'s entry for table ``name``, replacing its previous one; it expires
        ``ttl`` seconds from now unless reported again. One small request; it never
        touches the table's data or version."""

    @abc.abstractmethod
    def readers(self, name: str, deadline: float) -> dict[str, str]:
        """The table's unexpired reader entries: reader id -> record text. One small
        request (a few, for many readers); expired entries are never returned."""


#: Each ability and the flag derived from it.
ABILITIES: dict[type, str] = {
    SupportsBlockingWait: "supports_blocking_wait",
    SupportsLeafVersions: "supports_leaf_versions",
    SupportsReaderRegistry: "supports_reader_registry",
    SupportsElementDeltas: "supports_element_deltas",
    SupportsLeafSubsets: "supports_leaf_subsets",
}


def is_legacy(cls: type) -> bool:
    """Whether ``cls`` is a backend of the 0.2 protocol: it has ``version`` and no
    ``head`` of its own (or only :class:`Backend`'s abstract one). The registry adapts
    such a class once (``varsync._backends.legacy``)."""
    head = inspect.getattr_static(cls, "head", None)
    return callable(getattr(cls, "version", None)) and (
        head is None or getattr(head, "__isabstractmethod__", False)
    )


def abilities_of(cls: type) -> tuple[type, ...]:
    """The abilities ``cls`` declares, in :data:`ABILITIES`' order."""
    return tuple(ability for ability in ABILITIES if issubclass(cls, ability))


def missing_methods(cls: type) -> dict[str, list[str]]:
    """Per ability (``"Backend"`` for the required methods), the abstract methods ``cls``
    declares but does not implement: what makes it unusable."""
    missing: dict[str, list[str]] = {}
    for method in sorted(getattr(cls, "__abstractmethods__", ())):
        owner = next(
            (
                c.__name__
                for c in (Backend, *ABILITIES)
                if issubclass(cls, c) and method in c.__dict__
            ),
            "Backend",
        )
        missing.setdefault(owner, []).append(method)
    return missing


def leaf_subset(name: str, indices: Sequence[int], count: int) -> list[int]:
    """The flat indices of a :meth:`SupportsLeafSubsets.read_leaf_subset` of table
    ``name`` (of ``count`` leaves), sorted, each once: a set, so that a caller merging the
    leaves several slices touch need not drop repeats. Raise
    :class:`~varsync.ConfigurationError` (a ``ValueError``) naming an index that is not
    an int in ``0..count-1``: no negative indices from the end, which a mistaken offset
    would pass silently."""
    chosen = set()
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ConfigurationError(
                f"read_leaf_subset of table {name!r}: leaf index {index!r} is not an int; "
                f"give flat indices in 0..{count - 1}"
            )
        if not 0 <= index < count:
            raise ConfigurationError(
                f"read_leaf_subset of table {name!r}: leaf index {index} is outside the "
                f"table's {count} leaves; give flat indices in 0..{count - 1}"
            )
        chosen.add(int(index))
    return sorted(chosen)


def reads_leaf_subsets(backend: object) -> bool:
    """Whether ``backend`` reads chosen leaves alone (:class:`SupportsLeafSubsets`):
    where it does not, a reader of some leaves uses ``read_leaves`` and drops the rest.
    A metered backend has the abilities of the one it wraps; a 0.2-protocol one has
    none of this."""
    return isinstance(backend, SupportsLeafSubsets)
