"""Sharded tables (``docs/sharded.md``): one version from many writer ranks, and faults
that never expose a partial version, on every backend with leaf versions.

Ranks are threads with a container each, except the rank killed between its part and
the commit: a child process, SIGKILLed (on backends ``shared_across_processes``). Faults
are injected at the backend instance a rank's container uses (its ``write``,
``write_leaves`` and ``write_patches`` wrapped): a lost reply, a ``KeyboardInterrupt``
before or after each of a rank's writes, a rank held before its publication. Every
value of step ``s`` is filled with ``s``, so a pull that mixes two steps shows itself.

Backends without :class:`~varsync.backend.SupportsLeafVersions` skip these tests (sharded
tables are built on it).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import varsync
from varsync.backend import Backend, SupportsLeafVersions
from varsync.testing._base import _Base

__all__ = ["ShardedTests", "SHARDED", "rank_parts"]

#: The table of these tests; rank 0 of 2 holds rows 0-3 of ``w`` and ``step``, rank 1
#: rows 4-7 of ``w`` and ``b`` whole.
SHARDED = {
    "w": varsync.Spec((8, 6), "float32"),
    "b": varsync.Spec((6,), "float32"),
    "step": varsync.Spec((), "int64"),
}
WORLD = 2
BOUND = 60.0  # seconds: every wait of a step that must complete
SHORT = 0.5  # seconds: the timeout of a push that must be abandoned
_WRITES = ("write", "write_leaves", "write_patches")


def rank_parts(rank: int, step: int) -> dict[Any, Any]:
    """Rank ``rank``'s part of step ``step``: every element holds ``step``."""
    w = np.full((8, 6), step, np.float32)
    if rank == 0:
        return {"w": (((0, 4), (0, 6)), w[:4]), "step": np.int64(step)}
    return {"w": (((4, 8), (0, 6)), w[4:]), "b": np.full(6, step, np.float32)}


def _push_step(
    ranks: list[Any],
    table: str,
    step: int,
    part: Callable[[int, int], Any],
    attempts: int = 1,
    **options: Any,
) -> dict[int, Any]:
    """Every rank pushes ``part(rank, step)`` in a thread of its own, up to ``attempts``
    times while it raises; per rank, its answer or its last exception (the test asserts
    on them)."""
    answers: dict[int, Any] = {}

    def push(rank: int) -> None:
        for _ in range(attempts):
            try:
                answers[rank] = ranks[rank].push_shard(
                    table, part(rank, step), rank=rank, step=step, timeout=BOUND, **options
                )
                return
            except BaseException as exc:  # handed to the test, which asserts on it
                answers[rank] = exc

    threads = [threading.Thread(target=push, args=(r,), daemon=True) for r in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * BOUND)
    return answers


def _read_exactly(
    table: str,
    step: int,
    want: dict[str, Any],
    readers: tuple[Any, Any],
    held: dict[Any, Any],
    updater: Any,
    into: dict[str, Any],
) -> None:
    """The first of ``readers`` (every step) and the second (odd steps) by
    ``pull_if_newer(held=)``, and ``updater`` by ``update`` into ``into``, hold exactly
    ``want``, published as version ``step``."""
    every, sparse = readers
    for reader in (every, sparse) if step % 2 else (every,):
        got = reader.pull_if_newer(held[reader][0], table, held=held[reader][1])
        assert got is not None and got[0] == step, got
        held[reader] = got
        for key, value in want.items():
            same = np.asarray(got[1][key]).tobytes() == np.asarray(value).tobytes()
            assert same, (step, key)
    assert updater.update(into, table) == step
    for key, value in want.items():
        assert np.asarray(into[key]).tobytes() == np.asarray(value).tobytes(), (step, key)


def step_of(values: Any) -> int:
    """The one step every element of a pulled nest holds; fails on a mix."""
    seen = {float(x) for leaf in varsync.flatten(values) for x in np.asarray(leaf).ravel()}
    assert len(seen) == 1, f"a pull mixes the values of steps {sorted(seen)}"
    return int(seen.pop())


def latest(store: Any) -> tuple[int, Any]:
    """``(version, values)`` of table ``model``'s published version (one read)."""
    got = store.pull_if_newer(0, "model")
    assert got is not None, "nothing published"
    return int(got[0]), got[1]


