"""Element deltas: a changed leaf as the elements that changed, bit-exact.

:func:`diff` compares two same-dtype, same-shape C-contiguous arrays as unsigned integers
of their element width (bfloat16 and float8 as 2- and 1-byte elements, complex as 8-byte
lanes), so NaN payloads and -0.0 against +0.0 count as changes like any other bit.
It returns a :class:`Patch` holding the changed elements' positions and new values, in
the smallest of these forms, or ``None`` when the patch would not be smaller than
:data:`MAX_SHARE` of the leaf (then the caller sends the whole leaf):

- positions as ``uint32`` (``uint64`` past 2**32 elements), then the new values;
- gaps between positions as LEB128 varints (one byte for a gap under 128);
- a bitmap of every element (``count / 8`` bytes), best when many elements changed;
- with ``compress=True`` (needs the optional ``zstandard`` package, imported here only
  then): the varint gaps and the new values XORed with the old, byte planes split
  (``shuffle``), each section zstd-compressed at level 1.

Giving up is decided early: a strided sample of :data:`SAMPLE` elements first, then the
exact count block by block, stopping once the changed elements alone cannot fit.

The hot loops (the scan for changed elements, the gap varints and bitmaps both ways,
the in-place writes of :func:`apply`) are compiled (``varsync/_scan.c``) where the
install had a C compiler; else numpy does the same, to the same bytes (:data:`SCANNER`
says which).

:func:`apply` writes a patch into an array holding the old value, in place (or into
``out``), and checks the xxh3-128 hash of the whole new value that the writer put in
the patch: on a mismatch it restores what it overwrote and raises
:class:`~varsync._errors.CorruptDataError`, so the base is never changed by a failed
apply and the caller can fetch the whole leaf instead. :meth:`Patch.to_bytes` and
:meth:`Patch.from_bytes` are its wire form: a fixed header, then the two sections; every
field is checked on parsing. Push, pull and ``update`` use it
through :mod:`varsync._patches` (``docs/delta.md``, "Element deltas").
"""

from __future__ import annotations

import functools
import os
import struct
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from varsync._errors import CorruptDataError

__all__ = [
    "Patch",
    "diff",
    "candidates",
    "apply",
    "leaf_hash",
    "positions_of",
    "changed_count",
    "changed_positions",
    "sample_of",
    "changed_too_much",
    "MAX_SHARE",
    "SAMPLE",
    "BLOCK",
]

#: A patch is kept only if its serialised size is at most this share of the leaf's bytes:
#: past it, scattering the values costs more than the bytes it saves.
MAX_SHARE = 0.75
#: Elements compared first, evenly spread, to give up on a leaf that changed everywhere.
SAMPLE = 4096
#: Elements compared per block of the exact scan (the mask stays in cache).
BLOCK = 1 << 18
#: Blocks per scanning thread at least, and the most threads scanning one leaf. 4 blocks
#: (1 Mi elements): the model of benchmarks/elements.py (1-3 Mi element leaves, 2 %
#: changed) scanned in 37 ms with 4, 42 ms with 8 (numpy: 77 against 86 ms), 2 cores.
PARALLEL_BLOCKS = 4
MAX_SCAN_THREADS = 4

#: Blocks per call of the compiled scan (a thread's run is scanned in such calls).
COMPILED_BLOCKS = 16

_compiled: ModuleType | None
try:  # the compiled scan (varsync/_scan.c), built where a C compiler was at install
    from varsync import _scan as _compiled
except ImportError:  # pragma: no cover - scanned with numpy instead, to the same positions
    _compiled = None
#: Which scan finds changed elements here: ``"compiled"`` or ``"numpy"``.
SCANNER = "numpy" if _compiled is None else "compiled"
_GROUP = 32  # positions the compiled scan may write past its ``most``
_NOT_THE_WRITERS = (
    "element patch: the patched leaf's xxh3-128 differs from the writer's (a patch for "
    "another base version?); fetch the whole leaf"
)

