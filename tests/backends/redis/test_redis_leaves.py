"""The redis backend's leaf versions (issue 16, delta sync), against real redis-server
processes: partial pushes compose, pulls move only the changed leaves' bytes (counted by
the server), a leaf unchanged for 10,000 versions stays readable without segments piling
up, a push on a stale base publishes nothing, a reader never assembles leaves from two
histories, interrupted partial pushes leave the previous version readable, and heads
keep the format older readers read (or refuse clearly). (The suite's LeafVersionTests run
in tests/backends/redis/test_redis_backend.py's conformance classes.)"""

from __future__ import annotations

import importlib.util
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pytest
from fixtures.redis import ReplyCutter, command_calls, table_head

import varsync
from varsync.backend import Head, LeafRead

redis = pytest.importorskip("redis")
from varsync._backends.redis.protocol import PUBLISH as _PUBLISH_SCRIPT  # noqa: E402

KB = 1 << 10
MB = 1 << 20


@pytest.fixture
def server(redis_servers: Any) -> Any:
    """A server of this test's own (its key count and traffic are this test's)."""
    return redis_servers()


def specs_of(signature: Any) -> List[varsync.Spec]:
    return list(varsync.flatten(signature))


# The backend's own calls (protocol v1), on table "variables", with versions as numbers.


def write(backend: Any, arrays: List[np.ndarray], specs: Sequence[varsync.Spec]) -> int:
    return int(backend.write("variables", arrays, specs, math.inf).version)


def write_leaves(backend: Any, leaves: Dict[int, np.ndarray], specs: Sequence[varsync.Spec],
                 base: Optional[Head] = None) -> int:
    """The new version, or 0 if the backend refused (``None``)."""
    head = backend.write_leaves("variables", leaves, specs, base, math.inf)
    return 0 if head is None else int(head.version)


def read_leaves(backend: Any, held: int, specs: Sequence[varsync.Spec]) -> LeafRead:
    return backend.read_leaves("variables", held, math.inf, specs)


def read_numbered(backend: Any, held: int, specs: Sequence[varsync.Spec]) -> Any:
    """``(version, leaf versions, arrays)``."""
    head, versions, arrays = read_leaves(backend, held, specs)
    return head.version, versions, arrays


def leaf_versions(backend: Any) -> Any:
    head, versions = backend.leaf_versions("variables", math.inf)
    return head.version, versions


def filled_leaf(spec: varsync.Spec, number: int) -> np.ndarray:
    return np.full(spec.shape, number, spec.dtype)


def numbers(arrays: Sequence[Optional[np.ndarray]]) -> List[Optional[int]]:
    """The one number each array holds (``None`` for none); fails on a torn leaf."""
    out: List[Optional[int]] = []
    for array in arrays:
        if array is None:
            out.append(None)
            continue
        held = np.unique(array)
        assert held.size <= 1, f"a leaf holds several numbers: {held[:5]}"
        out.append(int(held[0]) if held.size else None)
    return out


def sent_bytes(admin: Any) -> int:
    """Bytes the server has sent to its clients so far (``INFO stats``)."""
    return int(admin.info("stats")["total_net_output_bytes"])


def chunk_keys(admin: Any, table: str = "variables") -> List[str]:
    return sorted(k.decode() for k in admin.scan_iter(match=f"varsync::{table}:d:*", count=1000))


#: Leaves of several sizes, some spanning 4 KiB chunks, one empty.
MIXED = {
    "a": varsync.Spec((3000,), "float32"),
    "b": varsync.Spec((7,), "int16"),
    "c": varsync.Spec((0,), "float64"),
    "d": varsync.Spec((2, 1500), "float64"),
    "e": varsync.Spec((), "int64"),
    "f": varsync.Spec((5000,), "uint8"),
}


# -- composing ---------------------------------------------------------------------------------


