"""``shm://<store>``: tables shared by the processes of one host, in files under /dev/shm.

Each table is a directory (see :mod:`varsync_shm.layout` for where)::

    signature.json   the core's signature text; written once, by rename, under the lock
    lock             the writers' lock (flock): held for bookkeeping, never while copying
    current          symlink -> seg-<version>: the published version, replaced by rename(2)
    seg-<version>    one complete version; never changed while a reader holds it
    spare-<token>    a retired segment no reader holds, kept for the next push to refill
    .fill-<token>    a segment a writer is filling (it holds flock LOCK_EX on it)

Guarantees, and how:

- **Readers never see a mix of two versions.** A version is published by renaming a new
  ``current`` link over the old one, after its segment is complete; rename is atomic.
  A reader reads the link, opens that segment, takes a *shared* flock (non-blocking) and
  checks that the segment's header names the version the link named. Writers refill a
  segment only under an *exclusive* flock and zero its version first, so a reader that
  holds the shared lock and sees the right version has exactly that version's bytes.
- **Writers never wait for readers**; a crashed reader or writer leaves nothing locked;
  a crashed writer leaves the last complete version readable; old versions are
  reclaimed (see :mod:`varsync_shm.writing`).
- **Only this user's directories are used** (:mod:`varsync_shm._dirs`): the store's
  directory is opened once, checked, and every table is addressed relative to it.
- **A table created again is a new history**: each backend remembers the signature it
  handed out per table and which ``signature.json`` held it. That file's identity (device,
  inode, mtime) is the table's epoch, kept in a :class:`~varsync.backend.Histories`: a
  reader holding a version of the old file's history gets
  :class:`~varsync.TableResetError`, and so does every call once the new file holds
  another signature.
- **No interrupt leaks a descriptor or closes one twice**: every descriptor a call opens
  belongs to a :class:`~varsync_shm._fds.Descriptors` made before the ``try`` that
  closes it; those that outlive a call belong to ``mmap``/``FileIO`` objects.

Pulls (:mod:`varsync_shm.reading`) of more than :data:`MAP_ABOVE` bytes return read-only
arrays viewing the segment (no copy), which keep its shared lock while any of them lives
(:mod:`varsync_shm.mappings`); smaller pulls copy the segment in one ``pread``.
:meth:`ShmBackend.block`, which the core's wait loop sleeps on, sleeps on an inotify watch
of the table's directory (:mod:`varsync_shm._inotify`), or where there is none, for at
most ``POLL_MAX`` (50 ms). Leaf versions (``supports_leaf_versions``: partial pushes,
pulls of only what changed) are recorded in each segment's head: :mod:`varsync_shm.leaves`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from varsync.backend import (
    POLL_MAX,
    AuthenticationError,
    Backend,
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    ErrorMap,
    Histories,
    LeafSnapshot,
    PullTimeoutError,
    Snapshot,
    Spec,
    deadline_after,
    refuse_unknown,
    remaining,
    reset_error,
    translate_errors,
)
from varsync_shm import _dirs, layout, reading, writing
from varsync_shm import leaves as leafsync
from varsync_shm._fds import Descriptors
from varsync_shm._inotify import Watch
from varsync_shm.epochs import (
    Handed,
    Identity,
    epoch_now,
    identity_of,
    record,
    table_exists,
)
from varsync_shm.mappings import Mappings
from varsync_shm.reading import MAP_ABOVE, READ_ATTEMPTS
from varsync_shm.registry import ReaderRegistry
from varsync_shm.writing import LOCK, SIGNATURE, token

__all__ = ["ShmBackend", "MAP_ABOVE", "SPARES"]

SPARES = writing.SPARES

_ERRORS: ErrorMap = {PermissionError: AuthenticationError, OSError: BackendConnectionError}


class ShmBackend(ReaderRegistry, Backend):
    """Tables in files under /dev/shm, shared by every process of the host that names
    the same store. Options: ``root`` (the directory holding stores; default /dev/shm)."""

    shared_across_processes = True
    supports_blocking_wait = True
    persistent = False  # tables outlive processes, not a reboot (tmpfs)
    supports_leaf_versions = True  # in each segment's head: see varsync_shm.leaves
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
        _dirs.check_root(root)
        self.root = root
        self.path = layout.namespace_path(self.store, namespace, root)
        self._store_entry = layout.store_entry(self.store)
        self.store_path = layout.store_path(self.store, root)  # for messages
        self._namespace_entry = layout.namespace_entry(namespace)
        self.mappings = Mappings()
        self._held = Descriptors()  # the store directories this backend opened
        self._store_fd = -1
        self._store_lock = threading.Lock()
        self._known: dict[str, tuple[str, Identity]] = {}  # signature, its file
        self._histories = Histories()  # the signature file each table's readers trust
        self._seen: dict[str, int] = {}  # the last version seen per table, for messages
        self._paths: dict[str, tuple[str, str]] = {}
        #: per table, the history of this backend's last write or read, and what it handed out
        self.handed: dict[str, Handed] = {}
        self.leaf_bytes: dict[str, dict[str, int]] = {}  # per table, for details()

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        table = self._table_path(name)
        fds = Descriptors()
        made: list[str] = []  # names this call created, removed if not renamed
        store = -1
        try:
            with self._errors(table):
                store = self._store(create=True)
                self._private_table(store, name, fds, create=True)
                rel = self._rel(name)
                lock = fds.open(f"{rel}/{LOCK}", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=store)
                fcntl.flock(lock, fcntl.LOCK_EX)
                stored = reading.read_signature(store, rel, fds, self.store_path)
                if stored is None:
                    temporary = f"{rel}/.sig-{token()}"
                    made.append(temporary)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
                    out = fds.open(temporary, flags, 0o600, dir_fd=store)
                    data = memoryview(signature.encode("utf-8"))
                    while data:  # bounded: each pass writes at least one byte or raises
                        data = data[os.write(out, data) :]
                    os.rename(temporary, f"{rel}/{SIGNATURE}", src_dir_fd=store, dst_dir_fd=store)
                    stored = signature
                # What the container will hold now, if it accepts the stored signature.
                identity = self._remember(name, stored, store, rel, replace=stored == signature)
                self._histories.adopt(name, identity)
                return stored
        finally:
            fds.close()  # first: it releases the writers' lock
            writing.unlink_all(store, made)

    def signature(self, name: str) -> str | None:
        table = self._table_path(name)
        fds = Descriptors()
        try:
            with self._errors(table):
                store = self._store(create=False)
                if store < 0 or self._private_table(store, name, fds, create=False) is None:
                    return None
                rel = self._rel(name)
                text = reading.read_signature(store, rel, fds, self.store_path)
                if text is not None and name not in self._known:
                    self._histories.adopt(name, self._remember(name, text, store, rel))
                return text
        finally:
            fds.close()

    def tables(self) -> list[str]:
        fds = Descriptors()
        try:
            with self._errors(self.path):
                store = self._store(create=False)
                if store < 0:
                    return []
                namespace = _dirs.enter(store, self._namespace_entry, self.path, fds, create=False)
                if namespace < 0:
                    return []
                names = []
                for entry in os.listdir(namespace):
                    name = layout.table_name_of(entry)
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        if name is not None and os.stat(f"{entry}/{SIGNATURE}", dir_fd=namespace):
                            names.append(name)
                return sorted(names)
        finally:
            fds.close()

    def details(self, name: str) -> dict[str, Any]:
        table = self._table_path(name)
        fds = Descriptors()
        try:
            with self._errors(table):
                store, rel = self._table(name)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                directory = fds.open(rel, flags, dir_fd=store)
                files = os.listdir(directory)
                used = 0
                for f in files:
                    with contextlib.suppress(FileNotFoundError):
                        used += os.stat(f, dir_fd=directory, follow_symlinks=False).st_blocks
                return {
                    "path": table,
                    "current": reading.current_segment(store, rel, self.store_path),
                    "segments": sorted(f for f in files if f.startswith(writing.SEGMENTS)),
                    "bytes_in_shm": used * 512,
                    **self.leaf_bytes.get(name, leafsync.counters()),
                }
        finally:
            fds.close()

    def describe_options(self) -> dict[str, Any]:
        return {**super().describe_options(), "root": self.root}

    # -- data ------------------------------------------------------------------------

    def version(self, name: str) -> int:
        with self._errors(self._table_path(name)):
            store, rel = self._table(name)
            version = 0 if store < 0 else reading.current_version(store, rel, self.store_path)
            self._seen[name] = version
            return version

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        with self._errors(self._table_path(name)):
            store, rel = self._writable(name)
            version = writing.write(self, name, store, rel, arrays, specs)
            self._seen[name] = version
            return version

    def read(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> Snapshot:
        # The segment's own index describes its arrays, checked as they are parsed, so
        # ``specs`` is not needed here.
        table = self._table_path(name)
        deadline = deadline_after(timeout)
        with self._errors(table):
            for _ in range(READ_ATTEMPTS):  # a retry when the segment was being replaced
                store, rel, epoch = self.table_epoch(name, held=newer_than)
                if store < 0:
                    return 0, None  # vanished: reads as empty; holders get TableResetError
                pointer = reading.current_segment(store, rel, self.store_path)
                version = reading.version_of(rel, pointer, self.store_path)
                self._seen[name] = version
                if version <= newer_than:
                    self.saw(name, epoch)
                    return version, None
                assert pointer is not None
                fds = Descriptors()
                try:
                    arrays = reading.open_version(
                        store, rel, pointer, version, fds, self.mappings, self.store_path
                    )
                finally:
                    fds.close()
                if arrays is not None:
                    self.saw(name, epoch, version)
                    return version, arrays
                if remaining(deadline) <= 0:
                    raise PullTimeoutError(
                        f"table {name!r} in {self.url}: no stable copy of version {version} "
                        f"within {timeout} s (it was being replaced); pull again"
                    )
            raise CorruptDataError(
                f"table {name!r} at {table}: {READ_ATTEMPTS} attempts found no stable "
                "segment; is a foreign process locking its files?"
            )

    # -- leaf versions (varsync_shm.leaves) ----------------------------------------------

    def write_leaves(
        self,
        name: str,
        leaves: Mapping[int, np.ndarray],
        specs: Sequence[Spec],
        base: int | None = None,
    ) -> int:
        with self._errors(self._table_path(name)):
            store, rel = self._writable(name)
            version = leafsync.write_leaves(self, name, store, rel, leaves, specs, base)
            if version:
                self._seen[name] = version
            return version

    def read_leaves(
        self, name: str, newer_than: int, timeout: float | None, specs: Sequence[Spec]
    ) -> LeafSnapshot:
        with self._errors(self._table_path(name)):  # the segment's index describes it
            return leafsync.read_leaves(self, name, newer_than, timeout)

    def leaf_versions(self, name: str) -> tuple[int, list[int]]:
        with self._errors(self._table_path(name)):
            return leafsync.leaf_versions(self, name)

    def current_history(self, name: str) -> Any:
        """The identity of the table's ``signature.json`` now, in the store's directory
        now (a store deleted and made again is looked up anew); ``None``: no table."""
        with self._errors(name):
            store = self._store(create=False)
            return None if store < 0 else epoch_now(store, self._rel(name))

    def history_of(self, name: str) -> Any:
        return self._histories.trusted(name)  # the signature file's identity

    def block(self, name: str, newer_than: int, seconds: float) -> None:
        """Sleep on an inotify watch of the table's directory until a file is renamed into
        it (a push renames ``current``) or ``seconds`` pass; at once if the version is no
        longer ``newer_than``. Without inotify, sleep at most ``POLL_MAX``.

        A deleted table (its store removed) reads as empty, as a Redis table whose keys
        vanished does: a holder of a version returns at once (the core reports the reset),
        a wait for a first push polls until the table is made again or time is up."""
        table = self._table_path(name)
        fds = Descriptors()
        try:
            watch = Watch.open(table, fds)  # armed before the look: no push goes unseen
            with self._errors(table):
                store, rel = self._table(name, held=newer_than)
                if store < 0 or not table_exists(store, rel):
                    if newer_than == 0:  # nothing to watch until it is made again
                        time.sleep(min(seconds, POLL_MAX))
                    return
                if reading.current_version(store, rel, self.store_path) != newer_than:
                    return
            if watch is None:  # inotify missing or exhausted: the core's loop polls
                time.sleep(min(seconds, POLL_MAX))
            else:
                watch.wait(seconds)
        finally:
            fds.close()

    def close(self) -> None:
        self.mappings.clear()
        self._held.close()

    # -- the store's directory and the table's signature ----------------------------------

    def _names(self, name: str) -> tuple[str, str]:
        """The table's directory: its path, and its path relative to the store's."""
        names = self._paths.get(name)
        if names is None:
            entry = layout.table_entry(name)
            names = (os.path.join(self.path, entry), f"{self._namespace_entry}/{entry}")
            if len(self._paths) < 4096:  # encoding a name costs more than a system call
                self._paths[name] = names
        return names

    def _table_path(self, name: str) -> str:
        return self._names(name)[0]

    def _rel(self, name: str) -> str:
        return self._names(name)[1]

    def _store(self, *, create: bool) -> int:
        """The descriptor of the store's checked directory, or -1 if there is none. Kept
        while the directory exists; reopened (and checked again) once it was deleted."""
        fd = self._store_fd
        if fd >= 0 and os.fstat(fd).st_nlink > 0:
            return fd
        path = layout.store_path(self.store, self.root)
        fds = Descriptors()
        try:
            root = fds.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            fd = _dirs.enter(root, self._store_entry, path, fds, create=create)
            if fd < 0:
                return -1
            with self._store_lock:  # replaced ones stay open until close(): threads may use them
                fds.give(fd, self._held)
                self._store_fd = fd
            return fd
        finally:
            fds.close()

    def _private_table(
        self, store: int, name: str, fds: Descriptors, *, create: bool
    ) -> str | None:
        """Check (and make, if ``create``) the namespace's and table's directories."""
        namespace = _dirs.enter(store, self._namespace_entry, self.path, fds, create=create)
        if namespace < 0:
            return None
        entry = self._rel(name).rpartition("/")[2]
        if _dirs.enter(namespace, entry, self._table_path(name), fds, create=create) < 0:
            return None
        return self._rel(name)

    def _table(self, name: str, held: int | None = None) -> tuple[int, str]:
        """``(store descriptor, table directory relative to it)``, after checking that the
        table still has the signature this backend handed out and, for a caller holding
        version ``held``, the history it trusts; store -1: no store."""
        store, rel, _ = self.table_epoch(name, held)
        return store, rel

    def _writable(self, name: str) -> tuple[int, str]:
        """:meth:`_table`, for a push: a table whose directory is gone is an error."""
        store, rel = self._table(name)
        if store < 0 or not table_exists(store, rel):
            raise BackendConnectionError(
                f"table {name!r} of {self.url} is gone ({self._table_path(name)} was "
                "deleted); create_table() it again, then push"
            )
        return store, rel

    def table_epoch(self, name: str, held: int | None = None) -> tuple[int, str, Identity | None]:
        """:meth:`_table`, and the identity of the ``signature.json`` checked (``None``:
        no table yet)."""
        rel = self._rel(name)
        store = self._store_fd  # as a rule, one stat: the signature file's
        for _ in range(2):  # a second pass only if the store's directory was replaced
            if store < 0:
                store = self._store(create=False)
                if store < 0:
                    return -1, rel, None
            try:
                status = os.stat(f"{rel}/{SIGNATURE}", dir_fd=store, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                if os.fstat(store).st_nlink > 0:
                    return store, rel, None  # no table (yet): it reads as empty
                store = -1  # the store's directory was deleted: look for a new one
                continue
            identity = identity_of(status)
            known = self._known.get(name)
            if known is None or known[1] != identity:
                self._adopt(name, store, rel)
            if held is not None:
                self._histories.check(name, identity, held, where=self.url)
            return store, rel, identity
        return -1, rel, None

    def saw(self, name: str, epoch: Identity | None, version: int = 0) -> None:
        """A write or read of the table returned ``version`` of history ``epoch``."""
        record(self.handed, name, epoch, version)

    def _adopt(self, name: str, store: int, rel: str) -> None:
        """The table's ``signature.json`` is not the one this backend knows: check it."""
        fds = Descriptors()
        try:
            if self._private_table(store, name, fds, create=False) is None:
                return
            text = reading.read_signature(store, rel, fds, self.store_path)
            if text is None:
                return
            known = self._known.get(name)
            if known is not None and known[0] != text:
                raise reset_error(
                    name,
                    self.url,
                    self._seen.get(name, 0),
                    why=f"{self._table_path(name)} was created again with another signature, "
                    "which this container cannot decode",
                    remedy="connect again (varsync.connect) to use it",
                )
            self._remember(name, text, store, rel)
        finally:
            fds.close()

    def _remember(
        self, name: str, text: str, store: int, rel: str, replace: bool = False
    ) -> Identity:
        """Know ``text`` as the table's signature, held by its current ``signature.json``
        (whose identity is returned), unless another one is known and not ``replace``d:
        the container still holds that one."""
        identity = identity_of(os.stat(f"{rel}/{SIGNATURE}", dir_fd=store, follow_symlinks=False))
        known = self._known.get(name)
        if known is None or known[0] == text or replace:
            self._known[name] = (text, identity)
        return identity

    def check_signature(self, name: str, store: int, rel: str) -> Identity:
        """Raise :class:`TableResetError` if the table's signature is no longer the one
        this backend handed out (writers call it under the writers' lock); return the
        identity of its ``signature.json`` (the history written into)."""
        try:
            status = os.stat(f"{rel}/{SIGNATURE}", dir_fd=store, follow_symlinks=False)
        except FileNotFoundError:
            raise BackendConnectionError(
                f"table {name!r} of {self.url} is gone ({self._table_path(name)} was "
                "deleted); create_table() it again, then push"
            ) from None
        identity = identity_of(status)
        known = self._known.get(name)
        if known is None or known[1] != identity:
            self._adopt(name, store, rel)
        return identity

    # -- internals -------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        with translate_errors(_ERRORS, f"shm store {where}"):
            yield

    def writable_mapping(self, rel: str, fd: int, size: int) -> Any:
        """A writable mapping of the file open as ``fd`` (kept for the next pushes)."""
        return self.mappings.get(rel, fd, size, writable=True)