POSITIONS, GAPS, BITMAP = 1, 2, 3
ENCODING_NAMES = {POSITIONS: "positions", GAPS: "gaps", BITMAP: "bitmap"}
_XOR, _ZSTD = 1, 2
_MAGIC = b"VSEP"
_FORMAT = 1
# magic, format, encoding, flags, itemsize, count, changed, positions bytes, values bytes,
# the xxh3-128 digest of the new value
_HEADER = struct.Struct("<4sBBBBQQQQ16s")


@dataclass(frozen=True)
class Patch:
    """The changed elements of one leaf: ``count`` elements of ``itemsize`` bytes, of
    which ``changed`` differ; ``positions`` and ``values`` are the encoded sections."""

    count: int
    itemsize: int
    encoding: int
    flags: int
    changed: int
    positions: bytes
    values: bytes
    digest: bytes

    @property
    def nbytes(self) -> int:
        """Bytes of :meth:`to_bytes`."""
        return _HEADER.size + len(self.positions) + len(self.values)

    @property
    def name(self) -> str:
        """The form, e.g. ``gaps`` or ``gaps+xor+zstd``."""
        return (
            ENCODING_NAMES[self.encoding]
            + ("+xor" if self.flags & _XOR else "")
            + ("+zstd" if self.flags & _ZSTD else "")
        )

    def to_bytes(self) -> bytes:
        header = _HEADER.pack(
            _MAGIC,
            _FORMAT,
            self.encoding,
            self.flags,
            self.itemsize,
            self.count,
            self.changed,
            len(self.positions),
            len(self.values),
            self.digest,
        )
        return b"".join((header, self.positions, self.values))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Patch:
        """The patch :meth:`to_bytes` wrote, or ``CorruptDataError`` naming the field that
        does not add up. Sections are checked against the header here; their contents
        when applied."""
        data = memoryview(data).cast("B")
        if len(data) < _HEADER.size:
            raise CorruptDataError(
                f"element patch: {len(data)} bytes, shorter than its {_HEADER.size}-byte "
                "header; fetch the whole leaf"
            )
        magic, fmt, encoding, flags, itemsize, count, changed, npos, nval, digest = (
            _HEADER.unpack_from(data)
        )
        problem = None
        if magic != _MAGIC:
            problem = f"magic {bytes(magic)!r}, expected {_MAGIC!r}"
        elif fmt != _FORMAT:
            problem = f"format {fmt}, this version reads {_FORMAT}"
        elif encoding not in ENCODING_NAMES:
            problem = f"encoding {encoding}, expected one of {sorted(ENCODING_NAMES)}"
        elif flags & ~(_XOR | _ZSTD) or flags == _XOR:
            problem = f"flags {flags:#x}, expected 0, or XOR with zstd"
        elif itemsize not in (1, 2, 4, 8, 16):
            problem = f"element size {itemsize}, expected 1, 2, 4, 8 or 16"
        elif changed > count:
            problem = f"{changed} changed elements of {count}"
        elif len(data) != _HEADER.size + npos + nval:
            problem = f"{len(data)} bytes, the header announces {_HEADER.size} + {npos} + {nval}"
        elif not flags & _ZSTD and nval != changed * itemsize:
            problem = f"{nval} value bytes for {changed} elements of {itemsize} bytes"
        if problem is not None:
            raise CorruptDataError(f"element patch: {problem}; fetch the whole leaf")
        start = _HEADER.size
        return cls(
            count,
            itemsize,
            encoding,
            flags,
            changed,
            bytes(data[start : start + npos]),
            bytes(data[start + npos :]),
            bytes(digest),
        )


# -- comparing ---------------------------------------------------------------------------


