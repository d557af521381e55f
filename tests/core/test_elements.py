"""Element patches (varsync._elements): bit-exact for every bit pattern, giving up when
the whole leaf is smaller, and refusing what does not add up without touching the base."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from varsync import _elements as elements
from varsync._errors import CorruptDataError
from varsync._spec import ML_DTYPE_NAMES

ml_dtypes = pytest.importorskip("ml_dtypes")
HAS_ZSTD = importlib.util.find_spec("zstandard") is not None

ML_DTYPES = [np.dtype(getattr(ml_dtypes, n)) for n in ML_DTYPE_NAMES if hasattr(ml_dtypes, n)]
COMPILED = elements._compiled  # varsync/_scan.c, as imported (tests set elements' own)


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def scanner(request, monkeypatch) -> str:
    """Every test here runs with the compiled scan, encoder and decoder, and with numpy's
    (a machine without a C compiler)."""
    monkeypatch.setattr(elements, "_compiled", COMPILED if request.param == "compiled" else None)
    return str(request.param)


ONE_BYTE = [np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.bool_)] + [
    d for d in ML_DTYPES if d.itemsize == 1
]
TWO_BYTE = [np.dtype(np.float16), np.dtype(np.uint16), np.dtype(ml_dtypes.bfloat16)]


def bits(array: np.ndarray) -> bytes:
    return array.tobytes()


def every_form(old: np.ndarray, new: np.ndarray) -> list[elements.Patch]:
    """Every encoding, each through its wire form."""
    forms = elements.candidates(old, new, compress=HAS_ZSTD)
    return [elements.Patch.from_bytes(p.to_bytes()) for p in forms]


def assert_patches_exactly(old: np.ndarray, new: np.ndarray) -> None:
    for patch in every_form(old, new):
        base = old.copy()
        assert elements.apply(base, patch) is base
        assert bits(base) == bits(new), patch.name
        out = np.empty_like(old)
        source = old.copy()
        elements.apply(source, patch, out=out)
        assert bits(out) == bits(new), patch.name
        assert bits(source) == bits(old), f"{patch.name}: apply with out= changed the base"


def all_patterns(dtype: np.dtype) -> np.ndarray:
    width = dtype.itemsize
    lane = np.uint8 if width == 1 else np.uint16
    return np.arange(1 << (8 * width), dtype=np.uint64).astype(lane).view(dtype)


@pytest.mark.parametrize("dtype", ONE_BYTE + TWO_BYTE, ids=str)
def test_every_bit_pattern_comes_back_exactly(dtype: np.dtype) -> None:
    if dtype == np.bool_:
        old = np.array([False, True] * 64, dtype)
        new = old[::-1].copy()
    else:
        old = all_patterns(dtype)
        new = np.roll(old, 1)  # every element becomes its neighbour's pattern
    assert_patches_exactly(old, new)
    # a few elements changed to arbitrary patterns, NaNs and zeros among them
    rng = np.random.default_rng(7)
    new = old.copy()
    where = rng.choice(old.size, max(1, old.size // 50), replace=False)
    new[where] = old[rng.permutation(old.size)[: where.size]]
    assert_patches_exactly(old, new)
    assert_patches_exactly(new, old)


def test_nan_payloads_and_signed_zeros_are_changes() -> None:
    patterns = np.array(
        [
            0x00000000,
            0x80000000,
            0x7FC00000,
            0x7FC00001,
            0xFFC00000,
            0x7F800001,
            0x7F800000,
            0xFF800000,
            0x00000001,
            0x80000001,
            0x3F800000,
            0x7FFFFFFF,
        ],
        np.uint32,
    )
    old = np.tile(patterns, 1000).view(np.float32)
    new = old.copy()
    flipped = np.tile(np.roll(patterns, 1), 1000).view(np.float32)
    new[::7] = flipped[::7]  # +0.0 <-> -0.0, one NaN payload for another, ...
    assert elements.changed_count(old, new) == np.count_nonzero(
        old.view(np.uint32) != new.view(np.uint32)
    )
    np.testing.assert_array_equal(
        elements.changed_positions(old, new),
        np.flatnonzero(old.view(np.uint32) != new.view(np.uint32)),
    )
    assert_patches_exactly(old, new)
    patch = elements.diff(old, new)
    assert patch is not None


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float64", "complex128"])
def test_integer_and_wide_elements(dtype: str) -> None:
    rng = np.random.default_rng(3)
    old = rng.integers(0, 2**62, 50_000, dtype=np.int64).view(np.uint8)[: 50_000 * 8]
    old = old[: (old.size // np.dtype(dtype).itemsize) * np.dtype(dtype).itemsize].view(dtype)
    old = old.reshape(-1, 2) if old.size % 2 == 0 else old
    new = old.copy()
    flat = new.reshape(-1).view(np.uint8)
    flat[rng.choice(flat.size, 300, replace=False)] ^= 0x10
    assert_patches_exactly(old, new)
    patch = elements.diff(old, new)
    assert patch is not None
    assert patch.nbytes < old.nbytes // 4


@pytest.mark.parametrize("shape", [(0,), (3, 0), ()], ids=str)
def test_empty_zero_size_and_zero_d_arrays(shape: tuple[int, ...]) -> None:
    old = np.zeros(shape, np.float32)
    new = np.full(shape, -0.0, np.float32)
    assert_patches_exactly(old, new)
    assert_patches_exactly(old, old.copy())
    # the header alone is larger than such a leaf: the whole leaf is smaller
    assert elements.diff(old, new) is None


def test_an_unchanged_leaf_is_a_header() -> None:
    old = np.arange(1 << 16, dtype=np.float32)
    patch = elements.diff(old, old.copy())
    assert patch is not None
    assert patch.changed == 0
    assert patch.nbytes < 100
    base = old.copy()
    elements.apply(base, patch)
    assert bits(base) == bits(old)


def test_a_leaf_changed_everywhere_gives_up() -> None:
    rng = np.random.default_rng(1)
    old = rng.standard_normal(1 << 20).astype(ml_dtypes.bfloat16)
    assert elements.diff(old, (old.astype(np.float32) * 1.01).astype(old.dtype)) is None
    # half changed, spread so that the sample does not decide: the exact count does
    new = old.copy()
    new[::2] = (old[::2].astype(np.float32) + 1).astype(old.dtype)
    assert elements.diff(old, new, limit=0.5) is None
    assert elements.diff(old, new, limit=None) is not None


def test_the_smallest_form_is_chosen() -> None:
    old = np.zeros(1 << 16, np.float32)
    sparse, dense = old.copy(), old.copy()
    sparse[::1000] = 1
    dense[::3] = 1
    assert elements.diff(old, sparse).name == "gaps"  # type: ignore[union-attr]
    assert elements.diff(old, dense).name == "bitmap"  # type: ignore[union-attr]


def test_a_patch_for_another_base_raises_and_leaves_the_base_unchanged() -> None:
    rng = np.random.default_rng(5)
    old = rng.standard_normal(10_000).astype(np.float32)
    new = old.copy()
    new[::100] += 1
    other = old.copy()
    other[1] = 42.0  # not a patched position: only the hash can tell
    for patch in every_form(old, new):
        base = other.copy()
        with pytest.raises(CorruptDataError, match="xxh3"):
            elements.apply(base, patch)
        assert bits(base) == bits(other), patch.name


def test_a_patch_for_another_shape_or_dtype_raises() -> None:
    old = np.zeros(100, np.float32)
    new = old.copy()
    new[3] = 1
    patch = elements.diff(old, new, limit=None)
    assert patch is not None
    for wrong in (np.zeros(101, np.float32), np.zeros(200, np.float16)):
        with pytest.raises(CorruptDataError, match="applied to"):
            elements.apply(wrong, patch)
    with pytest.raises(ValueError, match="same dtype and shape"):
        elements.diff(old, new.astype(np.float64))


def test_truncated_serialisations_raise() -> None:
    old = np.zeros(5000, np.float32)
    new = old.copy()
    new[::37] = 2.5
    for patch in every_form(old, new):
        data = patch.to_bytes()
        for end in range(len(data)):
            with pytest.raises(CorruptDataError):
                elements.apply(old.copy(), elements.Patch.from_bytes(data[:end]))
        with pytest.raises(CorruptDataError, match="bytes"):
            elements.Patch.from_bytes(data + b"\0")


def test_corrupted_serialisations_never_give_a_wrong_leaf() -> None:
    rng = np.random.default_rng(11)
    old = rng.standard_normal(3000).astype(np.float16)
    new = old.copy()
    new[rng.choice(old.size, 40, replace=False)] = 0
    for patch in every_form(old, new):
        data = bytearray(patch.to_bytes())
        for index in range(len(data)):
            for flip in (0x01, 0x80):
                data[index] ^= flip
                base = old.copy()
                try:
                    elements.apply(base, elements.Patch.from_bytes(bytes(data)))
                except CorruptDataError:
                    assert bits(base) == bits(old), (patch.name, index)
                else:
                    assert bits(base) == bits(new), (patch.name, index)
                data[index] ^= flip


@pytest.mark.parametrize(
    ("field", "offset", "value", "message"),
    [
        ("magic", 0, b"XXXX", "magic"),
        ("format", 4, b"\x09", "format"),
        ("encoding", 5, b"\x07", "encoding"),
        ("flags", 6, b"\x01", "flags"),
        ("itemsize", 7, b"\x03", "element size"),
    ],
)
def test_a_bad_header_names_the_field(field: str, offset: int, value: bytes, message: str) -> None:
    old = np.zeros(1000, np.float32)
    new = old.copy()
    new[5] = 1
    data = bytearray(elements.diff(old, new, limit=None).to_bytes())  # type: ignore[union-attr]
    data[offset : offset + len(value)] = value
    with pytest.raises(CorruptDataError, match=message):
        elements.Patch.from_bytes(bytes(data))


def test_a_read_only_or_strided_array_is_refused() -> None:
    old = np.zeros(100, np.float32)
    new = old.copy()
    new[0] = 1
    patch = elements.diff(old, new, limit=None)
    assert patch is not None
    old.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        elements.apply(old, patch)
    with pytest.raises(ValueError, match="C-contiguous"):
        elements.diff(np.zeros((10, 10))[:, ::2], np.zeros((10, 5)))


def test_the_compiled_scan_is_built_here() -> None:
    """The project's install builds varsync/_scan.c (a C compiler is part of the test
    environment): the figures in benchmarks/RESULTS.md are the compiled scan's."""
    assert elements.SCANNER == "compiled"
    assert COMPILED is not None


