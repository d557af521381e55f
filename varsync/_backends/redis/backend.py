"""The redis backend's class: a facade that builds the package's objects and hands each
protocol call to the one that does it, inside the one translation of redis-py's errors
(:mod:`.errors`); see the package's docstring."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, final

import numpy as np

from varsync._backends.redis.errors import OutOfTime, translated
from varsync._backends.redis.fetch import Fetcher
from varsync._backends.redis.options import parse_settings
from varsync._backends.redis.pool import MOVED_ROLE
from varsync._backends.redis.protocol import Keys, key_base_of, text
from varsync._backends.redis.publisher import Publisher
from varsync._backends.redis.pulled import PulledMemory
from varsync._backends.redis.reader import Reader
from varsync._backends.redis.readers import ReaderRegistry
from varsync._backends.redis.router import Floors, Router
from varsync._backends.redis.tables import Catalog, Writes
from varsync._backends.redis.topology import Requests, Topology
from varsync.backend import (
    Backend,
    BackendConnectionError,
    Head,
    LeafRead,
    PatchRead,
    Read,
    Spec,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
    deadline_after,
    leaf_subset,
)

__all__ = ["RedisBackend"]

#: The least time a new backend's first request may take, retries included (see __init__).
FIRST_ANSWER_SECONDS = 5.0


@final
class RedisBackend(
    Backend,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
):
    """Tables in a Redis server (``redis://[user:password@]host:port/db``; ``rediss://``
    for TLS). Options: ``db``, ``username``, ``password``, ``prefix`` (key prefix, default
    ``varsync``), ``chunk_size`` (bytes, default 4 MiB), ``keep`` (previous versions kept
    for readers in flight, default 1), ``connect_timeout`` and ``socket_timeout``
    (default: ``timeout``), ``retries`` (reconnect attempts, default 0), ``recycle_from``
    (bytes from which a push overwrites a retired version's chunks, default 256 MiB), redis-py's
    ``ssl_*`` options for ``rediss://``; ``replicas`` and ``read_from`` (reads from a
    replica, :mod:`.topology`), ``redis+sentinel://host:port[,...]/service[/db]``, and
    ``redis+cluster://host:port[,...]`` (a Redis Cluster, :mod:`.cluster`).

    Built of: :class:`~.topology.Topology` (the servers), :class:`~.router.Router` (where
    a read goes, and whether a replica's answer is trusted), :class:`~.reader.Reader`,
    :class:`~.publisher.Publisher` and :class:`~.readers.ReaderRegistry`, sharing a
    :class:`~.tables.Catalog` of the tables' keys and stored signatures."""

    supports_create_table = True
    shared_across_processes = True
    persistent = False  # only as persistent as the server's own configuration makes it
    max_push_bytes = None
    #: Chunks carry raw bytes, read back into arrays of the table's specs: any dtype.
    supported_ml_dtypes = (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
    )

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any):
        settings = parse_settings(url, timeout, namespace, options)
        super().__init__(url, timeout=timeout, namespace=namespace)
        self._settings = settings
        self.address = settings.address
        self.prefix = settings.prefix
        self.key_base = key_base_of(settings.prefix, namespace)
        self.chunk_size = settings.chunk_size
        self.keep = settings.keep
        writes = Writes()
        with translated("connecting", self.address):
            self.topology = Topology(settings, moved=writes.moved)
        try:
            cluster = self.topology.cluster
            self.catalog = Catalog(self.key_base, None if cluster is None else namespace)
            floors = Floors()
            self.router = Router(self.topology, floors, timeout)
            self.reader = Reader(
                self.router,
                self.catalog,
                Fetcher(PulledMemory(settings.reuse_pulled)),
                self.address,
                settings.socket_timeout,
            )
            self.publisher = Publisher(
                self.topology, self.catalog, writes, floors, settings, timeout
            )
            self.registry = ReaderRegistry(self.primary, cluster, self.catalog, self.address)
            with self._errors("connecting"):
                # Bounded, however many retries: by the timeout, but never below
                # FIRST_ANSWER_SECONDS, so that a short timeout (for waits) still connects.
                # 0 waits for no push and bounds nothing else.
                limit = None if not self.timeout else max(self.timeout, FIRST_ANSWER_SECONDS)
                try:
                    self.primary.call("PING", deadline=deadline_after(limit))
                except OutOfTime:
                    raise BackendConnectionError(
                        f"connecting at {self.address}: no answer within {limit:g} s; is "
                        "the server up, and not hung?"
                    ) from None
        except BaseException:
            self.topology.close()
            raise

    @property
    def primary(self) -> Requests:
        """Where writes go: the primary's client (in a cluster, every primary's)."""
        return self.topology.primary

    @property
    def pulls_restarted(self) -> int:
        """Pulls that found their version retired mid-read and started again."""
        return self.reader.pulls_restarted

    @property
    def reads_on_primary(self) -> int:
        """Reads a replica could not serve or vouch for, made on the primary."""
        return self.router.reads_on_primary

    def keys(self, name: str) -> Keys:
        """The keys of table ``name`` (see the package's docstring)."""
        return self.catalog.keys(name)

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        with translated(doing, self.address):
            try:
                yield
            except MOVED_ROLE:  # also a reply read off a pipeline: the primary may have moved
                self.topology.suspect_primary()
                raise

    # -- tables ----------------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._errors(f"creating table {name!r}"):
            return self.publisher.create(name, signature).signature

    def signature(self, name: str) -> str | None:
        with self._errors(f"reading table {name!r}"):
            stored = self.reader.stored(name)
        return None if stored is None else stored.signature

    def tables(self) -> list[str]:
        with self._errors("listing tables"):
            names = self.primary.call("SMEMBERS", self.catalog.tables_key)
        return sorted(text(n) for n in names)

    def details(self, name: str) -> dict[str, Any]:
        with self._errors(f"reading table {name!r}"):
            details = self.reader.details(name)
        return {**details, "keep": self.keep, "pulls_restarted": self.pulls_restarted}

    # -- data ------------------------------------------------------------------------------

    def head(self, name: str, deadline: float) -> Head:
        with self._errors(f"reading the version of table {name!r}"):
            return self.reader.head(name, deadline)

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        with self._errors(f"pushing {sum(a.nbytes for a in arrays)} bytes to table {name!r}"):
            return self.publisher.write(name, arrays, specs, deadline)

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        total = sum(a.nbytes for a in leaves.values())
        with self._errors(f"pushing {total} bytes to table {name!r}"):
            return self.publisher.write_leaves(name, leaves, specs, base, deadline)

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Head | None:
        total = sum(a.nbytes for a in leaves.values()) + sum(map(len, patches.values()))
        with self._errors(f"pushing {total} bytes to table {name!r}"):
            return self.publisher.write_patches(name, leaves, patches, specs, base, deadline)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        with self._errors(f"pulling table {name!r}"):
            head, _, arrays = self.reader.read_leaves(name, newer_than, deadline, specs, every=True)
        return Read(head, None if arrays is None else [a for a in arrays if a is not None])

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        with self._errors(f"pulling table {name!r}"):
            return self.reader.read_leaves(name, newer_than, deadline, specs)

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        chosen = leaf_subset(name, indices, len(specs))
        with self._errors(f"pulling {len(chosen)} leaves of table {name!r}"):
            return self.reader.read_leaf_subset(name, chosen, newer_than, deadline, specs)

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        with self._errors(f"pulling table {name!r}"):
            return self.reader.read_patches(name, newer_than, deadline, specs)

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        with self._errors(f"reading the leaf versions of table {name!r}"):
            return self.reader.leaf_versions(name, deadline)

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        with self._errors(f"waiting on table {name!r}"):
            self.reader.block(name, newer_than, deadline)

    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        with self._errors(f"reporting a reader of table {name!r}"):
            self.registry.report(name, reader, record, ttl, deadline)

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        with self._errors(f"listing the readers of table {name!r}"):
            return self.registry.readers(name, deadline)

    # -- the rest --------------------------------------------------------------------------

    def close(self) -> None:
        self.topology.close()
        self.reader.fetch.pulled.clear()

    def describe_options(self) -> Mapping[str, Any]:
        return {"timeout": self.timeout, "namespace": self.namespace, **self._settings.described()}

    def __repr__(self) -> str:
        return f"<RedisBackend {self.address} prefix={self.key_base!r}>"
