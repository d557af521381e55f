"""Every capability a backend declares is checked: what the flag promises, it does.

- ``max_push_bytes``: a push over it raises :class:`~varsync.ItemTooLargeError` and
  changes nothing (with an over-size array that costs no memory: a sparse file mapped
  read-only); where the limit is at most 64 MiB, a push of exactly the limit goes through.
- ``persistent``: tables and values outlive the process that wrote them, and a restart
  of the server (where the ``restart_server`` fixture can make one).
- ``supports_blocking_wait``: a blocked wait makes no requests through the protocol
  while it waits (it is woken, not polling), and the push wakes it.
- ``shared_across_processes``: another process sees a push made here, or, where the flag
  is ``False``, does not; a container used before a ``fork`` works in the child, at the
  same time as in the parent, and in the parent after.

And for every backend: tables and values outlive the container that made them.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import varsync
from varsync._backends.base import BLOCK_SLICE, Backend
from varsync.testing._base import BLOCKED_SECONDS, SMALL, TableMaker, _Base, _wait_codes
from varsync.testing.blocking import BlockingCall
from varsync.testing.values import assert_bit_equal, check_consistent, filled

__all__ = ["CapabilityTests"]

#: The largest limit whose push of exactly that size the suite makes (it allocates it).
LARGEST_PUSH_MADE = 64 * 2**20
#: Protocol calls a blocked wait may make while it waits (a look before, one after).
POLLS_ALLOWED = 2
#: The protocol's methods a polling wait would call.
POLLED_METHODS = ("head", "read", "signature", "tables", "details")
#: Pushes (each followed by a pull) a forked child makes through the inherited container.
FORKED_PUSHES = 30
#: How long the forked child may take (it imports nothing: a second or two is typical).
FORKED_SECONDS = 30.0

Sighting = tuple[str, Any, Any]


def _look_from_another_process(url: str, options: dict[str, Any], results: Any) -> None:
    """Child process: report what a container here sees of table ``variables``:
    ``("no table", tables, None)``, ``("table", version, number)`` or ``("error", ...)``."""
    try:
        with varsync.connect(url, **options) as container:
            tables = container.tables()
            if "variables" not in tables:
                results.put(("no table", tables, None))
                return
            got = container.pull_if_newer(0, timeout=20)
            version = container.version()
            results.put(("table", version, None if got is None else check_consistent(got[1])))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put(("error", f"{type(exc).__name__}: {exc}", None))


def _create_and_push(
    url: str, options: dict[str, Any], create: bool, number: int, results: Any
) -> None:
    """Child process: (create table ``variables`` and) push ``number``, then exit;
    report ``("pushed", version, None)`` or ``("error", ...)``."""
    try:
        with varsync.connect(url, **options) as container:
            if create:
                container.create_table("variables", SMALL)
            results.put(("pushed", container.push(filled(SMALL, number)), None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put(("error", f"{type(exc).__name__}: {exc}", None))


def _in_a_child(target: Callable[..., None], *args: Any) -> Sighting:
    """Run ``target(*args, results)`` in a spawned process; the report it put in
    ``results``, once the process has exited."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    try:
        report: Sighting = results.get(timeout=120)
    finally:
        child.join(120)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0, f"the child process exited with {child.exitcode}"
    return report


