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
- **Writers never wait for readers.** Writers only ever *try* to lock a retired segment
  (``LOCK_NB``); one a reader holds is left alone and a new file is used instead. Writers
  wait for each other only for the few system calls of claiming and publishing.
- **A crashed reader leaves nothing locked.** Readers hold no lock but their flocks, which
  the kernel drops with the process.
- **A crashed writer leaves the last complete version readable.** ``current`` only ever
  points at complete segments. The next writer deletes the dead writer's ``.fill-*`` file
  (its flock is gone) and stale temporary names; the writers' lock dies with its holder.
- **Old versions are reclaimed.** After each push a retired segment no reader holds is
  kept as the one spare (its pages are reused: a push then costs a memory copy, not an
  allocation) or deleted. Deleted files a reader still maps are freed by the kernel when
  the reader drops them.

Pulls of more than :data:`MAP_ABOVE` bytes return read-only arrays mapped straight from
the segment (no copy); the reader's shared flock lasts until the last of those arrays
(or any view of them) is garbage, so their bytes cannot change under them. Smaller pulls
copy the segment in one ``pread``. Each process keeps its mappings of a table's last two
segments (:mod:`varsync_shm.mappings`), so pushes into a spare and reads of a pulled
segment run at memory-copy speed instead of page-faulting. A new segment is written
with ``pwrite``. ``wait`` sleeps on an inotify watch of the table's directory (see
:mod:`varsync_shm._inotify`); where inotify is unavailable it polls with a growing
interval (1 ms doubling to 50 ms).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from varsync.backends.base import Backend, Snapshot, deadline_after, remaining
from varsync.errors import (
    AuthenticationError,
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    ItemTooLargeError,
    PullTimeoutError,
    TableNotFoundError,
    translate_errors,
)
from varsync.signature import Spec

from varsync_shm import layout, segment
from varsync_shm._inotify import Watch
from varsync_shm.mappings import Mappings

__all__ = ["ShmBackend", "MAP_ABOVE", "SPARES"]

MAP_ABOVE = 1 << 20
"""Segments larger than this many bytes are mapped by pulls instead of copied."""
SPARES = 1
"""Retired segments kept per table for reuse (besides the current one)."""

SIGNATURE = "signature.json"
LOCK = "lock"
CURRENT = "current"
_SEGMENT = "seg-"
_SPARE = "spare-"
_FILL = ".fill-"
_TEMPORARY = (".link-", ".sig-")  # made and renamed only under the writers' lock
_READ_ATTEMPTS = 1000
_ERRORS = {PermissionError: AuthenticationError, OSError: BackendConnectionError}


def _token() -> str:
    return os.urandom(8).hex()


