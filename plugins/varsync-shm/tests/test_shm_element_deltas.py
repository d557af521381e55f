"""Element deltas on shm:// (varsync_shm.chains): a patched push writes its patch, not the
leaf; delta reads give the links since what the reader holds (or the anchor and every
link when it is behind the anchor); whole reads rebuild patched leaves bit-exactly;
bases, long chains, a reader in another process, a killed writer, and the reclaiming of
patch files. Patches are made by the core's codec (``varsync._elements.diff``).
"""

import gc
import math
import os
import time

import ml_dtypes
import numpy as np
import pytest
from shm_helpers import CONTEXT, open_fds

import varsync
from varsync.backend import Head, LeafChain, assert_bit_equal, element_patch, rebuilt_leaf
from varsync.testing.faults import settled_fds
from varsync_shm import writing
from varsync_shm.backend import ShmBackend
from varsync_shm.reading import MAP_ABOVE

#: Leaf 0 is patched (2 MiB: over MAP_ABOVE, so a read of it maps the segment), leaf 1
#: is written whole, leaves 2-4 are the dtypes whose bits must survive (bf16, float32
#: NaN payloads and -0.0, int8).
SPECS = [
    varsync.Spec((512, 1024), "float32"),
    varsync.Spec((), "int64"),
    varsync.Spec((4096,), "bfloat16"),
    varsync.Spec((1024,), "float32"),
    varsync.Spec((8192,), "int8"),
]
TABLE = "t"
FOREVER = math.inf


def first_values():
    """Leaf values whose bits a float round trip would change."""
    rng = np.random.default_rng(7)
    weights = rng.standard_normal(SPECS[0].shape, dtype=np.float32)
    bf16 = rng.standard_normal(4096).astype(ml_dtypes.bfloat16)
    bf16.view(np.uint16)[:4] = [0x7FC1, 0xFFA3, 0x8000, 0x7F81]  # NaN payloads, -0.0
    f32 = rng.standard_normal(1024, dtype=np.float32)
    f32.view(np.uint32)[:4] = [0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800001]
    int8 = rng.integers(-128, 128, 8192, dtype=np.int8)
    return [weights, np.array(1, np.int64), bf16, f32, int8]


def changed(values, step):
    """The next values: a few elements of each patched leaf changed, step by step, with
    special bit patterns among them."""
    new = [v.copy() for v in values]
    new[0].reshape(-1)[step * 997 % new[0].size] = step
    new[2].view(np.uint16)[step % 4096] = 0x7FC0 + step % 64  # bf16 NaN payloads
    new[3].view(np.uint32)[step % 1024] = 0x80000000 if step % 2 else 0x7FC00000 + step
    new[4][step * 13 % 8192] = -(step % 128)
    return new


PATCHED = (0, 2, 3, 4)


def patches_between(old, new):
    return {i: element_patch(old[i], new[i], always=True) for i in PATCHED}


def open_backend(store_name):
    backend = ShmBackend(f"shm://{store_name}", timeout=30.0, namespace="")
    backend.create_table(TABLE, "signature text", SPECS)
    return backend


@pytest.fixture
def backend(store_name):
    backend = open_backend(store_name)
    yield backend
    backend.close()


def head_of(backend):
    return backend.head(TABLE, FOREVER)


def push_patches(backend, old, new, base=None):
    """A patched push of ``new`` (leaf 1 whole, the others as patches from ``old``) onto
    ``base`` (default: the head): the new version, or 0 if refused."""
    base = head_of(backend) if base is None else base
    leaves = {1: new[1]}
    head = backend.write_patches(TABLE, leaves, patches_between(old, new), SPECS, base, FOREVER)
    return 0 if head is None else head.version


def history(backend, pushes):
    """Version 1 whole, then ``pushes`` patched pushes: every version's values."""
    values = {1: first_values()}
    backend.write(TABLE, values[1], SPECS, FOREVER)
    for version in range(2, pushes + 2):
        values[version] = changed(values[version - 1], version)
        values[version][1] = np.array(version, np.int64)
        assert push_patches(backend, values[version - 1], values[version]) == version
    return values


def table_files(backend):
    path = backend.details(TABLE)["path"]
    return {f: os.stat(os.path.join(path, f)).st_size for f in os.listdir(path)}