def test_partial_pushes_compose_with_the_current_version_leaf_by_leaf(server: Any) -> None:
    specs = specs_of(MIXED)
    rng = random.Random(16)
    with varsync.connect(server.url + "?chunk_size=4096&keep=1") as writer, \
            varsync.connect(server.url) as reader:
        writer.create_table("variables", MIXED)
        backend = writer.backend
        assert write(backend, [filled_leaf(s, 1) for s in specs], specs) == 1
        model, versions = [1] * len(specs), [1] * len(specs)
        held = 1
        for version in range(2, 60):
            if version % 13 == 0:  # now and then a whole write, which resets every leaf
                assert write(backend, [filled_leaf(s, version) for s in specs],
                                     specs) == version
                model, versions = [version] * len(specs), [version] * len(specs)
            else:
                chosen = rng.sample(range(len(specs)), rng.randint(0, 3))
                leaves = {i: filled_leaf(specs[i], version) for i in chosen}
                assert write_leaves(backend, leaves, specs) == version
                for i in chosen:
                    model[i], versions[i] = version, version
            assert leaf_versions(backend) == (version, versions)
            got, got_versions, arrays = read_numbered(reader.backend, held, specs)
            assert got == version and got_versions == versions and arrays is not None
            for i, array in enumerate(arrays):
                if versions[i] > held:
                    assert array is not None and array.shape == specs[i].shape
                    assert numbers([array]) == [model[i] if specs[i].nbytes else None]
                else:
                    assert array is None
            held = version
            whole = numbers(varsync.flatten(reader.pull()))  # every leaf, via read()
            assert [n for i, n in enumerate(whole) if i != 2] == [
                m for i, m in enumerate(model) if i != 2]


def test_a_pull_that_finds_nothing_newer_is_one_small_request(server: Any) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs)
        assert read_numbered(store.backend, 2, specs) == (2, None, None)
        before = command_calls(admin)  # the server has the peek script now
        assert read_numbered(store.backend, 2, specs) == (2, None, None)
        after = command_calls(admin)
    ran = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # the peek script, whose one HMGET finds nothing newer
    assert {k: n for k, n in ran.items() if n and k != "info"} == {"evalsha": 1, "hmget": 1}


# -- bytes moved -----------------------------------------------------------------------------


def test_a_pull_of_one_changed_leaf_of_50_moves_about_that_leafs_bytes(server: Any) -> None:
    signature = {f"w{i:02d}": varsync.Spec((10_000,), "float32") for i in range(50)}  # 40 KB each
    specs = specs_of(signature)
    leaf = specs[0].nbytes
    with varsync.connect(server.url) as writer, varsync.connect(server.url) as reader, \
            server.client() as admin:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        assert numbers(read_numbered(reader.backend, 0, specs)[2]) == [1] * 50
        write_leaves(writer.backend, {17: filled_leaf(specs[17], 2)}, specs)
        baseline = sent_bytes(admin)
        info = sent_bytes(admin) - baseline  # what one INFO reply itself costs
        start = sent_bytes(admin)
        version, versions, arrays = read_numbered(reader.backend, 1, specs)
        moved = sent_bytes(admin) - start - info
        assert version == 2 and versions == [1] * 17 + [2] + [1] * 32
        assert arrays is not None and numbers(arrays) == [None] * 17 + [2] + [None] * 32
        # the leaf's 40 KB, its chunk header and the two head reads (a few hundred bytes)
        assert leaf <= moved <= leaf + 2 * KB, moved
        start = sent_bytes(admin)
        reader.pull()  # a whole pull of the same version: every leaf
        whole = sent_bytes(admin) - start - info
        assert whole >= 50 * leaf
    print(f"\n1 of 50 leaves changed: {moved} bytes moved (leaf {leaf}); whole pull {whole}")


def test_a_pull_fetches_only_the_chunks_covering_the_leaves_it_needs(server: Any) -> None:
    # 64 KiB chunks, a 1 MB whole segment: leaf 3 of it needs at most two chunks
    signature = {f"w{i}": varsync.Spec((25_000,), "float32") for i in range(10)}  # 100 KB each
    specs = specs_of(signature)
    with varsync.connect(server.url + "?chunk_size=65536") as writer, \
            varsync.connect(server.url) as reader, server.client() as admin:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        write_leaves(writer.backend, {i: filled_leaf(specs[i], 2) for i in range(10) if i != 3}, specs)
        write_leaves(writer.backend, {0: filled_leaf(specs[0], 3)}, specs)
        # a reader that holds nothing needs leaf 3 from version 1's segment, the rest from
        # the two partial ones: about the value's size, not the three segments'
        start = sent_bytes(admin)
        _, versions, arrays = read_numbered(reader.backend, 0, specs)
        moved = sent_bytes(admin) - start
        assert versions == [3, 2, 2, 1, 2, 2, 2, 2, 2, 2]
        assert numbers(arrays or []) == [3, 2, 2, 1, 2, 2, 2, 2, 2, 2]
        assert moved <= 10 * specs[0].nbytes + 3 * 65536, moved