def _open_regular(path: str, flags: int) -> int:
    """``os.open`` for a file varsync-shm made: anything else in its place (a directory,
    a FIFO, which would block the open) is ``CorruptDataError``."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptDataError(
            f"{path} is not a regular file; is something else writing in this store?"
        )
    return fd


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class ShmBackend(Backend):
    """Tables in files under /dev/shm, shared by every process of the host that names
    the same store. Options: ``root`` (the directory holding stores; default /dev/shm)."""

    shared_across_processes = True
    supports_blocking_wait = True
    persistent = False  # tables outlive processes, not a reboot (tmpfs)

    def __init__(
        self,
        url: str,
        *,
        timeout: Optional[float],
        namespace: str,
        root: str = layout.DEFAULT_ROOT,
        **options: Any,
    ) -> None:
        super().__init__(url, timeout=timeout, namespace=namespace, **options)
        self.store = layout.store_name_of(url)
        if not isinstance(root, str) or not os.path.isdir(root):
            raise ConfigurationError(
                f"shm root {root!r} is not a directory; shm:// keeps its files in /dev/shm, "
                "or in the directory given as ?root=<dir> (use a RAM-backed tmpfs)"
            )
        self.root = root
        self.path = layout.namespace_path(self.store, namespace, root)
        self._mappings = Mappings()

    # -- tables ----------------------------------------------------------------------

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        table = self._table_path(name)
        with self._errors(table):
            os.makedirs(table, mode=0o700, exist_ok=True)
            with self._writers_lock(table):
                stored = self._read_signature(table)
                if stored is not None:
                    return stored
                temporary = os.path.join(table, f".sig-{_token()}")
                with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
                    f.write(signature)
                os.rename(temporary, os.path.join(table, SIGNATURE))
                return signature

    def signature(self, name: str) -> Optional[str]:
        table = self._table_path(name)
        with self._errors(table):
            return self._read_signature(table)

    def tables(self) -> List[str]:
        with self._errors(self.path):
            try:
                entries = os.listdir(self.path)
            except FileNotFoundError:
                return []
            names = (layout.table_name_of(entry) for entry in entries)
            return sorted(
                name
                for name in names
                if name is not None
                and os.path.exists(os.path.join(self._table_path(name), SIGNATURE))
            )

    def details(self, name: str) -> Dict[str, Any]:
        table = self._table_path(name)
        with self._errors(table):
            files = os.listdir(table)
            used = sum(os.stat(os.path.join(table, f), follow_symlinks=False).st_blocks for f in files)
            return {
                "path": table,
                "current": self._pointer(table),
                "segments": sorted(f for f in files if f.startswith((_SEGMENT, _SPARE, _FILL))),
                "bytes_in_shm": used * 512,
            }

    def describe_options(self) -> Dict[str, Any]:
        return {**super().describe_options(), "root": self.root}

    # -- data ------------------------------------------------------------------------

    def version(self, name: str) -> int:
        table = self._table_path(name)
        with self._errors(table):
            return self._version_of(table, self._pointer(table))

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        table = self._table_path(name)
        plan = segment.plan(specs)
        with self._errors(table):
            with self._writers_lock(table):
                self._reclaim(table, self._pointer(table))
                fd, filling, fresh = self._claim(table, plan.size)
            published = False
            try:
                if fresh:  # pages to allocate anyway: pwrite beats faulting them in
                    self._allocate(fd, plan.size, table)
                    segment.write(fd, plan, arrays)
                else:  # a spare: through a mapping kept from earlier, at memcpy speed
                    mapping = self._mappings.get(table, filling, fd, plan.size, writable=True)
                    if mapping is None:
                        raise BackendConnectionError(f"{filling} was removed while being written")
                    segment.fill(mapping, plan, arrays)
                with self._writers_lock(table):
                    version = self._version_of(table, self._pointer(table)) + 1
                    # Readers may take their shared lock as soon as the link is renamed;
                    # only writers, all excluded by the writers' lock, wanted LOCK_EX.
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    segment.set_version(fd, version)
                    name_of_segment = f"{_SEGMENT}{version}"
                    os.rename(filling, os.path.join(table, name_of_segment))
                    link = os.path.join(table, f".link-{_token()}")
                    os.symlink(name_of_segment, link)
                    os.rename(link, os.path.join(table, CURRENT))
                    published = True
                    self._reclaim(table, name_of_segment)
                return version
            finally:
                if not published:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(filling)
                os.close(fd)

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        table = self._table_path(name)
        deadline = deadline_after(timeout)
        with self._errors(table):
            for _ in range(_READ_ATTEMPTS):
                pointer = self._pointer(table)
                version = self._version_of(table, pointer)
                if version <= newer_than:
                    return version, None
                assert pointer is not None
                arrays = self._open_version(table, pointer, version)
                if arrays is not None:
                    return version, arrays
                if remaining(deadline) <= 0:
                    raise PullTimeoutError(
                        f"table {name!r} in {self.url}: no stable copy of version {version} "
                        f"within {timeout} s (it was being replaced); pull again"
                    )
            raise CorruptDataError(
                f"table {name!r} at {table}: {_READ_ATTEMPTS} attempts found no stable "
                "segment; is a foreign process locking its files?"
            )

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        table = self._table_path(name)
        watch = Watch.open(table)
        if watch is None:  # no inotify here: poll (see the module docstring)
            return super().wait(name, newer_than, timeout)
        deadline = deadline_after(timeout)
        with watch:
            while True:  # each pass sleeps until a rename in the table or the deadline
                current = self.version(name)
                if current != newer_than:
                    return current
                left = remaining(deadline)
                if left <= 0:
                    raise PullTimeoutError(
                        f"table {name!r} in {self.url} stayed at version {current} (waiting "
                        f"for a version above {newer_than}) for {timeout} s"
                    )
                watch.wait(left)
                if not os.path.isdir(table):
                    raise TableNotFoundError(
                        f"table {name!r} in {self.url} was deleted ({table}) while waiting"
                    )

    def close(self) -> None:
        self._mappings.clear()

    # -- internals -------------------------------------------------------------------

    def _table_path(self, name: str) -> str:
        return layout.table_path(self.path, name)

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        with translate_errors(_ERRORS, f"shm store {where}"):
            yield

    @contextlib.contextmanager
    def _writers_lock(self, table: str) -> Iterator[None]:
        # A new open file description per use: flock excludes other threads too.
        fd = os.open(os.path.join(table, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def _read_signature(table: str) -> Optional[str]:
        path = os.path.join(table, SIGNATURE)
        try:
            fd = _open_regular(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with open(fd, "rb") as f:
            data = f.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptDataError(f"{path} is not text, so not a signature") from None

    @staticmethod
    def _pointer(table: str) -> Optional[str]:
        """The segment ``current`` names, or ``None`` before the first push."""
        try:
            return os.readlink(os.path.join(table, CURRENT))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a link
                raise CorruptDataError(f"{table}/{CURRENT} is not a varsync-shm link") from None
            raise

    @staticmethod
    def _version_of(table: str, pointer: Optional[str]) -> int:
        if pointer is None:
            return 0
        digits = pointer[len(_SEGMENT):]
        if not pointer.startswith(_SEGMENT) or not digits.isdigit():
            raise CorruptDataError(f"{table}/{CURRENT} points to {pointer!r}, not a segment")
        return int(digits)

    def _open_version(self, table: str, pointer: str, version: int) -> Optional[List[np.ndarray]]:
        """The arrays of segment ``pointer`` if it still holds ``version``, else ``None``
        (it was retired and reused meanwhile: the caller reads the link again)."""
        path = os.path.join(table, pointer)
        try:
            fd = _open_regular(path, os.O_RDONLY)
        except FileNotFoundError:
            if self._pointer(table) == pointer:
                raise CorruptDataError(f"{table}/{CURRENT} points to {pointer}, which is missing")
            return None
        keep_open = False
        try:
            if not _try_lock(fd, fcntl.LOCK_SH):
                return None  # a writer is refilling it: it is no longer current
            if segment.read_version(fd) != version:
                return None
            size = os.fstat(fd).st_size
            buffer: Any
            if size > MAP_ABOVE:
                buffer = self._mappings.get(table, path, fd, size, writable=False)
                if buffer is None:
                    return None
            else:
                buffer = os.pread(fd, size, 0)
            parsed = segment.parse(buffer, size, path)
            # One uint8 array per pull, which every pulled array is a view of: when the
            # last of them is garbage, it is too, and the shared lock goes with it.
            memory = np.frombuffer(buffer, np.uint8, size)
            arrays = segment.arrays_of(memory, parsed.leaves)
            if size > MAP_ABOVE:
                weakref.finalize(memory, os.close, fd)
                keep_open = True
            return arrays
        finally:
            if not keep_open:
                os.close(fd)

    def _claim(self, table: str, size: int) -> Tuple[int, str, bool]:
        """A file to fill, locked LOCK_EX and named ``.fill-*``: a spare if one is free,
        else a new one. Returns ``(fd, path, fresh)``. Call under the writers' lock."""
        for entry in sorted(os.listdir(table)):
            if not entry.startswith(_SPARE):
                continue
            filling = os.path.join(table, f"{_FILL}{_token()}")
            try:
                os.rename(os.path.join(table, entry), filling)
            except FileNotFoundError:
                continue
            fd = os.open(filling, os.O_RDWR | os.O_CLOEXEC)
            if _try_lock(fd, fcntl.LOCK_EX) and os.fstat(fd).st_size == size:
                segment.set_version(fd, 0)  # before any byte of the new version
                return fd, filling, False
            os.close(fd)  # a late reader still holds it: let the kernel free it later
            os.unlink(filling)
        filling = os.path.join(table, f"{_FILL}{_token()}")
        fd = os.open(filling, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd, filling, True

    def _allocate(self, fd: int, size: int, table: str) -> None:
        """Reserve the file's pages now, so a full /dev/shm is an error here and never a
        SIGBUS in a reader later."""
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG):
                free = os.statvfs(table)
                raise ItemTooLargeError(
                    f"{self.root} has no room for a {size}-byte segment of {table} "
                    f"({free.f_bavail * free.f_frsize} bytes free); nothing was published. "
                    "Free space there (old stores: varsync_shm.remove_store), or enlarge "
                    "the tmpfs."
                ) from None
            raise

    def _reclaim(self, table: str, current: Optional[str]) -> None:
        """Keep at most :data:`SPARES` free retired segments, delete the rest and what
        dead writers left behind. Call under the writers' lock."""
        spares = 0
        retired = []
        for entry in sorted(os.listdir(table)):
            path = os.path.join(table, entry)
            if entry.startswith(_FILL):
                if self._unused(path):  # its writer died: nobody holds its lock
                    self._unlink(path)
            elif entry.startswith(_TEMPORARY):
                self._unlink(path)
            elif entry.startswith(_SPARE):
                spares += 1
            elif entry.startswith(_SEGMENT) and entry != current:
                retired.append(entry)
        for entry in retired:
            path = os.path.join(table, entry)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
            except FileNotFoundError:
                continue
            try:
                if not _try_lock(fd, fcntl.LOCK_EX):
                    continue  # a reader holds it; a later push reclaims it
                if spares < SPARES:
                    os.rename(path, os.path.join(table, f"{_SPARE}{_token()}"))
                    spares += 1
                else:
                    os.unlink(path)
            finally:
                os.close(fd)

    @staticmethod
    def _unused(path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
        except FileNotFoundError:
            return False
        try:
            return _try_lock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)

    @staticmethod
    def _unlink(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