def _lanes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as unsigned integers of its element width (16-byte elements as
    two 8-byte lanes)."""
    if not array.flags.c_contiguous:
        raise ValueError("element patch: arrays must be C-contiguous; pass np.ascontiguousarray")
    width = array.dtype.itemsize
    lane = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}.get(width)
    if lane is None:
        raise ValueError(f"element patch: element size {width} is not 1, 2, 4, 8 or 16 bytes")
    return array.reshape(-1).view(lane)


def _element_mask(old: np.ndarray, new: np.ndarray, lanes: int) -> np.ndarray:
    mask: np.ndarray = np.not_equal(old, new)
    if lanes > 1:
        mask = np.asarray(mask.reshape(-1, lanes).any(axis=1))
    return mask


def leaf_hash(array: np.ndarray) -> bytes:
    """xxh3-128 of the array's bytes (the hash ``varsync._delta`` keeps of a leaf)."""
    import xxhash  # a core dependency

    return bytes(xxhash.xxh3_128_digest(array.reshape(-1).view(np.uint8).data))


def _check_pair(old: np.ndarray, new: np.ndarray) -> None:
    if old.dtype != new.dtype or old.shape != new.shape:
        raise ValueError(
            f"element patch: old is {old.dtype}{list(old.shape)}, new is "
            f"{new.dtype}{list(new.shape)}; a patch needs the same dtype and shape"
        )


def _bound(count: int, itemsize: int, limit: float) -> int:
    """The most changed elements a patch within ``limit`` of the leaf can hold: each
    costs its value and at least one byte of position, or the bitmap is paid once."""
    budget = limit * count * itemsize - _HEADER.size
    return max(0, int(max(budget / (itemsize + 1), (budget - count / 8) / itemsize)))


