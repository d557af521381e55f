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
from varsync._shard_layout import HELD_ROWS
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
    out: Dict[Any, Any] = {}
    for key, value in values.items():
        if np.ndim(value) == 2:
            rows = value.shape[0] // world
            a, z = rank * rows, (rank + 1) * rows
            out[key] = (((a, z), (0, value.shape[1])), value[a:z])
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

    def __init__(
        self,
        url: str,
        world: int,
        cols: int = 64,
        make: Callable[[int, int], Dict[str, Any]] | None = None,
        metrics: Any = None,
        **options: Any,
    ) -> None:
        self.url, self.world, self.cols, self.metrics = url, world, cols, metrics
        self.make = make or (lambda world, step: model(world, step, cols))
        self.options = options  # push_shard's
        self.stores = [self.connect() for _ in range(world)]

    def connect(self) -> Any:
        return varsync.connect(self.url, timeout=BOUND, metrics=self.metrics)

    def restart(self, rank: int) -> None:
        self.stores[rank].close()
        self.stores[rank] = self.connect()

    def push(self, step: int) -> int:
        """Every rank pushes ``step`` (a rank whose reply is lost, or that is
        interrupted, pushes it again)."""
        values = self.make(self.world, step)
        answers: Dict[int, Any] = {}

        def rank_main(rank: int) -> None:
            for _ in range(2):
                try:
                    answers[rank] = self.stores[rank].push_shard(
                        "model", parts(self.world, rank, values), rank=rank, step=step,
                        timeout=BOUND, **self.options,
                    )  # fmt: skip
                    return
                except (KeyboardInterrupt, Exception) as exc:  # pushed again, or to the test
                    answers[rank] = exc
                    if not isinstance(exc, (KeyboardInterrupt, varsync.BackendConnectionError)):
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


class Readers:
    """A reader of every step and one of every third by ``pull_if_newer(held=)``, and
    one by ``update`` into ``into``: each checked bit-exact on the version it gets."""

    def __init__(self, url: str, into: Dict[str, Any]) -> None:
        self.every, self.sparse, self.updater = (
            varsync.connect(url, timeout=BOUND) for _ in range(3)
        )
        self.into = into
        self.held: Dict[str, Any] = {}
        self.versions = {"every": 0, "sparse": 0}

    def check(self, step: int, version: int, values: Dict[str, Any]) -> None:
        """``values`` published as ``version``: step ``step``'s readers hold it."""
        for name in ("every", "sparse") if step % 3 == 0 else ("every",):
            reader = getattr(self, name)
            got = reader.pull_if_newer(self.versions[name], "model", held=self.held.get(name))
            assert got is not None and got[0] == version
            self.versions[name], self.held[name] = got
            assert_bit_equal(self.held[name], values)
        assert self.updater.update(self.into, "model") == version
        assert_bit_equal(self.into, values)

    def close(self) -> None:
        for reader in (self.every, self.sparse, self.updater):
            reader.close()


def counted(registry: Any, name: str) -> float:
    """The metered backend's counter ``name``, over every table."""
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == name
    )


def pulled(registry: Any) -> float:
    """Bytes of arrays the metered backend read, over every table."""
    return counted(registry, "varsync_bytes_pulled_total")


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
                # and each ~held (element deltas' versions); with element deltas, twice
                # more where this reader reads the slot for the first time since they
                # began (it asks for them alone, before the patches that come with them)
                small += world * HELD_ROWS * 16
                if url.startswith("redis") and subsets:
                    small += 8 * (4 * world + 1) + world * HELD_ROWS * 16
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
    readers = None
    try:
        ranks.stores[0].create_sharded_table("model", model(world, 0), world)
        readers = Readers(url, zeros(world))
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
            readers.check(step, version, model(world, step))
    finally:
        if readers is not None:
            readers.close()
        ranks.close()


_EVOLVING: Dict[Any, Dict[str, Any]] = {}
SHARE = 100  # one element in SHARE changes per step


