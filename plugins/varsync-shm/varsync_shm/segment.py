"""One version of a table in one file: a 64-byte header, a JSON leaf index, the leaf
versions and anchor versions, the arrays.

    offset  size  field
    0       8     magic b"VSYNCSHM"
    8       4     layout version (1; 2 when a leaf is held as an anchor and its links)
    12      4     bytes before the first array (header, index, leaf versions; 64-aligned)
    16      8     table version held; 0 while a writer fills the file
    24      8     file size
    32      4     number of leaves
    36      4     index length in bytes
    40      4     offset of the leaf versions (0: none, as in files of varsync-shm 0.1)
    44      4     offset of the anchor versions (0: none, as in files before element deltas)
    48      16    reserved (zero)
    64      ...   index: JSON [[dtype, shape, offset], ...] in flat order
    ...           leaf versions: one little-endian uint64 per leaf, 8-byte aligned: the
                  table version at which the leaf last changed, 0 for "this file's
                  version" (so a whole push, which changes every leaf, writes zeros)
    ...           anchor versions: one little-endian uint64 per leaf: 0 for a leaf held
                  whole, else the leaf version whose value its bytes hold (its anchor),
                  the links since being in link files (:mod:`varsync_shm.chains`)
    ...           each array's raw bytes, C order, native byte order, 64-byte aligned

A file without leaf versions (offset 0) holds every leaf at its own version. The layout
version stays 1: readers of 0.1 ignore the field, and a writer of 0.1 that refills a file
writes a whole header without it, which is right for its whole push. A file holding an
anchor says layout 2, which a reader that does not know anchors refuses (it would read
the anchor as the leaf's value).

Arrays are raw bytes described by a dtype string and a shape, never pickles; the dtype
must be a plain number or bool, named by its ``dtype.str`` (``"<f4"``), or one of
varsync's ml_dtypes types, named by its ``dtype.name`` (``"bfloat16"``, ``"float8_e5m2"``:
their ``dtype.str``, ``"<V2"`` or ``"<V1"``, names none of them). The table version is
written last when a file is published and zeroed first when a spare file is reused, so a
file whose header names a version holds exactly that version's bytes (see
:mod:`varsync_shm.backend`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from varsync.backend import CorruptDataError, Spec

__all__ = [
    "Plan",
    "Leaf",
    "plan",
    "write",
    "fill",
    "set_version",
    "read_version",
    "parse",
    "arrays_of",
    "read_head",
    "parse_head",
    "leaf_versions",
    "head_with",
    "version_in",
    "pwrite_all",
    "anchor_versions",
    "content_versions",
]

MAGIC = b"VSYNCSHM"
LAYOUT = 1
CHAINED_LAYOUT = 2  # a file with anchors: readers without element deltas must refuse it
_LAYOUTS = (LAYOUT, CHAINED_LAYOUT)
_LAYOUT = struct.Struct("<I")  # at offset 8
ALIGN = 64
_HEADER = struct.Struct("<8sIIQQIIII16x")
_VERSION = struct.Struct("<Q")
_VERSION_OFFSET = 16
_START = struct.Struct("<I")  # at offset 12
_HEAD_GUESS = 16384  # bytes read at first for a head: a header and index of ~300 leaves
HEADER_SIZE = _HEADER.size  # 64
_CHUNK = 1 << 24  # bytes per pwrite call
_NUMERIC_KINDS = "biufc"


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _versions_at(index_length: int) -> int:
    """Where the leaf versions start, after an index of this many bytes."""
    return -(-(HEADER_SIZE + index_length) // 8) * 8


@dataclass(frozen=True)
class Leaf:
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", math.prod(self.shape) * self.dtype.itemsize)


@dataclass(frozen=True)
class Plan:
    """Where each array of a table goes in its files; the same for every version."""

    head: bytes  # header (version 0) + index + leaf and anchor versions (all 0) + padding
    leaves: tuple[Leaf, ...]
    size: int
    versions_offset: int
    anchors_offset: int


def plan(specs: Sequence[Spec]) -> Plan:
    """The file layout for a table with these flat specs (worked out once per layout:
    for 50 leaves that costs more than a partial push's system calls)."""
    return _plan(tuple(specs))


@functools.lru_cache(maxsize=64)
def _plan(specs: tuple[Spec, ...]) -> Plan:
    index_entries: list[list[Any]] = []
    # The index length depends on the offsets and the offsets on the index length:
    # lay out once with a guess, then again until the data start stops moving.
    start = HEADER_SIZE
    for _ in range(16):  # converges in two or three passes
        offset = start
        leaves = []
        index_entries = []
        for spec in specs:
            leaves.append(Leaf(spec.dtype, tuple(spec.shape), offset))
            index_entries.append([_dtype_text(spec.dtype), list(spec.shape), offset])
            offset = _aligned(offset + spec.nbytes)
        index = json.dumps(index_entries, separators=(",", ":")).encode()
        needed = _aligned(_versions_at(len(index)) + 16 * len(specs))
        if needed <= start:
            break
        start = needed
    else:  # pragma: no cover - would need an index of astronomical size
        raise AssertionError("segment layout did not converge")
    size = max(offset, start)
    versions = _versions_at(len(index))
    anchors = versions + 8 * len(specs)
    header = _HEADER.pack(MAGIC, LAYOUT, start, 0, size, len(leaves), len(index), versions, anchors)
    head = header + index + bytes(start - HEADER_SIZE - len(index))
    return Plan(
        head=head, leaves=tuple(leaves), size=size, versions_offset=versions, anchors_offset=anchors
    )


def write(fd: int, layout: Plan, arrays: Sequence[np.ndarray]) -> None:
    """Write header (version 0), index and arrays into the file ``fd`` with ``pwrite``
    (faster than a mapping for a new file, whose pages the kernel must allocate)."""
    pwrite_all(fd, memoryview(layout.head), 0)
    for leaf, array in zip(layout.leaves, arrays):
        if leaf.nbytes:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            pwrite_all(fd, raw.data, leaf.offset)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):  # bounded: every pass writes at least one byte or raises
        written = os.pwrite(fd, data[done : done + _CHUNK], offset + done)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} bytes at offset {offset + done}")
        done += written