class CapabilityTests(_Base):
    """What each declared capability flag promises."""

    #: Whether a container made before ``fork`` works in the child (docs/plugins.md, "Fork
    #: safety"). ``False`` only where the engine's own client library cannot be used
    #: across a fork at all (gRPC, Reverb's: its channels hang in the child), and the
    #: backend's docs tell users to connect in the child: the fork test then skips.
    FORK_SAFE = True

    # -- max_push_bytes --------------------------------------------------------------------

    def test_a_push_over_max_push_bytes_is_refused_and_changes_nothing(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend], tmp_path: Path
    ) -> None:
        limit = backend_cls.max_push_bytes
        if limit is None:
            pytest.skip("backend declares no max_push_bytes")
        size = limit + 1
        container = connect(make_tables({"variables": {"big": varsync.Spec((size,), "uint8")}}))
        # Over the limit at no cost: a sparse file, mapped read-only, is a C-contiguous
        # array the core takes as it is (never touched, so never in memory or on disk).
        sparse = tmp_path / "over-the-limit.bin"
        with open(sparse, "wb") as f:
            f.truncate(size)
        big = np.memmap(sparse, dtype=np.uint8, mode="r", shape=(size,))
        try:
            with pytest.raises(varsync.ItemTooLargeError) as caught:
                container.push({"big": big})
        finally:
            del big
        assert isinstance(caught.value, ValueError)
        assert container.version() == 0
        assert container.pull_if_newer(0) is None

    def test_a_push_of_exactly_max_push_bytes_goes_through(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        limit = backend_cls.max_push_bytes
        if limit is None:
            pytest.skip("backend declares no max_push_bytes")
        if limit > LARGEST_PUSH_MADE:
            pytest.skip(
                f"max_push_bytes={limit} is over {LARGEST_PUSH_MADE} bytes, too big a "
                "push to make in a test"
            )
        values = {"big": (np.arange(limit) % 251).astype(np.uint8)}
        container = connect(make_tables({"variables": {"big": varsync.Spec((limit,), "uint8")}}))
        assert container.push(values) == 1
        assert_bit_equal(container.pull(), values)

    # -- persistence -----------------------------------------------------------------------

    def test_tables_and_values_outlive_the_container_that_made_them(
        self,
        url: str,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        if backend_cls.supports_create_table:
            with varsync.connect(url, **connect_options) as first:
                first.create_table("variables", SMALL)
                first.push(filled(SMALL, 4))
        else:
            url = make_tables({"variables": SMALL})
            with varsync.connect(url, **connect_options) as first:
                first.push(filled(SMALL, 4))
        later = connect(url)
        assert "variables" in later.tables()
        assert later.version() == 1
        assert_bit_equal(later.pull(), filled(SMALL, 4))

    def test_persistent_tables_outlive_the_process_that_wrote_them(
        self,
        url: str,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        if not backend_cls.persistent:
            pytest.skip("backend is not persistent")
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes: no other process to write")
        create = backend_cls.supports_create_table
        url = url if create else make_tables({"variables": SMALL})
        report = _in_a_child(_create_and_push, url, dict(connect_options), create, 6)
        assert report == ("pushed", 1, None), f"the writer process reported {report}"
        later = connect(url)
        assert "variables" in later.tables(), "the table went with the process that made it"
        assert later.version() == 1
        assert_bit_equal(later.pull(), filled(SMALL, 6))

    @pytest.fixture
    def restart_server(self) -> Callable[[str], None] | None:
        """``restart_server(url)``: stop the server behind ``url`` (one ``make_tables``
        returned) and start it again on the same address and storage, returning once it
        serves again; ``None`` (the default: no server, or none the tests may restart)
        skips the restart test. Only a ``persistent`` backend's test calls it."""
        return None

    def test_persistent_tables_outlive_a_server_restart(
        self,
        make_tables: TableMaker,
        connect: Any,
        backend_cls: type[Backend],
        restart_server: Callable[[str], None] | None,
    ) -> None:
        """``persistent`` promises tables that outlive server restarts: after one, a new
        container sees the table, its version and value, and the next push continues the
        numbering."""
        if not backend_cls.persistent:
            pytest.skip("backend is not persistent")
        if restart_server is None:
            pytest.skip("no server to restart (the restart_server fixture gives none)")
        url = make_tables({"variables": SMALL})
        before = connect(url)
        before.push(filled(SMALL, 1))
        assert before.push(filled(SMALL, 2)) == 2
        before.close()
        restart_server(url)
        later = connect(url)
        assert "variables" in later.tables(), "the table did not outlive the server's restart"
        assert later.version() == 2
        assert_bit_equal(later.pull(), filled(SMALL, 2))
        assert later.push(filled(SMALL, 3)) == 3

    # -- supports_blocking_wait ------------------------------------------------------------

    def test_a_blocking_wait_makes_no_requests_while_it_waits(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        if not backend_cls.supports_blocking_wait:
            pytest.skip("backend does not declare supports_blocking_wait")
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        writer.push(filled(SMALL, 1))
        calls: list[str] = []
        backend = reader.backend
        for name in POLLED_METHODS:  # count the protocol calls of the reader's backend
            method = getattr(backend, name)
            setattr(backend, name, _counted(method, name, calls))
        try:
            waiter = BlockingCall(lambda: reader.wait_for(1, timeout=20), "wait_for(1)")
            waiter.wait_until_inside(_wait_codes(reader))
            polls = len(calls)
            # A polling wait (the default: every 1 ms, up to every 50 ms) asks again and
            # again meanwhile; one the engine wakes asks nothing until it is woken.
            waiter.assert_still_blocked(max(BLOCKED_SECONDS, 0.3))
            polled = calls[polls:]
            assert len(polled) <= POLLS_ALLOWED, (
                f"a wait of a backend declaring supports_blocking_wait made {len(polled)} "
                f"protocol calls while it waited ({sorted(set(polled))}): it polls"
            )
            assert writer.push(filled(SMALL, 2)) == 2
            # Woken by the push: well before the core's wait loop would block again
            # (BLOCK_SLICE), which a backend whose block only sleeps waits out.
            assert waiter.result(timeout=BLOCK_SLICE / 2) == 2, (
                "a backend declaring supports_blocking_wait was not woken by the push"
            )
        finally:
            for name in POLLED_METHODS:
                vars(backend).pop(name, None)

    # -- shared_across_processes -----------------------------------------------------------

    def test_another_process_sees_a_push_exactly_when_the_store_is_shared(
        self,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        url = make_tables({"variables": SMALL})
        connect(url).push(filled(SMALL, 7))
        sighting = _in_a_child(_look_from_another_process, url, dict(connect_options))
        assert sighting[0] != "error", f"the other process: {sighting[1]}"
        if backend_cls.shared_across_processes:
            assert sighting == ("table", 1, 7), (
                f"a backend declaring shared_across_processes: another process saw {sighting}"
            )
        else:
            assert sighting[0] != "table" or sighting[2] != 7, (
                "a backend declaring shared_across_processes=False: another process saw this "
                f"process's push ({sighting}); declare it shared"
            )

    def test_a_container_used_before_a_fork_works_in_the_child_and_after(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        """A container that pushed and pulled, then ``fork`` (multiprocessing's ``fork``
        start method, a server forking workers): the child pushes and pulls through the
        same container object while the parent pulls through it too, and neither sees
        an error, a mix or the other's replies; the parent then sees the child's pushes
        and goes on. (The child must not use the parent's connections: see plugins.md,
        "Fork safety".)"""
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes: a child's pushes stay its own")
        if not hasattr(os, "fork"):
            pytest.skip("no os.fork on this platform")
        if not self.FORK_SAFE:
            pytest.skip("FORK_SAFE = False: the engine's client cannot be used across a fork")
        url = make_tables({"variables": SMALL})
        container = connect(url)
        assert container.push(filled(SMALL, 1)) == 1
        assert_bit_equal(container.pull(), filled(SMALL, 1))
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)

        def child() -> None:  # in the forked child: the parent's container object
            try:
                for number in range(2, FORKED_PUSHES + 2):
                    version = container.push(filled(SMALL, number))
                    assert version == number, f"push {number} returned version {version}"
                    pulled = check_consistent(container.pull())
                    assert pulled == number, f"after push {number} the child pulled {pulled}"
                send.send("ok")
            except BaseException as exc:  # reported to the parent, which fails the test
                send.send(f"{type(exc).__name__}: {exc}")
                raise

        process = context.Process(target=child)
        with warnings.catch_warnings():  # Python 3.12+ warns of a fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
        seen: list[int] = []
        try:
            deadline = time.monotonic() + FORKED_SECONDS
            while not receive.poll(0) and process.is_alive() and time.monotonic() < deadline:
                seen.append(check_consistent(container.pull()))  # meanwhile, in the parent
            report = (
                receive.recv() if receive.poll(max(deadline - time.monotonic(), 0)) else "no report"
            )
            process.join(max(deadline - time.monotonic(), 1))
        finally:
            if process.is_alive():
                process.kill()
                process.join()
        assert (report, process.exitcode) == ("ok", 0), (
            f"the forked child reported {report!r} and exited with {process.exitcode}"
        )
        assert seen == sorted(seen), f"the parent's pulls went back: {seen}"
        last = FORKED_PUSHES + 1
        assert container.version() == last, "the parent does not see the child's pushes"
        assert_bit_equal(container.pull(), filled(SMALL, last))
        assert container.push(filled(SMALL, last + 1)) == last + 1
        assert_bit_equal(connect(url).pull(), filled(SMALL, last + 1))


def _counted(method: Callable[..., Any], name: str, calls: list[str]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return method(*args, **kwargs)

    return counted