# -- reads at several newer_than --------------------------------------------------------


def test_a_reader_at_or_past_the_anchor_gets_the_links_since_what_it_holds(backend):
    values = history(backend, 5)  # versions 1 (whole) to 6
    for newer_than in range(1, 6):
        head, numbers, leaves = backend.read_patches(TABLE, newer_than, FOREVER, SPECS)
        assert head.version == 6
        assert numbers == [6] * len(SPECS)
        assert isinstance(leaves[1], np.ndarray)
        assert int(leaves[1]) == 6
        for i in PATCHED:
            chain = leaves[i]
            assert isinstance(chain, LeafChain)
            assert chain.anchor is None
            assert [(link.base, link.version) for link in chain.links] == [
                (v, v + 1) for v in range(newer_than, 6)
            ]
            assert_bit_equal(rebuilt_leaf(chain, values[newer_than][i]), values[6][i])
    assert backend.read_patches(TABLE, 6, FOREVER, SPECS) == (head_of(backend), None, None)


def test_a_reader_behind_the_anchor_gets_the_anchor_and_every_link(backend):
    values = history(backend, 3)  # the anchor is version 1
    newer_values = {}
    backend.write_leaves(TABLE, {0: values[4][0]}, SPECS, None, FOREVER)  # 5: 0 whole
    newer_values[5] = values[4]
    for version in (6, 7):  # patches on leaf 0's new anchor, version 5
        newer_values[version] = changed(newer_values[version - 1], version)
        assert push_patches(backend, newer_values[version - 1], newer_values[version]) == version
    for newer_than in (0, 1, 2, 3, 4):
        _, numbers, leaves = backend.read_patches(TABLE, newer_than, FOREVER, SPECS)
        assert numbers == [7] * len(SPECS)
        chain = leaves[0]
        assert isinstance(chain, LeafChain)
        assert chain.anchor_version == 5
        assert [(link.base, link.version) for link in chain.links] == [(5, 6), (6, 7)]
        assert_bit_equal(chain.anchor, values[4][0])
        assert not chain.anchor.flags.writeable
        assert_bit_equal(rebuilt_leaf(chain), newer_values[7][0])
        for i in (2, 3, 4):  # still on their version-1 anchors
            chain = leaves[i]
            if newer_than >= 1:
                assert chain.anchor is None
                assert chain.links[0].base == newer_than
                assert_bit_equal(rebuilt_leaf(chain, values[newer_than][i]), newer_values[7][i])
            else:
                assert chain.anchor_version == 1
                assert len(chain.links) == 5
                assert_bit_equal(rebuilt_leaf(chain), newer_values[7][i])
    _, _, leaves = backend.read_patches(TABLE, 5, FOREVER, SPECS)
    assert leaves[0].anchor is None
    assert [link.version for link in leaves[0].links] == [6, 7]


def test_after_a_whole_write_leaves_read_whole_and_no_patch_file_is_left(backend):
    values = history(backend, 4)
    assert backend.details(TABLE)["patches"] == [f"patch-{v}" for v in range(2, 6)]
    backend.write(TABLE, values[5], SPECS, FOREVER)  # version 6, every leaf whole
    _, numbers, leaves = backend.read_patches(TABLE, 5, FOREVER, SPECS)
    assert numbers == [6] * len(SPECS)
    for got, expected in zip(leaves, values[5]):
        assert isinstance(got, np.ndarray)
        assert_bit_equal(got, expected)
    assert backend.details(TABLE)["patches"] == []  # no segment left reaches them
    backend.write_leaves(TABLE, {3: values[5][3]}, SPECS, None, FOREVER)  # 7
    after = changed(values[5], 8)
    after[1] = values[5][1]
    assert push_patches(backend, values[5], after) == 8
    _, numbers, leaves = backend.read_patches(TABLE, 6, FOREVER, SPECS)
    assert numbers == [8] * len(SPECS)
    assert isinstance(leaves[3], LeafChain)
    assert leaves[3].anchor_version == 7
    assert_bit_equal(rebuilt_leaf(leaves[3]), after[3])
    assert isinstance(leaves[2], LeafChain)
    assert leaves[2].links[0].base == 6