# -- reads of chosen leaves (read_leaf_subset) -------------------------------------------------


def read_subset(backend: Any, indices: List[int], held: int, specs: Sequence[varsync.Spec]) -> Any:
    """``(version, leaf versions, numbers of the arrays)`` of a ``read_leaf_subset``."""
    head, versions, arrays = backend.read_leaf_subset("variables", indices, held, math.inf, specs)
    return head.version, versions, None if arrays is None else numbers(arrays)


def test_a_subset_read_fetches_only_the_chunks_of_the_chosen_leaves(server: Any) -> None:
    """Of a whole version (format 1) and of a composed one alike: about the chosen
    leaves' bytes, at most a chunk more on each side of each, never the version's."""
    signature = {f"w{i}": varsync.Spec((25_000,), "float32") for i in range(10)}  # 100 KB each
    specs = specs_of(signature)
    leaf, chunk = specs[0].nbytes, 65536
    with varsync.connect(server.url + "?chunk_size=65536") as writer, \
            varsync.connect(server.url) as reader, server.client() as admin:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        start = sent_bytes(admin)
        info = sent_bytes(admin) - start  # what one INFO reply itself costs
        start = sent_bytes(admin)
        got = read_subset(reader.backend, [3], 0, specs)
        moved = sent_bytes(admin) - start - info
        assert got == (1, [1] * 10, [None, None, None, 1] + [None] * 6)
        assert leaf <= moved <= leaf + 2 * chunk + 2 * KB, moved
        write_leaves(writer.backend, {3: filled_leaf(specs[3], 2), 7: filled_leaf(specs[7], 2)}, specs)
        start = sent_bytes(admin)
        got = read_subset(reader.backend, [5, 3], 0, specs)
        moved = sent_bytes(admin) - start - info
        versions = [1, 1, 1, 2, 1, 1, 1, 2, 1, 1]
        assert got == (2, versions, [None, None, None, 2, None, 1] + [None] * 4)
        assert 2 * leaf <= moved <= 2 * leaf + 4 * chunk + 2 * KB, moved
        assert read_subset(reader.backend, [5, 3], 1, specs) == (2, versions, [None] * 3 + [2] + [None] * 6)


def test_a_subset_read_of_a_small_whole_version_is_the_one_peek(server: Any) -> None:
    """A version of one small chunk comes with its head (the peek script): choosing
    leaves of it costs no request more."""
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        assert read_subset(store.backend, [0], 0, specs)[2] == [1] + [None] * 5
        before = command_calls(admin)  # the server has the peek script now
        assert read_subset(store.backend, [3, 5], 0, specs) == (1, [1] * 6, [None] * 3 + [1, None, 1])
        after = command_calls(admin)
    ran = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # the peek script, its HMGET of the head and GET of the one chunk
    assert {k: n for k, n in ran.items() if n and k != "info"} == {
        "evalsha": 1, "hmget": 1, "get": 1
    }


@pytest.mark.parametrize("recycle", [False, True], ids=["fresh", "recycled"])
def test_a_subset_read_restarts_when_the_version_it_reads_is_retired_mid_read(
    server: Any, monkeypatch: Any, recycle: bool
) -> None:
    """Whole pushes land between the reader's head and its chunks: the chunks it needs
    are gone (keep=0), or, recycled, overwritten in place under the next push's token;
    the read starts again and answers the newest version, never a mix."""
    signature = {f"w{i}": varsync.Spec((3000,), "float32") for i in range(4)}  # 12 KB each
    specs = specs_of(signature)
    recycling = "&recycle_from=0" if recycle else ""
    with varsync.connect(server.url + "?keep=0&chunk_size=4096" + recycling) as writer, \
            varsync.connect(server.url + "?chunk_size=4096") as reader:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        fetch = reader.backend.reader.fetch
        leaves = fetch.leaves
        retire = [2, 3, 4]

        def fetch_after_newer_pushes(*args: Any) -> Any:
            while retire:  # whole pushes: version 1's segment retired, its spare reused
                number = retire.pop(0)
                write(writer.backend, [filled_leaf(s, number) for s in specs], specs)
            return leaves(*args)

        monkeypatch.setattr(fetch, "leaves", fetch_after_newer_pushes)
        got = read_subset(reader.backend, [1, 2], 0, specs)
        assert got == (4, [4] * 4, [None, 4, 4, None])
        assert reader.backend.pulls_restarted == 1
    with server.client() as admin:  # a push overwrote a retired version's chunks in place
        assert bool(command_calls(admin).get("setrange")) == recycle


