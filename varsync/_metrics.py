"""Prometheus metrics of a container's backend calls: ``connect(url, metrics=True)``.

Off by default, and then free: :func:`varsync.connect` imports this module only when
``metrics`` is given, and without it the container talks to its backend directly. With it,
the backend is wrapped in a :class:`MeteredBackend`, a backend of the same abilities and
flags that times and counts the calls that move data (``write``, ``write_leaves``,
``write_patches``, ``read``, ``read_leaves``, ``read_patches``, ``read_leaf_subset``) and
the core's waits, and forwards the rest of the protocol, so
the core behaves as it would unwrapped. ``prometheus_client`` (extra
``varsync[metrics]``) is imported here only.

Every metric is labelled ``backend`` (the URL scheme) and ``table``:

- ``varsync_pushes_total``, ``varsync_bytes_pushed_total``, ``varsync_push_seconds``;
- ``varsync_pulls_total`` (every read, whether or not it found a newer version),
  ``varsync_pulls_unchanged_total`` (the reads that found nothing newer),
  ``varsync_bytes_pulled_total``, ``varsync_pull_seconds``;
- ``varsync_wait_seconds`` (``wait_for`` and the waits of pulls on an empty table);
- ``varsync_pull_lag_versions``: per read that found a newer version while holding one,
  the version read minus the version held; 1 means the reader saw every version;
- ``varsync_version``: the last version this process wrote or read;
- ``varsync_errors_total`` (with ``operation``: push, pull or wait): calls that raised.

See docs/cli.md, "Metrics", for exposing them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import numpy as np

from varsync._backends.base import (
    Backend,
    Head,
    LeafChain,
    LeafRead,
    PatchRead,
    Read,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsLeafVersions,
    SupportsReaderRegistry,
    abilities_of,
)
from varsync._errors import ConfigurationError, MissingDependencyError
from varsync._options import parse_bool
from varsync._signature import Spec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["MeteredBackend", "Meters", "meters_for", "metered", "leaf_bytes"]

LABELS = ("backend", "table")
#: Seconds: from an in-process memory:// call (tens of µs) to a large transfer.
SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
LAG_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 1000)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MissingDependencyError(
            "connect(..., metrics=...) needs prometheus-client, which is not installed: "
            'pip install "varsync[metrics]"'
        ) from None
    return prometheus_client


class Meters:
    """The metrics of one Prometheus registry, shared by every container metered into it
    (a registry refuses a second metric of the same name)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        prom = _prometheus()

        def counter(name: str, text: str, labels: Sequence[str] = LABELS) -> Any:
            return prom.Counter(name, text, labels, registry=registry)

        def histogram(name: str, text: str, buckets: Sequence[float]) -> Any:
            return prom.Histogram(name, text, LABELS, buckets=buckets, registry=registry)

        self.pushes = counter("varsync_pushes_total", "Versions written")
        self.pulls = counter("varsync_pulls_total", "Reads, newer version found or not")
        self.unchanged = counter(
            "varsync_pulls_unchanged_total", "Reads that found no version newer than held"
        )
        self.bytes_pushed = counter("varsync_bytes_pushed_total", "Bytes of arrays written")
        self.bytes_pulled = counter("varsync_bytes_pulled_total", "Bytes of arrays read")
        self.errors = counter(
            "varsync_errors_total", "Backend calls that raised", LABELS + ("operation",)
        )
        self.push_seconds = histogram("varsync_push_seconds", "Seconds per write", SECONDS_BUCKETS)
        self.pull_seconds = histogram("varsync_pull_seconds", "Seconds per read", SECONDS_BUCKETS)
        self.wait_seconds = histogram(
            "varsync_wait_seconds", "Seconds per wait for a newer version", SECONDS_BUCKETS
        )
        self.lag = histogram(
            "varsync_pull_lag_versions",
            "Per read that found a newer version: the version read minus the one held",
            LAG_BUCKETS,
        )
        self.version = prom.Gauge(
            "varsync_version",
            "The last version this process wrote or read",
            LABELS,
            registry=registry,
        )


class _TableMeters:
    """One table's labelled children, looked up once (``labels()`` costs a lock and a
    dict lookup per call)."""

    def __init__(self, meters: Meters, scheme: str, table: str) -> None:
        labels = (scheme, table)
        self.pushes = meters.pushes.labels(*labels)
        self.pulls = meters.pulls.labels(*labels)
        self.unchanged = meters.unchanged.labels(*labels)
        self.bytes_pushed = meters.bytes_pushed.labels(*labels)
        self.bytes_pulled = meters.bytes_pulled.labels(*labels)
        self.push_seconds = meters.push_seconds.labels(*labels)
        self.pull_seconds = meters.pull_seconds.labels(*labels)
        self.wait_seconds = meters.wait_seconds.labels(*labels)
        self.lag = meters.lag.labels(*labels)
        self.version = meters.version.labels(*labels)
        self._errors = meters.errors
        self._labels = labels

    def error(self, operation: str) -> None:
        self._errors.labels(*self._labels, operation).inc()

    def pushed(self, seconds: float, nbytes: int, version: int | None) -> None:
        """``version`` ``None``: a push whose caller dropped its version (the gauge keeps
        the last one known)."""
        self.pushes.inc()
        self.bytes_pushed.inc(nbytes)
        self.push_seconds.observe(seconds)
        if version is not None:
            self.version.set(version)

    def pulled(self, seconds: float, held: int, version: int, nbytes: int | None) -> None:
        self.pulls.inc()
        self.pull_seconds.observe(seconds)
        if nbytes is None:
            self.unchanged.inc()
            return
        self.bytes_pulled.inc(nbytes)
        self.version.set(version)
        if held > 0 and version > held:
            self.lag.observe(version - held)


