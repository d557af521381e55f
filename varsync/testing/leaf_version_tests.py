"""Leaf versions and delta sync (``docs/delta.md``): partial pushes, pushes that skip
unchanged leaves, pulls and updates that fetch only what changed, on every backend.

Backends declaring ``supports_leaf_versions`` are held to the ability itself (leaf
versions, ``write_leaves``/``read_leaves``, retention of unchanged leaves, atomic partial
pushes from several writers); every backend, with the ability or without, to the
results: a partial push, a pull given ``held=`` and an ``update`` are always exactly a
version's values, never a mix.

Optional fixture: ``new_history``, a function ``(url, table)`` that makes the table start
a new history (its data deleted and the table created again, as a server that lost its
data would); without it, the test of readers across two histories skips.
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import pytest

import varsync
from varsync.backend import Backend, Head, SupportsLeafVersions
from varsync.testing._base import TableMaker, _Base
from varsync.testing.values import assert_bit_equal

__all__ = ["LeafVersionTests", "DELTA", "LEAVES"]

#: The table of these tests: five leaves of several sizes, in flat order a, b[0], b[1], c, step.
DELTA = {
    "a": varsync.Spec((64, 64), "float32"),
    "b": [varsync.Spec((1000,), "float32"), varsync.Spec((3, 3), "float64")],
    "c": varsync.Spec((4096,), "int32"),
    "step": varsync.Spec((), "int64"),
}
DELTA_SPECS = varsync.flatten(DELTA)
#: Each leaf's path, in flat order.
LEAVES = [("a",), ("b", 0), ("b", 1), ("c",), ("step",)]


def _nest(numbers: Sequence[int]) -> Any:
    """A nest of :data:`DELTA` whose leaf ``i`` is filled with ``numbers[i]``."""
    specs = varsync.flatten(DELTA)
    return varsync.unflatten(DELTA, [np.full(s.shape, n, s.dtype) for s, n in zip(specs, numbers)])


def _numbers(values: Any) -> list[int]:
    """The number each leaf of a :func:`_nest` holds; fails on a leaf holding two."""
    out = []
    for path, leaf in zip(LEAVES, varsync.flatten(values)):
        held = np.unique(np.asarray(leaf))
        assert held.size == 1, f"leaf {path} holds several numbers {held[:5]}: a torn leaf"
        out.append(int(held[0]))
    return out


def _leaf(index: int, number: int) -> np.ndarray:
    spec = varsync.flatten(DELTA)[index]
    return np.full(spec.shape, number, spec.dtype)


#: The writer's schedule for the mixing tests: push ``k`` changes these leaves.
def _schedule(k: int) -> list[int]:
    return [k % 4, 4] if k % 5 else [0, 1, 2, 3, 4]


def _expected(version: int) -> list[int]:
    """Each leaf's number at ``version`` of the schedule (push 1 is whole: version 1)."""
    numbers = [1] * 5
    for k in range(2, version + 1):
        for index in _schedule(k):
            numbers[index] = k
    return numbers


def _write_schedule(url: str, options: dict[str, Any], table: str, count: int) -> None:
    """Process or thread: push 1 whole, then pushes 2..count by :func:`_schedule`."""
    with varsync.connect(url, **options) as container:
        container.push(_nest([1] * 5), table=table)
        for k in range(2, count + 1):
            container.push_leaves({LEAVES[i]: _leaf(i, k) for i in _schedule(k)}, table=table)


def _write_one_leaf(url: str, options: dict[str, Any], index: int, count: int, start: Any) -> None:
    """Process or thread: once every writer is ready (``start``, a barrier), push leaf
    ``index`` alone with the numbers 1..count."""
    with varsync.connect(url, **options) as container:
        container.version()  # connected before the start, so the pushes overlap
        start.wait(60)
        for k in range(1, count + 1):
            container.push_leaves({LEAVES[index]: _leaf(index, k)})


