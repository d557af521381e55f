"""Sharded tables (docs/sharded.md): many writer ranks, one version; readers that fetch
only their blocks. Threads stand in for ranks, on memory://, a real redis-server and
shm:// alike; a killed writer is a real child process. Last, mutants of the core (publishing
before the last part, mixing parts of two steps, reusing a number after an abandon) that
these tests and the conformance suite's ShardedTests must catch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

import varsync
from varsync import ShardTimeoutError

ROOT = Path(__file__).resolve().parents[2]
BOUND = 30.0  # seconds: every wait of a step that must complete


@pytest.fixture(params=["memory", "redis", "shm"])
def url(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        yield f"memory://sharded-{uuid.uuid4().hex}"
    elif request.param == "redis":
        yield request.getfixturevalue("redis_namespace")()
    else:
        varsync_shm = pytest.importorskip("varsync_shm")
        name = f"test-sharded-{uuid.uuid4().hex}"
        yield f"shm://{name}"
        varsync_shm.remove_store(name)


def model(seed: int) -> Dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((8, 6)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
        "step": np.int64(seed),
    }


def rows(world: int) -> Callable[[int, Dict[str, Any]], Dict[Any, Any]]:
    """Rank r holds rows r*8/world.. of w; rank 0 also b and step (whole)."""

    def parts(rank: int, values: Dict[str, Any]) -> Dict[Any, Any]:
        n = 8 // world
        out: Dict[Any, Any] = {"w": (((rank * n, (rank + 1) * n), (0, 6)), values["w"][rank * n : (rank + 1) * n])}
        if rank == 0:
            out.update(b=values["b"], step=values["step"])
        return out

    return parts


def columns(world: int) -> Callable[[int, Dict[str, Any]], Dict[Any, Any]]:
    """Rank r holds columns of w and of b; the last rank holds step."""

    def parts(rank: int, values: Dict[str, Any]) -> Dict[Any, Any]:
        cut = [round(i * 6 / world) for i in range(world + 1)]
        a, z = cut[rank], cut[rank + 1]
        out: Dict[Any, Any] = {
            "w": (((0, 8), (a, z)), values["w"][:, a:z]),
            "b": (((a, z),), values["b"][a:z]),
        }
        if rank == world - 1:
            out["step"] = values["step"]
        return out

    return parts


def whole_leaves(world: int) -> Callable[[int, Dict[str, Any]], Dict[Any, Any]]:
    owners = {"w": 0, "b": 1 % world, "step": (world - 1)}

    def parts(rank: int, values: Dict[str, Any]) -> Dict[Any, Any]:
        return {k: v for k, v in values.items() if owners[k] == rank}

    return parts


def push_all(
    url: str, table: str, world: int, step: int, parts: Dict[int, Dict[Any, Any]], timeout: float
) -> Dict[int, Any]:
    """Each rank of ``parts`` pushes from a thread of its own container; rank -> the
    version returned or the exception raised."""
    answers: Dict[int, Any] = {}

    def rank_main(rank: int) -> None:
        with varsync.connect(url, timeout=BOUND) as store:
            try:
                answers[rank] = store.push_shard(
                    table, parts[rank], rank=rank, step=step, timeout=timeout
                )
            except Exception as exc:  # handed to the test, which asserts on it
                answers[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 2 * BOUND)
    assert not any(t.is_alive() for t in threads)
    return answers


def assert_bit_equal(got: Dict[str, Any], want: Dict[str, Any]) -> None:
    for key in want:
        assert np.asarray(got[key]).tobytes() == np.asarray(want[key]).tobytes(), key


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", [rows, columns, whole_leaves])
def test_every_step_is_published_whole_once_every_rank_pushed(url: str, world: int, layout: Any) -> None:
    split = layout(world)
    with varsync.connect(url, timeout=BOUND) as reader:
        reader.create_sharded_table("model", model(0), world)
        assert reader.version("model") == 0
        for step in (1, 2, 3):
            values = model(step)
            answers = push_all(url, "model", world, step, {r: split(r, values) for r in range(world)}, BOUND)
            assert answers == {r: step for r in range(world)}
            assert reader.version("model") == step
            assert_bit_equal(reader.pull("model"), values)
            version, sliced = reader.pull_slices("model", {"w": ((1, 7), (2, 5)), "step": ()})
            assert version == step
            assert sliced["w"].tobytes() == values["w"][1:7, 2:5].tobytes()
            assert int(sliced["step"]) == step
            newer = reader.pull_if_newer(step - 1, "model")
            assert newer is not None and newer[0] == step
            assert reader.pull_if_newer(step, "model") is None
            into = {k: np.zeros_like(v) for k, v in model(0).items() if k != "step"}
            into["step"] = np.zeros((), np.int64)
            assert reader.update(into, "model") == step
            assert_bit_equal(into, values)


def test_a_rank_that_never_pushes_is_named_and_readers_keep_the_last_version(url: str) -> None:
    split = rows(4)
    with varsync.connect(url, timeout=BOUND) as reader:
        reader.create_sharded_table("model", model(0), 4)
        first = model(1)
        assert push_all(url, "model", 4, 1, {r: split(r, first) for r in range(4)}, BOUND) == {
            r: 1 for r in range(4)
        }
        second = model(2)
        answers = push_all(url, "model", 4, 2, {r: split(r, second) for r in (0, 1, 3)}, 1.0)
        for rank in (0, 1, 3):
            error = answers[rank]
            assert isinstance(error, ShardTimeoutError), error
            assert error.missing == [2] and error.step == 2
            assert "rank(s) [2]" in str(error)
        assert reader.version("model") == 1
        assert_bit_equal(reader.pull("model"), first)
        # the next step overwrites the abandoned one's parts; its number is the next one
        third = model(3)
        assert push_all(url, "model", 4, 3, {r: split(r, third) for r in range(4)}, BOUND) == {
            r: 2 for r in range(4)
        }
        assert_bit_equal(reader.pull("model"), third)


def test_a_published_step_pushed_again_returns_its_version_and_older_steps_are_refused(
    url: str,
) -> None:
    split = whole_leaves(2)
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", model(0), 2)
        values = model(5)
        assert push_all(url, "model", 2, 5, {r: split(r, values) for r in range(2)}, BOUND) == {0: 1, 1: 1}
        # a retry after a lost reply
        assert store.push_shard("model", split(1, values), rank=1, step=5, timeout=BOUND) == 1
        with pytest.raises(varsync.ConfigurationError, match="not after the published step 5"):
            store.push_shard("model", split(0, values), rank=0, step=4, timeout=BOUND)
        assert store.version("model") == 1


def test_a_rank_that_moves_on_withdraws_its_part_of_the_step_left_unfinished(url: str) -> None:
    split = rows(2)
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", model(0), 2)
        assert push_all(url, "model", 2, 1, {0: split(0, model(1)), 1: split(1, model(1))}, BOUND)[0] == 1
        # rank 0 builds step 2 alone and gives up; rank 1 then arrives with step 2 late,
        # while rank 0 has moved on to step 3: step 2 can never mix rank 0's and rank 1's
        lone = push_all(url, "model", 2, 2, {0: split(0, model(2))}, 0.5)
        assert isinstance(lone[0], ShardTimeoutError) and lone[0].missing == [1]
        answers: Dict[int, Any] = {}

        def rank0_step3() -> None:
            with varsync.connect(url, timeout=BOUND) as own:
                answers[0] = own.push_shard("model", split(0, model(3)), rank=0, step=3, timeout=BOUND)

        mover = threading.Thread(target=rank0_step3)
        mover.start()
        try:
            with varsync.connect(url, timeout=BOUND) as own:
                with pytest.raises(ShardTimeoutError) as late:
                    own.push_shard("model", split(1, model(2)), rank=1, step=2, timeout=1.0)
                assert late.value.missing == [0]
                assert store.version("model") == 1
                assert own.push_shard("model", split(1, model(3)), rank=1, step=3, timeout=BOUND) == 2
        finally:
            mover.join(2 * BOUND)
        assert answers == {0: 2}
        assert_bit_equal(store.pull("model"), model(3))


def test_a_second_push_of_one_rank_waits_for_the_first_then_says_so(url: str) -> None:
    split = rows(2)
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", model(0), 2)
        first: List[Any] = []
        started = threading.Event()

        def slow() -> None:
            started.set()
            try:
                store.push_shard("model", split(0, model(1)), rank=0, step=1, timeout=3.0)
            except ShardTimeoutError as exc:
                first.append(exc)

        thread = threading.Thread(target=slow)
        thread.start()
        try:
            started.wait(BOUND)
            deadline = time.monotonic() + BOUND
            while store.backend.head("model/stage/0", deadline).version < 2:  # rank 0 staged
                assert time.monotonic() < deadline, "rank 0 never staged step 1"
                time.sleep(0.01)
            with pytest.raises(ShardTimeoutError, match="still pushing an earlier step"):
                store.push_shard("model", split(0, model(2)), rank=0, step=2, timeout=0.2)
        finally:
            thread.join(2 * BOUND)
        assert len(first) == 1 and first[0].missing == [1]
        assert store.version("model") == 0


def test_parts_that_do_not_cover_a_leaf_are_refused_before_anything_is_published(url: str) -> None:
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", model(0), 2)
        values = model(1)
        parts = {
            0: {"w": (((0, 4), (0, 6)), values["w"][:4]), "b": values["b"], "step": values["step"]},
            1: {"w": (((4, 7), (0, 6)), values["w"][4:7])},  # row 7 is nobody's
        }
        answers = push_all(url, "model", 2, 1, parts, 2.0)
        assert all(isinstance(a, varsync.ConfigurationError) for a in answers.values()), answers
        assert "hold 42 of the 48 elements" in str(answers[0])
        assert store.version("model") == 0


def test_create_checks_world_and_signature(url: str) -> None:
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", model(0), 2)
        assert store.create_sharded_table("model", model(0), 2) is not None
        with pytest.raises(varsync.TableExistsError):
            store.create_sharded_table("model", model(0), 3)
        with pytest.raises(varsync.ConfigurationError, match="not sharded"):
            store.create_table("plain", model(0))
            store.push_shard("plain", {"w": model(0)["w"]}, rank=0, step=1)
        with pytest.raises(varsync.PullTimeoutError) as empty:
            store.pull("model", timeout=0.05)
        assert empty.value.still_empty


@pytest.mark.parametrize("tiles", [2, (2, 4), (1, 5)])
def test_blocks_pushed_as_tiles_read_back_bit_exact(url: str, tiles: Any) -> None:
    """push_shard(tiles=...) stores each block as tiles (leaves of their own); every
    read puts them together again, and a tiling that changes is refused."""
    world = 2
    split = rows(world)
    with varsync.connect(url, timeout=BOUND) as reader:
        reader.create_sharded_table("tiled", model(0), world)
        for step in (1, 2):
            values = model(step)
            answers: Dict[int, Any] = {}
            for rank in range(world):  # one thread per rank, each its own container

                def rank_main(rank: int = rank) -> None:
                    with varsync.connect(url, timeout=BOUND) as store:
                        answers[rank] = store.push_shard(
                            "tiled", split(rank, values), rank=rank, step=step, tiles=tiles
                        )

                threading.Thread(target=rank_main).start()
            deadline = time.monotonic() + 2 * BOUND
            while len(answers) < world and time.monotonic() < deadline:
                time.sleep(0.01)
            assert answers == {r: step for r in range(world)}
            assert_bit_equal(reader.pull("tiled"), values)
            _, sliced = reader.pull_slices("tiled", {"w": ((1, 7), (2, 5))})
            assert sliced["w"].tobytes() == values["w"][1:7, 2:5].tobytes()
            into = {k: np.zeros_like(v) for k, v in model(0).items() if k != "step"}
            into["step"] = np.zeros((), np.int64)
            assert reader.update(into, "tiled") == step
            assert_bit_equal(into, values)
        with pytest.raises(varsync.ConfigurationError, match="tiles"):
            reader.push_shard("tiled", split(0, model(3)), rank=0, step=3, tiles=0)
        with pytest.raises(varsync.TableExistsError):
            reader.push_shard("tiled", split(0, model(3)), rank=0, step=3, tiles=3)
        assert reader.version("tiled") == 2


def test_a_reader_of_a_slice_moves_only_the_parts_that_hold_it(redis_servers: Any) -> None:
    server = redis_servers()
    url = server.url
    world = 4
    big = {"w": np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64)}
    n = 4096 // world
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("big", big, world)
        parts = {r: {"w": (((r * n, (r + 1) * n), (0, 64)), big["w"][r * n : (r + 1) * n])} for r in range(world)}
        assert push_all(url, "big", world, 1, parts, BOUND) == {r: 1 for r in range(world)}
        store.pull("big")  # the part tables' signatures, cached: only data moves below
        store.pull_slices("big", {"w": ((0, 1), (0, 1))})
        with server.client() as admin:

            def sent() -> int:
                return int(admin.info("stats")["total_net_output_bytes"])

            before = sent()
            whole = store.pull("big")["w"]
            whole_bytes = sent() - before
            before = sent()
            _, half = store.pull_slices("big", {"w": ((0, 2 * n), (0, 64))})
            half_bytes = sent() - before
            before = sent()
            _, quarter = store.pull_slices("big", {"w": ((n + 3, n + 9), (5, 60))})
            quarter_bytes = sent() - before
    assert whole.tobytes() == big["w"].tobytes()
    assert half["w"].tobytes() == big["w"][: 2 * n].tobytes()
    assert quarter["w"].tobytes() == big["w"][n + 3 : n + 9, 5:60].tobytes()
    nbytes = big["w"].nbytes
    assert nbytes <= whole_bytes < nbytes * 1.05
    assert nbytes / 2 <= half_bytes < nbytes / 2 * 1.05
    assert nbytes / 4 <= quarter_bytes < nbytes / 4 * 1.05


def test_a_reader_sharded_another_way_moves_only_the_tiles_it_needs(redis_servers: Any) -> None:
    """Ranks push rows, cut into column tiles (``tiles=4``); a reader of a column half,
    or of one leaf of two, moves about that share of the bytes (Redis ``INFO stats``):
    only the tiles it intersects are read (``read_leaf_subset``; 4 KiB chunks, so that
    a chunk shared with an unread tile costs little)."""
    server = redis_servers()
    url = server.url + "?chunk_size=4096"
    world, rows_, cols = 4, 4096, 64
    big = {
        "a": np.arange(rows_ * cols, dtype=np.float32).reshape(rows_, cols),
        "b": -np.arange(rows_ * cols, dtype=np.float32).reshape(rows_, cols),
    }
    n = rows_ // world
    parts = {
        r: {k: (((r * n, (r + 1) * n), (0, cols)), v[r * n : (r + 1) * n]) for k, v in big.items()}
        for r in range(world)
    }
    answers: Dict[int, Any] = {}

    def rank_main(rank: int) -> None:
        with varsync.connect(url, timeout=BOUND) as store:
            answers[rank] = store.push_shard("tiled", parts[rank], rank=rank, step=1, tiles=4)

    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("tiled", big, world)
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * BOUND)
        assert answers == {r: 1 for r in range(world)}
        store.pull_slices("tiled", {"a": ((0, 1), (0, 1))})  # signatures cached
        nbytes = sum(v.nbytes for v in big.values())
        with server.client() as admin:

            def sent() -> int:
                return int(admin.info("stats")["total_net_output_bytes"])

            before = sent()
            halves = {k: ((0, rows_), (0, cols // 2)) for k in big}
            _, half = store.pull_slices("tiled", halves)
            half_bytes = sent() - before
            before = sent()
            _, quarter = store.pull_slices("tiled", {"a": ((0, rows_), (cols // 4, cols // 2))})
            quarter_bytes = sent() - before
            before = sent()
            _, one = store.pull_slices("tiled", {"b": ((0, rows_), (0, cols))})
            one_bytes = sent() - before
    assert half["a"].tobytes() == big["a"][:, : cols // 2].tobytes()
    assert half["b"].tobytes() == big["b"][:, : cols // 2].tobytes()
    assert quarter["a"].tobytes() == big["a"][:, cols // 4 : cols // 2].tobytes()
    assert one["b"].tobytes() == big["b"].tobytes()
    assert nbytes / 2 <= half_bytes < nbytes / 2 * 1.1
    assert nbytes / 8 <= quarter_bytes < nbytes / 8 * 1.1
    assert nbytes / 2 <= one_bytes < nbytes / 2 * 1.1


KILLED_RANK = textwrap.dedent(
    """
    import sys, numpy as np, varsync
    url, step = sys.argv[1], int(sys.argv[2])
    w = np.full((4, 6), step, np.float32)
    with varsync.connect(url, timeout=60) as store:
        store.push_shard("model", {"w": (((2, 4), (0, 6)), w[2:])}, rank=1, step=step, timeout=60)
    """
)


@pytest.mark.parametrize("kind", ["redis", "shm"])
def test_a_writer_killed_between_its_part_and_the_commit_publishes_nothing(
    kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "redis":
        url = request.getfixturevalue("redis_namespace")()
    else:
        varsync_shm = pytest.importorskip("varsync_shm")
        name = f"test-sharded-{uuid.uuid4().hex}"
        request.addfinalizer(lambda: varsync_shm.remove_store(name))
        url = f"shm://{name}"
    w1 = np.full((4, 6), 1, np.float32)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with varsync.connect(url, timeout=BOUND) as store:
        store.create_sharded_table("model", {"w": w1}, 2)
        child = subprocess.Popen([sys.executable, "-c", KILLED_RANK, url, "1"], env=env)
        try:
            assert store.push_shard("model", {"w": (((0, 2), (0, 6)), w1[:2])}, rank=0, step=1, timeout=BOUND) == 1
            assert child.wait(BOUND) == 0
            # step 2: rank 1 stages its part, then dies before rank 0 arrives
            child = subprocess.Popen([sys.executable, "-c", KILLED_RANK, url, "2"], env=env)
            deadline = time.monotonic() + BOUND
            while store.backend.read("model/stage/1", 0, deadline, _stage_specs(2)).arrays[1][0] != 2:
                assert time.monotonic() < deadline, "rank 1 never staged step 2"
                time.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            child.wait(BOUND)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(BOUND)
        assert store.version("model") == 1
        assert store.pull("model")["w"].tobytes() == w1.tobytes()
        # rank 0 comes with step 2, rank 1 is gone: nothing published, and rank 1 named
        w2 = np.full((4, 6), 2, np.float32)
        with pytest.raises(ShardTimeoutError) as error:
            # rank 1's staged entry shows step 2: with rank 0's, step 2 would be complete,
            # but the killed rank's part is there, whole: a commit of it would be right too
            store.push_shard("model", {"w": (((0, 2), (0, 6)), w2[:2])}, rank=0, step=3, timeout=0.5)
        assert error.value.missing == [1]
        assert store.version("model") == 1
        assert store.pull("model")["w"].tobytes() == w1.tobytes()
        # a restarted rank 1 and rank 0 publish step 4 as version 2
        child = subprocess.Popen([sys.executable, "-c", KILLED_RANK, url, "4"], env=env)
        try:
            w4 = np.full((4, 6), 4, np.float32)
            assert store.push_shard("model", {"w": (((0, 2), (0, 6)), w4[:2])}, rank=0, step=4, timeout=BOUND) == 2
            assert child.wait(BOUND) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(BOUND)
        assert store.pull("model")["w"].tobytes() == w4.tobytes()


def _stage_specs(world: int) -> List[Any]:
    return [varsync.Spec([2], np.int64)] * world + [varsync.Spec([1 + world], np.int64)]


# -- mutants of the core: the sharded tests must catch each -------------------------------


@pytest.fixture
def on_memory() -> Any:
    """``make()``: a new container on a memory:// store holding the conformance suite's
    sharded table (``varsync.testing.sharded_tests``); the suite's tests take it."""
    from varsync.testing.sharded_tests import SHARDED, WORLD

    url = f"memory://sharded-mutant-{uuid.uuid4().hex}"
    made: List[Any] = []

    def make() -> Any:
        made.append(varsync.connect(url, timeout=BOUND))
        return made[-1]

    make().create_sharded_table("model", SHARDED, WORLD)
    yield make
    for container in made:
        container.close()


