"""Element deltas: a leaf held as its anchor in the segments and its links in patch files.

A leaf written as an element patch (``write_patches``) keeps, in every segment of the
versions since, the bytes of its *anchor* (its value when it was last written whole,
whose leaf version the segment's anchor table names: :mod:`varsync_shm.segment`); the
patches since are its *links*. The patches a push writes are in one file,
``patch-<version>``, filled under the writers' lock as ``.patch-<token>`` and renamed into
place before the version is published, never changed after:

    offset  size     field
    0       8        magic b"VSYNCPAT"
    8       4        format (1)
    12      4        number of rows
    16      8        the table version it was written for
    24      8        file size
    32      40/row   rows, five little-endian uint64 each: leaf index, version, base,
                     offset, length. Per leaf patched at this version, every link of its
                     chain since its anchor, oldest first; a link's bytes are at
                     ``offset`` in ``patch-<version>`` (the last one: in this file)
    ...              the patches' bytes

So a reader finds a leaf's whole chain in the one file of its leaf version, and reads
from the others only the links it needs. Versions are never numbered twice in a table's
directory (a table made again is a new directory), so a patch file's name names its
bytes for good.

**Retention** (:func:`reclaim`, after each push under the writers' lock): a patch file
stays while a segment in the directory (the current one, or a retired one a reader
holds) has a chain reaching it; the others are deleted. A reader that opened a segment
just as it was retired may find a patch file gone: it reads ``current`` again, as it
does for a segment refilled under it (:class:`Gone`).
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from varsync.backend import CorruptDataError, LeafChain, PatchLink, rebuilt_leaf
from varsync_shm import layout, segment
from varsync_shm._fds import Descriptors
from varsync_shm._files import open_regular
from varsync_shm.store import TableDir

__all__ = ["Row", "Gone", "Links", "encode", "rebuilt", "reclaim"]

_MAGIC = b"VSYNCPAT"
_FORMAT = 1
_HEADER = struct.Struct("<8sIIQQ")
_ROW = 5  # uint64 fields per row
_ROWS_MAX = 1 << 24  # rows in one file, at most: more is not a file of ours


class Row(NamedTuple):
    """One link of a leaf's chain, and where its bytes are."""

    leaf: int
    version: int
    base: int
    offset: int
    length: int


class Gone(Exception):
    """A patch file a segment's chain names is not there: the segment was retired (and
    its patch files reclaimed) while it was being read."""


def patch_name(version: int) -> str:
    return f"{layout.PATCH}{version}"


def encode(
    version: int, earlier: Mapping[int, Sequence[Row]], patches: Mapping[int, tuple[int, bytes]]
) -> tuple[bytes, list[tuple[int, bytes]], int]:
    """The file ``patch-<version>`` for ``patches`` (leaf index -> (base, data)), each
    leaf's chain being ``earlier[index]`` (its links since its anchor) and the new link:
    its head (header and rows), where each patch goes, and its size."""
    count = sum(len(earlier.get(i, ())) + 1 for i in patches)
    offset = _HEADER.size + 8 * _ROW * count
    rows: list[Row] = []
    placed = []
    for index, (base, data) in sorted(patches.items()):
        rows.extend(earlier.get(index, ()))
        rows.append(Row(index, version, base, offset, len(data)))
        placed.append((offset, data))
        offset += len(data)
    table = np.array(rows, "<u8").reshape(-1, _ROW).tobytes()
    head = _HEADER.pack(_MAGIC, _FORMAT, count, version, offset) + table
    return head, placed, offset


class _File(NamedTuple):
    fd: int
    size: int
    data_start: int
    chains: dict[int, list[Row]]


