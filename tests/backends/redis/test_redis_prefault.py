"""A large Redis pull's arrays faulted in on a second thread while their bytes arrive
(varsync/_prefault.py): the bytes received are never disturbed, the thread
never outlives the block, small pulls start none, and it faults every page in."""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys

import numpy as np
import pytest

pytest.importorskip("redis")

from varsync import _prefault as prefault  # noqa: E402
from varsync._prefault import PREFAULT_FROM, Prefaulted  # noqa: E402

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")


@linux_only
def test_bytes_written_while_the_thread_faults_the_pages_in_stay_as_written() -> None:
    for seed in range(3):
        array = np.empty(PREFAULT_FROM * 2, np.uint8)
        expected = np.random.default_rng(seed).integers(0, 255, array.size, np.uint8)
        expected[expected == 0] = 1  # a zero page written over a byte would show as 0
        with Prefaulted([array]) as faulting:
            step = 1 << 16  # as a receive does: in order, a piece at a time
            for start in range(0, array.size, step):
                array[start : start + step] = expected[start : start + step]
        assert not faulting.running
        assert np.array_equal(array, expected)


@linux_only
def test_the_thread_is_stopped_and_joined_when_the_block_ends_by_an_error() -> None:
    arrays = [np.empty(PREFAULT_FROM, np.uint8) for _ in range(8)]
    faulting = Prefaulted(arrays)
    with pytest.raises(KeyboardInterrupt):
        with faulting:
            assert faulting.running
            raise KeyboardInterrupt
    assert not faulting.running


def test_smaller_pulls_start_no_thread() -> None:
    arrays = [np.empty(PREFAULT_FROM // 4 - 1, np.uint8) for _ in range(4)]
    with Prefaulted(arrays) as faulting:
        assert not faulting.running
    with Prefaulted([]) as faulting:
        assert not faulting.running


def _kernel() -> tuple:
    return tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])


def _resident_share(array: np.ndarray) -> float:
    """The share of the array's whole pages that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    ((start, end),) = prefault._page_ranges([array])
    pages = (end - start) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(start, end - start, vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(v & 1 for v in vector) / pages


@linux_only
def test_the_thread_faults_in_every_page_before_the_receive_reaches_it() -> None:
    untouched = np.empty(PREFAULT_FROM * 2, np.uint8)
    assert _resident_share(untouched) < 0.5  # fresh memory: what there is to fault in
    array = np.empty(PREFAULT_FROM * 2, np.uint8)
    faulting = Prefaulted([array])
    with faulting:
        if faulting._thread is not None:
            faulting._thread.join(60)  # let it finish before anything writes
    if not prefault._usable:
        assert _kernel() < (5, 14), "MADV_POPULATE_WRITE refused on Linux 5.14 or later"
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    assert _resident_share(array) == 1.0