def _stage_lie(monkeypatch: pytest.MonkeyPatch, counts: Callable[[int, int, int], bool]) -> None:
    """A mutant core whose commit (only) takes a rank's stage entry ``(s, v)`` as staged
    for the step it builds when ``counts(s, v, published step)``."""
    import sys

    from varsync import _sharded as sharded_lib

    real = sharded_lib.ShardedTables._stage

    def lying(self: Any, name: str, slot: int, world: int, deadline: float) -> Any:
        stage = real(self, name, slot, world, deadline)
        if sys._getframe(1).f_code.co_name != "_commit":
            return stage
        step = max(s for s, _ in stage.entries)
        published = self.manifest(name, deadline).step
        entries = [(step, v) if counts(s, v, published) else (s, v) for s, v in stage.entries]
        return stage._replace(entries=entries)

    monkeypatch.setattr(sharded_lib.ShardedTables, "_stage", lying)


def test_the_sharded_tests_catch_a_core_that_publishes_before_the_last_part(
    monkeypatch: pytest.MonkeyPatch, on_memory: Any
) -> None:
    """A rank alone commits its step, with the absent rank's stale entry: the abandon
    test catches it (here the cover check refuses the stale part, before any reader
    could see it, and the rank gets a ConfigurationError, not a ShardTimeoutError)."""
    from varsync.testing.sharded_tests import ShardedTests

    _stage_lie(monkeypatch, lambda s, v, published: True)  # every rank counted as in
    with pytest.raises(AssertionError):
        ShardedTests().test_numbers_are_never_reused_after_an_abandon(on_memory)


