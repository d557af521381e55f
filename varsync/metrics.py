"""Prometheus metrics of a container's backend calls: ``connect(url, metrics=True)``.

Off by default, and then free: :func:`varsync.connect` imports this module only when
``metrics`` is given, and without it the container talks to its backend directly. With it,
the backend is wrapped in a :class:`MeteredBackend`, a thin proxy that times and counts the
calls that move data (``write``, ``write_leaves``, ``read``, ``read_leaves``, ``wait``) and
forwards everything else, capability flags included, so the core behaves as it would
unwrapped. ``prometheus_client`` (extra ``varsync[metrics]``) is imported here only.

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

import inspect
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast
from weakref import WeakKeyDictionary

import numpy as np

from varsync.backends.base import (
    Backend,
    LeafSnapshot,
    Snapshot,
    read_snapshot,
    write_unversioned,
)
from varsync.errors import ConfigurationError, MissingDependencyError
from varsync.options import parse_bool
from varsync.signature import Spec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["MeteredBackend", "Meters", "meters_for", "metered"]

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
#: Class attributes of these types are flags: constant, so a proxy may keep them.
_CONSTANTS = (bool, int, float, str, tuple, frozenset, type(None))


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


class MeteredBackend:
    """A backend's proxy that times and counts the calls moving data, and forwards every
    other attribute (flags, ``details``, ``close``, abilities added later) unchanged.

    Made by :func:`metered` as a subclass named after the wrapped backend's class, so
    messages that name the backend's class read as they would unwrapped. It is
    registered as a virtual subclass of :class:`~varsync.backend.Backend`, whose class
    attributes it must not inherit: they would hide the wrapped backend's flags.
    """

    # __dict__ holds what __getattr__ found on the backend's class and will find again
    # (its methods, bound; its flags): the next lookup is a dict hit, not a __getattr__.
    __slots__ = ("__dict__", "_backend", "_meters", "_scheme", "_tables")
    _backend: Backend
    _meters: Meters
    _scheme: str
    _tables: dict[str, _TableMeters]

    def __init__(self, backend: Backend, meters: Meters, scheme: str) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_meters", meters)
        object.__setattr__(self, "_scheme", scheme)
        object.__setattr__(self, "_tables", {})

    @property
    def wrapped(self) -> Backend:
        """The backend this proxy forwards to."""
        return self._backend

    def __getattr__(self, name: str) -> Any:
        if name in MeteredBackend.__slots__:  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        backend = self._backend
        value = getattr(backend, name)
        if name not in getattr(backend, "__dict__", ()):  # the class's, not the instance's
            static = inspect.getattr_static(type(backend), name, None)
            if inspect.isfunction(static) or isinstance(static, _CONSTANTS):
                self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.pop(name, None)
        setattr(self._backend, name, value)

    def __repr__(self) -> str:
        return f"<metered {self._backend!r}>"

    def _table(self, name: str) -> _TableMeters:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = _TableMeters(self._meters, self._scheme, name)
        return table

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        table = self._table(name)
        start = time.perf_counter()
        try:
            version = self._backend.write(name, arrays, specs)
        except BaseException:
            table.error("push")
            raise
        table.pushed(time.perf_counter() - start, sum(a.nbytes for a in arrays), version)
        return version

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]
    ) -> None:
        table = self._table(name)
        start = time.perf_counter()
        try:
            write_unversioned(self._backend, name, arrays, specs)
        except BaseException:
            table.error("push")
            raise
        table.pushed(time.perf_counter() - start, sum(a.nbytes for a in arrays), None)

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: int | None = None,
    ) -> int:
        table = self._table(name)
        start = time.perf_counter()
        try:
            version = self._backend.write_leaves(name, leaves, specs, base)
        except BaseException:
            table.error("push")
            raise
        if version:  # 0: refused, nothing written (the core writes the whole nest next)
            seconds = time.perf_counter() - start
            table.pushed(seconds, sum(a.nbytes for a in leaves.values()), version)
        return version

    def read(
        self,
        name: str,
        newer_than: int,
        timeout: float | None,
        specs: Sequence[Spec] | None = None,
    ) -> Snapshot:
        table = self._table(name)
        start = time.perf_counter()
        try:
            if specs is None:  # a caller of the first protocol's read(name, newer_than, timeout)
                read: Any = self._backend.read
                version, arrays = read(name, newer_than, timeout)
            else:
                version, arrays = read_snapshot(self._backend, name, newer_than, timeout, specs)
        except BaseException:
            table.error("pull")
            raise
        nbytes = None if arrays is None else sum(a.nbytes for a in arrays)
        table.pulled(time.perf_counter() - start, newer_than, version, nbytes)
        return version, arrays

    def read_leaves(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> LeafSnapshot:
        table = self._table(name)
        start = time.perf_counter()
        try:
            version, numbers, arrays = self._backend.read_leaves(name, newer_than, timeout, specs)
        except BaseException:
            table.error("pull")
            raise
        nbytes = None if arrays is None else sum(a.nbytes for a in arrays if a is not None)
        table.pulled(time.perf_counter() - start, newer_than, version, nbytes)
        return version, numbers, arrays

    def wait(self, name: str, newer_than: int, timeout: float | None) -> int:
        table = self._table(name)
        start = time.perf_counter()
        try:
            return self._backend.wait(name, newer_than, timeout)
        except BaseException:
            table.error("wait")
            raise
        finally:  # a wait that timed out waited too
            table.wait_seconds.observe(time.perf_counter() - start)


Backend.register(MeteredBackend)

_CLASSES: dict[type, type[MeteredBackend]] = {}


def _metered_class(cls: type) -> type[MeteredBackend]:
    made = _CLASSES.get(cls)
    if made is None:
        made = type(
            cls.__name__,
            (MeteredBackend,),
            {
                "__slots__": (),
                "__module__": __name__,
                "__qualname__": f"MeteredBackend[{cls.__qualname__}]",
                "__doc__": f"{cls.__name__}, metered (see varsync.metrics.MeteredBackend).",
            },
        )
        _CLASSES[cls] = made
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
    proxy = _metered_class(type(backend))(backend, meters_for(registry), scheme)
    return cast(Backend, proxy)  # a virtual Backend: see MeteredBackend
