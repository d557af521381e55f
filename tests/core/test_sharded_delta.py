"""Delta reads of sharded tables (docs/sharded.md, "Reading"): after a first read,
``pull_if_newer(held=)`` and ``update`` fetch only the blocks that changed since the
version held, and end bit-exact, on memory://, a real redis-server and shm:// alike.
Ranks are threads, each with a container of its own that lives across steps (as a rank
process keeps its own); bytes are counted by the metered backend (``connect(metrics=)``)
and, on Redis, by the server's ``INFO stats``."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable, Dict, List

import numpy as np
import prometheus_client
import pytest

import varsync
from varsync.testing.sharded_tests import wrap_writes

BOUND = 30.0  # seconds: every wait of a step that must complete
ROWS = 16  # rows of each leaf per rank


@pytest.fixture(params=["memory", "redis", "shm"])
def url(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        yield f"memory://sharded-delta-{uuid.uuid4().hex}"
    elif request.param == "redis":
        yield request.getfixturevalue("redis_namespace")()
    else:
        varsync_shm = pytest.importorskip("varsync_shm")
        name = f"test-sharded-delta-{uuid.uuid4().hex}"
        yield f"shm://{name}"
        varsync_shm.remove_store(name)


def model(world: int, step: int, cols: int = 64) -> Dict[str, Any]:
    """``emb`` never changes; ``w`` changes every step; of ``head`` only rank 0's rows
    change, at even steps; ``flip``'s last rows are A, then B at steps 3 and 7 (A->B->A)."""
    rows = world * ROWS
    fixed = np.random.default_rng(0)
    emb = fixed.standard_normal((rows, cols)).astype(np.float32)
    head = fixed.standard_normal((rows, 8)).astype(np.float32)
    flip = fixed.standard_normal((rows, 4)).astype(np.float32)
    head[:ROWS] = np.random.default_rng(1000 + step // 2).standard_normal((ROWS, 8))
    if step in (3, 7):
        flip[-ROWS:] = np.random.default_rng(7).standard_normal((ROWS, 4))
    w = np.random.default_rng(step).standard_normal((rows, 8)).astype(np.float32)
    return {"emb": emb, "flip": flip, "head": head, "step": np.int64(step), "w": w}


def parts(world: int, rank: int, values: Dict[str, Any]) -> Dict[Any, Any]:
    """Rank ``rank`` holds its rows of every matrix; rank 0 also ``step``."""
    a, z = rank * ROWS, (rank + 1) * ROWS
    out: Dict[Any, Any] = {
        key: (((a, z), (0, values[key].shape[1])), values[key][a:z])
        for key in ("emb", "flip", "head", "w")
    }
    if rank == 0:
        out["step"] = values["step"]
    return out


def blocks(world: int, step: int, cols: int = 64) -> Dict[Any, bytes]:
    """Every rank's blocks of ``step``: (rank, leaf) -> their bytes."""
    out = {}
    for rank in range(world):
        for key, given in parts(world, rank, model(world, step, cols)).items():
            out[(rank, key)] = np.asarray(given[1] if isinstance(given, tuple) else given).tobytes()
    return out


def changed_bytes(world: int, step: int, *since: int, cols: int = 64) -> int:
    """Bytes of the blocks of ``step`` that differ from those of any step ``since``."""
    now = blocks(world, step, cols)
    then = [blocks(world, s, cols) for s in since]
    return sum(len(v) for k, v in now.items() if any(t[k] != v for t in then))


class Ranks:
    """``world`` rank containers, kept across steps as rank processes keep theirs."""

    def __init__(self, url: str, world: int, cols: int = 64) -> None:
        self.url, self.world, self.cols = url, world, cols
        self.stores = [varsync.connect(url, timeout=BOUND) for _ in range(world)]

    def restart(self, rank: int) -> None:
        self.stores[rank].close()
        self.stores[rank] = varsync.connect(self.url, timeout=BOUND)

    def push(self, step: int) -> int:
        """Every rank pushes ``step`` (a rank whose reply is lost pushes it again)."""
        values = model(self.world, step, self.cols)
        answers: Dict[int, Any] = {}

        def rank_main(rank: int) -> None:
            for _ in range(2):
                try:
                    answers[rank] = self.stores[rank].push_shard(
                        "model", parts(self.world, rank, values), rank=rank, step=step,
                        timeout=BOUND,
                    )  # fmt: skip
                    return
                except Exception as exc:  # a lost reply: pushed again; else to the test
                    answers[rank] = exc
                    if not isinstance(exc, varsync.BackendConnectionError):
                        return

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * BOUND)
        assert not any(t.is_alive() for t in threads)
        versions = set(answers.values())
        assert len(versions) == 1 and isinstance(next(iter(versions)), int), answers
        return int(versions.pop())

    def close(self) -> None:
        for store in self.stores:
            store.close()