def fill(buffer: Any, layout: Plan, arrays: Sequence[np.ndarray]) -> None:
    """Write header (version 0), index and arrays into ``buffer``, a writable mapping
    of a file of ``layout.size`` bytes."""
    memory = np.frombuffer(buffer, np.uint8, layout.size)
    memory[: len(layout.head)] = np.frombuffer(layout.head, np.uint8)
    for leaf, array in zip(layout.leaves, arrays):
        if leaf.nbytes:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            np.copyto(memory[leaf.offset : leaf.offset + leaf.nbytes], raw)


def set_version(fd: int, version: int) -> None:
    """Mark the file as holding ``version`` (0: being written, not a version)."""
    os.pwrite(fd, _VERSION.pack(version), _VERSION_OFFSET)


def version_in(head: bytes) -> int:
    """The table version in a head :func:`read_head` read (0: none)."""
    return _VERSION.unpack_from(head, _VERSION_OFFSET)[0] if len(head) >= HEADER_SIZE else 0


def read_version(fd: int) -> int:
    data = os.pread(fd, _VERSION.size, _VERSION_OFFSET)
    return _VERSION.unpack(data)[0] if len(data) == _VERSION.size else 0


@dataclass(frozen=True)
class Parsed:
    version: int
    leaves: tuple[Leaf, ...]
    start: int = 0  # bytes before the first array
    versions_offset: int = 0  # where the leaf versions are; 0: none
    anchors_offset: int = 0  # where the anchor versions are; 0: none


def parse(buffer: Any, size: int, where: str) -> Parsed:
    """The header and index of a file of ``size`` bytes whose start is in ``buffer``."""
    view = memoryview(buffer)
    parsed = parse_head(view, size, where)
    if len(view) < size:
        raise CorruptDataError(f"{where}: {len(view)} bytes read of a {size}-byte segment")
    return parsed


