"""The contract tests: what every backend must do that a broken one gets wrong.

Each test fails for one kind of broken backend (``tests/conformance/mutants/broken.py`` has one of
each, and ``tests/conformance/test_suite_catches_broken_backends.py`` proves the suite fails them):
namespaces that leak, answers of "nothing newer" that wait, a container that breaks
when threads share it, waits that give up early, closed containers that keep resources.
The checks are about behaviour: what a call returned and what had happened by then.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import tracemalloc
import uuid
from typing import Any, Callable

import numpy as np
import pytest

import varsync
from varsync._backends.base import Backend
from varsync._config import resolve
from varsync.testing._base import SMALL, TableMaker, _Base, _wait_codes
from varsync.testing.blocking import PATIENCE, BlockingCall
from varsync.testing.fault_tests import SLACK, Counts
from varsync.testing.faults import call_within, fd_targets, grown, resource_counts, settle
from varsync.testing.values import assert_bit_equal, check_consistent, filled

__all__ = ["ContractTests"]

#: A signature unlike SMALL, for the other namespace's table of the same name.
OTHER = {"x": varsync.Spec((4,), "int32")}

#: Several leaves of a few KiB: pulls that mix two versions show, pushes stay cheap.
SHARED = {
    "a": varsync.Spec((32, 32), "float32"),
    "b": [varsync.Spec((50,), "float64"), varsync.Spec((3,), "int32")],
    "step": varsync.Spec((), "int64"),
}

#: When the push a "does not wait" test schedules is made. A deliberate delay, not a
#: synchronisation: calls that answer at once return long before it (and the push is then
#: cancelled); a call that waits for data, or blocks for seconds, returns after it.
SCHEDULED_PUSH_DELAY = 2.0

#: The GIL's switch interval while threads share one container (the default is 5 ms).
SWITCH_INTERVAL = 2e-5

#: How much slower than on a tiny table a "nothing newer" answer on a large one may be, as
#: a median of the same rounds: a ratio and a margin loose enough for a loaded machine,
#: tight enough for an answer that reads the data (64 MiB take tens of milliseconds).
NOTHING_NEWER_RATIO = 10
NOTHING_NEWER_MARGIN = 0.020

#: A wait's timeout in the "never gives up early" test, and the clock reads' tolerance.
WAIT_TIMEOUT = 0.3
CLOCK_TOLERANCE = 0.005


class ContractTests(_Base):
    """Namespaces, answers without waiting, a container shared by threads, waits that
    last their timeout, and close()."""

    THREADS = 8  # half push, half pull, through one container
    PUSHES_PER_THREAD = 25
    #: The large table of the "nothing newer" cost test (or ``max_push_bytes`` if less),
    #: and how many rounds of calls it times.
    LARGE_TABLE_BYTES = 64 * 2**20
    NOTHING_NEWER_ROUNDS = 15

    @pytest.fixture
    def other_namespace(self, url: str, connect_options: dict[str, Any]) -> str:
        """A second namespace on the store of ``url``, fresh and empty: by default the URL's
        own namespace plus a unique suffix. Override it if your store must clean up
        namespaces it did not make."""
        base = resolve(url, dict(connect_options)).namespace
        suffix = f"isolation-{uuid.uuid4().hex[:8]}"
        return f"{base}.{suffix}" if base else suffix

    @pytest.fixture
    def leak_counts(self) -> Callable[[], Counts]:
        """Counts of backend-specific resources (server-side connections, ...) that a
        closed container must give back; the same hook as :class:`FaultTests`'."""
        return dict

    # -- namespaces ------------------------------------------------------------------------

    def test_namespaces_isolate_tables_versions_and_data(
        self,
        url: str,
        make_tables: TableMaker,
        connect: Any,
        backend_cls: type[Backend],
        other_namespace: str,
    ) -> None:
        if not backend_cls.supports_create_table:
            # Tables come from make_tables, in the URL's namespace only: check one way.
            a = connect(make_tables({"variables": SMALL}))
            a.push(filled(SMALL, 1))
            self._sees_nothing(connect(url, namespace=other_namespace), other_namespace)
            assert a.version() == 1
            return
        a, b = connect(url), connect(url, namespace=other_namespace)
        a.create_table("variables", SMALL)
        self._sees_nothing(b, other_namespace)
        # The same name with another signature: a table of b's own, not a conflict.
        assert varsync.flatten(b.create_table("variables", OTHER)) == varsync.flatten(OTHER)
        assert a.push(filled(SMALL, 1)) == 1
        assert a.push(filled(SMALL, 2)) == 2
        assert b.version() == 0, "a push in one namespace moved the other's version"
        assert b.pull_if_newer(0) is None
        assert b.push({"x": np.arange(4, dtype=np.int32)}) == 1
        assert a.version() == 2
        b.create_table("only_b", SMALL)
        # New containers, with nothing cached: what each namespace holds on the store.
        fresh_a, fresh_b = connect(url), connect(url, namespace=other_namespace)
        assert fresh_a.tables() == ["variables"]
        assert fresh_b.tables() == ["only_b", "variables"]
        assert varsync.flatten(fresh_a.signature()) == varsync.flatten(SMALL)
        assert varsync.flatten(fresh_b.signature()) == varsync.flatten(OTHER)
        assert_bit_equal(fresh_a.pull(), filled(SMALL, 2))
        assert_bit_equal(fresh_b.pull(), {"x": np.arange(4, dtype=np.int32)})
        assert fresh_a.version() == 2
        assert fresh_b.version() == 1

    def _sees_nothing(self, container: Any, namespace: str) -> None:
        assert container.tables() == [], (
            f"namespace {namespace!r} lists another namespace's tables: {container.tables()}"
        )
        for call in (
            lambda: container.version(),
            lambda: container.pull_if_newer(0),
            lambda: container.pull(timeout=0),
        ):
            with pytest.raises(varsync.TableNotFoundError):
                call()

    # -- nothing newer: an answer at once ----------------------------------------------------

    def test_nothing_newer_is_answered_without_waiting_for_a_push(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": SMALL, "empty": SMALL})
        reader, writer = connect(url), connect(url)
        writer.push(filled(SMALL, 1))
        reader.pull()  # connected and warmed up: what follows is the answers alone
        pushing = threading.Event()

        def push_later() -> None:
            pushing.set()
            writer.push(filled(SMALL, 2))
            writer.push(filled(SMALL, 2), table="empty")

        scheduled = threading.Timer(SCHEDULED_PUSH_DELAY, push_later)
        scheduled.start()
        try:
            answers = {
                "pull_if_newer(1)": reader.pull_if_newer(1),
                # A timeout bounds the transfer; it is no licence to wait for data.
                "pull_if_newer(1, timeout=20)": reader.pull_if_newer(1, timeout=20),
                "pull_if_newer(0) of an empty table": reader.pull_if_newer(0, "empty"),
                "version()": reader.version(),
                "version() of an empty table": reader.version("empty"),
            }
            answered_before_the_push = not pushing.is_set()
        finally:
            scheduled.cancel()
            scheduled.join(PATIENCE)
        assert answers == {
            "pull_if_newer(1)": None,
            "pull_if_newer(1, timeout=20)": None,
            "pull_if_newer(0) of an empty table": None,
            "version()": 1,
            "version() of an empty table": 0,
        }
        assert answered_before_the_push, (
            f"answering 'nothing newer' took past the push scheduled {SCHEDULED_PUSH_DELAY:g}"
            " s later: these calls must answer at once, without waiting"
        )

    def test_nothing_newer_costs_the_same_whatever_the_size_of_the_table(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        """``pull_if_newer(current)`` answers from the version alone, never the data. Two
        measures of one container's answers on a large table (:attr:`LARGE_TABLE_BYTES`)
        and a tiny one: the Python memory a call allocates (an answer that fetched the
        data allocates its size), and the median time of calls made in the same rounds
        (an engine reading into memory Python does not trace takes the transfer's time:
        the large table's median may be at most NOTHING_NEWER_RATIO times the tiny's,
        plus NOTHING_NEWER_MARGIN; no bound on either alone)."""
        size = min(self.LARGE_TABLE_BYTES, backend_cls.max_push_bytes or self.LARGE_TABLE_BYTES)
        large = {"large": varsync.Spec((size,), "uint8")}
        container = connect(make_tables({"large": large, "small": SMALL}))
        at = {
            "large": container.push({"large": np.full(size, 7, np.uint8)}, table="large"),
            "small": container.push(filled(SMALL, 1), table="small"),
        }
        answers = {
            name: (lambda name=name: container.pull_if_newer(at[name], name))
            for name in ("large", "small")
        }
        assert [answer() for answer in answers.values()] == [None, None]  # warmed up
        allocated = {name: _allocated_by(answer) for name, answer in answers.items()}
        assert allocated["large"] < size // 8, (
            f"answering 'nothing newer' on a table of {size} bytes allocated "
            f"{allocated['large']} bytes (on a tiny table: {allocated['small']}): it read "
            "the data; compare versions first"
        )
        took: dict[str, list[float]] = {name: [] for name in answers}
        for index in range(self.NOTHING_NEWER_ROUNDS):
            for name in sorted(answers, reverse=bool(index % 2)):  # either first, in turn
                started = time.perf_counter()
                assert answers[name]() is None
                took[name].append(time.perf_counter() - started)
        median = {name: statistics.median(times) for name, times in took.items()}
        assert median["large"] <= median["small"] * NOTHING_NEWER_RATIO + NOTHING_NEWER_MARGIN, (
            f"answering 'nothing newer' took a median {median['large'] * 1e3:.1f} ms on a "
            f"table of {size} bytes, {median['small'] * 1e3:.2f} ms on a tiny one (same "
            "rounds): the answer costs the table's size; compare versions first"
        )

    # -- one container, many threads ---------------------------------------------------------

    def test_one_container_shared_by_eight_threads_pushing_and_pulling(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        container = connect(make_tables({"variables": SHARED}))
        pushers = self.THREADS // 2
        start = threading.Barrier(self.THREADS)
        done = threading.Event()
        pushed: dict[int, list[int | None]] = {}  # pusher -> versions its pushes returned
        seen: list[tuple[int, int]] = []  # (version, number) pulled
        problems: list[str] = []

        def push(pusher: int) -> None:
            versions = pushed.setdefault(pusher, [])
            start.wait(PATIENCE)
            for number in range(pusher * 1000 + 1, pusher * 1000 + self.PUSHES_PER_THREAD + 1):
                try:
                    versions.append(container.push(filled(SHARED, number)))
                except varsync.ConcurrentPushError:
                    if backend_cls.supports_concurrent_writers:
                        raise
                    versions.append(None)  # published, version unknown: allowed here

        def pull(puller: int) -> None:
            last = 0
            start.wait(PATIENCE)
            while not done.is_set():
                if puller % 2:
                    got = container.pull_if_newer(last)
                    if got is None:
                        continue
                    version, values = got
                    seen.append((version, check_consistent(values)))
                else:
                    check_consistent(container.pull(timeout=PATIENCE))
                    version = container.version()
                if version < last:
                    problems.append(f"a thread saw version {version} after {last}")
                last = version

        def guard(target: Callable[[int], None], index: int) -> None:
            try:
                target(index)
            except BaseException as exc:  # reported below
                problems.append(f"{target.__name__} thread {index}: {type(exc).__name__}: {exc}")

        threads = [
            threading.Thread(target=guard, args=(push if i < pushers else pull, i))
            for i in range(self.THREADS)
        ]
        # Threads handed the GIL every 5 ms (the default) can run a small push whole
        # between two switches: a backend sharing one connection without a lock then
        # passed now and then. Switching every 20 us interleaves their calls.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        try:
            for thread in threads:
                thread.start()
            for thread in threads[:pushers]:
                thread.join(PATIENCE * 4)
        finally:
            done.set()
            sys.setswitchinterval(switch)
        for thread in threads:
            thread.join(PATIENCE)
        assert not any(t.is_alive() for t in threads), "a thread did not finish"
        assert problems == []
        returned = [v for versions in pushed.values() for v in versions if v is not None]
        assert len(returned) == len(set(returned)), "a version was returned to two pushes"
        for pusher, versions in pushed.items():
            given = [v for v in versions if v is not None]
            assert given == sorted(given), f"pusher {pusher} got versions {given}, not increasing"
        total = pushers * self.PUSHES_PER_THREAD
        assert container.version() == total, f"{total} pushes made version {container.version()}"
        assert set(returned) <= set(range(1, total + 1)), f"versions beyond {total}: {returned}"
        version_of = {
            pusher * 1000 + index + 1: version
            for pusher, versions in pushed.items()
            for index, version in enumerate(versions)
            if version is not None
        }
        # A pull labelled v holds push v's value or (Reverb, docs/guarantees.md) a later
        # push's: never an older value presented as newer.
        older = [(v, n, version_of[n]) for v, n in seen if n in version_of and version_of[n] < v]
        assert not older, (
            "pulls labelled with a version above their value's (label, value, its version): "
            f"{older[:5]}"
        )
        final = check_consistent(container.pull())
        last = [number for number, version in version_of.items() if version == total]
        assert final == (last[0] if last else final), (
            f"version {total} holds push {final}, not {last}"
        )

    # -- waits last their timeout ------------------------------------------------------------

    def test_a_wait_never_gives_up_before_its_timeout(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        container = connect(make_tables({"variables": SMALL, "empty": SMALL}))
        container.push(filled(SMALL, 1))
        calls = {
            f"wait_for(1, timeout={WAIT_TIMEOUT})": lambda: container.wait_for(
                1, timeout=WAIT_TIMEOUT
            ),
            f"pull(timeout={WAIT_TIMEOUT}) of an empty table": lambda: container.pull(
                "empty", timeout=WAIT_TIMEOUT
            ),
        }
        for what, call in calls.items():
            started = time.monotonic()
            with pytest.raises(varsync.PullTimeoutError):
                call_within(WAIT_TIMEOUT + SLACK, call)  # fails a wait that ignores it
            took = time.monotonic() - started
            assert took >= WAIT_TIMEOUT - CLOCK_TOLERANCE, (
                f"{what} gave up after {took:.3f} s, before its timeout"
            )

    # -- close -------------------------------------------------------------------------------

    def test_a_closed_container_refuses_every_call(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        container = connect(make_tables({"variables": SMALL}))
        container.push(filled(SMALL, 1))
        container.pull()
        container.close()
        container.close()  # a second close does nothing
        calls = {
            "push": lambda: container.push(filled(SMALL, 2)),
            "pull": lambda: container.pull(),
            "pull_if_newer": lambda: container.pull_if_newer(0),
            "version": lambda: container.version(),
            "wait_for": lambda: container.wait_for(1, timeout=1),
            "update": lambda: container.update(filled(SMALL, 0)),
            "tables": lambda: container.tables(),
            "table_info": lambda: container.table_info(),
            "signature": lambda: container.signature(),
            "create_table": lambda: container.create_table("variables", SMALL),
        }
        for what, call in calls.items():
            try:
                call()
            except varsync.ConfigurationError as exc:
                assert "closed" in str(exc), f"{what} on a closed container: {exc}"
            else:
                raise AssertionError(f"{what} on a closed container did not raise")

    def test_a_closed_container_holds_no_connection_or_thread(
        self,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        leak_counts: Callable[[], Counts],
    ) -> None:
        url = make_tables({"variables": SMALL, "warm_up": SMALL})
        # The same calls once on another table first: process-wide imports, caches and an
        # engine's pollers (gRPC makes them lazily) belong to no container.
        with varsync.connect(url, **connect_options) as warm:
            warm.push(filled(SMALL, 1), table="warm_up")
            warm.pull("warm_up")
            with pytest.raises(varsync.PullTimeoutError):
                warm.wait_for(1, table="warm_up", timeout=0.05)
        before, fds_before = resource_counts(leak_counts), fd_targets()
        container = varsync.connect(url, **connect_options)
        try:
            container.push(filled(SMALL, 1))
            container.pull()
            assert container.pull_if_newer(1) is None
            with pytest.raises(varsync.PullTimeoutError):
                container.wait_for(1, timeout=0.05)
            waiter = BlockingCall(lambda: container.wait_for(1, timeout=20), "wait_for(1)")
            waiter.wait_until_inside(_wait_codes(container))
            container.push(filled(SMALL, 2))
            assert waiter.result() == 2
        finally:
            container.close()
        # threads end and servers notice, soon after
        after = settle(
            lambda: resource_counts(leak_counts),
            lambda counts: not grown(before, counts),
            seconds=10,
            pause=0.02,
        )
        kept = grown(before, after)
        assert not kept, (
            f"a closed container still holds these (before, after): {kept}; descriptors new "
            f"since: {sorted(t for fd, t in fd_targets().items() if fds_before.get(fd) != t)[:20]}"
        )


def _allocated_by(call: Callable[[], Any]) -> int:
    """The most Python memory (bytes, :mod:`tracemalloc`) in use during ``call()`` beyond
    what was in use before it; tracing is started for the call unless it is on already."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()
