"""The redis backend's element deltas (``SupportsElementDeltas``), against real
redis-server processes: a patched leaf is kept as its anchor and the chain of patches
since; ``read_patches`` hands a reader only the links since the version it holds (or
the anchor and every link when it is behind the anchor), ``read`` and ``read_leaves``
rebuild whole values bit for bit, a patch on a stale base writes nothing, a chain's
segments stay while a version references them, a patched push and pull move about the
patch's bytes (counted by the server), an interrupted push leaves one whole version, and
the same holds through a replica and on a Redis Cluster."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

import ml_dtypes
import numpy as np
import pytest
from fixtures.redis import ReplyCutter, table_head
from fixtures.redis_cluster import LocalCluster, shared_redis_cluster  # noqa: F401

import varsync
from varsync._elements import diff
from varsync._patches import check_chain
from varsync.backend import Head, LeafChain, PatchRead

redis = pytest.importorskip("redis")
from varsync._backends.redis.protocol import PUBLISH as _PUBLISH_SCRIPT  # noqa: E402

KB = 1 << 10
TABLE = "variables"


@pytest.fixture
def server(redis_servers: Any) -> Any:
    """A server of this test's own (its key count and traffic are this test's)."""
    return redis_servers()


def specs_of(signature: Any) -> List[varsync.Spec]:
    return list(varsync.flatten(signature))


def patch(old: np.ndarray, new: np.ndarray) -> bytes:
    return diff(old, new, limit=None).to_bytes()


def same_bits(a: Optional[np.ndarray], b: np.ndarray) -> bool:
    return a is not None and a.dtype == b.dtype and a.shape == b.shape and (
        a.tobytes() == b.tobytes())


def chunks_of(nbytes: int) -> int:
    """Chunks of a segment of ``nbytes`` at chunk_size=4096 (4032 bytes of payload each)."""
    return -(-nbytes // 4032)


def chunk_keys(admin: Any, table: str = TABLE) -> List[str]:
    return sorted(k.decode() for k in admin.scan_iter(match=f"varsync::{table}:d:*", count=1000))


class Writer:
    """Pushes to one table through a backend, keeping the values and head it pushed."""

    def __init__(self, backend: Any, specs: Sequence[varsync.Spec], values: List[np.ndarray]):
        self.backend, self.specs = backend, list(specs)
        self.values = [v.copy() for v in values]
        self.head: Head = backend.write(TABLE, self.values, self.specs, math.inf)

    def push(self, changed: Dict[int, np.ndarray], whole: Sequence[int] = ()) -> Optional[Head]:
        """Leaves ``changed`` as patches against what was pushed last, those in ``whole``
        whole; the new head, or ``None`` if refused."""
        patches = {i: patch(self.values[i], v) for i, v in changed.items() if i not in whole}
        leaves = {i: v for i, v in changed.items() if i in whole}
        head = self.backend.write_patches(TABLE, leaves, patches, self.specs, self.head, math.inf)
        if head is not None:
            self.head = head
            for i, v in changed.items():
                self.values[i] = v.copy()
        return head


def read_patches(backend: Any, held: int, specs: Sequence[varsync.Spec]) -> PatchRead:
    return backend.read_patches(TABLE, held, math.inf, specs)


def applied(held: np.ndarray, chain: LeafChain) -> np.ndarray:
    return varsync.backend.rebuilt_leaf(chain, held)


FLOATS = {"a_weights": varsync.Spec((4096,), "float32"), "b_step": varsync.Spec((), "int64"),
          "c_bias": varsync.Spec((2000,), "int32")}


def floats_at(version: int) -> List[np.ndarray]:
    """A value whose leaf 0 differs from version to version in a few elements."""
    weights = np.linspace(-1, 1, 4096, dtype=np.float32)
    weights[: version * 3] += version
    return [weights, np.array(version, np.int64), np.arange(2000, dtype=np.int32)]


# -- read_patches ----------------------------------------------------------------------------


def test_read_patches_gives_each_reader_the_links_since_the_version_it_holds(
    server: Any,
) -> None:
    specs = specs_of(FLOATS)
    with varsync.connect(server.url + "?chunk_size=4096") as store, \
            varsync.connect(server.url) as reader:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        history = {1: floats_at(1)}
        for version in range(2, 7):
            head = writer.push({0: floats_at(version)[0], 1: floats_at(version)[1]}, whole=[1])
            assert head is not None and head.version == version
            history[version] = floats_at(version)
        for held in range(1, 6):
            answer = read_patches(reader.backend, held, specs)
            assert answer.head == writer.head and answer.leaf_versions == [6, 6, 1]
            assert answer.leaves is not None
            chain, step, bias = answer.leaves
            assert isinstance(chain, LeafChain) and chain.anchor is None
            assert [(link.base, link.version) for link in chain.links] == [
                (v, v + 1) for v in range(held, 6)]
            check_chain("leaf 0", chain, held, 6)  # the core's own check
            assert same_bits(applied(history[held][0], chain), history[6][0])
            assert same_bits(step, history[6][1]) and bias is None
        # a reader holding nothing gets the anchor (version 1's whole value) and every link
        chain = read_patches(reader.backend, 0, specs).leaves[0]
        assert isinstance(chain, LeafChain) and chain.anchor_version == 1
        assert same_bits(chain.anchor, history[1][0]) and len(chain.links) == 5
        check_chain("leaf 0", chain, 0, 6)
        assert same_bits(varsync.backend.rebuilt_leaf(chain), history[6][0])
        assert read_patches(reader.backend, 6, specs) == PatchRead(writer.head, None, None)


def test_a_reader_behind_the_anchor_gets_the_anchor_and_links_and_a_whole_write_resets(
    server: Any,
) -> None:
    specs = specs_of(FLOATS)
    with varsync.connect(server.url) as store, varsync.connect(server.url) as reader:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        writer.push({0: floats_at(2)[0]})  # 2: a link on version 1's anchor
        writer.push({0: floats_at(3)[0]}, whole=[0])  # 3: whole again, a new anchor
        writer.push({0: floats_at(4)[0]})  # 4, 5: links on anchor 3
        writer.push({0: floats_at(5)[0]})
        for held in (1, 2):  # before anchor 3: its links do not reach back to what it holds
            chain = read_patches(reader.backend, held, specs).leaves[0]
            assert isinstance(chain, LeafChain)
            assert chain.anchor_version == 3 and same_bits(chain.anchor, floats_at(3)[0])
            assert [(link.base, link.version) for link in chain.links] == [(3, 4), (4, 5)]
            check_chain("leaf 0", chain, held, 5)
        for held in (3, 4):  # on or past the anchor: links only
            chain = read_patches(reader.backend, held, specs).leaves[0]
            assert isinstance(chain, LeafChain) and chain.anchor is None
            assert same_bits(applied(floats_at(held)[0], chain), floats_at(5)[0])
        # a whole write (of every leaf, or of that leaf) leaves no chain: whole arrays
        writer.push({0: floats_at(6)[0]}, whole=[0])
        answer = read_patches(reader.backend, 5, specs)
        assert answer.leaf_versions == [6, 1, 1] and answer.leaves is not None
        assert same_bits(answer.leaves[0], floats_at(6)[0])
        assert answer.leaves[1:] == [None, None]
        writer.push({0: floats_at(7)[0]})
        store.backend.write(TABLE, floats_at(8), specs, math.inf)
        assert table_head(server)["fmt"] == "1"
        answer = read_patches(reader.backend, 7, specs)
        assert answer.leaf_versions == [8, 8, 8] and answer.leaves is not None
        assert all(same_bits(a, b) for a, b in zip(answer.leaves, floats_at(8)))


# -- whole reads -------------------------------------------------------------------------------


def special_floats() -> np.ndarray:
    """float32 with NaN payloads (quiet and signalling, both signs), -0.0 and +inf."""
    bits = np.arange(3000, dtype=np.uint32) * np.uint32(2654435761)
    bits[::7] = 0x7FC00001  # a quiet NaN with a payload
    bits[1::11] = 0xFF800123  # a negative signalling NaN with another
    bits[2::13] = 0x80000000  # -0.0
    return bits.view(np.float32)


def test_read_and_read_leaves_rebuild_patched_leaves_bit_for_bit(server: Any) -> None:
    signature = {"a_bf16": varsync.Spec((5000,), "bfloat16"),
                 "b_f32": varsync.Spec((3000,), "float32"),
                 "c_int": varsync.Spec((1000,), "int64")}
    specs = specs_of(signature)
    rng = np.random.default_rng(7)
    values = [rng.standard_normal(5000).astype(ml_dtypes.bfloat16), special_floats(),
              rng.integers(-(2**62), 2**62, 1000)]
    with varsync.connect(server.url + "?chunk_size=4096&keep=0") as store, \
            varsync.connect(server.url) as reader:
        store.create_table(TABLE, signature)
        writer = Writer(store.backend, specs, values)
        for version in range(2, 12):
            new = [v.copy() for v in writer.values]
            spots = rng.choice(1000, 20, replace=False)
            new[0][spots] = rng.standard_normal(20).astype(ml_dtypes.bfloat16)
            raw = new[1].view(np.uint32)
            raw[spots] ^= np.uint32(0x00400001)  # NaN payloads, signs and zeros flip bits
            raw[spots[:3]] = 0x80000000  # -0.0 where +0.0 or anything else was
            new[2][spots] += version
            assert writer.push(dict(enumerate(new))) is not None
            assert table_head(server)["fmt"] == "3"
            whole = store.backend.read(TABLE, 0, math.inf, specs)
            assert whole.head == writer.head and whole.arrays is not None
            assert all(same_bits(a, b) for a, b in zip(whole.arrays, writer.values))
            answer = reader.backend.read_leaves(TABLE, version - 1, math.inf, specs)
            assert answer.leaf_versions == [version] * 3 and answer.arrays is not None
            assert all(same_bits(a, b) for a, b in zip(answer.arrays, writer.values))
        pulled = reader.pull(TABLE)  # the core's whole pull
        assert same_bits(np.asarray(pulled["b_f32"]), writer.values[1])


def test_patches_and_whole_leaves_compose_with_partial_pushes(server: Any) -> None:
    specs = specs_of(FLOATS)
    with varsync.connect(server.url + "?chunk_size=4096") as store:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        head = store.backend.write_leaves(TABLE, {2: floats_at(1)[2] + 1}, specs, None, math.inf)
        writer.head, writer.values[2] = head, floats_at(1)[2] + 1  # format 2, then patches
        assert writer.push({0: floats_at(3)[0], 2: floats_at(3)[2]}, whole=[2]) is not None
        assert writer.push({1: floats_at(4)[1]}, whole=[1]) is not None
        head, versions = store.backend.leaf_versions(TABLE, math.inf)
        assert head == writer.head and versions == [3, 4, 3]
        arrays = store.backend.read(TABLE, 0, math.inf, specs).arrays
        assert all(same_bits(a, b) for a, b in zip(arrays, writer.values))


# -- refusals --------------------------------------------------------------------------------


def test_a_patch_on_another_base_returns_none_and_writes_nothing(server: Any) -> None:
    specs = specs_of(FLOATS)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table(TABLE, FLOATS)
        empty = store.backend.head(TABLE, math.inf)
        old = floats_at(1)
        data = {0: patch(old[0], floats_at(2)[0])}
        assert store.backend.write_patches(TABLE, {}, data, specs, empty, math.inf) is None
        assert chunk_keys(admin) == []
        writer = Writer(store.backend, specs, old)
        first = writer.head
        assert writer.push({0: floats_at(2)[0]}) is not None
        before, keys = table_head(server), chunk_keys(admin)
        for base in (first, Head(2, "0" * 16), Head(3, first.epoch)):
            assert store.backend.write_patches(TABLE, {}, data, specs, base, math.inf) is None
            assert table_head(server) == before and chunk_keys(admin) == keys
        answer = store.backend.read(TABLE, 0, math.inf, specs)
        assert answer.head.version == 2 and same_bits(answer.arrays[0], floats_at(2)[0])
        with pytest.raises(ValueError, match="both whole and as a patch"):
            store.backend.write_patches(TABLE, {0: old[0]}, data, specs, writer.head, math.inf)
        with pytest.raises(IndexError, match="outside the table's 3 leaves"):
            store.backend.write_patches(TABLE, {}, {3: data[0]}, specs, writer.head, math.inf)
        assert table_head(server) == before


# -- chains and retention --------------------------------------------------------------------


def test_a_chain_of_many_links_reads_right_at_every_length_and_stays_retained(
    server: Any,
) -> None:
    specs = specs_of(FLOATS)
    with varsync.connect(server.url + "?keep=0&chunk_size=4096") as store, \
            varsync.connect(server.url) as reader, server.client() as admin:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        whole = set(chunk_keys(admin))  # version 1's whole segment: the anchor
        history = {1: floats_at(1)[0]}
        for version in range(2, 42):
            assert writer.push({0: floats_at(version)[0]}) is not None
            history[version] = floats_at(version)[0]
            # keep=0, yet the anchor's chunks and every link's stay: the version names them
            assert whole <= set(chunk_keys(admin))
            assert len(chunk_keys(admin)) == len(whole) + version - 1
            arrays = reader.backend.read(TABLE, 0, math.inf, specs).arrays
            assert same_bits(arrays[0], history[version])
            if version % 10 == 1:
                for held in (1, version // 2, version - 1):
                    chain = read_patches(reader.backend, held, specs).leaves[0]
                    assert isinstance(chain, LeafChain) and chain.anchor is None
                    assert len(chain.links) == version - held
                    assert same_bits(applied(history[held], chain), history[version])
        # the leaf whole again: nothing references the old anchor and links, all retired
        writer.push({0: floats_at(50)[0]}, whole=[0])
        writer.push({0: floats_at(51)[0]}, whole=[0])
        head = table_head(server)
        assert len(head["segments"].split(",")) == 2  # version 1's (leaves 1, 2), the last
        assert len(chunk_keys(admin)) == len(whole) + chunks_of(specs[0].nbytes)
        arrays = reader.backend.read(TABLE, 0, math.inf, specs).arrays
        assert same_bits(arrays[0], floats_at(51)[0]) and same_bits(arrays[2], floats_at(1)[2])


def test_a_retained_version_keeps_the_segments_of_its_chain(
    server: Any, monkeypatch: Any
) -> None:
    # keep=2: the version two before the current one stays readable with its links, even
    # after the leaf was written whole since
    specs = specs_of(FLOATS)
    with varsync.connect(server.url + "?keep=2&chunk_size=4096") as store, \
            varsync.connect(server.url) as reader, server.client() as admin:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        writer.push({0: floats_at(2)[0]})
        writer.push({0: floats_at(3)[0]})  # 3: anchor 1, links 2 and 3
        fetch = reader.backend.reader.fetch
        leaves = fetch.leaves
        pushed = []

        def fetch_after_newer_pushes(*args: Any) -> Any:
            if not pushed:  # while the reader holds version 3's head: two whole pushes
                pushed.append(writer.push({0: floats_at(4)[0]}, whole=[0]))
                pushed.append(writer.push({0: floats_at(5)[0]}, whole=[0]))
            return leaves(*args)

        monkeypatch.setattr(fetch, "leaves", fetch_after_newer_pushes)
        answer = reader.backend.read_leaves(TABLE, 0, math.inf, specs)
        assert [head.version for head in pushed] == [4, 5]
        # version 3 was still retained (keep=2): its anchor and links were all there
        assert answer.head.version == 3 and reader.backend.pulls_restarted == 0
        assert same_bits(answer.arrays[0], floats_at(3)[0])
        writer.push({1: floats_at(6)[1]}, whole=[1])  # 6: version 3 is no longer retained
        assert len(table_head(server)["segments"].split(",")) == 4  # 1, 4, 5 and 6
        whole = sum(s.nbytes for s in specs)
        assert len(chunk_keys(admin)) == chunks_of(whole) + 2 * chunks_of(specs[0].nbytes) + 1


# -- bytes moved -------------------------------------------------------------------------------


def net_bytes(admin: Any) -> tuple:
    stats = admin.info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


def test_a_patched_push_and_pull_move_about_the_patch_not_the_leaf(server: Any) -> None:
    signature = {"w": varsync.Spec((1 << 20,), "bfloat16")}  # a 2 MiB leaf
    specs = specs_of(signature)
    rng = np.random.default_rng(3)
    old = rng.standard_normal(1 << 20).astype(ml_dtypes.bfloat16)
    new = old.copy()
    new[rng.choice(1 << 20, 1000, replace=False)] += 1  # 0.1% of the elements
    with varsync.connect(server.url) as store, varsync.connect(server.url) as reader, \
            server.client() as admin:
        store.create_table(TABLE, signature)
        writer = Writer(store.backend, specs, [old])
        assert same_bits(reader.backend.read(TABLE, 0, math.inf, specs).arrays[0], old)
        size = len(patch(old, new))
        start = net_bytes(admin)
        info = [b - a for a, b in zip(start, net_bytes(admin))]  # what one INFO costs
        start = net_bytes(admin)
        assert writer.push({0: new}) is not None
        pushed = net_bytes(admin)[0] - start[0] - info[0]
        start = net_bytes(admin)
        answer = read_patches(reader.backend, 1, specs)
        pulled = net_bytes(admin)[1] - start[1] - info[1]
        assert answer.leaves is not None and isinstance(answer.leaves[0], LeafChain)
        assert same_bits(applied(old, answer.leaves[0]), new)
        # the patch, its chunk header and the head fields and script arguments
        assert size <= pushed <= size + 2 * KB, (pushed, size)
        assert size <= pulled <= size + 2 * KB, (pulled, size)
        assert size < specs[0].nbytes // 100
        start = net_bytes(admin)
        assert same_bits(reader.backend.read(TABLE, 1, math.inf, specs).arrays[0], new)
        rebuilt = net_bytes(admin)[1] - start[1] - info[1]
        assert rebuilt >= specs[0].nbytes  # a whole read: the anchor and the link
    print(f"\npatch {size} bytes of a {specs[0].nbytes}-byte leaf: pushed {pushed}, "
          f"pulled {pulled}; a whole read {rebuilt}")


# -- interrupted pushes ------------------------------------------------------------------------


def test_a_patched_push_whose_chunk_reply_is_lost_leaves_the_previous_version(
    server: Any,
) -> None:
    # a push of more chunks than are written ahead of their replies (a patch and a 40 KB
    # leaf): the lost reply stops it before its publish script is sent
    signature = {**FLOATS, "c_bias": varsync.Spec((10_000,), "int32")}
    specs = specs_of(signature)
    bias = np.arange(10_000, dtype=np.int32)
    with ReplyCutter(server.port) as cutter, server.client() as admin:
        via = f"redis://127.0.0.1:{cutter.port}/0?chunk_size=4096"
        with varsync.connect(via, timeout=10) as store:
            store.create_table(TABLE, signature)
            writer = Writer(store.backend, specs, [*floats_at(1)[:2], bias])
            writer.push({0: floats_at(2)[0]})
            before, keys = table_head(server), chunk_keys(admin)
            cutter.cut_reply_to(b"$3\r\nSET\r\n")
            with pytest.raises(varsync.BackendConnectionError):
                writer.push({0: floats_at(3)[0], 2: bias + 1}, whole=[2])
            assert cutter.cut == 1
            assert table_head(server) == before and chunk_keys(admin) == keys
            arrays = store.backend.read(TABLE, 0, math.inf, specs).arrays
            assert same_bits(arrays[0], floats_at(2)[0]) and same_bits(arrays[2], bias)


def test_a_patched_push_whose_publish_answer_is_lost_keeps_one_whole_version(
    server: Any,
) -> None:
    specs = specs_of(FLOATS)
    with ReplyCutter(server.port) as cutter, varsync.connect(server.url) as reader:
        via = f"redis://127.0.0.1:{cutter.port}/0"
        with varsync.connect(via, timeout=10) as store:
            store.create_table(TABLE, FLOATS)
            writer = Writer(store.backend, specs, floats_at(1))
            cutter.cut_reply_to(_PUBLISH_SCRIPT.sha.encode())
            with pytest.raises(varsync.BackendConnectionError, match="may have published"):
                writer.push({0: floats_at(2)[0]})
            assert cutter.cut == 1
            answer = reader.backend.read_leaves(TABLE, 0, math.inf, specs)
            assert answer.leaf_versions == [2, 1, 1]
            assert same_bits(answer.arrays[0], floats_at(2)[0])
            # the writer does not know the head: a patch on what it knew is refused
            assert writer.push({0: floats_at(3)[0]}) is None
            assert reader.backend.head(TABLE, math.inf).version == 2


# -- damage ----------------------------------------------------------------------------------


#: Damage to a chained head's leaf map, and what the error says.
CHAIN_DAMAGE = {
    "links out of order": (lambda m: m.replace("~2.", "~9.").replace("~3.", "~2.")
                           .replace("~9.", "~3."), "out of order"),
    "a link past its segment": (lambda m: m.replace("~3.0.", "~3.999999."), "past the end"),
    "a link in a segment not listed": (lambda m: m.replace("~3.", "~77."), "does not list"),
    "a link with no length": (lambda m: m.replace("~3.0.", "~3."), "malformed"),
}


@pytest.mark.parametrize("damage", sorted(CHAIN_DAMAGE))
def test_a_damaged_chain_is_corrupt_data_never_wrong_arrays(server: Any, damage: str) -> None:
    change, message = CHAIN_DAMAGE[damage]
    specs = specs_of(FLOATS)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        writer.push({0: floats_at(2)[0]})
        writer.push({0: floats_at(3)[0]})
        key = f"varsync::{TABLE}:head"
        leaves = admin.hget(key, "leaves").decode()
        assert leaves.startswith("3|1~2.0.") and "~3.0." in leaves, leaves
        admin.hset(key, "leaves", change(leaves))
        with varsync.connect(server.url) as reader:
            for read in (reader.backend.read, reader.backend.read_patches):
                with pytest.raises(varsync.CorruptDataError, match=message):
                    read(TABLE, 0, math.inf, specs)


# -- replicas and clusters ---------------------------------------------------------------------


def test_element_deltas_read_through_a_replica(redis_servers: Any) -> None:
    primary = redis_servers()
    replica = redis_servers(config=["--replicaof", "127.0.0.1", str(primary.port)])
    specs = specs_of(FLOATS)
    reading = f"{primary.url}?replicas=127.0.0.1:{replica.port}"
    with varsync.connect(primary.url, timeout=10) as store, \
            varsync.connect(reading, timeout=10) as reader, primary.client() as p, \
            replica.client() as r:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        for version in (2, 3):
            writer.push({0: floats_at(version)[0]})
        deadline = time.monotonic() + 10
        while r.info("replication").get("master_repl_offset") != p.info("replication")[
                "master_repl_offset"] or r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.02)  # polling the replica's state, bounded by the deadline
        chain = read_patches(reader.backend, 1, specs).leaves[0]
        assert isinstance(chain, LeafChain) and len(chain.links) == 2
        assert same_bits(applied(floats_at(1)[0], chain), floats_at(3)[0])
        arrays = reader.backend.read(TABLE, 0, math.inf, specs).arrays
        assert same_bits(arrays[0], floats_at(3)[0])
        assert reader.backend.reads_on_primary == 0


def test_element_deltas_on_a_redis_cluster(
    shared_redis_cluster: LocalCluster,  # noqa: F811
) -> None:
    url = shared_redis_cluster.url(namespace=f"ed-{uuid.uuid4().hex[:8]}", chunk_size=4096)
    specs = specs_of(FLOATS)
    with varsync.connect(url, timeout=10) as store, varsync.connect(url, timeout=10) as reader:
        store.create_table(TABLE, FLOATS)
        writer = Writer(store.backend, specs, floats_at(1))
        for version in range(2, 6):
            assert writer.push({0: floats_at(version)[0]}) is not None
        chain = read_patches(reader.backend, 2, specs).leaves[0]
        assert isinstance(chain, LeafChain) and len(chain.links) == 3
        assert same_bits(applied(floats_at(2)[0], chain), floats_at(5)[0])
        arrays = reader.backend.read(TABLE, 0, math.inf, specs).arrays
        assert all(same_bits(a, b) for a, b in zip(arrays, writer.values))