class Links:
    """The patch files of one table that one call reads, each opened once (its
    descriptor owned by the call's ``fds``)."""

    def __init__(self, table: TableDir, fds: Descriptors) -> None:
        self.table = table
        self.fds = fds
        self.read = 0  # bytes of links read
        self._files: dict[int, _File] = {}

    def chain(self, index: int, leaf_version: int, anchor: int) -> list[Row]:
        """Leaf ``index``'s links from ``anchor`` to ``leaf_version``, checked to join up."""
        rows = self._file(leaf_version).chains.get(index, [])
        where = self.table.where(patch_name(leaf_version))
        if not rows or rows[0].base != anchor or rows[-1].version != leaf_version:
            raise CorruptDataError(
                f"{where} holds no chain of leaf {index} from version {anchor} to "
                f"{leaf_version}, which its segment names"
            )
        for before, row in zip(rows, rows[1:]):
            if row.base != before.version or row.version <= row.base:
                raise CorruptDataError(
                    f"{where}: the links of leaf {index} do not join up ({before.version}, "
                    f"then a link against {row.base})"
                )
        return rows

    def data(self, row: Row) -> bytes:
        """The bytes of link ``row``."""
        file = self._file(row.version)
        if row.offset < file.data_start or row.offset + row.length > file.size:
            raise CorruptDataError(
                f"{self.table.where(patch_name(row.version))}: a link of {row.length} bytes "
                f"at {row.offset} is outside its {file.size} bytes"
            )
        data = os.pread(file.fd, row.length, row.offset)
        if len(data) != row.length:
            raise CorruptDataError(f"{self.table.where(patch_name(row.version))} ended early")
        self.read += row.length
        return data

    def links(self, rows: Sequence[Row]) -> list[PatchLink]:
        return [PatchLink(row.base, row.version, self.data(row)) for row in rows]

    def _file(self, version: int) -> _File:
        found = self._files.get(version)
        if found is None:
            found = self._files[version] = self._open(version)
        return found

    def _open(self, version: int) -> _File:
        name = patch_name(version)
        where = self.table.where(name)
        try:
            fd = open_regular(
                self.table.file(name), os.O_RDONLY, self.fds, dir_fd=self.table.store, where=where
            )
        except FileNotFoundError:
            raise Gone(where) from None
        size = os.fstat(fd).st_size
        head = os.pread(fd, min(size, 1 << 16), 0)
        if len(head) < _HEADER.size:
            raise CorruptDataError(f"{where} is {size} bytes, too short to be a patch file")
        magic, form, count, held, total = _HEADER.unpack_from(head, 0)
        data_start = _HEADER.size + 8 * _ROW * count
        if magic != _MAGIC or form != _FORMAT:
            raise CorruptDataError(
                f"{where} is not a varsync-shm patch file of format {_FORMAT} (magic "
                f"{magic!r}, format {form}); upgrade varsync-shm on every process of the store"
            )
        if held != version or total != size or count > _ROWS_MAX or data_start > size:
            raise CorruptDataError(
                f"{where}: header says version {held}, {total} bytes and {count} rows; "
                f"expected version {version}, and the file has {size} bytes"
            )
        if len(head) < data_start:
            head += os.pread(fd, data_start - len(head), len(head))
        table = np.frombuffer(head, "<u8", _ROW * count, _HEADER.size).reshape(-1, _ROW)
        chains: dict[int, list[Row]] = {}
        for leaf, *rest in table.tolist():
            chains.setdefault(leaf, []).append(Row(leaf, *rest))
        return _File(fd, size, data_start, chains)


def rebuilt(
    links: Links, index: int, leaf_version: int, anchor: int, held: np.ndarray
) -> np.ndarray:
    """Leaf ``index``'s whole value (a new, read-only array): ``held``, its anchor's
    bytes, with its links applied and verified."""
    rows = links.chain(index, leaf_version, anchor)
    whole = rebuilt_leaf(LeafChain(held, anchor, links.links(rows)))
    whole.flags.writeable = False
    return whole


def reclaim(table: TableDir, entries: Sequence[str], segments: Sequence[str]) -> None:
    """Delete the patch files among ``entries`` (the directory's names) that no chain of
    ``segments`` (the segment names left after reclaiming) reaches. Deletes nothing when
    unsure (a segment or patch file that does not parse). Call under the writers' lock."""
    found = {}
    for entry in entries:
        digits = entry[len(layout.PATCH) :]
        if entry.startswith(layout.PATCH) and digits.isdigit():
            found[int(digits)] = entry
    if not found:
        return
    keep = _referenced(table, segments)
    if keep is None:
        return
    for version, entry in found.items():
        if version not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(table.file(entry), dir_fd=table.store)


def _referenced(table: TableDir, segments: Sequence[str]) -> set[int] | None:
    """The versions of the patch files the chains of ``segments`` reach; ``None`` if one
    of them could not be read."""
    keep: set[int] = set()
    fds = Descriptors()
    try:
        links = Links(table, fds)
        for name in segments:
            try:  # non-blocking: a FIFO must not block
                fd = fds.open(
                    table.file(name),
                    os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW,
                    dir_fd=table.store,
                )
            except FileNotFoundError:
                continue
            size = os.fstat(fd).st_size
            head = segment.read_head(fd, size)
            parsed = segment.parse_head(head, size, table.where(name))
            numbers = segment.leaf_versions(head, parsed, table.where(name))
            anchors = segment.anchor_versions(head, parsed, table.where(name))
            for index, (anchor, changed) in enumerate(zip(anchors, numbers)):
                if anchor:
                    keep.update(row.version for row in links.chain(index, changed, anchor))
        return keep
    except (OSError, CorruptDataError, Gone):
        return None
    finally:
        fds.close()