def pulled(registry: Any) -> float:
    """Bytes of arrays the metered backend read, over every table."""
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "varsync_bytes_pulled_total"
    )


def zeros(world: int) -> Dict[str, Any]:
    into = {k: np.zeros_like(v) for k, v in model(world, 0).items()}
    into["step"] = np.zeros((), np.int64)
    return into


def assert_bit_equal(got: Dict[str, Any], want: Dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert np.asarray(got[key]).tobytes() == np.asarray(want[key]).tobytes(), key


@pytest.mark.parametrize("subsets", [True, False], ids=["chosen-leaves", "read-leaves"])
@pytest.mark.parametrize("world", [2, 4])
def test_delta_reads_fetch_only_the_blocks_that_changed(
    url: str, world: int, subsets: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a first read of each slot, steps 5 and 6 move ``w``, ``step`` and rank 0's
    rows of ``head`` where they changed: exactly those on a backend that reads chosen
    leaves (all three here); with ``read_leaves`` alone (the reader told the backend
    lacks that ability), also ``flip``'s last rows at step 5 (changed since step 3, the
    step this reader last read that slot at, though not since step 4). Never ``emb``,
    70 % of the model."""
    if not subsets:
        monkeypatch.setattr("varsync._sharded_reads.reads_leaf_subsets", lambda backend: False)
    ranks = Ranks(url, world)
    pulling, updating = prometheus_client.CollectorRegistry(), prometheus_client.CollectorRegistry()
    try:
        ranks.stores[0].create_sharded_table("model", model(world, 0), world)
        with (
            varsync.connect(url, timeout=BOUND, metrics=pulling) as reader,
            varsync.connect(url, timeout=BOUND, metrics=updating) as updater,
        ):
            for step in (1, 2, 3):
                ranks.push(step)
            version, held = reader.pull_if_newer(0, "model")
            into = zeros(world)
            assert updater.update(into, "model") == version == 3
            ranks.push(4)  # flip changes back: its block is read again, not the whole part
            version, held = reader.pull_if_newer(version, "model", held=held)
            assert updater.update(into, "model") == version == 4
            for step in (5, 6):
                ranks.push(step)
                values = model(world, step)
                before = pulled(pulling), pulled(updating)
                got = reader.pull_if_newer(version, "model", held=held)
                assert got is not None and got[0] == step
                version, old, held = got[0], held, got[1]
                assert updater.update(into, "model") == step
                moved = pulled(pulling) - before[0], pulled(updating) - before[1]
                assert_bit_equal(held, values)
                assert_bit_equal(into, values)
                assert held["emb"] is old["emb"]  # not copied: held's own leaf
                # what changed since the step held; at most, also what changed since the
                # step before it, at which this reader last read the same slot
                needed = changed_bytes(world, step, step - 1)
                most = changed_bytes(world, step, step - 1, step - 2)
                small = 8 * (world + 2) + 8 * (4 * world + 1)  # the manifest, every ~changed
                whole = sum(np.asarray(v).nbytes for v in values.values())
                assert needed < whole / 3
                for count in moved:
                    assert needed <= count <= (needed if subsets else most) + small, (
                        count,
                        needed,
                        most,
                        whole,
                    )
                assert reader.pull_if_newer(version, "model", held=held) is None
            fresh_registry = prometheus_client.CollectorRegistry()
            with varsync.connect(url, timeout=BOUND, metrics=fresh_registry) as fresh:
                assert_bit_equal(fresh.pull("model"), model(world, 6))  # a fresh reader: whole
            assert pulled(fresh_registry) >= whole
    finally:
        ranks.close()


@pytest.mark.parametrize("world", [2, 4])
def test_delta_reads_stay_bit_exact_through_reverts_skips_restarts_and_retries(
    url: str, world: int
) -> None:
    """Readers that read every step, every third step, or by ``update``, through a
    block that changes and changes back (steps 3, 4 and 7, 8), a rank restarted (a new
    container, step 5) and a rank whose reply to its part was lost (step 6, pushed
    again)."""
    ranks = Ranks(url, world)
    readers: List[Any] = []
    try:
        ranks.stores[0].create_sharded_table("model", model(world, 0), world)
        every, sparse, updater = (varsync.connect(url, timeout=BOUND) for _ in range(3))
        readers += [every, sparse, updater]
        held: Dict[str, Any] = {}
        into = zeros(world)
        versions = {"every": 0, "sparse": 0}
        for step in range(1, 11):
            if step == 5:
                ranks.restart(world - 1)
            lost: List[str] = []
            if step == 6:

                def hook(
                    method: str, table: str, call: Callable[[], Any], _lost: List[str] = lost
                ) -> Any:
                    result = call()
                    if "/parts/" in table and not _lost:
                        _lost.append(table)
                        raise varsync.BackendConnectionError("test: the reply to the part was lost")
                    return result

                wrap_writes(ranks.stores[0].backend, hook)
            version = ranks.push(step)
            assert bool(lost) == (step == 6)
            values = model(world, step)
            got = every.pull_if_newer(versions["every"], "model", held=held.get("every"))
            assert got is not None and got[0] == version
            versions["every"], held["every"] = got
            assert_bit_equal(held["every"], values)
            assert updater.update(into, "model") == version
            assert_bit_equal(into, values)
            if step % 3 == 0:
                got = sparse.pull_if_newer(versions["sparse"], "model", held=held.get("sparse"))
                assert got is not None and got[0] == version
                versions["sparse"], held["sparse"] = got
                assert_bit_equal(held["sparse"], values)
    finally:
        for reader in readers:
            reader.close()
        ranks.close()


def test_a_reader_reports_the_sharded_version_it_holds(url: str) -> None:
    ranks = Ranks(url, 2)
    try:
        ranks.stores[0].create_sharded_table("model", model(2, 0), 2)
        with (
            varsync.connect(url, timeout=BOUND) as reader,
            varsync.connect(url, timeout=BOUND) as learner,
        ):
            reader.report_as("actor-0", ttl=BOUND)
            for step in (4, 9):
                version = ranks.push(step)
                got = reader.pull_if_newer(version - 1, "model")
                assert got is not None and got[0] == version
                (info,) = learner.wait_for_readers(version, 1, "model", timeout=BOUND)
                assert (info.reader, info.version) == ("actor-0", version)
            assert learner.readers("model")[0].lag(learner.version("model")) == 0
    finally:
        ranks.close()


def test_on_redis_a_delta_read_moves_the_changed_blocks_over_the_wire(redis_servers: Any) -> None:
    """The server's own count (``INFO stats``): after a first read, step 6 changes ``w``,
    ``step`` and rank 0's rows of ``head``: a delta read moves those blocks (2.5 KiB of a
    1 MiB model here) and a few KiB of requests, where a whole read moves the model."""
    server = redis_servers()
    world, cols = 4, 4096
    ranks = Ranks(server.url, world, cols)
    try:
        ranks.stores[0].create_sharded_table("model", model(world, 0, cols), world)
        with varsync.connect(server.url, timeout=BOUND) as reader, server.client() as admin:

            def sent() -> int:
                return int(admin.info("stats")["total_net_output_bytes"])

            version, held = 0, None
            for step in (1, 2, 3, 4, 5):  # every slot read once
                ranks.push(step)
                version, held = reader.pull_if_newer(version, "model", held=held)
            ranks.push(6)
            before = sent()
            version, held = reader.pull_if_newer(version, "model", held=held)
            delta_bytes = sent() - before
            before = sent()
            whole = reader.pull("model")
            whole_bytes = sent() - before
        values = model(world, 6, cols)
        assert_bit_equal(held, values)
        assert_bit_equal(whole, values)
        nbytes = sum(np.asarray(v).nbytes for v in values.values())
        needed = changed_bytes(world, 6, 5, cols=cols)
        print(
            f"\nredis, {world} ranks: a delta read sent {delta_bytes} B for {needed} B of "
            f"changed blocks; a whole read {whole_bytes} B of a {nbytes} B model"
        )
        assert nbytes <= whole_bytes < nbytes * 1.05
        assert needed <= delta_bytes < needed + 8192  # + requests' framing, ~changed
        assert delta_bytes < nbytes / 100
    finally:
        ranks.close()