# -- whole reads: bit-exact --------------------------------------------------------------


def test_read_and_read_leaves_give_patched_leaves_whole_and_bit_exact(backend):
    values = history(backend, 6)
    head, arrays = backend.read(TABLE, 0, FOREVER, SPECS)
    assert head.version == 7
    assert_bit_equal(arrays, values[7])
    assert not any(a.flags.writeable for a in arrays)
    head, numbers, arrays = backend.read_leaves(TABLE, 3, FOREVER, SPECS)
    assert numbers == [7] * len(SPECS)
    assert_bit_equal(arrays, values[7])
    head, numbers, arrays = backend.read_leaves(TABLE, 0, FOREVER, SPECS)
    assert_bit_equal(arrays, values[7])
    assert backend.leaf_versions(TABLE, FOREVER) == (head, [7] * len(SPECS))
    # A partial push of another leaf keeps the chains, and whole reads still rebuild them.
    backend.write_leaves(TABLE, {1: np.array(99, np.int64)}, SPECS, None, FOREVER)
    _, arrays = backend.read(TABLE, 0, FOREVER, SPECS)
    assert_bit_equal(arrays, [values[7][0], np.array(99, np.int64), *values[7][2:]])


# -- bases -------------------------------------------------------------------------------


def test_a_base_that_is_not_the_head_writes_nothing(backend, store_name):
    values = first_values()
    later = changed(values, 2)
    empty = head_of(backend)
    assert empty.version == 0
    assert push_patches(backend, values, later, base=empty) == 0  # an empty table
    assert backend.details(TABLE)["segments"] == []
    backend.write(TABLE, values, SPECS, FOREVER)
    files = table_files(backend)
    head = head_of(backend)
    assert push_patches(backend, values, later, base=Head(2, head.epoch)) == 0
    assert push_patches(backend, values, later, base=Head(0, head.epoch)) == 0
    other_epoch = type(head.epoch)(head.epoch.device, head.epoch.inode + 1, 0)
    assert push_patches(backend, values, later, base=Head(1, other_epoch)) == 0
    assert table_files(backend) == files
    assert backend.details(TABLE)["patch_bytes_written"] == 0
    assert head_of(backend) == head
    assert push_patches(backend, values, later, base=head) == 2


def test_a_leaf_given_both_whole_and_as_a_patch_is_refused(backend):
    values = history(backend, 1)
    patches = patches_between(values[1], values[2])
    with pytest.raises(ValueError, match="both whole and as patches"):
        backend.write_patches(TABLE, {0: values[2][0]}, patches, SPECS, head_of(backend), FOREVER)
    assert head_of(backend).version == 2


# -- long chains -------------------------------------------------------------------------


def test_a_chain_of_many_links_reads_from_every_version(backend):
    pushes = 40
    values = history(backend, pushes)
    last = pushes + 1
    for newer_than in range(last):
        _, _, leaves = backend.read_patches(TABLE, newer_than, FOREVER, SPECS)
        for i in PATCHED:
            chain = leaves[i]
            held = values[newer_than][i] if chain.anchor is None else None
            assert len(chain.links) == last - max(newer_than, 1)
            assert_bit_equal(rebuilt_leaf(chain, held), values[last][i])
    assert_bit_equal(backend.read(TABLE, 0, FOREVER, SPECS)[1], values[last])
    assert len(backend.details(TABLE)["patches"]) == pushes


# -- what a push writes ------------------------------------------------------------------


def test_a_patched_push_writes_its_patch_not_the_leaf(backend):
    values = history(backend, 2)  # the first patched push fills a new file: one copy
    version = 3
    for _ in range(10):
        before_files = table_files(backend)
        before = backend.details(TABLE)
        new = changed(values[version], version + 1)
        patch_bytes = sum(len(p) for p in patches_between(values[version], new).values())
        assert push_patches(backend, values[version], new) == version + 1
        version += 1
        values[version] = new
        after = backend.details(TABLE)
        assert after["leaf_bytes_written"] - before["leaf_bytes_written"] == 8  # leaf 1
        assert after["patch_bytes_written"] - before["patch_bytes_written"] == patch_bytes
        grown = sum(table_files(backend).values()) - sum(before_files.values())
        rows = 40 * len(PATCHED) * (version - 1)  # each leaf's chain since version 1
        assert patch_bytes <= grown <= patch_bytes + rows + 64  # the patch file alone
        assert grown < SPECS[0].nbytes // 100
        assert len(after["segments"]) == 2  # the current one and the spare
    assert_bit_equal(backend.read(TABLE, 0, FOREVER, SPECS)[1], values[version])