def parse_head(buffer: Any, size: int, where: str) -> Parsed:
    """Like :func:`parse`, from only the file's first bytes (:func:`read_head`): enough
    for the header, the index and the leaf versions."""
    view = memoryview(buffer)
    if len(view) < HEADER_SIZE:
        raise CorruptDataError(
            f"{where} is {len(view)} bytes, too short to be a varsync-shm segment"
        )
    magic, layout, start, version, total, count, index_len, versions, anchors = _HEADER.unpack_from(
        view, 0
    )
    if magic != MAGIC:
        raise CorruptDataError(f"{where} is not a varsync-shm segment (magic {magic!r})")
    if layout not in _LAYOUTS:
        raise CorruptDataError(
            f"{where} has segment layout {layout}; this varsync-shm reads layouts "
            f"{', '.join(map(str, _LAYOUTS))} (upgrade varsync-shm on every process that "
            "shares the store)"
        )
    if total != size or HEADER_SIZE + index_len > start or start > total or len(view) < start:
        raise CorruptDataError(
            f"{where}: header says {total} bytes with data from {start}, index {index_len} "
            f"bytes; the file has {size}"
        )
    if versions and (
        versions % 8 or versions < HEADER_SIZE + index_len or versions + 8 * count > start
    ):
        raise CorruptDataError(
            f"{where}: leaf versions at {versions} do not fit between the index (ending at "
            f"{HEADER_SIZE + index_len}) and the data (from {start})"
        )
    if anchors and (
        anchors % 8 or anchors < HEADER_SIZE + index_len or anchors + 8 * count > start
    ):
        raise CorruptDataError(
            f"{where}: anchor versions at {anchors} do not fit between the index (ending at "
            f"{HEADER_SIZE + index_len}) and the data (from {start})"
        )
    try:
        leaves = _leaves(bytes(view[HEADER_SIZE : HEADER_SIZE + index_len]), start, total, count)
    except CorruptDataError as exc:
        raise CorruptDataError(f"{where}: {exc}") from None
    return Parsed(
        version=version,
        leaves=leaves,
        start=start,
        versions_offset=versions,
        anchors_offset=anchors,
    )


def read_head(fd: int, size: int) -> bytes:
    """The first bytes of the file ``fd`` (of ``size`` bytes) up to its data: the header,
    the index and the leaf versions, in one ``pread`` as a rule (two for a large index)."""
    head = os.pread(fd, min(size, _HEAD_GUESS), 0)
    if len(head) >= HEADER_SIZE:
        start = _START.unpack_from(head, 12)[0]
        if len(head) < start <= size:
            head += os.pread(fd, start - len(head), len(head))
    return head


def leaf_versions(head: Any, parsed: Parsed, where: str) -> list[int]:
    """The version at which each leaf last changed, from a head :func:`parse_head` read
    (a file without leaf versions: every leaf at the file's version)."""
    count, version = len(parsed.leaves), parsed.version
    if not parsed.versions_offset:
        return [version] * count
    table = np.frombuffer(head, "<u8", count, parsed.versions_offset)
    numbers = np.where(table == 0, version, table)
    if count and int(numbers.max()) > version:
        raise CorruptDataError(
            f"{where}: a leaf version above the file's version {version} ({int(numbers.max())})"
        )
    return [int(n) for n in numbers.tolist()]


def anchor_versions(head: Any, parsed: Parsed, where: str) -> list[int]:
    """Each leaf's anchor version (0: held whole), from a head :func:`parse_head` read;
    all 0 for a file without the table. Each anchor is below its leaf's leaf version."""
    count = len(parsed.leaves)
    if not parsed.anchors_offset:
        return [0] * count
    anchors = [int(n) for n in np.frombuffer(head, "<u8", count, parsed.anchors_offset).tolist()]
    for anchor, changed in zip(anchors, leaf_versions(head, parsed, where)):
        if anchor and anchor >= changed:
            raise CorruptDataError(
                f"{where}: an anchor at version {anchor}, not before its leaf's {changed}"
            )
    return anchors