def changed_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Sorted flat positions of the elements that differ bitwise: the exact scan
    :func:`diff` makes (no sample, no bound), compiled where it was built."""
    _check_pair(old, new)
    lanes = max(1, old.dtype.itemsize // 8)
    found = _changed_positions(_lanes(old), _lanes(new), lanes, None)
    assert found is not None  # no bound: never given up
    return found


def changed_count(old: np.ndarray, new: np.ndarray) -> int:
    """How many elements differ bitwise."""
    _check_pair(old, new)
    lanes = max(1, old.dtype.itemsize // 8)
    return int(np.count_nonzero(_element_mask(_lanes(old), _lanes(new), lanes)))


@functools.lru_cache(maxsize=1024)
def _picks(count: int, lanes: int) -> np.ndarray:
    """The lanes of :data:`SAMPLE` elements evenly spread over ``count`` (read-only: one
    array per leaf shape, kept; a push that gives up samples every leaf, and computing
    the picks cost more than the samples)."""
    picks = np.linspace(0, count - 1, SAMPLE).astype(np.intp)
    if lanes > 1:
        picks = (picks[:, None] * lanes + np.arange(lanes)).reshape(-1)
    picks.flags.writeable = False
    return picks


def _sample_over(sample_old: np.ndarray, sample_new: np.ndarray, lanes: int, share: float) -> bool:
    """Whether the sampled elements' changed share is clearly over ``share``: by 0.05,
    ~6 standard deviations of the sampled share at :data:`SAMPLE` elements."""
    sampled = np.count_nonzero(_element_mask(sample_old, sample_new, lanes))
    return bool(sampled / SAMPLE > share + 0.05)


def sample_of(array: np.ndarray) -> np.ndarray | None:
    """A copy of :data:`SAMPLE` of the array's elements, evenly spread (``None`` for an
    array too small to sample): :func:`changed_too_much` later tells from it alone
    whether a patch from this value could fit."""
    a = _lanes(array)
    lanes = max(1, array.dtype.itemsize // 8)
    count = a.size // lanes
    if count <= 4 * SAMPLE:
        return None
    sample: np.ndarray = a[_picks(count, lanes)]
    return sample


def changed_too_much(sample: np.ndarray, new: np.ndarray, limit: float) -> bool:
    """Whether ``new`` differs from the value ``sample`` (:func:`sample_of`) was taken
    of in clearly too many elements for a patch within ``limit`` of the leaf's bytes,
    as the sample shows (the test :func:`diff` makes before its exact scan)."""
    b = _lanes(new)
    lanes = max(1, new.dtype.itemsize // 8)
    count = b.size // lanes
    picks = _picks(count, lanes)
    if sample.shape != picks.shape or sample.dtype != b.dtype:
        raise ValueError("element patch: the sample is of another shape or dtype")
    most = _bound(count, new.dtype.itemsize, limit)
    return _sample_over(sample, b[picks], lanes, most / count)


def _scan(
    old: np.ndarray, new: np.ndarray, lanes: int, most: int | None, starts: range
) -> list[np.ndarray] | None:
    """The changed positions in the blocks starting at ``starts`` (lane offsets), or
    ``None`` once more than ``most`` of them."""
    if _compiled is not None:
        return _scan_compiled(old, new, lanes, most, starts)
    found = []
    total = 0
    step = BLOCK * lanes
    for start in starts:
        mask = _element_mask(old[start : start + step], new[start : start + step], lanes)
        where = np.flatnonzero(mask)
        total += where.size
        if most is not None and total > most:
            return None
        if where.size:
            found.append(where + start // lanes)
    return found


def _scan_compiled(
    old: np.ndarray, new: np.ndarray, lanes: int, most: int | None, starts: range
) -> list[np.ndarray] | None:
    """:func:`_scan` by the compiled scan, :data:`COMPILED_BLOCKS` blocks per call into
    one buffer of positions (of ``most`` at most), each call's found copied out."""
    assert _compiled is not None
    width = old.itemsize * lanes
    calls = range(0, len(starts), COMPILED_BLOCKS)
    per_call = min(BLOCK * COMPILED_BLOCKS, old.size // lanes)
    room = per_call if most is None else min(per_call, most + 1)
    out = np.empty(room + _GROUP, np.int64)
    found = []
    total = 0
    for first in calls:
        start = starts[first]
        stop = starts[min(first + COMPILED_BLOCKS, len(starts)) - 1] + BLOCK * lanes
        left = room if most is None else min(room, most - total)
        count = _compiled.changed(old[start:stop], new[start:stop], width, out, left)
        if count < 0:
            return None
        total += count
        if count:
            found.append(out[:count] + start // lanes)
    return found


def _scan_threads(blocks: int) -> int:
    """How many threads scan a leaf of ``blocks`` blocks: one below
    :data:`PARALLEL_BLOCKS` per thread (starting a thread costs more than the scan), else
    up to :data:`MAX_SCAN_THREADS`, at most the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_SCAN_THREADS, cpus, blocks // PARALLEL_BLOCKS))


def _changed_positions(
    old: np.ndarray, new: np.ndarray, lanes: int, most: int | None
) -> np.ndarray | None:
    """Sorted positions of the changed elements, or ``None`` once more than ``most``.

    A large leaf's blocks are scanned by a few threads, each a contiguous run of them
    (numpy's comparison and ``flatnonzero`` release the GIL: two threads scanned 100 MB
    of bf16 in 12.5 ms against 21.3 ms for one, on 2 cores). A thread is started per
    call, not pooled, so a forked child scans as its parent does."""
    count = old.size // lanes
    if most is not None and count > 4 * SAMPLE:
        picks = _picks(count, lanes)
        if _sample_over(old[picks], new[picks], lanes, most / count):
            return None
    step = BLOCK * lanes
    starts = range(0, old.size, step)
    threads = _scan_threads(len(starts))
    if threads == 1:
        found = _scan(old, new, lanes, most, starts)
    else:
        share = -(-len(starts) // threads)
        runs = [starts[k * share : (k + 1) * share] for k in range(threads)]
        results: list[list[np.ndarray] | BaseException | None] = [None] * threads

        def scan_run(k: int) -> None:
            try:
                results[k] = _scan(old, new, lanes, most, runs[k])
            except BaseException as error:  # handed to the caller below
                results[k] = error

        helpers = [
            threading.Thread(target=scan_run, args=(k,), name="varsync-diff", daemon=True)
            for k in range(1, threads)
        ]
        for helper in helpers:
            helper.start()
        scan_run(0)
        for helper in helpers:
            helper.join()
        for result in results:
            if isinstance(result, BaseException):
                raise result
        parts = [r for r in results if not isinstance(r, BaseException)]
        if any(r is None for r in parts):
            return None
        found = [a for r in parts if r is not None for a in r]
        if most is not None and sum(a.size for a in found) > most:
            return None
    if found is None:
        return None
    return np.concatenate(found) if found else np.zeros(0, np.intp)


# -- encoding ----------------------------------------------------------------------------


def _varint_lengths(gaps: np.ndarray) -> np.ndarray:
    lengths = np.ones(gaps.size, np.intp)
    shift = 7
    while shift < 64 and gaps.size and gaps.max() >= (1 << shift):
        lengths += gaps >= np.uint64(1 << shift)
        shift += 7
    return lengths


def _varints(gaps: np.ndarray) -> bytes:
    """LEB128 of non-negative integers, vectorised: every first byte in one pass, the
    few longer varints' further bytes over just their indices."""
    gaps = gaps.astype(np.uint64)
    if not gaps.size:
        return b""
    lengths = _varint_lengths(gaps)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]), np.uint8)
    longer = lengths > 1
    out[starts] = (gaps & np.uint64(0x7F)).astype(np.uint8) | (longer.astype(np.uint8) << 7)
    rest = np.flatnonzero(longer)
    byte = 1
    while rest.size:
        more = lengths[rest] > byte + 1
        part = (gaps[rest] >> np.uint64(7 * byte)) & np.uint64(0x7F)
        out[starts[rest] + byte] = part.astype(np.uint8) | (more.astype(np.uint8) << 7)
        rest = rest[more]
        byte += 1
    return out.tobytes()


