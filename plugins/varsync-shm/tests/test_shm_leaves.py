"""Leaf versions on shm:// (varsync_shm.leaves): what a partial push copies, what a delta
pull reads, retention of leaves unchanged for long, bases, two writer processes, and a
table created again. Bytes moved are counted by the backend itself (``details()``'s
``leaf_bytes_written`` and ``leaf_bytes_read``); the conformance suite checks the rest
of the ability on every backend.
"""

import gc
import math
import os
import shutil

import numpy as np
import pytest
from shm_helpers import CONTEXT, open_fds
from test_shm_reliability import Interrupts

import varsync
from varsync.backend import Head
from varsync.testing.faults import settled_fds
from varsync_shm import layout
from varsync_shm.backend import ShmBackend
from varsync_shm.reading import MAP_ABOVE

#: Leaf 0 is mapped by pulls (2 MiB > MAP_ABOVE), the others are copied.
SPECS = [
    varsync.Spec((512, 1024), "float32"),
    varsync.Spec((1000,), "float32"),
    varsync.Spec((3, 3), "float64"),
    varsync.Spec((), "int64"),
]
SIZES = [s.nbytes for s in SPECS]
TABLE = "t"
FOREVER = math.inf  # no deadline


def leaf(index, number):
    return np.full(SPECS[index].shape, number, SPECS[index].dtype)


def numbers_of(arrays):
    out = []
    for array in arrays:
        held = np.unique(np.asarray(array))
        assert held.size == 1, f"a torn leaf: {held[:4]}"
        out.append(int(held[0]))
    return out


def open_backend(store_name):
    backend = ShmBackend(f"shm://{store_name}", timeout=30.0, namespace="")
    backend.create_table(TABLE, "signature text", SPECS)
    return backend


@pytest.fixture
def backend(store_name):
    backend = open_backend(store_name)
    yield backend
    backend.close()


def moved(backend):
    details = backend.details(TABLE)
    return details["leaf_bytes_written"], details["leaf_bytes_read"]


def write_whole(backend, number):
    arrays = [leaf(i, number) for i in range(len(SPECS))]
    return backend.write(TABLE, arrays, SPECS, FOREVER).version


def at(backend, version):
    """``version`` of the table's current history, as a base for a partial push."""
    return Head(version, backend.head(TABLE, FOREVER).epoch)


def push(backend, leaves, base=None):
    """A partial push (on top of head ``base``, if given): the new version, or 0 if it
    was refused (nothing written)."""
    head = backend.write_leaves(TABLE, leaves, SPECS, base, FOREVER)
    return 0 if head is None else head.version


def leaf_versions_of(backend):
    head, numbers = backend.leaf_versions(TABLE, FOREVER)
    return head.version, numbers


def read(backend, newer_than):
    head, arrays = backend.read(TABLE, newer_than, FOREVER, SPECS)
    return head.version, arrays


def read_leaves(backend, newer_than):
    head, numbers, arrays = backend.read_leaves(TABLE, newer_than, FOREVER, SPECS)
    return head.version, numbers, arrays


def test_partial_pushes_compose_on_the_current_version(backend):
    assert write_whole(backend, 1) == 1
    assert push(backend, {1: leaf(1, 2)}) == 2
    assert push(backend, {3: leaf(3, 3), 2: leaf(2, 3)}) == 3
    assert leaf_versions_of(backend) == (3, [1, 2, 3, 3])
    version, arrays = read(backend, 0)
    assert version == 3
    assert numbers_of(arrays) == [1, 2, 3, 3]
    assert write_whole(backend, 4) == 4  # a whole push: every leaf at its version
    assert leaf_versions_of(backend) == (4, [4, 4, 4, 4])


def test_write_leaves_into_an_empty_table_writes_nothing(backend):
    assert push(backend, {1: leaf(1, 2)}) == 0
    assert push(backend, {1: leaf(1, 2)}, base=at(backend, 0)) == 0
    assert backend.head(TABLE, FOREVER).version == 0
    assert backend.details(TABLE)["segments"] == []
    assert leaf_versions_of(backend) == (0, [])


def test_a_delta_pull_returns_and_reads_only_the_changed_leaves(backend):
    write_whole(backend, 1)
    push(backend, {1: leaf(1, 2)})
    push(backend, {3: leaf(3, 3)})
    before = moved(backend)[1]
    version, numbers, arrays = read_leaves(backend, 2)
    assert (version, numbers) == (3, [1, 2, 1, 3])
    assert [a is None for a in arrays] == [True, True, True, False]
    assert int(arrays[3]) == 3
    assert moved(backend)[1] - before == SIZES[3]  # 8 bytes, not the 2 MB table
    version, numbers, arrays = read_leaves(backend, 1)
    assert [a is None for a in arrays] == [True, False, True, False]
    assert numbers_of([arrays[1], arrays[3]]) == [2, 3]
    assert moved(backend)[1] - before == 2 * SIZES[3] + SIZES[1]
    assert read_leaves(backend, 3) == (3, None, None)
    version, numbers, arrays = read_leaves(backend, 0)
    assert numbers_of(arrays) == [1, 2, 1, 3]
    assert not any(a.flags.writeable for a in arrays)
    assert SIZES[0] > MAP_ABOVE
    assert not arrays[0].flags.owndata  # a view of the segment