def wrap_writes(backend: Backend, hook: Callable[[str, str, Callable[[], Any]], Any]) -> None:
    """Route every write of ``backend`` (this instance only) through ``hook(method,
    table, call)``, which must make the call (or not) and return its result."""
    for method in _WRITES:
        original = getattr(backend, method, None)
        if original is None:
            continue

        def wrapped(name: str, *args: Any, _m: str = method, _o: Any = original, **kw: Any) -> Any:
            return hook(_m, name, lambda: _o(name, *args, **kw))

        setattr(backend, method, wrapped)


def stage_events(
    store: Any, hold_until: threading.Event | None = None, hold_publication: bool = False
) -> tuple[threading.Event, threading.Event]:
    """Events set once ``store``'s rank has written its stage entry (its part is in) and
    once it has written a second stage value (the seal). With ``hold_until``, the rank's
    stage writes after its entry (its attempts to seal) wait for that event, and with
    ``hold_publication`` its writes of the manifest too: the other rank seals (and
    publishes) the step."""
    staged, sealed = threading.Event(), threading.Event()
    count = [0]

    def hook(method: str, table: str, call: Callable[[], Any]) -> Any:
        stage = "/stage/" in table and method == "write_leaves"
        if hold_until is not None and (
            (stage and count[0] >= 1) or (hold_publication and table == "model")
        ):
            assert hold_until.wait(BOUND), "the rank held back was never let go"
        result = call()
        if stage:
            count[0] += 1
            (staged if count[0] == 1 else sealed).set()
        return result

    wrap_writes(store.backend, hook)
    return staged, sealed