_REGISTRIES: WeakKeyDictionary[Any, Meters] = WeakKeyDictionary()


def meters_for(registry: CollectorRegistry | None = None) -> Meters:
    """The :class:`Meters` of ``registry`` (default: prometheus_client's ``REGISTRY``),
    made on first use."""
    if registry is None:
        registry = _prometheus().REGISTRY
    meters = _REGISTRIES.get(registry)
    if meters is None:
        meters = _REGISTRIES[registry] = Meters(registry)
    return meters


class MeteredBackend(Backend):
    """A backend that times and counts the calls of the backend it wraps that move data
    (``write``, ``write_unversioned``, ``write_leaves``, ``read``, ``read_leaves``) and
    the core's waits on it, and forwards every other call of the protocol unchanged.

    Made by :func:`metered` as a subclass named after the wrapped backend's class, with
    the same abilities and flags, so the core and messages see what they would see
    unwrapped; engine-specific attributes are the wrapped backend's (:attr:`wrapped`).
    """

    def __init__(self, backend: Backend, meters: Meters, scheme: str) -> None:
        self._backend = backend
        self._meters = meters
        self._scheme = scheme
        self._tables: dict[str, _TableMeters] = {}
        self.url = backend.url
        self.timeout = backend.timeout
        self.namespace = backend.namespace

    @property
    def wrapped(self) -> Backend:
        """The backend this one forwards to."""
        return self._backend

    def __repr__(self) -> str:
        return f"<metered {self._backend!r}>"

    def _table(self, name: str) -> _TableMeters:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = _TableMeters(self._meters, self._scheme, name)
        return table

    # -- forwarded --------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        return self._backend.create_table(name, signature, specs)

    def signature(self, name: str) -> str | None:
        return self._backend.signature(name)

    def tables(self) -> list[str]:
        return self._backend.tables()

    def details(self, name: str) -> dict[str, Any]:
        return self._backend.details(name)

    def describe_options(self) -> Mapping[str, Any]:
        return self._backend.describe_options()

    def close(self) -> None:
        self._backend.close()

    def head(self, name: str, deadline: float) -> Head:
        return self._backend.head(name, deadline)

    # -- metered ----------------------------------------------------------------------

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        table = self._table(name)
        start = time.perf_counter()
        try:
            head = self._backend.write(name, arrays, specs, deadline)
        except BaseException:
            table.error("push")
            raise
        table.pushed(time.perf_counter() - start, sum(a.nbytes for a in arrays), head.version)
        return head

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> None:
        table = self._table(name)
        start = time.perf_counter()
        try:
            self._backend.write_unversioned(name, arrays, specs, deadline)
        except BaseException:
            table.error("push")
            raise
        table.pushed(time.perf_counter() - start, sum(a.nbytes for a in arrays), None)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        table = self._table(name)
        start = time.perf_counter()
        try:
            answer = self._backend.read(name, newer_than, deadline, specs)
        except BaseException:
            table.error("pull")
            raise
        arrays = answer.arrays
        nbytes = None if arrays is None else sum(a.nbytes for a in arrays)
        table.pulled(time.perf_counter() - start, newer_than, answer.head.version, nbytes)
        return answer

    def waited(self, name: str, seconds: float, failed: bool) -> None:
        """The core's wait loop ended a wait on table ``name`` (``varsync._waiting``)."""
        table = self._table(name)
        if failed:
            table.error("wait")
        table.wait_seconds.observe(seconds)


class _MeteredLeaves(MeteredBackend, SupportsLeafVersions):
    _backend: Any

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        table = self._table(name)
        start = time.perf_counter()
        try:
            head: Head | None = self._backend.write_leaves(name, leaves, specs, base, deadline)
        except BaseException:
            table.error("push")
            raise
        if head is not None:  # None: refused, nothing written (the core writes it whole)
            seconds = time.perf_counter() - start
            table.pushed(seconds, sum(a.nbytes for a in leaves.values()), head.version)
        return head

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        table = self._table(name)
        start = time.perf_counter()
        try:
            answer: LeafRead = self._backend.read_leaves(name, newer_than, deadline, specs)
        except BaseException:
            table.error("pull")
            raise
        arrays = answer.arrays
        nbytes = None if arrays is None else sum(a.nbytes for a in arrays if a is not None)
        table.pulled(time.perf_counter() - start, newer_than, answer.head.version, nbytes)
        return answer

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        answer: tuple[Head, list[int]] = self._backend.leaf_versions(name, deadline)
        return answer