def test_a_delta_pull_of_small_leaves_pins_no_version(backend):
    """Small changed leaves are copied: holding them keeps no segment from reclaiming."""
    write_whole(backend, 1)
    push(backend, {3: leaf(3, 2)})
    _, _, held = read_leaves(backend, 1)
    for k in range(3, 6):
        push(backend, {3: leaf(3, k)})
    assert len(backend.details(TABLE)["segments"]) == 2  # current and the spare
    assert int(held[3]) == 2
    _, _, mapped = read_leaves(backend, 0)  # leaf 0 is a view: a pin
    push(backend, {3: leaf(3, 6)})
    push(backend, {3: leaf(3, 7)})
    assert len(backend.details(TABLE)["segments"]) == 3  # the pinned one stays
    assert numbers_of(mapped) == [1, 1, 1, 5]


def test_a_partial_push_onto_the_spare_copies_only_what_changed_since_it(backend):
    write_whole(backend, 1)
    assert backend.details(TABLE)["segments"] == ["seg-1"]  # no spare yet
    push(backend, {3: leaf(3, 2)})  # a new file: one whole copy
    assert moved(backend)[0] == sum(SIZES)
    push(backend, {3: leaf(3, 3)})  # onto seg-1's spare: leaf 3
    assert moved(backend)[0] == sum(SIZES) + SIZES[3]
    # onto seg-2's spare: leaf 1, given, and leaf 3, which changed at version 3
    push(backend, {1: leaf(1, 4)})
    assert moved(backend)[0] == sum(SIZES) + 2 * SIZES[3] + SIZES[1]
    version, arrays = read(backend, 0)
    assert version == 4
    assert numbers_of(arrays) == [1, 4, 1, 3]
    assert leaf_versions_of(backend) == (4, [1, 4, 1, 3])


def test_a_leaf_unchanged_for_10000_versions_stays_readable(backend):
    write_whole(backend, 1)
    pushes = 10_000
    for k in range(2, pushes + 2):
        push(backend, {3: leaf(3, k)})
    last = pushes + 1
    assert leaf_versions_of(backend) == (last, [1, 1, 1, last])
    version, arrays = read(backend, 0)
    assert version == last
    assert numbers_of(arrays) == [1, 1, 1, last]
    _, _, changed = read_leaves(backend, last - 1)
    assert [a is None for a in changed] == [True, True, True, False]
    assert len(backend.details(TABLE)["segments"]) <= 2  # current and the spare
    # the first partial push copied the table once; every other one its 8 bytes
    assert moved(backend)[0] == sum(SIZES) + (pushes - 1) * SIZES[3]


def test_a_base_that_is_not_current_writes_nothing(backend):
    write_whole(backend, 1)
    assert push(backend, {1: leaf(1, 2)}, base=at(backend, 1)) == 2
    files = sorted(os.listdir(backend.details(TABLE)["path"]))
    assert push(backend, {1: leaf(1, 3)}, base=at(backend, 1)) == 0
    assert push(backend, {1: leaf(1, 3)}, base=at(backend, 7)) == 0
    assert sorted(os.listdir(backend.details(TABLE)["path"])) == files
    assert leaf_versions_of(backend) == (2, [1, 2, 1, 1])
    assert push(backend, {1: leaf(1, 3)}, base=at(backend, 2)) == 3


def test_a_base_of_another_history_writes_nothing(backend, store_name):
    write_whole(backend, 1)
    base = backend.write_leaves(TABLE, {1: leaf(1, 2)}, SPECS, None, FOREVER)
    assert base.version == 2
    delete_table(store_name)
    other = open_backend(store_name)
    try:
        write_whole(other, 5)
        push(other, {3: leaf(3, 6)})  # version 2 of the new history
        assert backend.head(TABLE, FOREVER).version == base.version
        assert push(backend, {1: leaf(1, 3)}, base=base) == 0  # the epoch differs
        assert leaf_versions_of(other) == (2, [1, 1, 1, 2])
    finally:
        other.close()


def delete_table(store_name):
    shutil.rmtree(layout.table_path(layout.namespace_path(store_name, ""), TABLE))


def test_a_table_created_again_answers_with_its_new_epoch(backend, store_name):
    """Answers name the history they are of (the table's epoch): the core compares it
    with the held version's and turns a delta pull of an old history's version into a
    reset (the next test); the backend remembers nothing itself."""
    write_whole(backend, 1)
    push(backend, {1: leaf(1, 2)})
    held = backend.read(TABLE, 0, FOREVER, SPECS).head
    assert held.version == 2
    delete_table(store_name)
    other = open_backend(store_name)
    try:
        write_whole(other, 5)
        for k in range(6, 9):  # past the version held, in the new history
            push(other, {0: leaf(0, k)})
        answer = backend.read_leaves(TABLE, held.version, FOREVER, SPECS)
        assert answer.head.version == 4
        assert answer.head.epoch != held.epoch
        assert numbers_of([a for a in answer.arrays if a is not None]) == [8]  # all new
        assert backend.head(TABLE, FOREVER) == answer.head
        assert other.head(TABLE, FOREVER) == answer.head  # one epoch for every process
        push(other, {3: leaf(3, 9)})
        _, _, changed = read_leaves(backend, answer.head.version)
        assert [a is None for a in changed] == [True, True, True, False]
    finally:
        other.close()