# -- retention -----------------------------------------------------------------------------


def test_a_leaf_unchanged_for_10000_versions_stays_readable_and_keys_stay_bounded(
    server: Any,
) -> None:
    signature = {"a_frozen": varsync.Spec((64,), "float32"), "b_step": varsync.Spec((), "int64"),
                 "c_bias": varsync.Spec((8,), "float32")}  # in flat (sorted) order
    specs = specs_of(signature)
    with varsync.connect(server.url + "?keep=1") as writer, \
            varsync.connect(server.url) as reader, server.client() as admin:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        most = 0
        for version in range(2, 10_002):
            leaves = {1: filled_leaf(specs[1], version)}
            if version % 7 == 0:
                leaves[2] = filled_leaf(specs[2], version)
            assert write_leaves(writer.backend, leaves, specs) == version
            if version % 500 == 0:
                most = max(most, admin.dbsize())
                _, versions, arrays = read_numbered(reader.backend, 0, specs)
                assert versions is not None and versions[0] == 1
                assert numbers(arrays or [])[:2] == [1, version]
        # head, events, tables, and the chunks of the segments that the current version
        # and the one kept reference: at most five segments of one chunk each
        assert admin.dbsize() <= 8 and most <= 8, (admin.dbsize(), most)
        head = table_head(server)
        assert len(head["segments"].split(",")) <= 5
        last_bias = max(v for v in range(2, 10_002) if v % 7 == 0)
        assert numbers(varsync.flatten(reader.pull())) == [1, 10_001, last_bias]


def test_recycling_never_overwrites_a_segment_a_retained_version_references(
    server: Any,
) -> None:
    # pushes of recycle_from (here 4 MiB) or more recycle the spare in place: the spare
    # is only ever a segment that no retained version references, never the unchanged leaf's
    signature = {"frozen": varsync.Spec((MB,), "float32"),  # 4 MiB, pushed once
                 "moving": varsync.Spec((MB + 8,), "float32")}  # above 4 MiB, every push
    specs = specs_of(signature)
    with varsync.connect(server.url + "?keep=1&chunk_size=1048576&recycle_from=4194304") as writer, \
            varsync.connect(server.url) as reader, server.client() as admin:
        writer.create_table("variables", signature)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        counts = []
        for version in range(2, 14):
            assert write_leaves(writer.backend, {1: filled_leaf(specs[1], version)}, specs) == version
            counts.append(len(chunk_keys(admin)))
            assert numbers(varsync.flatten(reader.pull())) == [1, version]
        head = table_head(server)
        assert head["spare"]
        assert head["spare"].split(":")[0] not in head["segments"]
        assert max(counts[3:]) == min(counts[3:])  # recycled: no chunk keys pile up
        assert writer.backend.details("variables")["spare_version"]


def test_a_whole_write_after_partial_ones_goes_back_to_format_1(server: Any) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url + "?keep=0") as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        assert table_head(server)["fmt"] == "1"
        write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs)
        head = table_head(server)
        assert head["fmt"] == "2" and head["leaves"].startswith("2|")
        write(store.backend, [filled_leaf(s, 3) for s in specs], specs)
        head = table_head(server)
        assert head["fmt"] == "1" and head["leaves"] == ""
        # keep=0: only the whole version's segment is left
        assert head["segments"] == f"3:{head['data']}:{head['layout']}"
        assert {k.split(":")[4] for k in chunk_keys(admin)} == {head["data"]}


