"""``shm://<store>``: tables shared by the processes of one host, in files under /dev/shm.

:class:`ShmBackend` translates the Backend protocol (v1) to the files of a store and
nothing more; each part is composed, not mixed in, and takes what it uses:

- :class:`~varsync_shm.store.SegmentStore`: the store's checked directory and its tables'
  directories (:class:`~varsync_shm.store.TableDir`), whose ``signature.json``'s identity
  is the table's epoch (:class:`~varsync_shm.store.Epoch`);
- :class:`~varsync_shm.signatures.Signatures`: the signature this backend handed out per
  table (a table made again with *another* one is the one reset the backend raises);
- :mod:`varsync_shm.reading`, :mod:`varsync_shm.writing`, :mod:`varsync_shm.leaves`
  (with :mod:`varsync_shm.chains` for element deltas) and :mod:`varsync_shm.registry`:
  functions of a :class:`~varsync_shm.store.TableDir` (and of the
  :class:`~varsync_shm.mappings.Mappings` they map segments with);
- :mod:`varsync_shm._inotify`: the sleep of :meth:`ShmBackend.block`.

Guarantees, and how:

- **Readers never see a mix of two versions.** A version is published by renaming a new
  ``current`` link over the old one, after its segment is complete; rename is atomic.
  A reader reads the link, opens that segment, takes a *shared* flock (non-blocking) and
  checks that the segment's header names the version the link named. Writers refill a
  segment only under an *exclusive* flock and zero its version first, so a reader that
  holds the shared lock and sees the right version has exactly that version's bytes.
- **Every answer is of one history.** An answer's epoch is read before and after what it
  answers (one ``stat`` each); if they differ the table was made again meanwhile and the
  read starts over. The core compares epochs: the backend remembers nothing of what a
  caller saw.
- **Writers never wait for readers**; a crashed reader or writer leaves nothing locked;
  a crashed writer leaves the last complete version readable; old versions are
  reclaimed (see :mod:`varsync_shm.writing`).
- **A read of chosen leaves reads those alone** (:class:`SupportsLeafSubsets`): the
  segment a delta pull reads, under the same lock and checks, and only their bytes.
- **A patched push writes its patches, not the leaf** (:class:`SupportsElementDeltas`):
  the segment keeps the leaf's anchor and a patch file holds the new link, so in the
  steady state (a spare to refill) a push copies no byte of a patched leaf. Readers'
  delta reads get the links since what they hold (:mod:`varsync_shm.chains`). A plain
  pull (``read``, ``read_leaves``) of a patched leaf rebuilds it whole: it costs a copy
  of the leaf, until the next whole write of it.
- **Only this user's directories are used** (:mod:`varsync_shm._dirs`).
- **No interrupt leaks a descriptor or closes one twice**: every descriptor a call opens
  belongs to a :class:`~varsync_shm._fds.Descriptors` made before the ``try`` that
  closes it; those that outlive a call belong to ``mmap``/``FileIO`` objects.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, final

import numpy as np

from varsync.backend import (
    POLL_MAX,
    AuthenticationError,
    Backend,
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    ErrorMap,
    Head,
    LeafRead,
    PatchRead,
    PullTimeoutError,
    Read,
    Spec,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
    TableNotFoundError,
    leaf_subset,
    refuse_unknown,
    remaining,
    request_timeout,
    translate_errors,
)
from varsync_shm import layout, reading, registry, writing
from varsync_shm import leaves as leafsync
from varsync_shm._fds import Descriptors
from varsync_shm._inotify import Watch
from varsync_shm.mappings import Mappings
from varsync_shm.reading import MAP_ABOVE, READ_ATTEMPTS
from varsync_shm.signatures import Signatures, gone
from varsync_shm.store import Epoch, SegmentStore, TableDir

__all__ = ["ShmBackend", "MAP_ABOVE", "SPARES"]

SPARES = writing.SPARES

_ERRORS: ErrorMap = {PermissionError: AuthenticationError, OSError: BackendConnectionError}
_T = TypeVar("_T")
#: Opens segment ``pointer`` of a table, if it still holds ``version``: what a read reads.
_Opener = Callable[[TableDir, str, int, Descriptors], "_T | None"]


@final
class ShmBackend(
    Backend,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsReaderRegistry,
):
    """Tables in files under /dev/shm, shared by every process of the host that names
    the same store. Options: ``root`` (the directory holding stores; default /dev/shm)."""

    shared_across_processes = True
    persistent = False  # tables outlive processes, not a reboot (tmpfs)
    #: Element deltas only where a table turns them on: on one host a whole leaf is one
    #: copy into the segment, and finding its changed elements costs more than that
    #: (docs/shm.md, "Element deltas").
    element_deltas_default = False
    #: Segments hold raw bytes; their index names these by name (see :mod:`.segment`).
    supported_ml_dtypes = (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
    )

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None,
        namespace: str,
        root: str = layout.DEFAULT_ROOT,
        **options: Any,
    ) -> None:
        refuse_unknown(options, ("root",), "shm")
        super().__init__(url, timeout=timeout, namespace=namespace)
        self.store = layout.store_name_of(url)
        if not isinstance(root, str):
            raise ConfigurationError(f"shm root must be a directory name, got {root!r}")
        self.root = root
        self.files = SegmentStore(self.store, namespace, root)
        self.mappings = Mappings()
        self._signatures = Signatures(self.files, self.url)
        self._moved: dict[str, dict[str, int]] = {}  # per table, for details()

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        with self._errors(self.files.table_path(name)):
            stored, epoch = self.files.create(name, signature)
            # What the container will hold now, if it accepts the stored signature.
            self._signatures.remember(name, stored, epoch, replace=stored == signature)
            return stored

    def signature(self, name: str) -> str | None:
        fds = Descriptors()
        try:
            with self._errors(self.files.table_path(name)):
                table = self.files.open(name, fds)
                found = None if table is None else table.read_signature(fds)
                if found is None:
                    return None
                text, epoch = found
                if not self._signatures.knows(name):
                    self._signatures.remember(name, text, epoch)
                return text
        finally:
            fds.close()

    def tables(self) -> list[str]:
        with self._errors(self.files.path):
            return self.files.names()

    def details(self, name: str) -> dict[str, Any]:
        path = self.files.table_path(name)
        fds = Descriptors()
        try:
            with self._errors(path):
                table, _ = self._look(name)
                files: list[str] = []
                used = 0
                if table is not None and table.exists():
                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                    directory = fds.open(table.rel, flags, dir_fd=table.store)
                    files = os.listdir(directory)
                    for f in files:
                        with contextlib.suppress(FileNotFoundError):
                            used += os.stat(f, dir_fd=directory, follow_symlinks=False).st_blocks
                return {
                    "path": path,
                    "current": None if table is None else reading.current_segment(table),
                    "segments": sorted(f for f in files if f.startswith(layout.SEGMENTS)),
                    "patches": sorted(f for f in files if f.startswith(layout.PATCH)),
                    "bytes_in_shm": used * 512,
                    **self._moved.get(name, _counters()),
                }
        finally:
            fds.close()

    def describe_options(self) -> dict[str, Any]:
        return {**super().describe_options(), "root": self.root}

    # -- data ------------------------------------------------------------------------

    def head(self, name: str, deadline: float) -> Head:
        """One ``stat`` of ``signature.json`` (the epoch), one ``readlink`` of
        ``current`` (the version is in the segment's name), and the ``stat`` again."""
        with self._errors(self.files.table_path(name)):
            for _ in range(READ_ATTEMPTS):  # again only if the table was made again meanwhile
                table, epoch = self._look(name)
                if table is None or epoch is None:
                    return Head(0, None)  # no table: reads as empty (the core tells holders)
                version = reading.current_version(table)
                if table.epoch() == epoch:
                    return Head(version, epoch)
            raise self._unstable(name)

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        with self._errors(self.files.table_path(name)):
            table = self._writable(name)
            version, epoch = writing.write(
                table, arrays, specs, self.mappings, self._signatures.checked
            )
            return Head(version, epoch)

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        # The segment's own index describes its arrays, checked as they are parsed.
        def open_version(
            table: TableDir, pointer: str, version: int, fds: Descriptors
        ) -> list[np.ndarray] | None:
            return reading.open_version(table, pointer, version, fds, self.mappings)

        with self._errors(self.files.table_path(name)):
            return Read(*self._read(name, newer_than, deadline, open_version))

    # -- leaf versions (varsync_shm.leaves) ----------------------------------------------

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: Head | None,
        deadline: float,
    ) -> Head | None:
        with self._errors(self.files.table_path(name)):
            table = self._writable(name)
            written = leafsync.write_leaves(
                table, leaves, specs, base, self.mappings, self._signatures.checked
            )
            if written is None:
                return None
            self._count(name, "leaf_bytes_written", written.copied)
            return written.head

    def read_leaves(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> LeafRead:
        return self._read_leaves(name, newer_than, deadline, None)

    def read_leaf_subset(
        self,
        name: str,
        indices: Sequence[int],
        newer_than: int,
        deadline: float,
        specs: Sequence[Spec],
    ) -> LeafRead:
        """:meth:`read_leaves` of the chosen leaves alone: the same segment, lock and
        checks, and only their bytes read (mapped or copied as a delta pull's)."""
        chosen = frozenset(leaf_subset(name, indices, len(specs)))
        return self._read_leaves(name, newer_than, deadline, chosen)

    def _read_leaves(
        self, name: str, newer_than: int, deadline: float, chosen: frozenset[int] | None
    ) -> LeafRead:
        def open_leaves(
            table: TableDir, pointer: str, version: int, fds: Descriptors
        ) -> tuple[list[int], leafsync.Arrays, int] | None:
            return leafsync.open_leaves(
                table, pointer, version, newer_than, fds, self.mappings, chosen
            )

        with self._errors(self.files.table_path(name)):
            head, got = self._read(name, newer_than, deadline, open_leaves)
            if got is None:
                return LeafRead(head, None, None)
            numbers, arrays, moved = got
            self._count(name, "leaf_bytes_read", moved)
            return LeafRead(head, numbers, arrays)

    # -- element deltas (varsync_shm.leaves, varsync_shm.chains) --------------------------

    def write_patches(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        patches: Mapping[int, bytes],
        specs: Sequence[Spec],
        base: Head,
        deadline: float,
    ) -> Head | None:
        with self._errors(self.files.table_path(name)):
            table = self._writable(name)
            written = leafsync.write_leaves(
                table, leaves, specs, base, self.mappings, self._signatures.checked, patches
            )
            if written is None:
                return None
            self._count(name, "leaf_bytes_written", written.copied)
            self._count(name, "patch_bytes_written", written.patched)
            return written.head

    def read_patches(
        self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]
    ) -> PatchRead:
        def open_patches(
            table: TableDir, pointer: str, version: int, fds: Descriptors
        ) -> tuple[list[int], leafsync.Leaves, int] | None:
            return leafsync.open_patches(table, pointer, version, newer_than, fds, self.mappings)

        with self._errors(self.files.table_path(name)):
            head, got = self._read(name, newer_than, deadline, open_patches)
            if got is None:
                return PatchRead(head, None, None)
            numbers, leaves, moved = got
            self._count(name, "leaf_bytes_read", moved)
            return PatchRead(head, numbers, leaves)

    def leaf_versions(self, name: str, deadline: float) -> tuple[Head, list[int]]:
        with self._errors(self.files.table_path(name)):
            head, numbers = self._read(name, 0, deadline, leafsync.versions_of)
            return head, numbers or []  # empty: the core knows how many leaves

    # -- readers (varsync_shm.registry) ----------------------------------------------

    def report_reader(
        self, name: str, reader: str, record: str, ttl: float, deadline: float
    ) -> None:
        with self._errors(self.files.table_path(name)):
            registry.report(self._writable(name), reader, record, ttl)

    def readers(self, name: str, deadline: float) -> dict[str, str]:
        with self._errors(self.files.table_path(name)):
            table, _ = self._look(name)
            if table is None:
                raise TableNotFoundError(f"table {name!r} of {self.url} is gone")
            return registry.listing(table)

    # -- waiting ---------------------------------------------------------------------

    def block(self, name: str, newer_than: int, deadline: float) -> None:
        """Sleep on an inotify watch of the table's directory until a file is renamed into
        it (a push renames ``current``) or ``deadline``; at once if the version is no
        longer ``newer_than``. Without inotify, sleep at most ``POLL_MAX``.

        A deleted table (its store removed) reads as empty, as a Redis table whose keys
        vanished does: a holder of a version returns at once (the core reports the reset),
        a wait for a first push polls until the table is made again or time is up."""
        path = self.files.table_path(name)
        fds = Descriptors()
        try:
            watch = Watch.open(path, fds)  # armed before the look: no push goes unseen
            with self._errors(path):
                table, _ = self._look(name)
                if table is None or not table.exists():
                    if newer_than == 0:  # nothing to watch until it is made again
                        time.sleep(min(max(remaining(deadline), 0.0), POLL_MAX))
                    return
                if reading.current_version(table) != newer_than:
                    return
            left = max(remaining(deadline), 0.0)
            if watch is None:  # inotify missing or exhausted: the core's loop polls
                time.sleep(min(left, POLL_MAX))
            else:
                watch.wait(left)
        finally:
            fds.close()

    def close(self) -> None:
        self.mappings.clear()
        self.files.close()

    # -- internals -------------------------------------------------------------------

    def _look(self, name: str) -> tuple[TableDir | None, Epoch | None]:
        """The table's directory (``None``: no store) and epoch (``None``: no table),
        after checking that its signature is still the one this backend handed out."""
        found = self.files.find(name)
        if found is None:
            return None, None
        table, epoch = found
        if epoch is not None:
            self._signatures.check(table, epoch)
        return table, epoch

    def _writable(self, name: str) -> TableDir:
        """:meth:`_look`, for a push: a table whose directory is gone is an error."""
        table, _ = self._look(name)
        if table is None or not table.exists():
            raise gone(name, self.files.table_path(name), self.url)
        return table

    def _read(
        self, name: str, newer_than: int, deadline: float, open_segment: _Opener[_T]
    ) -> tuple[Head, _T | None]:
        """The head and, if its version is above ``newer_than``, what ``open_segment``
        reads of its segment; read again while the segment was being replaced or the
        table made again, until ``deadline`` (and the backend's ``timeout``)."""
        seconds = request_timeout(deadline, self.timeout)
        stop = math.inf if seconds is None else time.monotonic() + seconds
        for _ in range(READ_ATTEMPTS):
            table, epoch = self._look(name)
            if table is None or epoch is None:
                return Head(0, None), None  # no table: reads as empty (the core tells holders)
            pointer = reading.current_segment(table)
            version = layout.version_named(pointer, table.path)
            got = None
            if pointer is not None and version > newer_than:
                fds = Descriptors()
                try:
                    got = open_segment(table, pointer, version, fds)
                finally:
                    fds.close()
            if (got is not None or version <= newer_than) and table.epoch() == epoch:
                return Head(version, epoch), got  # all of one history
            if time.monotonic() >= stop:
                raise PullTimeoutError(
                    f"table {name!r} in {self.url}: no stable copy of version {version} "
                    "before the deadline (it was being replaced); pull again"
                )
        raise self._unstable(name)

    def _unstable(self, name: str) -> CorruptDataError:
        return CorruptDataError(
            f"table {name!r} at {self.files.table_path(name)}: {READ_ATTEMPTS} attempts "
            "found no stable segment; is a foreign process locking its files?"
        )

    def _count(self, name: str, counter: str, nbytes: int) -> None:
        self._moved.setdefault(name, _counters())[counter] += nbytes

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        with translate_errors(_ERRORS, f"shm store {where}"):
            yield


def _counters() -> dict[str, int]:
    """The byte counters ``details()`` shows, before any partial push or delta pull:
    leaf bytes copied into segments and patch bytes written by partial pushes, bytes
    read or mapped by delta pulls (links included)."""
    return {"leaf_bytes_written": 0, "patch_bytes_written": 0, "leaf_bytes_read": 0}