def test_the_sharded_tests_catch_a_core_that_mixes_parts_of_two_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a part staged for any step not yet published counts for the step being built
    _stage_lie(monkeypatch, lambda s, v, published: s > published and v >= 0)
    with pytest.raises(AssertionError):
        test_a_rank_that_moves_on_withdraws_its_part_of_the_step_left_unfinished(
            f"memory://sharded-mutant-{uuid.uuid4().hex}"
        )


def test_the_sharded_tests_catch_a_core_that_reuses_a_number_after_an_abandon(
    on_memory: Any,
) -> None:
    """The mutant numbers a step as soon as a part of it is staged (its readers see that
    number, on the last version's values) and hands the number back when the step is
    abandoned: the next step published takes it again."""
    from varsync.testing.sharded_tests import ShardedTests

    made: List[Any] = []

    def make() -> Any:
        container = on_memory()
        if not made:  # the suite's first container is its reader
            shards = container._shards
            real = shards.manifest

            def numbered_when_staged(name: str, deadline: float) -> Any:
                manifest = real(name, deadline)
                stage = shards._stage(name, 1 - manifest.slot, 2, deadline)
                if any(s > manifest.step and v >= 0 for s, v in stage.entries):
                    return manifest._replace(
                        head=manifest.head._replace(version=manifest.head.version + 1)
                    )
                return manifest

            shards.manifest = numbered_when_staged
        made.append(container)
        return container

    with pytest.raises(AssertionError, match="version 2 named step 1"):
        ShardedTests().test_numbers_are_never_reused_after_an_abandon(make)