# -- retention ---------------------------------------------------------------------------


def test_patch_files_stay_while_a_held_segment_reaches_them(backend):
    values = history(backend, 3)
    _, _, held = backend.read_patches(TABLE, 0, FOREVER, SPECS)
    assert SPECS[0].nbytes > MAP_ABOVE
    assert not held[0].anchor.flags.owndata  # a view of seg-4: it pins it
    backend.write(TABLE, values[4], SPECS, FOREVER)  # 5, whole
    backend.write(TABLE, values[4], SPECS, FOREVER)  # 6, whole
    details = backend.details(TABLE)
    assert "seg-4" in details["segments"]
    assert details["patches"] == ["patch-2", "patch-3", "patch-4"]  # seg-4's chains
    assert_bit_equal(rebuilt_leaf(held[0]), values[4][0])
    del held
    backend.write(TABLE, values[4], SPECS, FOREVER)  # 7: seg-4 is reclaimed, and its links
    details = backend.details(TABLE)
    assert "seg-4" not in details["segments"]
    assert details["patches"] == []


def test_a_leftover_patch_file_of_a_push_never_published_is_reclaimed(backend):
    values = history(backend, 2)
    path = backend.details(TABLE)["path"]
    with open(os.path.join(path, "patch-99"), "wb") as orphan:
        orphan.write(b"VSYNCPAT not a version anyone published")
    with open(os.path.join(path, ".patch-0123"), "wb") as staged:
        staged.write(b"a dead writer's")
    new = changed(values[3], 4)
    assert push_patches(backend, values[3], new) == 4
    assert backend.details(TABLE)["patches"] == ["patch-2", "patch-3", "patch-4"]
    assert ".patch-0123" not in os.listdir(path)


# -- other processes ---------------------------------------------------------------------


def _expected(last):
    values = {1: first_values()}
    for version in range(2, last + 1):
        values[version] = changed(values[version - 1], version)
        values[version][1] = np.array(version, np.int64)
    return values


def _follow_with_patches(store_name, last, ready, results):
    """Child: follow the table to version ``last`` by delta reads, applying links into
    what it holds; every version seen must be the writer's, bit for bit."""
    problems, seen = [], 0
    backend = ShmBackend(f"shm://{store_name}", timeout=30.0, namespace="")
    try:
        expected = _expected(last)
        ready.set()
        version, held = 0, None
        deadline = time.monotonic() + 120
        while version < last and time.monotonic() < deadline:
            head, _, leaves = backend.read_patches(TABLE, version, FOREVER, SPECS)
            if leaves is None:
                backend.block(TABLE, version, time.monotonic() + 1)
                continue
            new = []
            for i, leaf in enumerate(leaves):
                if leaf is None:
                    new.append(held[i])
                elif isinstance(leaf, LeafChain):
                    new.append(rebuilt_leaf(leaf, None if held is None else held[i]))
                else:
                    new.append(np.array(leaf))
            if not all(a.tobytes() == b.tobytes() for a, b in zip(new, expected[head.version])):
                problems.append(f"version {head.version} is not the writer's")
            at, whole = backend.read(TABLE, 0, FOREVER, SPECS)
            if not all(a.tobytes() == b.tobytes() for a, b in zip(whole, expected[at.version])):
                problems.append(f"a whole read of version {at.version} is not the writer's")
            version, held, seen = head.version, new, seen + 1
    except Exception as exc:  # reported to the parent
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        backend.close()
    results.put((seen, problems))