def evolving(world: int, step: int) -> Dict[str, Any]:
    """A model of which 1 % of ``w16``'s and ``w32``'s elements change per step, to bit
    patterns at random (NaN payloads and -0.0 among them); ``emb`` never changes."""
    key = (world, step)
    if key in _EVOLVING:
        return _EVOLVING[key]
    if step == 0:
        rng = np.random.default_rng(0)
        rows = world * ROWS
        out = {
            "emb": rng.standard_normal((rows, 64)).astype(np.float32),
            "w16": rng.standard_normal((rows, 512)).astype(np.float16),
            "w32": rng.standard_normal((rows, 256)).astype(np.float32),
        }
    else:
        out = {k: np.array(v, copy=True) for k, v in evolving(world, step - 1).items()}
        rng = np.random.default_rng(1000 + step)
        for name, unsigned, special in (("w16", np.uint16, 0x7C01), ("w32", np.uint32, 0x7FC0_0001)):
            flat = out[name].reshape(-1).view(unsigned)
            at = rng.choice(flat.size, flat.size // SHARE, replace=False)
            flat[at] = rng.integers(0, np.iinfo(unsigned).max, at.size, dtype=unsigned)
            flat[at[:2]] = (special, 1 << (8 * flat.itemsize - 1))  # a NaN payload, -0.0
    out["step"] = np.int64(step)
    _EVOLVING[key] = out
    return out


def element_bytes(world: int, step: int, since: int) -> int:
    """Elements of ``step`` that differ from ``since``'s, times (their bytes + 4)."""
    now, then = evolving(world, step), evolving(world, since)
    total = 0
    for key in ("w16", "w32"):
        width = now[key].dtype.itemsize
        bits = np.dtype(f"u{width}")
        differ = now[key].reshape(-1).view(bits) != then[key].reshape(-1).view(bits)
        total += int(differ.sum()) * (width + 4)
    return total


def pushed(registry: Any) -> float:
    """Bytes of arrays the metered backend wrote, over every table."""
    return counted(registry, "varsync_bytes_pushed_total")


@pytest.mark.parametrize("world", [2, 4])
def test_element_deltas_per_block_move_only_the_elements_that_changed(
    url: str, world: int
) -> None:
    """Ranks push with element deltas: from the third step on, each rank sends its
    changed elements (twice: the catch-up of its other slot, then the step) and readers
    holding the step before fetch them alone, by ``pull_if_newer(held=)`` and by
    ``update``, within 1.3 x (changed elements x (bytes + 4)) plus the small leaves; a
    reader that reads every other step applies two steps' patches; all bit-exact,
    NaN payloads and -0.0 included."""
    writing = prometheus_client.CollectorRegistry()
    ranks = Ranks(url, world, make=evolving, metrics=writing, element_deltas=True)
    pulling, updating = prometheus_client.CollectorRegistry(), prometheus_client.CollectorRegistry()
    try:
        ranks.stores[0].create_sharded_table("model", evolving(world, 0), world)
        with (
            varsync.connect(url, timeout=BOUND, metrics=pulling) as reader,
            varsync.connect(url, timeout=BOUND, metrics=updating) as updater,
            varsync.connect(url, timeout=BOUND) as sparse,
        ):
            version, held = 0, None
            into = {k: np.zeros_like(v) for k, v in evolving(world, 0).items()}
            into["step"] = np.zeros((), np.int64)
            sparse_version, sparse_held = 0, None
            for step in range(1, 9):
                before = pushed(writing), pulled(pulling), pulled(updating)
                assert ranks.push(step) == step
                values = evolving(world, step)
                got = reader.pull_if_newer(version, "model", held=held)
                assert got is not None and got[0] == step
                version, held = got
                assert updater.update(into, "model") == step
                assert_bit_equal(held, values)
                assert_bit_equal(into, values)
                if step % 2 == 0:
                    got = sparse.pull_if_newer(sparse_version, "model", held=sparse_held)
                    assert got is not None and got[0] == step
                    sparse_version, sparse_held = got
                    assert_bit_equal(sparse_held, values)
                if step < 4:
                    continue  # the first steps write each slot whole, then catch one up
                ideal = element_bytes(world, step, step - 1)
                # per part: ~changed and ~held, twice (with the leaf versions, then with
                # the patches), a patch's header per block; the manifest; step
                small = world * 2 * (8 * 4 + 16 * HELD_ROWS + 3 * 64) + 8 * (world + 2) + 8
                blocks_whole = sum(
                    v.nbytes for k, v in values.items() if k in ("w16", "w32", "step")
                )
                for moved in (pulled(pulling) - before[1], pulled(updating) - before[2]):
                    assert ideal / 3 < moved <= 1.3 * ideal + small, (moved, ideal, small)
                    assert moved < blocks_whole / 5
                sent = pushed(writing) - before[0]
                assert sent <= 2 * (1.3 * ideal + small), (sent, ideal)
    finally:
        ranks.close()


def test_element_deltas_per_block_stay_bit_exact_through_faults(url: str) -> None:
    """Ranks push with element deltas through a lost reply to a part write (each of a
    push's writes in turn: a catch-up, a step), an interrupt between a rank's part
    writes, a rank restarted (a new container: no copies, no slots known) and a step
    abandoned (a rank never pushes it); readers of every step, of every third, and by
    ``update`` stay bit-exact at every version."""
    world = 2
    ranks = Ranks(url, world, make=evolving, element_deltas=True)
    readers = None
    try:
        ranks.stores[0].create_sharded_table("model", evolving(world, 0), world)
        into = {k: np.zeros_like(v) for k, v in evolving(world, 0).items()}
        into["step"] = np.zeros((), np.int64)
        readers = Readers(url, into)
        published = 0
        for step in range(1, 15):
            faults: List[str] = []
            if step == 9:
                ranks.restart(1)
            if step in (4, 5, 6, 7):  # rank 0's part writes this step, one of them failing

                def hook(
                    method: str,
                    table: str,
                    call: Callable[[], Any],
                    _at: int = step % 2,
                    _seen: List[str] = faults,
                ) -> Any:
                    if "/parts/" not in table:
                        return call()
                    _seen.append(method)
                    if len(_seen) != _at + 1:
                        return call()
                    if step < 6:
                        call()
                        raise varsync.BackendConnectionError("test: the reply was lost")
                    raise KeyboardInterrupt  # before the write

                wrap_writes(ranks.stores[0].backend, hook)
            if step == 11:  # rank 1 never pushes it: abandoned
                with pytest.raises(varsync.ShardTimeoutError) as caught:
                    ranks.stores[0].push_shard(
                        "model",
                        parts(world, 0, evolving(world, step)),
                        rank=0,
                        step=step,
                        timeout=1.0,
                        element_deltas=True,
                    )
                assert caught.value.missing == [1]
                continue
            version = ranks.push(step)  # a rank interrupted, or whose reply was lost, again
            for method in ("write", "write_leaves", "write_patches"):
                ranks.stores[0].backend.__dict__.pop(method, None)  # the hook, if any, off
            published += 1
            assert version == published, (step, version)
            assert len(faults) > step % 2 if step in (4, 5, 6, 7) else not faults, (step, faults)
            readers.check(step, published, evolving(world, step))
    finally:
        if readers is not None:
            readers.close()
        ranks.close()


@pytest.mark.parametrize("elements", [True, False], ids=["element-deltas", "blocks"])
def test_pull_slices_given_held_fetches_only_what_changed_in_its_slices(
    url: str, elements: bool
) -> None:
    """Readers sharded another way (``pull_slices(held=)``): a row half (inside two
    ranks' blocks), a column half (across every rank's blocks, cut into two column
    tiles) and a column quarter (half of each tile) stay bit-exact on their slices of
    each step; a slice that did not change is the held array itself; they move only
    blocks that changed, in their slices, and with element deltas only the patches of
    blocks inside their slices (1 % of the elements change per step)."""
    world = 4
    rows = world * ROWS
    registry = prometheus_client.CollectorRegistry()
    ranks = Ranks(url, world, make=evolving, element_deltas=elements, tiles=2)
    slices = {
        "rows": {k: ((0, rows // 2), (0, cols)) for k, cols in (("emb", 64), ("w16", 512))},
        "columns": {"w16": ((0, rows), (0, 256)), "w32": ((0, rows), (128, 256))},
        "quarter": {"w16": ((0, rows), (0, 128))},
    }
    try:
        ranks.stores[0].create_sharded_table("model", evolving(world, 0), world)
        with varsync.connect(url, timeout=BOUND, metrics=registry) as reader:
            held: Dict[str, Any] = {}
            for step in range(1, 8):
                assert ranks.push(step) == step
                values = evolving(world, step)
                for name, wanted in slices.items():
                    before = pulled(registry)
                    got = reader.pull_slices("model", wanted, held=held.get(name))
                    moved = pulled(registry) - before
                    assert got[0] == step
                    for key, ranges in wanted.items():
                        want = values[key][tuple(slice(a, b) for a, b in ranges)]
                        assert got[1][key].tobytes() == want.tobytes(), (step, name, key)
                    if name in held and "emb" in wanted:
                        assert got[1]["emb"] is held[name][1]["emb"]  # unchanged: held's own
                    whole = sum(
                        int(np.prod([b - a for a, b in r])) * values[k].dtype.itemsize
                        for k, r in wanted.items()
                    )
                    if step >= 4:
                        small = 8 * (world + 2) + world * 2 * (8 * 8 + 16 * HELD_ROWS) + 4096
                        # the quarter cuts its tiles in two: they come whole, twice it
                        share = 2.0 if name == "quarter" else 0.1 if elements else 1.0
                        assert moved <= share * whole + small, (step, name, moved, whole)
                    held[name] = got
    finally:
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
        assert delta_bytes < nbytes / 80  # ~held, the versions element deltas read from, too
    finally:
        ranks.close()
