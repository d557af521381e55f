"""The segment store: one store's checked directory and its tables' directories.

A :class:`SegmentStore` is what the readers, writers and the reader registry work on,
through the :class:`TableDir` it gives them for one table: the descriptor of the store's
checked directory and the table's directory relative to it. It knows nothing of the
backend that uses it.

The store's directory is opened once, checked (:mod:`varsync_shm._dirs`) and kept open;
every table is addressed relative to it, so nothing can be swapped between a check and
a use. When the store is deleted and made again, the new directory is opened and checked
and the old descriptor kept until :meth:`SegmentStore.close` (other threads may use it).

**Epochs.** A table's ``signature.json`` is written once, by rename, when the table is
made; a table made again (its directory deleted and made anew) has another one. The
file's identity (device, inode, modification time), an :class:`Epoch`, is therefore the
token of the table's history that every process of the host reads alike: the epoch of
every :class:`~varsync.backend.Head` the backend answers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
from typing import NamedTuple

from varsync.backend import CorruptDataError
from varsync_shm import _dirs, layout
from varsync_shm._fds import Descriptors
from varsync_shm._files import open_regular, token, unlink_all, write_all

__all__ = ["Epoch", "TableDir", "SegmentStore"]

_SIGNATURE_MAX = 64 << 20  # bytes: a signature.json larger than this is not one


class Epoch(NamedTuple):
    """One history of a table: device, inode and modification time of its
    ``signature.json``."""

    device: int
    inode: int
    mtime_ns: int

    def __str__(self) -> str:  # for reset messages
        return f"signature.json inode {self.inode}"


def _epoch_of(status: os.stat_result) -> Epoch:
    return Epoch(status.st_dev, status.st_ino, status.st_mtime_ns)


class TableDir(NamedTuple):
    """One table's directory as a call addresses it."""

    name: str
    store: int  # the descriptor of the store's checked directory
    rel: str  # the table's directory, relative to it
    path: str  # its full path, for messages only

    def file(self, entry: str) -> str:
        """``entry`` of the table's directory, relative to :attr:`store`."""
        return f"{self.rel}/{entry}"

    def where(self, entry: str) -> str:
        """``entry``'s full path, for messages."""
        return f"{self.path}/{entry}"

    def epoch(self) -> Epoch | None:
        """The identity of the table's ``signature.json`` now (``None``: there is none)."""
        try:
            status = os.stat(self.file(layout.SIGNATURE), dir_fd=self.store, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _epoch_of(status)

    def exists(self) -> bool:
        """Whether the table's directory exists (a push into a deleted one is an error)."""
        try:
            return stat.S_ISDIR(os.stat(self.rel, dir_fd=self.store, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def read_signature(self, fds: Descriptors) -> tuple[str, Epoch] | None:
        """The text of the table's ``signature.json`` and the epoch of the file read;
        ``None`` if there is none."""
        where = self.where(layout.SIGNATURE)
        try:
            fd = open_regular(
                self.file(layout.SIGNATURE), os.O_RDONLY, fds, dir_fd=self.store, where=where
            )
        except (FileNotFoundError, NotADirectoryError):
            return None
        status = os.fstat(fd)
        size = status.st_size
        if size > _SIGNATURE_MAX:
            raise CorruptDataError(f"{where} is {size} bytes, too large to be a signature")
        data = os.pread(fd, size + 1, 0)
        try:
            return data.decode("utf-8"), _epoch_of(status)
        except UnicodeDecodeError:
            raise CorruptDataError(f"{where} is not text, so not a signature") from None


class SegmentStore:
    """The directories of store ``store``'s namespace ``namespace`` under ``root``;
    thread-safe."""

    def __init__(self, store: str, namespace: str, root: str) -> None:
        _dirs.check_root(root)
        self.root = root
        self.store_path = layout.store_path(store, root)  # for messages
        self.path = layout.namespace_path(store, namespace, root)  # the namespace's
        self._store_entry = layout.store_entry(store)
        self._namespace_entry = layout.namespace_entry(namespace)
        self._held = Descriptors()  # the store directories opened
        self._fd = -1
        self._lock = threading.Lock()
        self._names: dict[str, tuple[str, str]] = {}

    def close(self) -> None:
        self._held.close()

    # -- addressing --------------------------------------------------------------------

    def table_path(self, name: str) -> str:
        """Table ``name``'s directory (whether or not it exists)."""
        return self._entry(name)[0]

    def _entry(self, name: str) -> tuple[str, str]:
        names = self._names.get(name)
        if names is None:
            entry = layout.table_entry(name)
            names = (os.path.join(self.path, entry), f"{self._namespace_entry}/{entry}")
            if len(self._names) < 4096:  # encoding a name costs more than a system call
                self._names[name] = names
        return names

    def _table(self, name: str, store: int) -> TableDir:
        path, rel = self._entry(name)
        return TableDir(name, store, rel, path)

    def directory(self, *, create: bool) -> int:
        """The descriptor of the store's checked directory, or -1 if there is none. Kept
        while the directory exists; reopened (and checked again) once it was deleted."""
        fd = self._fd
        if fd >= 0 and os.fstat(fd).st_nlink > 0:
            return fd
        fds = Descriptors()
        try:
            root = fds.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            fd = _dirs.enter(root, self._store_entry, self.store_path, fds, create=create)
            if fd < 0:
                return -1
            with self._lock:  # replaced ones stay open until close(): threads may use them
                fds.give(fd, self._held)
                self._fd = fd
            return fd
        finally:
            fds.close()

    def find(self, name: str) -> tuple[TableDir, Epoch | None] | None:
        """Table ``name``'s directory and its epoch (``None``: no table yet, which reads as
        empty); ``None``: there is no store. As a rule one ``stat``, the signature's."""
        store = self._fd
        for _ in range(2):  # a second pass only if the store's directory was replaced
            if store < 0:
                store = self.directory(create=False)
                if store < 0:
                    return None
            table = self._table(name, store)
            epoch = table.epoch()
            if epoch is not None or os.fstat(store).st_nlink > 0:
                return table, epoch
            store = -1  # the store's directory was deleted: look for a new one
        return None

    def check(self, table: TableDir, fds: Descriptors, *, create: bool = False) -> bool:
        """Check (and make, if ``create``) the namespace's and the table's directories:
        whether they exist (see :mod:`varsync_shm._dirs` for what is refused)."""
        namespace = _dirs.enter(table.store, self._namespace_entry, self.path, fds, create=create)
        if namespace < 0:
            return False
        entry = table.rel.rpartition("/")[2]
        return _dirs.enter(namespace, entry, table.path, fds, create=create) >= 0

    # -- tables ------------------------------------------------------------------------

    def create(self, name: str, signature: str) -> tuple[str, Epoch]:
        """Make table ``name`` with ``signature`` unless it exists, under the writers'
        lock; the signature text it has now, and its epoch."""
        fds = Descriptors()
        made: list[str] = []  # names this call created, removed if not renamed
        store = -1
        try:
            store = self.directory(create=True)
            table = self._table(name, store)
            self.check(table, fds, create=True)
            lock = fds.open(table.file(layout.LOCK), os.O_RDWR | os.O_CREAT, 0o600, dir_fd=store)
            fcntl.flock(lock, fcntl.LOCK_EX)
            stored = table.read_signature(fds)
            if stored is not None:
                return stored
            temporary = table.file(f".sig-{token()}")
            made.append(temporary)
            out = fds.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=store)
            write_all(out, signature.encode())
            epoch = _epoch_of(os.fstat(out))  # rename keeps the inode and the mtime
            os.rename(temporary, table.file(layout.SIGNATURE), src_dir_fd=store, dst_dir_fd=store)
            return signature, epoch
        finally:
            fds.close()  # first: it releases the writers' lock
            unlink_all(store, made)

    def open(self, name: str, fds: Descriptors) -> TableDir | None:
        """Table ``name``'s checked directory, or ``None`` if there is none."""
        store = self.directory(create=False)
        if store < 0:
            return None
        table = self._table(name, store)
        return table if self.check(table, fds) else None

    def names(self) -> list[str]:
        """The tables of the namespace: the directories that hold a signature."""
        fds = Descriptors()
        try:
            store = self.directory(create=False)
            if store < 0:
                return []
            namespace = _dirs.enter(store, self._namespace_entry, self.path, fds, create=False)
            if namespace < 0:
                return []
            names = []
            for entry in os.listdir(namespace):
                name = layout.table_name_of(entry)
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    if name is not None and os.stat(
                        f"{entry}/{layout.SIGNATURE}", dir_fd=namespace
                    ):
                        names.append(name)
            return sorted(names)
        finally:
            fds.close()