def content_versions(head: Any, parsed: Parsed, where: str) -> list[int]:
    """The leaf version whose value each leaf's bytes in the file hold: its anchor's, or
    its own for a leaf held whole. Equal numbers in two files of a table: equal bytes."""
    changed = leaf_versions(head, parsed, where)
    return [a or v for a, v in zip(anchor_versions(head, parsed, where), changed)]


def head_with(
    layout: Plan, versions: Sequence[int], version: int, anchors: Sequence[int] = ()
) -> bytes:
    """``layout.head`` recording these leaf versions (and anchor versions, 0 for a leaf
    held whole) for a file of ``version``; layout 2 if any leaf has an anchor."""
    head = bytearray(layout.head)
    table = np.array([0 if v == version else v for v in versions], "<u8").tobytes()
    head[layout.versions_offset : layout.versions_offset + len(table)] = table
    if any(anchors):
        table = np.array(anchors, "<u8").tobytes()
        head[layout.anchors_offset : layout.anchors_offset + len(table)] = table
        _LAYOUT.pack_into(head, 8, CHAINED_LAYOUT)
    return bytes(head)


def _dtype_text(dtype: np.dtype) -> str:
    """How the index names ``dtype``: its ``str`` where that names it exactly (numpy's
    own dtypes, as before ml_dtypes), else its ``name`` (bfloat16, float8_*)."""
    try:
        if np.dtype(dtype.str) == dtype:
            return dtype.str
    except TypeError:  # "<f1", float8_e5m2's str, is no dtype
        pass
    return dtype.name


def _dtype_of(text: str) -> np.dtype:
    """The dtype an index entry names (``ValueError`` if none): numpy's, or one of
    varsync's names, which numpy knows only once ml_dtypes is imported."""
    try:
        return np.dtype(text)
    except TypeError:
        return Spec((), text).dtype  # bfloat16, float8_*; SignatureError is a ValueError


def _storable(dtype: np.dtype) -> bool:
    """A native plain number or bool, or one of varsync's ml_dtypes types."""
    if dtype.kind in _NUMERIC_KINDS:
        return dtype.isnative
    try:
        return Spec((), dtype.name).dtype == dtype
    except ValueError:  # SignatureError: not a dtype varsync stores (object, void, ...)
        return False


@functools.lru_cache(maxsize=64)  # the same few indexes, pulled again and again
def _leaves(index: bytes, start: int, total: int, count: int) -> tuple[Leaf, ...]:
    try:
        leaves = tuple(
            Leaf(_dtype_of(str(dtype)), tuple(int(d) for d in shape), int(offset))
            for dtype, shape, offset in json.loads(index)
        )
    except (ValueError, TypeError) as exc:
        raise CorruptDataError(f"leaf index is malformed ({exc})") from None
    for leaf in leaves:
        if (
            not _storable(leaf.dtype)
            or any(d < 0 for d in leaf.shape)
            or leaf.offset < start
            or leaf.offset + leaf.nbytes > total
        ):
            raise CorruptDataError(f"leaf {leaf} does not fit a {total}-byte segment")
    if len(leaves) != count:
        raise CorruptDataError(f"header says {count} leaves, the index has {len(leaves)}")
    return leaves


def arrays_of(memory: np.ndarray, leaves: Sequence[Leaf]) -> list[np.ndarray]:
    """Read-only arrays viewing ``memory`` (a uint8 array over the file), without copying.

    Every non-empty array is a view of ``memory``, whose lifetime therefore ends only
    when all of them are gone (numpy's ``base`` chain stops at ``memory``, the first array
    that does not own its data and whose base is not an array).
    """
    out = []
    for leaf in leaves:
        if leaf.nbytes == 0:
            array = np.empty(leaf.shape, leaf.dtype)
            array.flags.writeable = False
        else:
            raw = memory[leaf.offset : leaf.offset + leaf.nbytes]
            array = raw.view(leaf.dtype).reshape(leaf.shape)
        out.append(array)
    return out