# -- refusals --------------------------------------------------------------------------------


def test_leaves_on_a_stale_base_return_0_and_publish_nothing(server: Any) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        base = Head(1, table_head(server)["epoch"])
        assert write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs, base) == 2
        before, keys = table_head(server), chunk_keys(admin)
        assert write_leaves(store.backend, {0: filled_leaf(specs[0], 3)}, specs, base) == 0
        assert table_head(server) == before and chunk_keys(admin) == keys
        assert read_numbered(store.backend, 0, specs)[0] == 2


def test_leaves_into_an_empty_table_return_0_for_the_core_to_write_the_whole(
    server: Any,
) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        assert write_leaves(store.backend, {0: filled_leaf(specs[0], 1)}, specs) == 0
        assert table_head(server)["version"] == "0" and chunk_keys(admin) == []
        assert leaf_versions(store.backend) == (0, [0] * len(specs))


def test_a_reset_between_versions_is_a_reset_error_for_a_holder_never_mixed_leaves(
    server: Any,
) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as writer, varsync.connect(server.url) as reader, \
            server.client() as admin:
        writer.create_table("variables", MIXED)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        write_leaves(writer.backend, {0: filled_leaf(specs[0], 2)}, specs)
        held_head = read_leaves(reader.backend, 0, specs).head
        held = held_head.version
        assert held == 2
        admin.flushall()  # the server lost its data
        # the writer's leaves are deltas of a history that is gone: nothing is composed
        assert write_leaves(writer.backend, {1: filled_leaf(specs[1], 3)}, specs) == 0
        assert chunk_keys(admin) == []
        with varsync.connect(server.url) as other:  # another writer starts a new history
            other.create_table("variables", MIXED)
            write(other.backend, [filled_leaf(s, 7) for s in specs], specs)
            for _ in range(2, 5):  # past the version the reader holds
                write_leaves(other.backend, {0: filled_leaf(specs[0], 8)}, specs)
        # another epoch: the core drops the answer and raises TableResetError
        assert read_leaves(reader.backend, held, specs).head.epoch != held_head.epoch
        version, versions, arrays = read_numbered(reader.backend, 0, specs)
        assert version == 4 and versions == [4, 1, 1, 1, 1, 1]
        assert [n for n in numbers(arrays or []) if n is not None] == [8, 7, 7, 7, 7]
        # the first writer: leaves on a base of its history are refused; without a base
        # they land on the current version of the new one (whose numbers are all above
        # the leaf versions it keeps)
        assert write_leaves(writer.backend, {1: filled_leaf(specs[1], 9)}, specs, held_head) == 0
        assert write_leaves(writer.backend, {1: filled_leaf(specs[1], 9)}, specs) == 5
        version, versions, arrays = read_numbered(reader.backend, 4, specs)
        assert version == 5 and versions == [4, 5, 1, 1, 1, 1]
        assert numbers(arrays or []) == [None, 9, None, None, None, None]


# -- interrupted pushes ------------------------------------------------------------------------


def test_a_partial_push_whose_chunk_reply_is_lost_leaves_the_previous_version(
    server: Any,
) -> None:
    specs = specs_of(MIXED)
    with ReplyCutter(server.port) as cutter, server.client() as admin:
        via = f"redis://127.0.0.1:{cutter.port}/0?chunk_size=4096"
        with varsync.connect(via, timeout=10) as writer:
            writer.create_table("variables", MIXED)
            write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
            write_leaves(writer.backend, {0: filled_leaf(specs[0], 2)}, specs)
            before, keys = table_head(server), chunk_keys(admin)
            cutter.cut_reply_to(b"$3\r\nSET\r\n")
            with pytest.raises(varsync.BackendConnectionError):
                write_leaves(writer.backend, {i: filled_leaf(specs[i], 3) for i in (0, 3, 5)}, specs)
            assert cutter.cut == 1
            assert table_head(server) == before and chunk_keys(admin) == keys
            _, versions, arrays = read_numbered(writer.backend, 0, specs)
            assert versions == [2, 1, 1, 1, 1, 1] and numbers(arrays or [])[0] == 2