class LeafVersionTests(_Base):
    """Partial pushes, skipped unchanged leaves, and pulls of what changed only."""

    #: Versions a leaf stays unchanged in the retention test (the issue's figure).
    RETAINED_VERSIONS = 10_000
    #: Pushes of the writer in the mixing tests.
    PUSHES = 120
    #: Pushes of each of the two writers of one leaf each.
    CONCURRENT_PUSHES = 400

    @pytest.fixture
    def delta_url(self, make_tables: TableMaker) -> str:
        """The URL of a store with table ``variables`` of :data:`DELTA`, empty."""
        return make_tables({"variables": DELTA})

    @pytest.fixture
    def delta(self, delta_url: str, connect: Callable[..., Any]) -> Any:
        """A container on :meth:`delta_url`."""
        return connect(delta_url)

    @staticmethod
    def _needs_leaf_versions(backend_cls: type[Backend]) -> None:
        if not backend_cls.supports_leaf_versions:
            pytest.skip("backend does not declare supports_leaf_versions")

    # -- every backend: the results -------------------------------------------------------

    def test_push_leaves_changes_only_the_given_leaves(self, delta: Any) -> None:
        delta.push(_nest([1, 1, 1, 1, 1]))
        version = delta.push_leaves({("a",): _leaf(0, 2), ("b", 1): _leaf(2, 2)})
        assert version == 2
        assert _numbers(delta.pull()) == [2, 1, 2, 1, 1]
        assert delta.push_leaves({"step": 3}) == 3  # a top-level key; a Python scalar
        assert _numbers(delta.pull()) == [2, 1, 2, 1, 3]

    def test_push_leaves_of_an_inner_node_takes_a_nest(self, delta: Any) -> None:
        delta.push(_nest([1] * 5))
        delta.push_leaves({("b",): [_leaf(1, 5), _leaf(2, 6)]})
        assert _numbers(delta.pull()) == [1, 5, 6, 1, 1]

    def test_a_path_not_in_the_signature_names_the_nearest_and_writes_nothing(
        self, delta: Any
    ) -> None:
        delta.push(_nest([1] * 5))
        with pytest.raises(varsync.LeafPathError) as caught:
            delta.push_leaves({("a",): _leaf(0, 2), ("bb", 0): _leaf(1, 2)})
        assert isinstance(caught.value, KeyError)
        message = str(caught.value)
        assert "('bb', 0)" in message and "('b', 0)" in message, message
        with pytest.raises(varsync.LeafPathError, match=r"\('b', 1\)"):
            delta.push_leaves({("b", 7): _leaf(1, 2)})
        assert delta.version() == 1
        assert _numbers(delta.pull()) == [1] * 5

    def test_a_wrong_value_writes_nothing_and_names_its_path(self, delta: Any) -> None:
        delta.push(_nest([1] * 5))
        with pytest.raises(varsync.SignatureMismatchError, match=r"\['b'\]\[0\].*shape"):
            delta.push_leaves({("a",): _leaf(0, 2), ("b", 0): np.zeros(999, np.float32)})
        with pytest.raises(varsync.SignatureMismatchError, match="dtype"):
            delta.push_leaves({("c",): np.zeros(4096, np.float64)})
        assert delta.version() == 1
        assert _numbers(delta.pull()) == [1] * 5

    def test_push_leaves_into_an_empty_table_is_refused(self, delta: Any) -> None:
        with pytest.raises(varsync.TableNotFoundError, match="first push gives every leaf"):
            delta.push_leaves({("a",): _leaf(0, 2)})
        assert delta.version() == 0
        # every leaf given is a whole push, which an empty table takes
        assert delta.push_leaves({p: _leaf(i, 4) for i, p in enumerate(LEAVES)}) == 1
        assert _numbers(delta.pull()) == [4] * 5

    def test_pull_if_newer_given_held_returns_exactly_the_new_version(self, delta: Any) -> None:
        delta.push(_nest([1] * 5))
        version, held = delta.pull_if_newer(0)
        delta.push_leaves({("c",): _leaf(3, 2)})
        delta.push_leaves({("a",): _leaf(0, 3)})
        version, values = delta.pull_if_newer(version, held=held)
        assert version == 3
        assert _numbers(values) == [3, 1, 1, 2, 1]
        assert delta.pull_if_newer(version, held=values) is None
        assert_bit_equal(values, delta.pull())

    def test_update_after_partial_pushes_holds_exactly_the_new_version(self, delta: Any) -> None:
        delta.push(_nest([1] * 5))
        targets = _nest([0] * 5)
        assert delta.update(targets) == 1
        assert _numbers(targets) == [1] * 5
        delta.push_leaves({("b", 0): _leaf(1, 2)})
        delta.push_leaves({("step",): _leaf(4, 3)})
        assert delta.update(targets) == 3
        assert _numbers(targets) == [1, 2, 1, 1, 3]
        assert delta.update(targets) == 3
        assert _numbers(targets) == [1, 2, 1, 1, 3]

    def test_leaf_versions_without_the_ability_is_a_clear_error(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        if backend_cls.supports_leaf_versions:
            pytest.skip("backend declares supports_leaf_versions")
        delta.push(_nest([1] * 5))
        with pytest.raises(varsync.UnsupportedError, match="leaf versions"):
            delta.leaf_versions()

    # -- the ability --------------------------------------------------------------------------

    def test_leaf_versions_say_where_each_leaf_last_changed(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        assert delta.leaf_versions() == (0, _as_nest([0] * 5))
        delta.push(_nest([1] * 5))
        delta.push_leaves({("a",): _leaf(0, 2)})
        delta.push_leaves({("b", 1): _leaf(2, 3), ("step",): _leaf(4, 3)})
        assert delta.leaf_versions() == (3, _as_nest([2, 1, 3, 1, 3]))
        delta.push(_nest([9] * 5))  # a whole push of new values: every leaf changed
        assert delta.leaf_versions() == (4, _as_nest([4] * 5))

    def test_a_push_does_not_send_leaves_identical_to_its_last(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        for step in range(1, 4):
            delta.push(_nest([1, 1, 1, 1, step]))
        assert delta.leaf_versions() == (3, _as_nest([1, 1, 1, 1, 3]))
        # a leaf of nearly half the bytes that changed, then stopped: skipped from the
        # second push that repeats it (a change seen in the sample of so large a share
        # is not hashed, so the first repeat is sent once more)
        for step in range(4, 7):
            delta.push(_nest([1, 1, 1, 4 if step > 4 else 1, step]))
        assert delta.leaf_versions() == (6, _as_nest([1, 1, 1, 6, 6]))
        # one element of a large leaf changed: its sample may not show it, its hash does
        changed = _nest([1, 1, 1, 4, 7])
        changed["a"][17, 5] = 2
        delta.push(changed)
        assert delta.leaf_versions() == (7, _as_nest([7, 1, 1, 6, 7]))
        assert_bit_equal(delta.pull(), changed)
        assert delta.push(changed, skip_unchanged=False) == 8
        assert delta.leaf_versions() == (8, _as_nest([8] * 5))
        delta.configure_table(skip_unchanged=False)
        for _ in range(3):
            version = delta.push(changed)
        assert delta.leaf_versions() == (version, _as_nest([version] * 5))

    def test_a_small_leaf_that_stops_changing_is_skipped_from_its_first_repeat(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        delta.push(_nest([1] * 5))
        delta.push(_nest([1, 2, 1, 1, 1]))  # b[0]: a tenth of the bytes, changed
        delta.push(_nest([1, 2, 1, 1, 1]))  # repeated: not sent again
        assert delta.leaf_versions() == (3, _as_nest([1, 2, 1, 1, 1]))

    def test_a_push_after_another_writers_sends_every_leaf(
        self,
        delta: Any,
        connect: Callable[..., Any],
        delta_url: str,
        backend_cls: type[Backend],
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        mine = _nest([1] * 5)
        for _ in range(3):
            delta.push(mine)
        other = connect(delta_url)
        other.push_leaves({("c",): _leaf(3, 7)})  # another writer changed leaf c
        delta.push(mine)  # the same values as this container's last push: c must go back
        assert_bit_equal(delta.pull(), mine)

    def test_write_leaves_refuses_a_base_that_is_not_current(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        backend, specs, inf = delta.backend, DELTA_SPECS, math.inf
        assert backend.write_leaves("variables", {0: _leaf(0, 1)}, specs, None, inf) is None
        assert delta.version() == 0  # an empty table: nothing to keep the rest of
        delta.push(_nest([1] * 5))
        first = backend.head("variables", inf)
        delta.push_leaves({("a",): _leaf(0, 2)})
        assert backend.write_leaves("variables", {3: _leaf(3, 5)}, specs, first, inf) is None
        assert delta.version() == 2
        assert _numbers(delta.pull()) == [2, 1, 1, 1, 1]
        current = backend.head("variables", inf)
        stranger = Head(current.version, ("another", "history", current.epoch))
        assert backend.write_leaves("variables", {3: _leaf(3, 5)}, specs, stranger, inf) is None
        assert delta.version() == 2  # the same number in another history is not the base
        written = backend.write_leaves("variables", {3: _leaf(3, 5)}, specs, current, inf)
        assert written == Head(3, current.epoch)
        assert _numbers(delta.pull()) == [2, 1, 1, 5, 1]

    def test_read_leaves_returns_the_union_of_what_changed_since(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        backend, specs, inf = delta.backend, DELTA_SPECS, math.inf
        delta.push(_nest([1] * 5))
        delta.push_leaves({("a",): _leaf(0, 2)})
        delta.push_leaves({("c",): _leaf(3, 3)})
        delta.push_leaves({("a",): _leaf(0, 4)})
        head = backend.head("variables", inf)
        assert head.version == 4
        answer = backend.read_leaves("variables", 1, inf, specs)
        assert answer.head == head
        assert list(answer.leaf_versions) == [4, 1, 1, 3, 1]
        arrays = answer.arrays
        assert [a is not None for a in arrays] == [True, False, False, True, False]
        assert_bit_equal(arrays[0], _leaf(0, 4))
        assert_bit_equal(arrays[3], _leaf(3, 3))
        arrays = backend.read_leaves("variables", 3, inf, specs).arrays
        assert [a is not None for a in arrays] == [True, False, False, False, False]
        assert backend.read_leaves("variables", 4, inf, specs) == (head, None, None)
        arrays = backend.read_leaves("variables", 0, inf, specs).arrays
        assert all(a is not None for a in arrays)
        assert _numbers(varsync.unflatten(DELTA, arrays)) == [4, 1, 1, 3, 1]
        assert backend.leaf_versions("variables", inf) == (head, [4, 1, 1, 3, 1])

    def test_pull_if_newer_given_held_reuses_the_held_unchanged_leaves(
        self,
        delta: Any,
        connect: Callable[..., Any],
        delta_url: str,
        backend_cls: type[Backend],
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        delta.push(_nest([1] * 5))
        version, held = delta.pull_if_newer(0)
        delta.push_leaves({("c",): _leaf(3, 2)})
        version, values = delta.pull_if_newer(version, held=held)
        assert values["a"] is held["a"]
        assert values["b"][1] is held["b"][1]
        assert values["c"] is not held["c"]
        assert _numbers(values) == [1, 1, 1, 2, 1]
        # a version this container did not hand out: every leaf is fetched
        _, fresh = connect(delta_url).pull_if_newer(1, held=held)
        assert fresh["a"] is not held["a"]
        assert _numbers(fresh) == [1, 1, 1, 2, 1]

    def test_update_assigns_only_the_leaves_changed_since_its_last(
        self, delta: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        delta.push(_nest([1] * 5))
        targets = _nest([0] * 5)
        delta.update(targets)
        targets["a"][...] = -1  # not varsync's: a delta update leaves unchanged leaves be
        delta.push_leaves({("c",): _leaf(3, 2)})
        assert delta.update(targets) == 2
        assert _numbers(targets) == [-1, 1, 1, 2, 1]
        targets["b"][0][...] = -1
        assert delta.update(targets) == 2
        assert _numbers(targets) == [-1, -1, 1, 2, 1]
        assert delta.update(targets, delta_only=False) == 2
        assert _numbers(targets) == [1, 1, 1, 2, 1]
        # other variables of the same structure are updated whole
        others = _nest([0] * 5)
        assert delta.update(others) == 2
        assert _numbers(others) == [1, 1, 1, 2, 1]

    def test_a_leaf_unchanged_for_many_versions_stays_readable(
        self,
        make_tables: TableMaker,
        connect: Callable[..., Any],
        backend_cls: type[Backend],
    ) -> None:
        self._needs_leaf_versions(backend_cls)
        signature = {"frozen": varsync.Spec((1024,), "float32"), "step": varsync.Spec((), "int64")}
        small_url = make_tables({"small": signature})
        writer = connect(small_url)
        frozen = np.arange(1024, dtype=np.float32)
        writer.push({"frozen": frozen, "step": 0}, table="small")
        reader = connect(small_url)
        version, held = reader.pull_if_newer(0, table="small")
        for step in range(1, self.RETAINED_VERSIONS + 1):
            writer.push_leaves({"step": step}, table="small")
        fresh = connect(small_url).pull(table="small")
        assert_bit_equal(fresh["frozen"], frozen)
        assert int(fresh["step"]) == self.RETAINED_VERSIONS
        version, values = reader.pull_if_newer(version, table="small", held=held)
        assert version == self.RETAINED_VERSIONS + 1
        assert int(values["step"]) == version - 1
        assert values["frozen"] is held["frozen"]
        assert writer.leaf_versions("small") == (version, {"frozen": 1, "step": version})

    def test_partial_pushes_from_two_writers_lose_no_leaf(
        self,
        delta: Any,
        delta_url: str,
        connect: Callable[..., Any],
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        """Two writers (processes where shared), started together, push one leaf each;
        a reader checks that no version ever takes a leaf back to an older number (what
        a write composed from a stale leaf map does), and the end holds both."""
        self._needs_leaf_versions(backend_cls)
        delta.push(_nest([0] * 5))
        count = self.CONCURRENT_PUSHES
        kind: Any = threading.Thread
        start: Any = threading.Barrier(2)
        if backend_cls.shared_across_processes:
            context = multiprocessing.get_context("spawn")
            kind, start = context.Process, context.Barrier(2)
        writers = [
            kind(target=_write_one_leaf, args=(delta_url, dict(connect_options), i, count, start))
            for i in (0, 3)
        ]
        problems: list[str] = []
        done = threading.Event()

        def watch() -> None:
            reader, version, held, last = connect(delta_url), 0, None, [0] * 5
            deadline = time.monotonic() + 120
            while not done.is_set() and time.monotonic() < deadline:
                answer = reader.pull_if_newer(version, held=held)
                if answer is None:
                    continue
                version, held = answer
                numbers = _numbers(held)
                for index in (0, 3):
                    if numbers[index] < last[index]:
                        problems.append(
                            f"version {version} took leaf {LEAVES[index]} back from "
                            f"{last[index]} to {numbers[index]}: a partial push lost it"
                        )
                last = numbers

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join(120)
        finally:
            done.set()
            watcher.join(60)
        assert not any(w.is_alive() for w in writers), "a writer did not finish"
        for writer in writers:
            assert getattr(writer, "exitcode", 0) == 0, "a writer process failed"
        assert problems[:3] == []
        assert delta.version() == 1 + 2 * count
        assert _numbers(delta.pull()) == [count, 0, 0, count, 0]

    # -- every backend: never a mix ---------------------------------------------------------

    def test_readers_of_partial_pushes_never_see_a_mix(
        self,
        delta: Any,
        delta_url: str,
        connect: Callable[..., Any],
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        """A writer (another process where the store is shared) pushes some leaves at a
        time; readers pulling with ``held=`` and updating in place check every version
        they get against the writer's schedule."""
        problems: list[str] = []
        stop = threading.Event()

        def read(container: Any, updating: bool) -> None:
            version, values, seen = 0, None, 0
            targets = _nest([0] * 5)
            deadline = time.monotonic() + 90
            try:
                while time.monotonic() < deadline and seen < 10_000:
                    finished = stop.is_set()
                    if updating:
                        if container.version() == 0:
                            time.sleep(0.001)
                            continue
                        got = container.update(targets)
                        new = got != version
                        version, values = got, targets
                    else:
                        answer = container.pull_if_newer(version, held=values)
                        new = answer is not None
                        if new:
                            version, values = answer
                    if new:
                        seen += 1
                        if _numbers(values) != _expected(version):
                            problems.append(
                                f"version {version} held {_numbers(values)}, not "
                                f"{_expected(version)}"
                            )
                    elif finished:
                        break
                if version != self.PUSHES:
                    problems.append(f"a reader ended at version {version}, not {self.PUSHES}")
            except Exception as exc:
                problems.append(f"{type(exc).__name__}: {exc}")

        readers = [
            threading.Thread(target=read, args=(connect(delta_url), updating))
            for updating in (False, True, False)
        ]
        for thread in readers:
            thread.start()
        try:
            if backend_cls.shared_across_processes:
                child = multiprocessing.get_context("spawn").Process(
                    target=_write_schedule,
                    args=(delta_url, dict(connect_options), "variables", self.PUSHES),
                )
                child.start()
                child.join(120)
                if child.is_alive():
                    child.kill()
                    child.join()
                assert child.exitcode == 0, f"writer process exited with {child.exitcode}"
            else:
                _write_schedule(delta_url, dict(connect_options), "variables", self.PUSHES)
        finally:
            stop.set()
            for thread in readers:
                thread.join(90)
        assert not any(t.is_alive() for t in readers), "a reader did not finish"
        assert problems == []

    def test_a_reader_never_assembles_leaves_from_two_histories(
        self,
        delta: Any,
        delta_url: str,
        connect: Callable[..., Any],
        new_history: Callable[[str, str], None] | None,
        backend_cls: type[Backend],
    ) -> None:
        if new_history is None:
            pytest.skip("no new_history fixture: the suite cannot restart this backend's history")
        delta.push(_nest([1] * 5))
        version, held = delta.pull_if_newer(0)
        epoch = delta.backend.head("variables", math.inf).epoch
        targets = _nest([0] * 5)
        delta.update(targets)
        new_history(delta_url, "variables")
        writer = connect(delta_url)
        writer.create_table("variables", DELTA)
        writer.push(_nest([5] * 5))
        for k in range(6, 9):  # past the version the reader holds, in the new history
            writer.push_leaves({("a",): _leaf(0, k)})
        expected = [8, 5, 5, 5, 5]
        # the protocol itself: every answer names the new history's epoch, which the core
        # compares with the held version's (by number alone it would take the new
        # history's leaves changed since for the rest)
        assert delta.backend.head("variables", math.inf).epoch != epoch
        if isinstance(delta.backend, SupportsLeafVersions):
            answer = delta.backend.read_leaves("variables", version, math.inf, DELTA_SPECS)
            assert answer.head.epoch != epoch
        try:
            answer = delta.pull_if_newer(version, held=held)
        except varsync.TableResetError:
            answer = delta.pull_if_newer(0)
        assert answer is not None
        assert _numbers(answer[1]) == expected
        assert delta.update(targets) == 4
        assert _numbers(targets) == expected


def _as_nest(numbers: Sequence[int]) -> Any:
    return varsync.unflatten(DELTA, list(numbers))