class _Rank(threading.Thread):
    """A rank pushing one step from a thread; ``answer`` is its version or exception."""

    def __init__(
        self, store: Any, rank: int, step: int, timeout: float,
        hold_until: threading.Event | None = None, hold_publication: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.store, self.rank, self.step, self.timeout = store, rank, step, timeout
        self.answer: Any = None
        self.staged, _ = stage_events(store, hold_until, hold_publication)

    def start_first(self) -> None:
        """Start, and return once this rank's part is staged (the other rank is last)."""
        self.start()
        assert self.staged.wait(BOUND), f"rank {self.rank} never staged step {self.step}"

    def run(self) -> None:
        try:
            self.answer = self.store.push_shard(
                "model", rank_parts(self.rank, self.step), rank=self.rank, step=self.step,
                timeout=self.timeout,
            )  # fmt: skip
        except BaseException as exc:  # handed to the test, which asserts on it
            self.answer = exc

    def result(self) -> Any:
        self.join(self.timeout + BOUND)
        assert not self.is_alive(), f"rank {self.rank}'s push of step {self.step} never returned"
        return self.answer


def _killed_rank(url: str, options: dict[str, Any], step: int, staged: Any) -> None:
    """Child process: rank 1 pushes ``step``; once its stage entry is written it sets
    ``staged`` and waits to be killed (bounded: it exits after ``BOUND``)."""
    with varsync.connect(url, **options) as store:

        def hook(method: str, table: str, call: Callable[[], Any]) -> Any:
            result = call()
            if "/stage/" in table and method == "write_leaves":
                staged.set()
                threading.Event().wait(BOUND)
                os._exit(3)
            return result

        wrap_writes(store.backend, hook)
        store.push_shard("model", rank_parts(1, step), rank=1, step=step, timeout=BOUND)


class ShardedTests(_Base):
    """Many writer ranks, one version; faults that publish nothing partial."""

    @pytest.fixture
    def sharded(self, url: str, connect: Any) -> Callable[[], Any]:
        """``sharded()``: a new container on a store holding the sharded table ``model``
        of :data:`WORLD` ranks (one container per rank: ranks share none)."""
        creator = connect(url, timeout=BOUND)
        if not isinstance(creator.backend, SupportsLeafVersions):
            pytest.skip("backend has no leaf versions, which sharded tables need")
        creator.create_sharded_table("model", SHARDED, WORLD)
        return lambda: connect(url, timeout=BOUND)

    def _publish(self, sharded: Callable[[], Any], step: int) -> int:
        ranks = [_Rank(sharded(), r, step, BOUND) for r in range(WORLD)]
        for rank in ranks:
            rank.start()
        answers = [rank.result() for rank in ranks]
        assert answers[0] == answers[1] and isinstance(answers[0], int), answers
        return int(answers[0])

    def test_a_sharded_step_is_published_whole_with_the_next_number(
        self, sharded: Callable[[], Any]
    ) -> None:
        reader = sharded()
        assert reader.version("model") == 0
        for number, step in enumerate((3, 4, 9), start=1):
            assert self._publish(sharded, step) == number
            assert reader.version("model") == number
            assert step_of(reader.pull("model")) == step
            version, block = reader.pull_slices("model", {"w": ((3, 5), (1, 4))})
            assert version == number
            assert block["w"].tobytes() == np.full((2, 3), step, np.float32).tobytes()

    def test_readers_never_see_a_partial_version(self, sharded: Callable[[], Any]) -> None:
        reader = sharded()
        stop = threading.Event()
        seen: dict[int, int] = {}
        problems: list[str] = []

        def read() -> None:
            try:
                while not stop.is_set():
                    version, values = latest(reader)
                    assert seen.setdefault(version, step_of(values)) == step_of(values)
            except BaseException as exc:  # reported below
                problems.append(f"{type(exc).__name__}: {exc}")

        watcher = threading.Thread(target=read, daemon=True)
        self._publish(sharded, 1)
        watcher.start()
        try:
            for step in range(2, 8):
                self._publish(sharded, step)
        finally:
            stop.set()
            watcher.join(BOUND)
        assert problems == []
        assert seen and all(seen[v] == v for v in seen), seen

    def test_two_ranks_publishing_one_sealed_step_publish_it_once(
        self, sharded: Callable[[], Any]
    ) -> None:
        """Rank 1 seals the step (rank 0 is held back from sealing it), and is held
        before it publishes it until rank 0 has published it: its publication must then
        find the manifest moved on and publish nothing (a compare-and-swap on the
        manifest's head)."""
        rank0, rank1 = sharded(), sharded()
        _, rank1_sealed = stage_events(rank1)
        first = _Rank(rank0, 0, 1, BOUND, hold_until=rank1_sealed)

        def hook(method: str, table: str, call: Callable[[], Any]) -> Any:
            if table == "model" and method == "write_leaves":
                first.join(BOUND)  # rank 0 publishes meanwhile
            return call()

        wrap_writes(rank1.backend, hook)
        first.start_first()
        assert rank1.push_shard("model", rank_parts(1, 1), rank=1, step=1) == 1
        assert first.result() == 1
        assert rank0.version("model") == 1
        assert self._publish(sharded, 2) == 2

    def test_a_lost_reply_is_answered_by_pushing_the_step_again(
        self, sharded: Callable[[], Any]
    ) -> None:
        """The last rank's reply is lost after its part, then after its publication
        (the other rank held back from sealing and publishing until the end): pushing
        the same step again gives the version every rank got."""
        for number, lost_after in enumerate(("/parts/", "model"), start=1):
            done = threading.Event()
            other = _Rank(sharded(), 0, number, BOUND, hold_until=done, hold_publication=True)
            last = sharded()
            lost: list[str] = []

            def hook(
                method: str, table: str, call: Callable[[], Any], _at: str = lost_after,
                _lost: list[str] = lost,
            ) -> Any:  # fmt: skip
                result = call()
                hit = table == _at if _at == "model" else _at in table
                if hit and not _lost:
                    _lost.append(table)
                    raise varsync.BackendConnectionError(f"test: the reply to {table} was lost")
                return result

            wrap_writes(last.backend, hook)
            other.start_first()
            with pytest.raises(varsync.BackendConnectionError):
                last.push_shard("model", rank_parts(1, number), rank=1, step=number)
            try:
                again = last.push_shard("model", rank_parts(1, number), rank=1, step=number)
            finally:
                done.set()
            assert again == number == other.result()
            assert step_of(latest(last)[1]) == number

    @pytest.mark.parametrize("when", ["before", "after"])
    def test_an_interrupt_at_any_write_of_a_rank_publishes_nothing_partial(
        self, sharded: Callable[[], Any], when: str
    ) -> None:
        """A ``KeyboardInterrupt`` before (after) the rank's 1st, 2nd, ... write: readers
        see the previous version or the whole new one; the rank pushing the step again
        publishes it, with the next number, for both ranks."""
        reader = sharded()
        published = self._publish(sharded, 1)
        at = 0
        while True:
            at += 1
            step = at + 1
            other, rank1 = _Rank(sharded(), 0, step, BOUND), sharded()
            writes: list[str] = []

            def hook(
                method: str, table: str, call: Callable[[], Any], _at: int = at,
                _writes: list[str] = writes,
            ) -> Any:  # fmt: skip
                _writes.append(table)
                if when == "before" and len(_writes) == _at:
                    raise KeyboardInterrupt
                result = call()
                if when == "after" and len(_writes) == _at:
                    raise KeyboardInterrupt
                return result

            wrap_writes(rank1.backend, hook)
            other.start_first()
            try:
                version = rank1.push_shard("model", rank_parts(1, step), rank=1, step=step)
                interrupted = False
            except KeyboardInterrupt:
                interrupted = True
                version, values = latest(reader)
                assert version in (published, published + 1)
                assert step_of(values) == (step if version > published else step - 1)
                version = rank1.push_shard("model", rank_parts(1, step), rank=1, step=step)
            assert version == published + 1 == other.result()
            published = version
            assert step_of(reader.pull("model")) == step
            if not interrupted:  # the push made fewer writes than `at`: every point done
                assert at > 2, f"a push of a rank made {len(writes)} writes"
                return

    def test_numbers_are_never_reused_after_an_abandon(self, sharded: Callable[[], Any]) -> None:
        """A step abandoned (rank 1 never comes) takes no number: readers keep the last
        version all along, and the next step published takes the next number. One
        number, one value, over everything a reader observed."""
        reader = sharded()
        seen: dict[int, int] = {}

        def observe() -> None:
            version, values = latest(reader)
            assert seen.setdefault(version, step_of(values)) == step_of(values), (
                f"version {version} named step {seen[version]}, now step {step_of(values)}"
            )

        assert self._publish(sharded, 1) == 1
        observe()
        alone = _Rank(sharded(), 0, 2, SHORT)
        alone.start()
        while alone.is_alive():
            observe()
        error = alone.result()
        assert isinstance(error, varsync.ShardTimeoutError), error
        assert error.missing == [1] and error.step == 2
        observe()
        assert reader.version("model") == 1
        assert self._publish(sharded, 3) == 2
        observe()
        assert seen == {1: 1, 2: 3}
        newer = reader.pull_if_newer(1, "model")
        assert newer is not None and newer[0] == 2 and step_of(newer[1]) == 3

    def test_delta_reads_are_bit_exact_through_frozen_changing_and_reverting_blocks(
        self, sharded: Callable[[], Any]
    ) -> None:
        """Ranks keep their containers across steps; rank 0's rows of ``w`` never change,
        rank 1's go 0, 1, 0, 0, 1, 1, 1, 0, 1 (changed, the same, changed back to what
        the slot held two steps before), ``b`` every third step, ``step`` every step.
        Readers by ``pull_if_newer(held=)`` (every step and every other one) and by
        ``update`` hold exactly each published step."""

        def values(step: int) -> dict[str, Any]:
            w = np.ones((8, 6), np.float32)
            w[4:] = (0, 1, 0, 0, 1, 1, 1, 0, 1)[step - 1]
            return {"b": np.full(6, step // 3, np.float32), "step": np.int64(step), "w": w}

        def part(rank: int, step: int) -> dict[Any, Any]:
            v = values(step)
            if rank == 0:
                return {"w": (((0, 4), (0, 6)), v["w"][:4]), "step": v["step"]}
            return {"w": (((4, 8), (0, 6)), v["w"][4:]), "b": v["b"]}

        ranks = [sharded() for _ in range(WORLD)]
        every, sparse, updater = sharded(), sharded(), sharded()
        into = {"b": np.zeros(6, np.float32), "step": np.zeros((), np.int64)}
        into["w"] = np.zeros((8, 6), np.float32)
        held: dict[Any, Any] = {every: (0, None), sparse: (0, None)}
        for step in range(1, 10):
            answers = _push_step(ranks, "model", step, part)
            assert answers.get(0) == answers.get(1) == step, answers
            _read_exactly("model", step, values(step), (every, sparse), held, updater, into)

    def test_element_deltas_per_block_are_bit_exact_through_interrupts_and_lost_replies(
        self, sharded: Callable[[], Any]
    ) -> None:
        """On a backend with element deltas, ranks push with ``element_deltas=True``
        blocks of which a few elements change per step: from the third step on, readers
        holding the step before get patches (``read_patches`` answers links, no anchor)
        and hold exactly each step, by ``pull_if_newer(held=)`` and by ``update``, also
        after rank 0 is interrupted between its two part writes of a step (the catch-up
        of its other slot, then the step) and after the reply to its first one is lost."""
        if not isinstance(sharded().backend, varsync.backend.SupportsElementDeltas):
            pytest.skip("the backend has no element deltas")
        signature = {"step": varsync.Spec((), "int64"), "w": varsync.Spec((64, 64), "float32")}

        def values(step: int) -> dict[str, Any]:
            w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
            for s in range(1, step + 1):  # 8 elements per step, half of them in each rank's rows
                w.reshape(-1)[(np.arange(8) * 509 + 97 * s) % w.size] = -s
            return {"step": np.int64(step), "w": w}

        def part(rank: int, step: int) -> dict[Any, Any]:
            v = values(step)
            rows = ((0, 32), (0, 64)) if rank == 0 else ((32, 64), (0, 64))
            out: dict[Any, Any] = {"w": (rows, v["w"][rows[0][0] : rows[0][1]])}
            if rank == 0:
                out["step"] = v["step"]
            return out

        ranks = [sharded() for _ in range(WORLD)]
        ranks[0].create_sharded_table("elements", signature, WORLD)
        every, sparse, updater = sharded(), sharded(), sharded()
        chains: list[bool] = []

        def record(name: str, *args: Any, _o: Any = every.backend.read_patches, **kw: Any) -> Any:
            answer = _o(name, *args, **kw)
            links = [x for x in answer.leaves or () if isinstance(x, varsync.backend.LeafChain)]
            chains.extend(x.anchor is None for x in links)
            return answer

        every.backend.read_patches = record
        into = {"step": np.zeros((), np.int64), "w": np.zeros((64, 64), np.float32)}
        held: dict[Any, Any] = {every: (0, None), sparse: (0, None)}
        for step in range(1, 9):
            writes = [0]

            def hook(
                method: str,
                table: str,
                call: Callable[[], Any],
                _s: int = step,
                _writes: list[int] = writes,
            ) -> Any:
                if "/parts/" not in table:
                    return call()
                _writes[0] += 1
                if _s == 4 and _writes[0] == 2:  # between the catch-up and the step
                    raise KeyboardInterrupt
                result = call()
                if _s == 6 and _writes[0] == 1:
                    raise varsync.BackendConnectionError("test: the reply was lost")
                return result

            wrap_writes(ranks[0].backend, hook)
            # an interrupted rank, or one whose reply was lost, pushes again
            answers = _push_step(ranks, "elements", step, part, attempts=2, element_deltas=True)
            for method in _WRITES:
                ranks[0].backend.__dict__.pop(method, None)
            assert answers.get(0) == answers.get(1) == step, answers
            _read_exactly("elements", step, values(step), (every, sparse), held, updater, into)
        assert chains and all(chains), "readers holding the step before got no patches"

    def test_a_rank_killed_between_its_part_and_the_commit_publishes_nothing(
        self,
        sharded: Callable[[], Any],
        url: str,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        reader = sharded()
        assert self._publish(sharded, 1) == 1
        context = multiprocessing.get_context("spawn")
        staged = context.Event()
        child = context.Process(
            target=_killed_rank, args=(url, dict(connect_options), 2, staged), daemon=True
        )
        child.start()
        try:
            assert staged.wait(BOUND), "the child rank never staged its part"
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join(BOUND)
        finally:
            if child.is_alive():
                child.kill()
                child.join(BOUND)
        assert child.exitcode == -signal.SIGKILL
        assert reader.version("model") == 1
        assert step_of(reader.pull("model")) == 1
        # rank 0 moves on alone: nothing published, the dead rank named
        with pytest.raises(varsync.ShardTimeoutError) as error:
            sharded().push_shard("model", rank_parts(0, 3), rank=0, step=3, timeout=SHORT)
        assert error.value.missing == [1]
        assert reader.version("model") == 1
        # a restarted rank 1 with rank 0: the next step, the next number
        assert self._publish(sharded, 4) == 2
        assert step_of(reader.pull("model")) == 4