def test_a_partial_push_whose_publish_answer_is_lost_keeps_what_the_server_published(
    server: Any,
) -> None:
    specs = specs_of(MIXED)
    with ReplyCutter(server.port) as cutter, varsync.connect(server.url) as reader:
        via = f"redis://127.0.0.1:{cutter.port}/0"
        with varsync.connect(via, timeout=10) as writer:
            writer.create_table("variables", MIXED)
            write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
            cutter.cut_reply_to(_PUBLISH_SCRIPT.sha.encode())
            with pytest.raises(varsync.BackendConnectionError, match="may have published"):
                write_leaves(writer.backend, {4: filled_leaf(specs[4], 2)}, specs)
            assert cutter.cut == 1
            _, versions, arrays = read_numbered(reader.backend, 0, specs)
            assert versions == [1, 1, 1, 1, 2, 1] and numbers(arrays or [])[4] == 2
            # the writer carries on on top of what was published
            assert write_leaves(writer.backend, {0: filled_leaf(specs[0], 3)}, specs) == 3
        _, versions, _ = read_numbered(reader.backend, 0, specs)
        assert versions == [3, 1, 1, 1, 2, 1]


def test_a_pull_restarts_when_a_segment_it_needs_is_retired_mid_read(
    server: Any, monkeypatch: Any
) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url + "?keep=0&chunk_size=4096") as writer, \
            varsync.connect(server.url) as reader:
        writer.create_table("variables", MIXED)
        write(writer.backend, [filled_leaf(s, 1) for s in specs], specs)
        write_leaves(writer.backend, {0: filled_leaf(specs[0], 2)}, specs)
        fetch = reader.backend.reader.fetch
        leaves = fetch.leaves
        retire = [3, 4]

        def fetch_after_newer_pushes(*args: Any) -> Any:
            while retire:  # leaf 0 again, twice: version 2's segment is retired (keep=0)
                write_leaves(writer.backend, {0: filled_leaf(specs[0], retire.pop(0))}, specs)
            return leaves(*args)

        monkeypatch.setattr(fetch, "leaves", fetch_after_newer_pushes)
        version, _, arrays = read_numbered(reader.backend, 1, specs)
        assert version == 4 and numbers(arrays or [])[0] == 4
        assert reader.backend.pulls_restarted == 1


# -- formats ---------------------------------------------------------------------------------


def _old_check_format(directory: Path) -> Any:
    """``check_format`` of the varsync before leaf versions (this repository's history)."""
    root = Path(__file__).resolve().parents[3]
    source = subprocess.run(
        ["git", "show", "a1bdb42:varsync/backends/redis/protocol.py"],
        cwd=root, capture_output=True, text=True,
    )
    if source.returncode != 0:
        pytest.skip("the repository's history is not here")
    path = directory / "old_redis_protocol.py"
    spec = importlib.util.spec_from_file_location("old_redis_protocol", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path.write_text(source.stdout)
    sys.modules[spec.name] = module  # its dataclasses look their module up while made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module.check_format


def test_older_readers_read_whole_writes_and_refuse_composed_versions_clearly(
    server: Any, tmp_path: Path,
) -> None:
    old_check_format = _old_check_format(tmp_path)
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        old_check_format("table 'variables'", table_head(server)["fmt"])  # reads it
        write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs)
        with pytest.raises(varsync.CorruptDataError, match="newer varsync wrote it"):
            old_check_format("table 'variables'", table_head(server)["fmt"])
        write(store.backend, [filled_leaf(s, 3) for s in specs], specs)
        old_check_format("table 'variables'", table_head(server)["fmt"])


def test_details_and_the_head_stay_small_with_many_leaves(server: Any) -> None:
    signature = {f"w{i:03d}": varsync.Spec((4,), "float32") for i in range(500)}
    specs = specs_of(signature)
    with varsync.connect(server.url) as store:
        store.create_table("variables", signature)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        for version in range(2, 12):
            write_leaves(store.backend, {version: filled_leaf(specs[version], version)},
                                       specs)
        head: Dict[str, str] = table_head(server)
        # unchanged leaves of the whole segment cost one short entry each
        assert len(head["leaves"]) < 500 * 3 + 10 * 12, len(head["leaves"])
        assert leaf_versions(store.backend)[1][:12] == [1, 1] + list(range(2, 12))