def _unvarints(data: bytes, changed: int) -> np.ndarray:
    raw = np.frombuffer(data, np.uint8)
    last = raw < 0x80
    ends = np.flatnonzero(last)
    if ends.size != changed or (raw.size and not last[-1]):
        raise CorruptDataError(
            f"element patch: gap section holds {ends.size} complete varints "
            f"({raw.size} bytes), expected {changed}; fetch the whole leaf"
        )
    if raw.size == changed:  # every gap under 128: one byte each
        return raw.astype(np.uint64)
    starts = np.empty(changed, np.intp)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 9:
        raise CorruptDataError("element patch: a gap varint over 9 bytes; fetch the whole leaf")
    # every first byte in one pass, then the further bytes of just the longer varints
    # (the encoder's order; 4x faster than summing shifted bytes per varint)
    gaps = (raw[starts] & np.uint8(0x7F)).astype(np.uint64)
    rest = np.flatnonzero(lengths > 1)
    byte = 1
    while rest.size:
        bits = (raw[starts[rest] + byte] & np.uint8(0x7F)).astype(np.uint64)
        gaps[rest] |= bits << np.uint64(7 * byte)
        rest = rest[lengths[rest] > byte + 1]
        byte += 1
    return gaps


def _positions_section(kind: int, positions: np.ndarray, count: int) -> bytes:
    if kind == POSITIONS:
        return positions.astype("<u4" if count <= 1 << 32 else "<u8").tobytes()
    if kind == GAPS:
        if _compiled is not None:  # room for the longest varints (pages touched only as
            # written), and for a two-byte write's spill past the last
            out = np.empty(10 * positions.size + 2, np.uint8)
            written = _compiled.gaps(np.ascontiguousarray(positions, np.int64), out)
            return out[:written].tobytes()
        gaps = np.diff(positions, prepend=-1) - 1 if positions.size else positions
        return _varints(gaps)
    if _compiled is not None:
        bitmap = bytearray((count + 7) // 8)
        _compiled.bits(np.ascontiguousarray(positions, np.int64), bitmap)
        return bytes(bitmap)
    bits = np.zeros(count, np.bool_)
    bits[positions] = True
    return np.packbits(bits, bitorder="little").tobytes()


def _gap_bytes(positions: np.ndarray) -> int:
    if not positions.size:
        return 0
    gaps = np.diff(positions, prepend=-1) - 1
    total = positions.size
    for shift in range(7, 64, 7):
        more = int(np.count_nonzero(gaps >= (1 << shift)))
        if not more:
            break
        total += more
    return total


def _shuffle(values: np.ndarray, itemsize: int) -> np.ndarray:
    return np.ascontiguousarray(values.view(np.uint8).reshape(-1, itemsize).T)


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "element patches with compress=True need zstandard: pip install zstandard"
        ) from error
    return zstandard