def test_a_reader_in_another_process_follows_patches_bit_exactly(backend, store_name, children):
    last = 120
    expected = _expected(last)
    backend.write(TABLE, expected[1], SPECS, FOREVER)
    ready, results = CONTEXT.Event(), CONTEXT.Queue()
    children(_follow_with_patches, store_name, last, ready, results)
    assert ready.wait(60)
    for version in range(2, last + 1):
        if version % 15 == 0:  # chains reset: their patch files are reclaimed under it
            backend.write(TABLE, expected[version], SPECS, FOREVER)
        else:
            assert push_patches(backend, expected[version - 1], expected[version]) == version
    seen, problems = results.get(timeout=120)
    assert problems == []
    assert seen >= 1


def _push_then_die_before_publishing(store_name, reached, release):
    """Child: one patched push that stops (killed) after its patch file is in place and
    its segment filled, before the link is renamed."""
    backend = open_backend(store_name)
    values = _expected(3)

    def stalled(table, fd, version, made):
        reached.set()
        release.wait(60)  # the parent kills this process long before

    writing.publish = stalled
    push_patches(backend, values[2], values[3])


def test_a_writer_killed_before_publishing_leaves_the_last_version(backend, store_name, children):
    values = _expected(4)
    backend.write(TABLE, values[1], SPECS, FOREVER)
    assert push_patches(backend, values[1], values[2]) == 2
    reached, release = CONTEXT.Event(), CONTEXT.Event()
    child = children(_push_then_die_before_publishing, store_name, reached, release)
    assert reached.wait(60)
    assert "patch-3" in os.listdir(backend.details(TABLE)["path"])  # renamed, unpublished
    child.kill()
    child.join(30)
    assert head_of(backend).version == 2
    assert_bit_equal(backend.read(TABLE, 0, FOREVER, SPECS)[1], values[2])
    assert push_patches(backend, values[2], values[3]) == 3  # over the dead one's patch-3
    assert_bit_equal(backend.read(TABLE, 0, FOREVER, SPECS)[1], values[3])
    files = os.listdir(backend.details(TABLE)["path"])
    assert [f for f in files if f.startswith((".fill-", ".link-", ".patch-"))] == []
    assert push_patches(backend, values[3], values[4]) == 4
    assert_bit_equal(backend.read(TABLE, 0, FOREVER, SPECS)[1], values[4])


def test_interrupted_patched_pushes_leave_one_whole_version_and_no_file(backend):
    """SIGINTs at random points of patched pushes (see test_shm_reliability): every
    version read is one the writer made, bit for bit; nothing is left locked or behind,
    and the patch files left are the current chains'."""
    from test_shm_reliability import Interrupts  # SIGINT rounds: left out on py313

    values = {1: first_values()}
    backend.write(TABLE, values[1], SPECS, FOREVER)

    def push_next():
        version = head_of(backend).version
        new = values.get(version + 1)
        if new is None:
            new = values[version + 1] = changed(values[version], version + 1)
            new[1] = np.array(version + 1, np.int64)
        push_patches(backend, values[version], new)

    for _ in range(4):  # warm up the mapping caches
        push_next()
    gc.collect()
    before = open_fds()
    with Interrupts(seed=17) as interrupts:
        for round_ in range(200):
            interrupts.round(push_next, most_seconds=0.004)
            head, arrays = backend.read(TABLE, 0, FOREVER, SPECS)
            assert_bit_equal(arrays, values[head.version])
            del arrays  # views of the segment: they would keep it, and its chains
            if round_ % 20 == 19:  # chains reset now and then, under the interrupts
                backend.write(TABLE, values[head.version], SPECS, FOREVER)
                values[head.version + 1] = values[head.version]
    assert interrupts.unraisable == []
    gc.collect()
    assert settled_fds(before + 2) <= before + 2
    push_next()  # not blocked by a lock an interrupted push kept, and reclaims its files
    files = os.listdir(backend.details(TABLE)["path"])
    assert [f for f in files if f.startswith((".fill-", ".link-", ".patch-"))] == []
    head, arrays = backend.read(TABLE, 0, FOREVER, SPECS)
    assert_bit_equal(arrays, values[head.version])
    del arrays
    push_next()  # reclaims what the last pull kept
    _, _, leaves = backend.read_patches(TABLE, 0, FOREVER, SPECS)
    reached = {
        link.version for leaf in leaves if isinstance(leaf, LeafChain) for link in leaf.links
    }
    assert backend.details(TABLE)["patches"] == sorted(f"patch-{v}" for v in reached)