WIDTHS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.complex128}


@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("size", [0, 1, 15, 16, 31, 32, 33, 1000, 2 * elements.BLOCK + 7])
def test_the_compiled_and_numpy_scans_find_the_same_positions(
    monkeypatch, width: int, size: int
) -> None:
    """Every element width, sizes around the compiled scan's 32-byte groups and its
    tail (and the seams between its calls), a random bit of a random byte of each
    changed element, and the bound on changed elements exact (at the count the
    positions, one below it none), the same for both scans."""
    rng = np.random.default_rng(width * 1000 + size)
    raw = rng.integers(0, 256, size * width, dtype=np.uint8)
    old = raw.view(WIDTHS[width])
    new = old.copy()
    flat = new.view(np.uint8)
    changed = np.sort(rng.choice(size, min(size, 3 + size // 50), replace=False))
    changed = np.unique(np.concatenate([changed, [0, size - 1]] if size else [changed]))
    for position in changed:  # a bit of a random byte of each chosen element
        flat[position * width + rng.integers(width)] ^= np.uint8(1 << int(rng.integers(8)))
    a, b = elements._lanes(old), elements._lanes(new)
    lanes = max(1, width // 8)
    found = {}
    for name in ("compiled", "numpy"):
        monkeypatch.setattr(elements, "_compiled", COMPILED if name == "compiled" else None)
        monkeypatch.setattr(elements, "_scan_threads", lambda blocks: min(2, max(1, blocks)))
        monkeypatch.setattr(elements, "COMPILED_BLOCKS", 1)  # a call per block: their seams
        got = elements._changed_positions(a, b, lanes, None)
        assert got is not None
        np.testing.assert_array_equal(got, changed)
        exact = elements._scan(a, b, lanes, changed.size, range(0, a.size, elements.BLOCK * lanes))
        assert exact is not None
        np.testing.assert_array_equal(np.concatenate(exact or [np.zeros(0, np.intp)]), changed)
        if changed.size:
            starts = range(0, a.size, elements.BLOCK * lanes)
            assert elements._scan(a, b, lanes, changed.size - 1, starts) is None
        found[name] = got
    np.testing.assert_array_equal(found["compiled"], found["numpy"])


def test_the_compiled_scan_refuses_what_it_cannot_scan() -> None:
    scan = COMPILED
    assert scan is not None
    a, b = np.zeros(64, np.uint16), np.zeros(64, np.uint16)
    room = np.empty(64 + 32, np.int64)
    assert scan.changed(a, b, 2, room, 64) == 0
    b[[3, 40]] = 1
    assert scan.changed(a, b, 2, room, 64) == 2
    assert list(room[:2]) == [3, 40]
    assert scan.changed(a, b, 2, room, 1) == -1  # more than most
    for args, message in [
        ((a, b[:10], 2, room, 64), "differ in length"),
        ((a, b, 3, room, 64), "width must be"),
        ((a[:63].view(np.uint8)[:-1], b[:63].view(np.uint8)[:-1], 4, room, 1), "multiple"),
        ((a, b, 2, room, -1), "at least 0"),
        ((a, b, 2, np.empty(64, np.int64), 64), "no room"),
    ]:
        with pytest.raises(ValueError, match=message):
            scan.changed(*args)
    with pytest.raises(TypeError):
        scan.changed(a, b, 2, np.empty(96, np.int64)[::1].copy().tobytes(), 64)  # read-only


@pytest.mark.parametrize("scale", [1, 100, 200, 20_000, 3_000_000, 1 << 40, 1 << 50])
def test_the_compiled_and_numpy_varints_are_the_same_bytes(monkeypatch, scale: int) -> None:
    """Gaps of every varint length (one byte to nine), the compiled encoder's branch-free
    one- and two-byte writes among them, and positions that start at 0 or far from it:
    the same bytes from both encoders, and they decode to the positions."""
    rng = np.random.default_rng(scale % 1000)
    for size in (0, 1, 2, 3, 1000):
        gaps = rng.integers(0, scale, size, dtype=np.int64) // rng.integers(1, 3, size)
        positions = np.cumsum(gaps + 1) - 1
        if size > 2:
            positions[-1] = np.iinfo(np.int64).max - 1  # about the largest gap there can be
        count = int(positions[-1]) + 1 if size else 1
        monkeypatch.setattr(elements, "_compiled", COMPILED)
        compiled = elements._positions_section(elements.GAPS, positions, count)
        monkeypatch.setattr(elements, "_compiled", None)
        assert compiled == elements._positions_section(elements.GAPS, positions, count)
        assert len(compiled) == elements._gap_bytes(positions)
        decoded = np.cumsum(elements._unvarints(compiled, size) + np.uint64(1)) - np.uint64(1)
        np.testing.assert_array_equal(decoded.astype(np.int64), positions)
        assert COMPILED is not None
        out = np.empty(size, np.int64)
        COMPILED.ungaps(compiled, size, count, out)
        np.testing.assert_array_equal(out, positions)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099])
def test_the_compiled_and_numpy_bitmaps_are_the_same_bytes(monkeypatch, count: int) -> None:
    """Bitmaps of sizes around bytes and 64-bit words, with every share of bits set:
    the same bytes from both encoders and the same positions from both decoders."""
    rng = np.random.default_rng(count)
    for share in (0.0, 0.1, 0.5, 1.0):
        positions = np.flatnonzero(rng.random(count) < share).astype(np.int64)
        patch = elements.Patch(count, 2, elements.BITMAP, 0, positions.size, b"", b"", b"")
        sections, decoded = [], []
        for scan in (COMPILED, None):
            monkeypatch.setattr(elements, "_compiled", scan)
            sections.append(elements._positions_section(elements.BITMAP, positions, count))
            decoded.append(elements._decode_positions(patch, sections[-1]))
        assert sections[0] == sections[1]
        np.testing.assert_array_equal(decoded[0], positions)
        np.testing.assert_array_equal(decoded[1], positions)


def test_the_compiled_varints_refuse_what_they_cannot_encode() -> None:
    scan = COMPILED
    assert scan is not None
    out = bytearray(16)
    assert scan.gaps(np.array([0, 1, 129], np.int64), out) == 3  # gaps 0, 0, 127
    assert bytes(out[:3]) == bytes([0, 0, 127])
    assert scan.gaps(np.array([0, 1, 130, 130 + (1 << 20) + 1], np.int64), out) == 7
    assert bytes(out[:7]) == bytes([0, 0, 0x80, 0x01, 0x80, 0x80, 0x40])  # 128, 2**20
    for positions, room, message in [
        (np.array([5, 5], np.int64), 16, "do not ascend"),
        (np.array([5, 2], np.int64), 16, "do not ascend"),
        (np.array([-1], np.int64), 16, "do not ascend"),
        (np.array([1 << 20], np.int64), 2, "too small"),
        (np.array([1, 2, 3], np.int64), 2, "too small"),
    ]:
        with pytest.raises(ValueError, match=message):
            scan.gaps(positions, bytearray(room))
    with pytest.raises(ValueError, match="whole int64s"):
        scan.gaps(b"1234567", bytearray(16))


def test_the_compiled_decoder_refuses_what_does_not_add_up() -> None:
    """A patch from the wire is never trusted: every way the gaps can be wrong is a
    ValueError (a CorruptDataError in apply), and a swap checks every position before
    it writes anything."""
    scan = COMPILED
    assert scan is not None
    out = np.empty(8, np.int64)
    scan.ungaps(bytes([0, 0, 0x80, 0x01]), 3, 200, out)
    assert list(out[:3]) == [0, 1, 130]
    for data, changed, count, message in [
        (bytes([0, 0]), 3, 200, "end inside a varint or before the last"),
        (bytes([0, 0x80]), 2, 200, "end inside a varint"),
        (bytes([0, 0, 0]), 2, 200, "bytes left"),
        (bytes([0x80] * 9 + [1]), 1, 1 << 62, "over 9 bytes"),
        (bytes([5]), 1, 5, "past the last element"),
        (bytes([4, 0]), 2, 5, "past the last element"),
        (bytes([3, 0]), 2, 5, None),  # 3, 4: the last there is
        (bytes([0x7F] * 2), 2, 1 << 20, None),
    ]:
        if message is None:
            scan.ungaps(data, changed, count, out)
            continue
        with pytest.raises(ValueError, match=message):
            scan.ungaps(data, changed, count, out)
    with pytest.raises(ValueError, match="no room"):
        scan.ungaps(bytes([0] * 9), 9, 200, out)
    scan.unbits(bytes([0b101, 0, 0, 0, 0, 0, 0, 0, 0b10]), 3, 66, out)
    assert list(out[:3]) == [0, 2, 65]
    for bitmap, changed, count, message in [
        (bytes([1, 0]), 1, 17, "not \\(count \\+ 7\\) // 8 bytes"),
        (bytes([1]), 1, 9, "not \\(count"),
        (bytes([0b1001]), 2, 3, "past the last element"),
        (bytes([0b111]), 2, 8, "more bits set"),
        (bytes([0b11]), 3, 8, "fewer bits set"),
        (bytes([0] * 9), 9, 72, "no room"),
    ]:
        with pytest.raises(ValueError, match=message):
            scan.unbits(bitmap, changed, count, out)
    bitmap = bytearray(2)
    scan.bits(np.array([0, 9, 15], np.int64), bitmap)
    assert bytes(bitmap) == bytes([1, 0b10000010])
    with pytest.raises(ValueError, match="outside the bitmap"):
        scan.bits(np.array([16], np.int64), bytearray(2))
    target = np.arange(10, dtype=np.uint16)
    saved = np.empty(2, np.uint16)
    scan.swap(target, np.array([1, 9], np.int64), np.array([70, 90], np.uint16), 2, saved)
    assert list(target) == [0, 70, 2, 3, 4, 5, 6, 7, 8, 90]
    assert list(saved) == [1, 9]
    for positions, width, message in [
        (np.array([1, 10], np.int64), 2, "outside"),
        (np.array([-1, 2], np.int64), 2, "outside"),
        (np.array([1, 2], np.int64), 3, "width must be"),
        (np.array([1, 2, 3], np.int64), 2, "one element per position"),
    ]:
        before = target.copy()
        with pytest.raises(ValueError, match=message):
            scan.swap(target, positions, np.zeros(2, np.uint16), width, saved)
        assert np.array_equal(target, before)  # nothing written


def test_a_patch_decoded_by_either_side_applies_the_same(monkeypatch) -> None:
    """A patch made by the compiled encoder applies bit-exact through numpy's decoder and
    back; a corrupted gaps section is refused by both, the base unchanged."""
    rng = np.random.default_rng(12)
    old = rng.integers(0, 1 << 16, 300_000, dtype=np.uint16).view(ml_dtypes.bfloat16)
    new = old.copy()
    new.view(np.uint16)[rng.choice(old.size, 3000, replace=False)] ^= 0x40
    for made, applied in [(COMPILED, None), (None, COMPILED)]:
        monkeypatch.setattr(elements, "_compiled", made)
        patch = elements.diff(old, new)
        assert patch is not None
        assert patch.encoding == elements.GAPS
        monkeypatch.setattr(elements, "_compiled", applied)
        assert bits(elements.apply(old.copy(), patch)) == bits(new)
        broken = elements.Patch(
            patch.count, patch.itemsize, patch.encoding, patch.flags, patch.changed,
            patch.positions[:-1] + bytes([0x80]), patch.values, patch.digest,
        )  # fmt: skip
        base = old.copy()
        with pytest.raises(CorruptDataError):
            elements.apply(base, broken)
        assert bits(base) == bits(old)


@pytest.mark.parametrize("encoding", [elements.GAPS, elements.BITMAP])
@pytest.mark.parametrize("count", [1 << 40, (1 << 64) - 1])
@pytest.mark.parametrize("compressed", [False, True])
def test_a_header_that_overstates_the_elements_is_refused(
    encoding: int, count: int, compressed: bool
) -> None:
    """A patch from the wire whose header announces far more elements (or, compressed,
    changed elements) than its sections hold is refused before anything is allocated
    for them, and applying it leaves the base as it was."""
    flags = elements._XOR | elements._ZSTD if compressed else 0
    changed = count if compressed else 4  # uncompressed: the values bound it
    header = elements._HEADER.pack(
        elements._MAGIC, elements._FORMAT, encoding, flags, 2, count, changed, 16,
        0 if compressed else 8, bytes(16),
    )  # fmt: skip
    patch = elements.Patch.from_bytes(header + bytes(range(16)) + bytes(0 if compressed else 8))
    # without zstandard (an optional package) a compressed section cannot be read at all,
    # unless its header is refused first, as the count past 2**63 is
    unreadable = compressed and not HAS_ZSTD and count < 1 << 63
    with pytest.raises(ImportError if unreadable else CorruptDataError):
        elements.positions_of(patch)
    base = np.zeros(8, np.uint16)
    with pytest.raises(CorruptDataError):
        elements.apply(base, patch)
    assert not base.any()


def test_a_large_leaf_scanned_by_threads_finds_the_same_positions(monkeypatch) -> None:
    """A leaf of 19 blocks scanned by three threads (contiguous runs of blocks): the same
    sorted positions as one scan, and the bound on changed elements holds across them."""
    rng = np.random.default_rng(9)
    old = rng.integers(0, 1 << 16, 5_000_000, dtype=np.uint16)
    new = old.copy()
    picked = np.sort(rng.choice(old.size, 40_000, replace=False))
    new[picked] ^= 1
    monkeypatch.setattr(elements, "_scan_threads", lambda blocks: 3)
    np.testing.assert_array_equal(elements._changed_positions(old, new, 1, None), picked)
    assert elements._changed_positions(old, new, 1, 39_999) is None  # one too many, in all
    np.testing.assert_array_equal(elements._changed_positions(old, new, 1, 40_000), picked)
    patch = elements.diff(old, new, limit=None)
    assert patch is not None
    np.testing.assert_array_equal(elements.apply(old.copy(), patch), new)
    monkeypatch.setattr(elements, "_scan_threads", lambda blocks: 1)
    np.testing.assert_array_equal(elements._changed_positions(old, new, 1, None), picked)