def candidates(
    old: np.ndarray, new: np.ndarray, *, compress: bool = False, positions: Any = None
) -> list[Patch]:
    """Every form of the patch from ``old`` to ``new`` (never giving up): what
    :func:`diff` chooses from, and what the benchmark reports."""
    _check_pair(old, new)
    a, b = _lanes(old), _lanes(new)
    lanes = max(1, old.dtype.itemsize // 8)
    if positions is None:
        positions = _changed_positions(a, b, lanes, None)
    return _forms(a, b, lanes, positions, leaf_hash(new), compress, every=True)


def _forms(
    a: np.ndarray,
    b: np.ndarray,
    lanes: int,
    positions: np.ndarray,
    digest: bytes,
    compress: bool,
    every: bool,
) -> list[Patch]:
    count, itemsize = a.size // lanes, a.itemsize * lanes
    rows_new = (b[positions] if lanes == 1 else b.reshape(count, lanes)[positions]).reshape(
        -1, lanes
    )
    values = rows_new.tobytes()
    # the compiled encoder writes the gaps' varints faster than numpy counts their bytes
    gap_section = None if _compiled is None else _positions_section(GAPS, positions, count)
    sizes = {
        POSITIONS: positions.size * (4 if count <= 1 << 32 else 8),
        GAPS: _gap_bytes(positions) if gap_section is None else len(gap_section),
        BITMAP: (count + 7) // 8,
    }

    def section(kind: int) -> bytes:
        if kind == GAPS and gap_section is not None:
            return gap_section
        return _positions_section(kind, positions, count)

    kinds = sorted(sizes) if every else [min(sizes, key=lambda k: sizes[k])]
    forms = [
        Patch(count, itemsize, k, 0, positions.size, section(k), values, digest) for k in kinds
    ]
    if compress:
        zstd = _zstd().ZstdCompressor(level=1)
        xor = rows_new ^ a.reshape(count, lanes)[positions]
        packed = zstd.compress(_shuffle(xor, itemsize).tobytes())
        gaps = zstd.compress(section(GAPS))
        forms.append(
            Patch(count, itemsize, GAPS, _XOR | _ZSTD, positions.size, gaps, packed, digest)
        )
    return forms


def diff(
    old: np.ndarray,
    new: np.ndarray,
    *,
    limit: float | None = MAX_SHARE,
    compress: bool = False,
    digest: bytes | None = None,
) -> Patch | None:
    """The smallest patch from ``old`` to ``new``, or ``None`` when it would be over
    ``limit`` times the leaf's bytes (``limit=None``: always a patch). ``digest``: the
    :func:`leaf_hash` of ``new`` where the caller has it already (a push that hashed the
    leaf to tell whether it changed), else it is computed here."""
    _check_pair(old, new)
    a, b = _lanes(old), _lanes(new)
    lanes = max(1, old.dtype.itemsize // 8)
    count, itemsize = a.size // lanes, old.dtype.itemsize
    most = None if limit is None else _bound(count, itemsize, limit)
    positions = _changed_positions(a, b, lanes, most)
    if positions is None:
        return None
    digest = leaf_hash(new) if digest is None else digest
    forms = _forms(a, b, lanes, positions, digest, compress, every=False)
    best = min(forms, key=lambda p: p.nbytes)
    if limit is not None and best.nbytes > limit * old.nbytes:
        return None
    return best


# -- applying ----------------------------------------------------------------------------


def _decode_positions(patch: Patch, section: bytes) -> np.ndarray:
    count, changed = patch.count, patch.changed
    if patch.encoding == POSITIONS:
        width = 4 if count <= 1 << 32 else 8
        if len(section) != changed * width:
            raise CorruptDataError(
                f"element patch: {len(section)} position bytes for {changed} positions of "
                f"{width} bytes; fetch the whole leaf"
            )
        positions = np.frombuffer(section, f"<u{width}").astype(np.int64)
    elif _compiled is not None:  # gaps or a bitmap: checked as they are decoded
        decode = _compiled.ungaps if patch.encoding == GAPS else _compiled.unbits
        # what the header says is bounded by the section before anything is allocated:
        # a varint is a byte at least, a bitmap a bit per element
        room = len(section) if patch.encoding == GAPS else 8 * len(section)
        if changed > room or count >= 1 << 63:
            raise CorruptDataError(
                f"element patch: {changed} changed elements of {count} in a "
                f"{len(section)}-byte {patch.name} section; fetch the whole leaf"
            )
        positions = np.empty(changed, np.int64)
        try:
            decode(section, changed, count, positions)
        except ValueError as error:
            raise CorruptDataError(f"element patch: {error}; fetch the whole leaf") from None
        return positions
    elif patch.encoding == GAPS:
        positions = np.cumsum(_unvarints(section, changed) + np.uint64(1)).astype(np.int64) - 1
    else:
        if len(section) != (count + 7) // 8:
            raise CorruptDataError(
                f"element patch: bitmap of {len(section)} bytes for {count} elements; "
                "fetch the whole leaf"
            )
        bits = np.unpackbits(np.frombuffer(section, np.uint8), bitorder="little")
        if bits[count:].any():
            raise CorruptDataError("element patch: bitmap bits set past the last element")
        positions = np.flatnonzero(bits[:count])
        if positions.size != changed:
            raise CorruptDataError(
                f"element patch: bitmap marks {positions.size} elements, the header {changed}"
            )
    if changed and (positions[0] < 0 or positions[-1] >= count or np.any(np.diff(positions) <= 0)):
        raise CorruptDataError(
            f"element patch: positions not increasing within 0..{count - 1}; fetch the whole leaf"
        )
    return positions


def _rows_shape(count: int, lanes: int) -> tuple[int, ...]:
    """Elements as rows of lanes, or flat where an element is one lane (numpy gathers
    and scatters a flat array 1.4-1.7x faster than one of one-lane rows)."""
    return (count, lanes) if lanes > 1 else (count,)


def _decode_values(
    patch: Patch, rows_old: np.ndarray | None, lane: np.dtype[Any], lanes: int
) -> np.ndarray:
    """The new values, as rows of ``lanes`` lanes; ``rows_old``, the old values at the
    patch's positions, is needed only for an XOR patch."""
    expected = patch.changed * patch.itemsize
    data = patch.values
    if patch.flags & _ZSTD:
        try:
            data = _zstd().ZstdDecompressor().decompress(data, max_output_size=expected)
        except _zstd().ZstdError as error:
            raise CorruptDataError(f"element patch: values do not decompress ({error})") from error
    if len(data) != expected:
        raise CorruptDataError(
            f"element patch: {len(data)} value bytes, expected {expected}; fetch the whole leaf"
        )
    raw = np.frombuffer(data, np.uint8)
    if patch.flags & _ZSTD:
        raw = np.ascontiguousarray(raw.reshape(patch.itemsize, patch.changed).T)
    values = raw.view(lane).reshape(_rows_shape(patch.changed, lanes))
    if patch.flags & _XOR:
        assert rows_old is not None  # the caller gathers them for an XOR patch
        values = np.bitwise_xor(values, rows_old)
    return values


def _positions_bytes(patch: Patch) -> bytes:
    section = patch.positions
    if patch.flags & _ZSTD:
        if patch.changed > (sys.maxsize - 1) // 10:  # no room could be that large
            raise CorruptDataError(
                f"element patch: {patch.changed} changed elements; fetch the whole leaf"
            )
        try:
            section = (
                _zstd()
                .ZstdDecompressor()
                .decompress(section, max_output_size=10 * patch.changed + 1)
            )
        except _zstd().ZstdError as error:
            raise CorruptDataError(
                f"element patch: positions do not decompress ({error})"
            ) from error
    return section


def positions_of(patch: Patch) -> np.ndarray:
    """The flat positions of the elements ``patch`` changes, increasing (checked)."""
    return _decode_positions(patch, _positions_bytes(patch))


def apply(base: np.ndarray, patch: Patch, out: np.ndarray | None = None) -> np.ndarray:
    """``base`` (the old value) with ``patch`` applied, in place, or into ``out`` (which
    then gets a copy of ``base`` first); returns the array written.

    Raises ``CorruptDataError`` when the patch does not fit ``base`` or its result's
    hash is not the writer's: ``base`` is then unchanged (restored if written in place),
    and ``out``'s contents are undefined."""
    target = base if out is None else out
    if not target.flags.writeable or not base.flags.c_contiguous or not target.flags.c_contiguous:
        raise ValueError("element patch: apply needs C-contiguous arrays and a writable target")
    if target is not base and (target.dtype != base.dtype or target.shape != base.shape):
        raise ValueError(
            f"element patch: out is {target.dtype}{list(target.shape)}, base "
            f"{base.dtype}{list(base.shape)}"
        )
    lanes = max(1, base.dtype.itemsize // 8)
    if base.size != patch.count or base.dtype.itemsize != patch.itemsize:
        raise CorruptDataError(
            f"element patch: for {patch.count} elements of {patch.itemsize} bytes, applied to "
            f"{base.size} of {base.dtype.itemsize} ({base.dtype}); fetch the whole leaf"
        )
    positions = positions_of(patch)
    if _compiled is not None and not patch.flags & _XOR:
        return _apply_compiled(base, target, patch, positions)
    rows = _lanes(base).reshape(_rows_shape(patch.count, lanes))
    # the old values, gathered once: for an XOR patch, and to restore a patch applied
    # in place that does not verify
    old = rows[positions] if target is base or patch.flags & _XOR else None
    values = _decode_values(patch, old, rows.dtype, lanes)
    if target is not base:
        np.copyto(target, base)
    written = _lanes(target).reshape(_rows_shape(patch.count, lanes))
    written[positions] = values
    if leaf_hash(target) != patch.digest:
        if target is base:
            assert old is not None
            written[positions] = old
        raise CorruptDataError(_NOT_THE_WRITERS)
    return target


def _apply_compiled(
    base: np.ndarray, target: np.ndarray, patch: Patch, positions: np.ndarray
) -> np.ndarray:
    """:func:`apply`'s writes by the compiled ``swap``: each new value written where it
    goes and what it overwrote kept, in one pass (numpy's gather and scatter took about
    10 ns per element each), then undone the same way if the hash is not the writer's."""
    assert _compiled is not None
    lanes = max(1, base.dtype.itemsize // 8)
    values = _decode_values(patch, None, _lanes(base).dtype, lanes)
    if target is not base:
        np.copyto(target, base)
    flat = _lanes(target)
    saved = np.empty_like(values)
    _compiled.swap(flat, positions, values, patch.itemsize, saved)
    if leaf_hash(target) != patch.digest:
        if target is base:
            _compiled.swap(flat, positions, saved, patch.itemsize, np.empty_like(saved))
        raise CorruptDataError(_NOT_THE_WRITERS)
    return target
