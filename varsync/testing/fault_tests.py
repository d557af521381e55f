"""The suite's fault injection: every backend gets it by subclassing ConformanceTests.

- interrupts (``KeyboardInterrupt`` from a SIGINT at seeded random points) during push,
  pull and wait, on every backend;
- lost and delayed replies through a loopback :class:`~varsync.testing.faults.Proxy`, for
  backends whose URL names a ``host:port`` (override ``server_address`` / ``url_via``
  when yours is spelled otherwise);
- a server paused with SIGSTOP under per-call timeouts, where the ``server_pid`` fixture
  names the server process;
- two writer processes at once, where the backend is ``shared_across_processes``.

After each fault: the table holds one whole version, the previous or a newer one (never
older, never mixed, never corrupt); no call outlives its bound; no file descriptor or
thread is left behind (plus whatever the ``leak_counts`` fixture counts); no version
number is returned twice.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

import pytest

import varsync
from varsync._backends.base import Backend
from varsync.testing._base import CONSISTENCY, TableMaker, _Base
from varsync.testing.faults import (
    Interrupter,
    Proxy,
    call_within,
    fd_targets,
    grown,
    resource_counts,
    settle,
)
from varsync.testing.values import check_consistent, filled

#: How long past its own timeout a call may take before the suite calls it hung: this
#: machine may be loaded, and a backend may round a timeout up to whole milliseconds.
SLACK = 3.0
#: What a check may take before the suite calls the store hung (a lock left held).
CHECK_SECONDS = 30.0
#: Errors a call may raise when the network or the server fails under it.
TRANSIENT = (varsync.BackendConnectionError, varsync.PullTimeoutError)

Counts = dict[str, int]


class _History:
    """What one writer pushed and saw, to check every later observation against."""

    def __init__(self) -> None:
        self.returned: list[int] = []
        self.held: tuple[int, int] = (0, 0)  # (version, number) last seen in the table
        self.pushed = 0  # the number of the last push tried

    def pushed_as(self, version: int | None) -> None:
        if version is None:
            return
        assert version not in self.returned, f"version {version} was returned twice"
        assert not self.returned or version > self.returned[-1], (
            f"push returned version {version} after {self.returned[-1]}"
        )
        self.returned.append(version)

    def observe(self, container: Any) -> None:
        """The table holds one whole version, no older than the last one seen, whose
        value is one of the pushes made since (numbers only grow)."""
        got = call_within(CHECK_SECONDS, lambda: container.pull_if_newer(0, timeout=10))
        assert got is not None, "the table lost every version"
        version, values = got
        number = check_consistent(values)
        held_version, held_number = self.held
        assert version >= held_version, f"version went back from {held_version} to {version}"
        assert held_number <= number <= self.pushed, (
            f"the table holds push {number}; expected one of pushes {held_number}..{self.pushed}"
        )
        if version == held_version:
            assert number == held_number, f"version {version} changed value"
        self.held = (version, number)


class _CallTimes:
    """How long a call typically takes, for interrupts that land anywhere in it: the median
    of the last few uninterrupted calls, five measured first and one in every ten calls
    after. It follows the machine as it gets busier or quieter during the test, so that a
    slow start does not send most interrupts after the call has returned (one CI run put
    only 25 of 450 inside pushes). Only uninterrupted calls are timed: the calls that
    completed before an interrupt are the shorter ones, and would drag the median down."""

    KEPT = 5
    MEASURE_EVERY = 10

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.recent: list[float] = []
        self.calls = 0
        for _ in range(self.KEPT):
            self._timed(fn)

    def _timed(self, fn: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = fn()
        self.recent = (self.recent + [time.perf_counter() - started])[-self.KEPT :]
        return result

    def interrupted(self, interrupter: Interrupter, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """``interrupter.call(fn, delay)``, the delay drawn from 0 to 1.2 times the typical
        duration; or, one call in ten, ``(True, fn())`` timed."""
        self.calls += 1
        if self.calls % self.MEASURE_EVERY == 0:
            return True, self._timed(fn)
        delay = interrupter.random.uniform(0, 1.2 * statistics.median(self.recent))
        return interrupter.call(fn, delay)


def _interrupt_rounds(rounds: int, interrupter: Interrupter) -> Iterator[int]:
    """``rounds`` calls, and up to twice as many more while fewer than a quarter were
    interrupted: a busy machine can stretch or shrink calls between two measurements of
    the typical time, so that more of the interrupts land after the call."""
    for index in range(3 * rounds):
        if index >= rounds and interrupter.fired > rounds // 4:
            return
        yield index


def _write_and_report(
    url: str, options: dict[str, Any], first: int, count: int, start: Any, results: Any
) -> None:
    """Child process: once every writer is ready (``start``, a barrier), push ``count``
    consistent nests numbered from ``first``; report the version each push returned
    (``None`` for a ConcurrentPushError)."""
    versions: list[int | None] = []
    try:
        with varsync.connect(url, **options) as container:
            container.version()  # connected, imports done: the pushes will overlap
            start.wait(120)
            for number in range(first, first + count):
                try:
                    versions.append(container.push(filled(CONSISTENCY, number)))
                except varsync.ConcurrentPushError:
                    versions.append(None)
        results.put((first, versions, None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((first, versions, f"{type(exc).__name__}: {exc}"))


class FaultTests(_Base):
    """Interrupts, lost and delayed replies, a paused server, two writer processes."""

    #: Calls interrupted per test; calls made with replies lost (override to trade time:
    #: gRPC backs off for a second or more after each connection it loses).
    INTERRUPTS = 150
    LOST_REPLY_CALLS = 60
    LOST_REPLY_PROBABILITY = 0.05
    #: How much a resource count may grow over a fault test (pools, caches, reconnections).
    LEAK_ALLOWANCE = 4

    # -- fixtures a backend author may override ------------------------------------------

    @pytest.fixture
    def server_pid(self) -> Any:
        """The pid of the server process (not this process) behind the URLs
        ``make_tables`` returns, for the SIGSTOP test; or a function ``pid(url)`` where
        each URL has a server of its own. ``None`` skips the test."""
        return None

    @pytest.fixture
    def server_address(self) -> Callable[[str], tuple[str, int] | None]:
        """``server_address(url)``: ``(host, port)`` of the server behind a URL that
        ``make_tables`` returned, for the proxy tests; ``None`` (by default, where the URL
        names no port) skips them."""

        def address(url: str) -> tuple[str, int] | None:
            parts = urlsplit(url)
            try:
                port = parts.port
            except ValueError:
                return None
            if port is None or parts.hostname is None:
                return None
            return parts.hostname, port

        return address

    @pytest.fixture
    def url_via(self) -> Callable[[str, str, int], str]:
        """``url_via(url, host, port)``: the same store and namespace reached through
        ``host:port`` (the proxy) instead."""

        def via(url: str, host: str, port: int) -> str:
            parts = urlsplit(url)
            userinfo = parts.netloc.rpartition("@")[0]
            netloc = (userinfo + "@" if userinfo else "") + f"{host}:{port}"
            return urlunsplit(parts._replace(netloc=netloc))

        return via

    @pytest.fixture
    def leak_counts(self) -> Callable[[], Counts]:
        """Counts of backend-specific resources that must not grow with faults (files,
        server-side connections, ...), added to the suite's own fd and thread counts."""
        return dict

    # -- helpers ---------------------------------------------------------------------------

    def _assert_no_leaks(
        self,
        before: Counts,
        leak_counts: Callable[[], Counts],
        faults: int,
        fds_before: dict[int, str],
    ) -> None:
        """Nothing grew with the faults: a few of anything may be pooled or cached (a
        reconnection, a worker thread), one per fault may not. What other threads of a
        long test session open and close meanwhile is given a moment to settle."""
        allowance = self.LEAK_ALLOWANCE
        after = settle(
            lambda: resource_counts(leak_counts),
            lambda counts: not grown(before, counts, allowance),
            seconds=2.0,
        )
        more = grown(before, after, allowance)
        new = {fd: target for fd, target in fd_targets().items() if fds_before.get(fd) != target}
        assert not more, (
            f"after {faults} faults these grew (before, after): {more}; "
            f"descriptors new since: {sorted(new.values())[:20]}"
        )

    def _baseline(self, leak_counts: Callable[[], Counts]) -> tuple[Counts, dict[int, str]]:
        return resource_counts(leak_counts), fd_targets()

    def _proxy(self, server_address: Callable[[str], Any], url: str) -> Proxy:
        address = server_address(url)
        if address is None:
            pytest.skip("no server address to put a proxy in front of (server_address gives none)")
        return Proxy(*address)

    # -- interrupts ------------------------------------------------------------------------

    def test_interrupted_pushes_leave_one_whole_version_and_nothing_behind(
        self, make_tables: TableMaker, connect: Any, leak_counts: Callable[[], Counts]
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        writer, checker = connect(url), connect(url)
        history = _History()
        for _ in range(3):  # warm up: connections, workers, caches
            history.pushed += 1
            history.pushed_as(writer.push(filled(CONSISTENCY, history.pushed)))
        history.observe(checker)

        def push() -> int:
            history.pushed += 1
            return writer.push(filled(CONSISTENCY, history.pushed))

        times = _CallTimes(lambda: history.pushed_as(push()))
        history.observe(checker)
        before, fds_before = self._baseline(leak_counts)
        with Interrupter(seed=11) as interrupter:
            for _ in _interrupt_rounds(self.INTERRUPTS, interrupter):
                done, version = times.interrupted(interrupter, push)
                history.pushed_as(version if done else None)
                history.observe(checker)
        assert interrupter.fired > self.INTERRUPTS // 4, "too few pushes were interrupted"
        history.pushed_as(push())
        history.observe(checker)
        assert history.held[1] == history.pushed
        self._assert_no_leaks(before, leak_counts, interrupter.fired, fds_before)

    def test_interrupted_pulls_leave_nothing_behind(
        self, make_tables: TableMaker, connect: Any, leak_counts: Callable[[], Counts]
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        writer, reader = connect(url), connect(url)
        history = _History()
        history.pushed = 1
        writer.push(filled(CONSISTENCY, 1))
        times = _CallTimes(reader.pull)
        kept = []  # pulled values held on to, as an actor holds its weights
        before, fds_before = self._baseline(leak_counts)
        with Interrupter(seed=12) as interrupter:
            for index in _interrupt_rounds(self.INTERRUPTS, interrupter):
                calls: list[Callable[[], Any]] = [reader.pull, lambda: reader.pull_if_newer(0)]
                done, got = times.interrupted(interrupter, calls[index % 2])
                if done:
                    check_consistent(got if index % 2 == 0 else got[1])
                    kept = [got]
                if index % 10 == 0:
                    history.pushed += 1
                    writer.push(filled(CONSISTENCY, history.pushed))
                history.observe(reader)
        assert interrupter.fired > self.INTERRUPTS // 4, "too few pulls were interrupted"
        del kept
        self._assert_no_leaks(before, leak_counts, interrupter.fired, fds_before)

    def test_interrupted_waits_leave_nothing_behind(
        self, make_tables: TableMaker, connect: Any, leak_counts: Callable[[], Counts]
    ) -> None:
        url = make_tables({"variables": CONSISTENCY, "empty": CONSISTENCY})
        writer, reader = connect(url), connect(url)
        version = writer.push(filled(CONSISTENCY, 1))
        reader.pull()
        before, fds_before = self._baseline(leak_counts)
        rounds = self.INTERRUPTS // 3
        with Interrupter(seed=13) as interrupter:
            for index in range(rounds):
                wait: Callable[[], Any] = (
                    (lambda: reader.wait_for(version, timeout=20))
                    if index % 2 == 0
                    else (lambda: reader.pull("empty", timeout=20))
                )
                done, _ = interrupter.call(wait, interrupter.random.uniform(0, 0.02))
                assert not done, "a wait returned though nothing was pushed"
        assert interrupter.fired == rounds
        # The store still wakes a waiter, and still times one out.
        with pytest.raises(varsync.PullTimeoutError):
            call_within(CHECK_SECONDS, lambda: reader.wait_for(version, timeout=0.2))
        woke: list[int] = []
        waiter = threading.Thread(target=lambda: woke.append(reader.wait_for(version, timeout=20)))
        waiter.start()
        writer.push(filled(CONSISTENCY, 2))
        waiter.join(CHECK_SECONDS)
        assert woke == [version + 1]
        self._assert_no_leaks(before, leak_counts, interrupter.fired, fds_before)

    # -- lost and delayed replies ----------------------------------------------------------

    def test_lost_push_replies_never_lose_or_mix_published_data(
        self,
        make_tables: TableMaker,
        connect: Any,
        server_address: Any,
        url_via: Any,
        leak_counts: Callable[[], Counts],
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        with self._proxy(server_address, url) as proxy:
            writer = connect(url_via(url, proxy.host, proxy.port), timeout=5)
            checker = connect(url)
            history = _History()
            history.pushed = 1
            history.pushed_as(writer.push(filled(CONSISTENCY, 1)))
            history.observe(checker)
            before, fds_before = self._baseline(leak_counts)
            proxy.lose_replies(probability=self.LOST_REPLY_PROBABILITY, seed=21)
            failed = calls = 0
            # LOST_REPLY_CALLS calls, and more (boundedly) until one failed: how many replies
            # a call takes, and so how many may be lost, varies with the engine's protocol.
            most = 4 * self.LOST_REPLY_CALLS
            while calls < self.LOST_REPLY_CALLS or (not failed and calls < most):
                calls += 1
                history.pushed += 1
                try:
                    history.pushed_as(writer.push(filled(CONSISTENCY, history.pushed)))
                except TRANSIENT:
                    failed += 1
                history.observe(checker)
            proxy.heal()
            history.pushed += 1
            history.pushed_as(writer.push(filled(CONSISTENCY, history.pushed)))
            history.observe(checker)
            assert history.held[1] == history.pushed
            assert proxy.lost > 0 and failed > 0, "no reply was lost: the test tested nothing"
            self._assert_no_leaks(before, leak_counts, failed, fds_before)

    def test_lost_pull_replies_raise_or_return_one_whole_version(
        self, make_tables: TableMaker, connect: Any, server_address: Any, url_via: Any
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        with self._proxy(server_address, url) as proxy:
            writer = connect(url)
            reader = connect(url_via(url, proxy.host, proxy.port), timeout=5)
            writer.push(filled(CONSISTENCY, 1))
            proxy.lose_replies(probability=self.LOST_REPLY_PROBABILITY, seed=22)
            last, number = 0, 1
            most = 4 * self.LOST_REPLY_CALLS
            while number <= self.LOST_REPLY_CALLS or (not proxy.lost and number <= most):
                number += 1
                writer.push(filled(CONSISTENCY, number))
                try:
                    got = reader.pull_if_newer(last) if number % 2 else (None, reader.pull())
                except TRANSIENT:
                    continue
                if got is not None:
                    held = check_consistent(got[1])
                    assert held == number, f"pulled push {held} after push {number} was made"
                    last = got[0] or last
            proxy.heal()
            assert check_consistent(reader.pull()) == number
            # A read is idempotent: a backend may ask again on a new connection within the
            # call's bound, so that no call failed; but replies must have been lost.
            assert proxy.lost > 0, "no reply was lost: the test tested nothing"

    def test_a_call_never_outlives_its_timeout_when_replies_stop(
        self, make_tables: TableMaker, connect: Any, server_address: Any, url_via: Any
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        with self._proxy(server_address, url) as proxy:
            writer = connect(url)
            slow = connect(url_via(url, proxy.host, proxy.port))  # the default timeout: 30 s
            version = writer.push(filled(CONSISTENCY, 1))
            slow.pull()
            proxy.delay_replies(3 * (1 + SLACK))
            self._each_call_ends_within_its_timeout(slow, version)
            proxy.heal()
            proxy.drop_connections()  # the delayed replies are not waited for
            assert check_consistent(slow.pull(timeout=20)) == 1

    def test_a_paused_server_never_holds_a_call_past_its_timeout(
        self, make_tables: TableMaker, connect: Any, server_pid: Any, caplog: Any
    ) -> None:
        if server_pid is None:
            pytest.skip("no server process to pause (the server_pid fixture gives none)")
        url = make_tables({"variables": CONSISTENCY})
        if callable(server_pid):
            server_pid = server_pid(url)
        assert server_pid != os.getpid(), "server_pid must name another process"
        container = connect(url)
        version = container.push(filled(CONSISTENCY, 1))
        container.pull()
        reporting = None
        if container.backend.supports_reader_registry:  # its reports are bounded too
            reporting = connect(url)
            reporting.report_as("paused-server-reader", ttl=1.5)
            reporting.pull()
            container.wait_for_readers(version, 1, timeout=CHECK_SECONDS)
        caplog.set_level(logging.WARNING, logger="varsync.readers")
        os.kill(server_pid, signal.SIGSTOP)
        try:
            self._each_call_ends_within_its_timeout(container, version)
            if reporting is not None:
                # a report round on a hung server ends within its refresh interval (ttl /
                # 3), logging what failed; closing the container then waits for no server
                def failed_a_round() -> bool:
                    return any("paused-server-reader" in r.getMessage() for r in caplog.records)

                assert settle(failed_a_round, lambda done: done, 1 + SLACK), (
                    "the reporter's round on the paused server did not end within its bound"
                )
                started = time.monotonic()
                reporting.close()
                took = time.monotonic() - started
                assert took < 1 + SLACK, f"closing a reporting container took {took:.1f} s"
        finally:
            os.kill(server_pid, signal.SIGCONT)
        assert check_consistent(container.pull(timeout=20)) == 1
        assert container.push(filled(CONSISTENCY, 2)) == version + 1

    def test_a_paused_server_never_holds_a_call_past_the_containers_timeout(
        self, make_tables: TableMaker, connect: Any, server_pid: Any
    ) -> None:
        """Calls that take no timeout of their own (``push``, ``version``, ``table_info``)
        or are given none (``pull()``) are bounded by the container's: each, on a
        container of its own connected with ``timeout=2``, raises within 2 s (+ SLACK)
        of the server being paused. They run at once, on threads, so the test takes one
        timeout, not four."""
        if server_pid is None:
            pytest.skip("no server process to pause (the server_pid fixture gives none)")
        url = make_tables({"variables": CONSISTENCY})
        if callable(server_pid):
            server_pid = server_pid(url)
        assert server_pid != os.getpid(), "server_pid must name another process"
        timeout = 2.0
        names = ["push", "pull()", "version()", "table_info()"]
        containers = {name: connect(url, timeout=timeout) for name in names}
        version = containers["push"].push(filled(CONSISTENCY, 1))
        for container in containers.values():  # connected, the table known: warmed up
            container.pull()
            container.table_info()
        calls: dict[str, Callable[[], Any]] = {
            "push": lambda: containers["push"].push(filled(CONSISTENCY, 2)),
            "pull()": lambda: containers["pull()"].pull(),
            "version()": lambda: containers["version()"].version(),
            "table_info()": lambda: containers["table_info()"].table_info(),
        }
        outcomes: dict[str, tuple[float, str]] = {}

        def timed(name: str) -> None:
            started = time.monotonic()
            try:
                got = call_within(timeout + SLACK, calls[name])
                outcome = f"returned {got!r:.60}"
            except TRANSIENT as exc:
                outcome = f"raised {type(exc).__name__}"
            except BaseException as exc:  # reported below
                outcome = f"unexpected {type(exc).__name__}: {exc}"
            outcomes[name] = (time.monotonic() - started, outcome)

        threads = [threading.Thread(target=timed, args=(name,)) for name in names]
        os.kill(server_pid, signal.SIGSTOP)
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout + 2 * SLACK)
        finally:
            os.kill(server_pid, signal.SIGCONT)
        late = {
            name: f"{took:.1f} s, {outcome}"
            for name, (took, outcome) in outcomes.items()
            if took >= timeout + SLACK or not outcome.startswith("raised")
        }
        assert len(outcomes) == len(names) and not late, (
            f"on a paused server, with the container's timeout {timeout:g} s, these did not "
            f"raise one of {[e.__name__ for e in TRANSIENT]} within {timeout + SLACK:g} s: "
            f"{late or sorted(set(names) - set(outcomes))}"
        )
        # The push may have reached the server before it stopped: one whole version, the
        # first push's or the second's, and pushes go on after it.
        got = call_within(CHECK_SECONDS, lambda: containers["pull()"].pull_if_newer(0, timeout=20))
        assert got is not None
        assert check_consistent(got[1]) in (1, 2)
        assert containers["push"].push(filled(CONSISTENCY, 3)) > max(version, got[0])

    def _each_call_ends_within_its_timeout(self, container: Any, version: int) -> None:
        calls = {
            "pull(timeout=1)": lambda: container.pull(timeout=1),
            "pull_if_newer(0, timeout=1)": lambda: container.pull_if_newer(0, timeout=1),
            "wait_for(version, timeout=1)": lambda: container.wait_for(version, timeout=1),
        }
        backend = container.backend
        if backend.supports_leaf_versions:
            calls["leaf_versions(timeout=1)"] = lambda: container.leaf_versions(timeout=1)
        if backend.supports_reader_registry:
            calls["readers(timeout=1)"] = lambda: container.readers(timeout=1)
            calls["wait_for_readers(version, 1, timeout=1)"] = lambda: container.wait_for_readers(
                version, 1, timeout=1
            )
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises(TRANSIENT):
                call_within(1 + SLACK, call)
            took = time.monotonic() - started
            assert took < 1 + SLACK, f"{name} took {took:.1f} s"

    # -- two writers -----------------------------------------------------------------------

    def test_two_writer_processes_never_get_the_same_version(
        self,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        url = make_tables({"variables": CONSISTENCY})
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        count = 100
        start = context.Barrier(2)
        writers = [
            context.Process(
                target=_write_and_report,
                args=(url, dict(connect_options), first, count, start, results),
            )
            for first in (1, 1001)
        ]
        reader = connect(url)
        problems: list[str] = []
        stop = threading.Event()

        def read() -> None:
            last = 0
            try:
                while not stop.is_set():
                    got = reader.pull_if_newer(last)
                    if got is not None:
                        check_consistent(got[1])
                        last = got[0]
            except BaseException as exc:  # reported below
                problems.append(f"{type(exc).__name__}: {exc}")

        watcher = threading.Thread(target=read)
        watcher.start()
        try:
            for process in writers:
                process.start()
            reports = [results.get(timeout=180) for _ in writers]
        finally:
            stop.set()
            watcher.join(60)
            for process in writers:
                process.join(30)
                if process.is_alive():
                    process.kill()
                    process.join()
        assert problems == []
        returned: list[int] = []
        for first, versions, error in reports:
            assert error is None, f"writer {first}: {error}"
            given = [v for v in versions if v is not None]
            assert given == sorted(set(given)), f"writer {first} got versions out of order"
            if backend_cls.supports_concurrent_writers:
                assert len(given) == count, (
                    "a push raised ConcurrentPushError on a backend "
                    "that declares supports_concurrent_writers"
                )
            returned += given
        duplicates: set[int] = {v for v in returned if returned.count(v) > 1}
        assert not duplicates, f"versions returned to both writers: {sorted(duplicates)[:10]}"
        assert reader.version() == 2 * count, "a push was lost or counted twice"
        assert max(returned, default=0) <= 2 * count