def test_a_head_written_before_leaf_versions_takes_partial_pushes_and_retires_its_chunks(
    server: Any,
) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url + "?keep=1&chunk_size=4096") as store, \
            server.client() as admin:
        store.create_table("variables", MIXED)
        for version in (1, 2, 3):
            write(store.backend, [filled_leaf(s, version) for s in specs], specs)
        # what a varsync before leaf versions leaves: no segments, retained items only
        admin.hdel("varsync::variables:head", "segments", "leaves")
        whole = len(chunk_keys(admin)) // 2  # chunks of one whole version
        for version in (4, 5, 6):
            write_leaves(store.backend, {0: filled_leaf(specs[0], version)}, specs)
        _, versions, arrays = read_numbered(store.backend, 0, specs)
        assert versions == [6, 3, 3, 3, 3, 3] and numbers(arrays or [])[:2] == [6, 3]
        # version 3's whole segment (still referenced), and 5's and 6's of leaf 0: version
        # 2's chunks were retired through the old retained list
        leaf = -(-specs[0].nbytes // 4032)
        assert len(chunk_keys(admin)) == whole + 2 * leaf
        assert store.backend.details("variables")["segments"] == 3


def test_maxmemory_makes_a_partial_push_fail_and_keeps_the_previous_version(
    redis_servers: Any,
) -> None:
    server = redis_servers(config=["--maxmemory", "48mb", "--maxmemory-policy", "noeviction"])
    signature = {"a_small": varsync.Spec((1000,), "uint8"),
                 "b_big": varsync.Spec((30 * MB,), "uint8")}
    specs = specs_of(signature)
    with varsync.connect(server.url, chunk_size=MB) as store, server.client() as admin:
        store.create_table("variables", signature)
        assert write(store.backend, [filled_leaf(s, 1) for s in specs], specs) == 1
        keys = chunk_keys(admin)
        with pytest.raises(varsync.ItemTooLargeError, match="maxmemory"):
            write_leaves(store.backend, {1: filled_leaf(specs[1], 2)}, specs)
        assert chunk_keys(admin) == keys  # the failed push's chunks are gone
        _, versions, arrays = read_numbered(store.backend, 0, specs)
        assert versions == [1, 1] and numbers(arrays or []) == [1, 1]
        assert write_leaves(store.backend, {0: filled_leaf(specs[0], 3)}, specs) == 2


#: Damage to a composed head's leaf map, and what the error says.
MAP_DAMAGE = {
    "an entry that is not digits": ("leaves", lambda h: h.replace("|", "|x", 1), "malformed"),
    "a leaf in a segment not listed": ("leaves", lambda h: h.replace("|", "|99.0,", 1)
                                       .rsplit(",", 1)[0], "does not list"),
    "one leaf too few": ("leaves", lambda h: h.rsplit(",", 1)[0], "its signature has"),
    "an offset past its segment": ("leaves", lambda h: h.replace("2.0", "2.999999"),
                                   "past the end"),
    "a segment token that is not hex": ("segments", lambda h: h.replace(h.split(":")[1], "zz"),
                                        "not a token"),
}


@pytest.mark.parametrize("damage", sorted(MAP_DAMAGE))
def test_a_damaged_leaf_map_is_corrupt_data_never_wrong_arrays(server: Any, damage: str) -> None:
    field, change, message = MAP_DAMAGE[damage]
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs)
        head = "varsync::variables:head"
        admin.hset(head, field, change(admin.hget(head, field).decode()))
        with varsync.connect(server.url) as reader:
            with pytest.raises(varsync.CorruptDataError, match=message):
                read_numbered(reader.backend, 0, specs)
            with pytest.raises(varsync.CorruptDataError, match=message):
                reader.pull()


def test_a_damaged_segment_list_makes_the_publish_script_refuse(server: Any) -> None:
    specs = specs_of(MIXED)
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", MIXED)
        write(store.backend, [filled_leaf(s, 1) for s in specs], specs)
        admin.hset("varsync::variables:head", "segments", "1:nothex")
        before = table_head(server)
        with pytest.raises(varsync.CorruptDataError, match="malformed segments"):
            write_leaves(store.backend, {0: filled_leaf(specs[0], 2)}, specs)
        assert table_head(server) == before