class _MeteredElements(_MeteredLeaves, SupportsElementDeltas):
    _backend: Any

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
        start = time.perf_counter()
        try:
            head: Head | None = self._backend.write_patches(
                name, leaves, patches, specs, base, deadline
            )
        except BaseException:
            table.error("push")
            raise
        if head is not None:  # None: refused, nothing written (the core writes it whole)
            nbytes = sum(a.nbytes for a in leaves.values()) + sum(map(len, patches.values()))
            table.pushed(time.perf_counter() - start, nbytes, head.version)
        return head

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        table = self._table(name)
        start = time.perf_counter()
        try:
            answer: PatchRead = self._backend.read_patches(name, newer_than, deadline, specs)
        except BaseException:
            table.error("pull")
            raise
        nbytes = None if answer.leaves is None else sum(map(leaf_bytes, answer.leaves))
        table.pulled(time.perf_counter() - start, newer_than, answer.head.version, nbytes)
        return answer


class _MeteredSubsets(_MeteredLeaves, SupportsLeafSubsets):
    _backend: Any

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        table = self._table(name)
        start = time.perf_counter()
        try:
            answer: LeafRead = self._backend.read_leaf_subset(
                name, indices, newer_than, deadline, specs
            )
        except BaseException:
            table.error("pull")
            raise
        arrays = answer.arrays
        nbytes = None if arrays is None else sum(a.nbytes for a in arrays if a is not None)
        table.pulled(time.perf_counter() - start, newer_than, answer.head.version, nbytes)
        return answer


def leaf_bytes(leaf: np.ndarray | LeafChain | None) -> int:
    """The bytes a read moved for one leaf: an array's, a chain's anchor and patches',
    none for a leaf the caller holds."""
    if leaf is None:
        return 0
    if isinstance(leaf, LeafChain):
        anchor = 0 if leaf.anchor is None else leaf.anchor.nbytes
        return anchor + sum(len(link.data) for link in leaf.links)
    return leaf.nbytes


class _MeteredRegistry(MeteredBackend, SupportsReaderRegistry):
    _backend: Any

    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        self._backend.report_reader(name, reader, record, ttl, deadline)

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        listed: dict[str, str] = self._backend.readers(name, deadline)
        return listed


class _MeteredBlocking(MeteredBackend, SupportsBlockingWait):
    _backend: Any

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        self._backend.block(name, newer_than, deadline)


_METERED: dict[type, type[MeteredBackend]] = {
    SupportsLeafVersions: _MeteredLeaves,
    SupportsElementDeltas: _MeteredElements,
    SupportsLeafSubsets: _MeteredSubsets,
    SupportsReaderRegistry: _MeteredRegistry,
    SupportsBlockingWait: _MeteredBlocking,
}
_FLAGS = (
    "supports_create_table",
    "shared_across_processes",
    "persistent",
    "max_push_bytes",
    "supports_concurrent_writers",
    "supported_ml_dtypes",
)
_CLASSES: dict[type, type[MeteredBackend]] = {}


def _metered_class(cls: type[Backend]) -> type[MeteredBackend]:
    made = _CLASSES.get(cls)
    if made is None:
        abilities = abilities_of(cls)
        # an ability that extends another (element deltas: leaf versions) replaces it
        kept = [a for a in abilities if not any(b is not a and issubclass(b, a) for b in abilities)]
        bases = tuple(_METERED[ability] for ability in kept) or (MeteredBackend,)
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": f"MeteredBackend[{cls.__qualname__}]",
            "__doc__": f"{cls.__name__}, metered (see varsync._metrics.MeteredBackend).",
        }
        namespace.update({flag: getattr(cls, flag) for flag in _FLAGS})
        made = _CLASSES[cls] = type(cls.__name__, bases, namespace)
    return made


def metered(backend: Backend, metrics: Any, scheme: str) -> Backend:
    """``backend`` wrapped to record its calls in Prometheus metrics, as ``connect``'s
    ``metrics`` option asks: ``True`` (or ``"1"``, ``"true"``... from a URL's query
    string) for prometheus_client's default registry, a ``CollectorRegistry`` for that
    one; false: ``backend`` itself."""
    if isinstance(metrics, (bool, str)):
        if not parse_bool(metrics, "metrics"):
            return backend
        registry = None
    elif metrics is None:
        return backend
    else:
        registry = metrics
        if not isinstance(registry, _prometheus().CollectorRegistry):
            raise ConfigurationError(
                f"metrics must be True, False or a prometheus_client.CollectorRegistry, "
                f"got {metrics!r}"
            )
    return _metered_class(type(backend))(backend, meters_for(registry), scheme)