def test_a_delta_pull_of_a_version_of_an_earlier_history_is_a_reset(store_name):
    """Through a container: even once it pulled the new history, a version it handed out
    in the old one is a reset for ``pull_if_newer(held=...)``, never a mix."""
    signature = {f"leaf{i}": spec for i, spec in enumerate(SPECS)}

    def nest(number):
        return {f"leaf{i}": leaf(i, number) for i in range(len(SPECS))}

    url = f"shm://{store_name}"
    with varsync.connect(url) as reader:
        reader.create_table(TABLE, signature)
        reader.push(nest(1), TABLE)
        reader.push(nest(2), TABLE)
        held = reader.pull(TABLE)
        delete_table(store_name)
        with varsync.connect(url) as writer:
            writer.create_table(TABLE, signature)
            for k in range(5, 9):
                writer.push(nest(k), TABLE)
        assert reader.pull_if_newer(0, TABLE)[0] == 4  # adopts the new history
        with pytest.raises(varsync.TableResetError):
            reader.pull_if_newer(2, TABLE, held=held)


def test_a_segment_without_leaf_versions_reads_as_all_at_its_version(backend):
    """Files of varsync-shm 0.1 have no leaf versions: every leaf is at the file's."""
    write_whole(backend, 1)
    push(backend, {1: leaf(1, 2)})
    path = os.path.join(backend.details(TABLE)["path"], "seg-2")
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(4), 40)  # the header's leaf-versions offset: none
    finally:
        os.close(fd)
    assert leaf_versions_of(backend) == (2, [2, 2, 2, 2])
    _, _, changed = read_leaves(backend, 1)
    assert numbers_of(changed) == [1, 2, 1, 1]
    assert push(backend, {3: leaf(3, 3)}) == 3
    assert leaf_versions_of(backend) == (3, [2, 2, 2, 3])


def _push_one_leaf(store_name, index, count, start, results):
    """Child: push leaf ``index`` alone with the numbers 1..count."""
    backend = ShmBackend(f"shm://{store_name}", timeout=30.0, namespace="")
    try:
        backend.signature(TABLE)
        start.wait(30)
        versions = [push(backend, {index: leaf(index, k)}) for k in range(1, count + 1)]
        results.put((index, versions))
    except Exception as exc:  # reported to the parent
        results.put((index, f"{type(exc).__name__}: {exc}"))
    finally:
        backend.close()


def test_partial_pushes_from_two_processes_lose_no_leaf(backend, store_name, children):
    write_whole(backend, 0)
    count = 300
    start, results = CONTEXT.Event(), CONTEXT.Queue()
    for index in (1, 3):
        children(_push_one_leaf, store_name, index, count, start, results)
    start.set()
    got = dict(results.get(timeout=120) for _ in range(2))
    for index in (1, 3):
        assert isinstance(got[index], list), got[index]
    versions = sorted(got[1] + got[3])
    assert versions == list(range(2, 2 * count + 2))  # every push its own version
    last, numbers = leaf_versions_of(backend)
    assert last == 2 * count + 1
    assert numbers == [1, got[1][-1], 1, got[3][-1]]
    _, arrays = read(backend, 0)
    assert numbers_of(arrays) == [0, count, 0, count]


def test_interrupted_partial_pushes_leave_one_whole_version_and_no_file(backend):
    """SIGINTs at random points of partial pushes (see test_shm_reliability): every
    version read holds both leaves of one push and the untouched ones; nothing is left
    locked or behind."""
    write_whole(backend, 1)
    attempts = [1]

    def push_both():
        attempts[0] += 1
        k = attempts[0]
        push(backend, {1: leaf(1, k), 3: leaf(3, k)})

    for _ in range(4):  # warm up the mapping caches
        push_both()
    gc.collect()
    before = open_fds()
    with Interrupts(seed=16) as interrupts:
        for _ in range(300):
            interrupts.round(push_both, most_seconds=0.003)
            version, arrays = read(backend, 0)
            numbers = numbers_of(arrays)
            assert numbers[0] == numbers[2] == 1
            assert numbers[1] == numbers[3] <= attempts[0]
            assert leaf_versions_of(backend) == (version, [1, version, 1, version])
    assert interrupts.unraisable == []
    gc.collect()
    assert settled_fds(before + 2) <= before + 2
    push_both()  # not blocked by a lock an interrupted push kept, and reclaims its files
    files = os.listdir(backend.details(TABLE)["path"])
    assert [f for f in files if f.startswith((".fill-", ".link-"))] == []
    assert len(backend.details(TABLE)["segments"]) <= 2
    assert numbers_of(read(backend, 0)[1]) == [1, attempts[0], 1, attempts[0]]
