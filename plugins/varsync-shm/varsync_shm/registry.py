"""The reader registry of an shm table (``supports_reader_registry``): one small file per
reader in the table's ``readers/`` directory.

An entry is ``readers/<id hash>.json``: the reader id, the core's record text and the
wall-clock time (``time.time()``: every process of the host shares the clock) at which it
expires. A report writes a temporary file and renames it over the entry, so a listing
reads an entry whole or not at all; the file name is a hash of the id, so no id can name
a path. A listing skips expired entries and removes them (best effort: a reader may be
reporting again meanwhile: an entry replaced since it was read is kept). Nothing here
takes the table's lock: reports never wait for pushes, and pushes never wait for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any

from varsync_shm._fds import Descriptors
from varsync_shm._files import token, write_all
from varsync_shm.layout import READERS
from varsync_shm.store import TableDir

__all__ = ["report", "listing", "MAX_ENTRY_BYTES"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
#: The largest entry file a listing reads (an entry varsync writes is a few hundred bytes).
MAX_ENTRY_BYTES = 64 * 1024


def _entry_name(reader: str) -> str:
    return hashlib.sha256(reader.encode("utf-8")).hexdigest()[:32] + ".json"


def report(table: TableDir, reader: str, record: str, ttl: float) -> None:
    """Store ``record`` as reader ``reader``'s entry of the table, expiring in ``ttl``
    seconds; by rename, so a listing reads it whole or not at all."""
    body = json.dumps({"reader": reader, "record": record, "expires": time.time() + ttl})
    data = body.encode("utf-8")
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"a reader entry of {len(data)} bytes; at most {MAX_ENTRY_BYTES}")
    fds = Descriptors()
    try:
        directory = table.file(READERS)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700, dir_fd=table.store)
        entries = fds.open(directory, _DIRECTORY, dir_fd=table.store)
        temporary = f".{token()}.tmp"
        out = fds.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=entries)
        try:
            write_all(out, data)
            os.rename(temporary, _entry_name(reader), src_dir_fd=entries, dst_dir_fd=entries)
        except BaseException:
            _unlink(temporary, entries)
            raise
    finally:
        fds.close()


def listing(table: TableDir) -> dict[str, str]:
    """The table's unexpired entries (reader id -> record); expired ones are removed."""
    out: dict[str, str] = {}
    fds = Descriptors()
    try:
        try:
            entries = fds.open(table.file(READERS), _DIRECTORY, dir_fd=table.store)
        except FileNotFoundError:
            return out
        now = time.time()
        for entry in os.listdir(entries):
            if not entry.endswith(".json"):
                continue
            parsed = _read_entry(entry, entries)
            if parsed is None:
                continue
            reader, record, expires, inode = parsed
            if expires <= now:
                _unlink_if(entry, entries, inode)
            else:
                out[reader] = record
    finally:
        fds.close()
    return out


def _read_entry(entry: str, directory: int) -> Any:
    """``(reader, record, expires, inode)`` of one entry file, or ``None`` if it vanished
    or is not an entry this plugin writes."""
    fds = Descriptors()
    try:
        try:
            fd = fds.open(entry, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=directory)
        except (FileNotFoundError, OSError):
            return None
        inode = os.fstat(fd).st_ino
        body = os.read(fd, MAX_ENTRY_BYTES + 1)
        if len(body) > MAX_ENTRY_BYTES:
            return None
        fields = json.loads(body)
        reader, record, expires = fields["reader"], fields["record"], float(fields["expires"])
        if not isinstance(reader, str) or not isinstance(record, str):
            return None
        if _entry_name(reader) != entry:
            return None  # not where its id puts it: not ours
        return reader, record, expires, inode
    except (ValueError, KeyError, TypeError):
        return None
    finally:
        fds.close()


def _unlink_if(entry: str, directory: int, inode: int) -> None:
    """Remove an expired entry, unless a new report replaced it since it was read (a
    report landing between this check and the unlink is lost until its next refresh,
    ``ttl / 3`` later)."""
    try:
        if os.stat(entry, dir_fd=directory, follow_symlinks=False).st_ino == inode:
            os.unlink(entry, dir_fd=directory)
    except OSError:
        pass


def _unlink(entry: str, directory: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(entry, dir_fd=directory)
