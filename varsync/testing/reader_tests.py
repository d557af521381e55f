"""The reader registry (``supports_reader_registry``): readers report the version they
hold, with an expiry; ``readers`` lists them and ``wait_for_readers`` waits for them, also
across processes where the store is shared. Without the ability, a clear error."""

from __future__ import annotations

import math
import multiprocessing
import time
from typing import Any, Callable

import pytest

import varsync
from varsync._backends.base import Backend
from varsync.testing._base import SMALL, TableMaker, _Base
from varsync.testing.values import filled

__all__ = ["ReaderRegistryTests"]


def _read_as(url: str, options: dict[str, Any], reader: str, seconds: float) -> None:
    """Process: report as ``reader``, pull the latest version, hold on for ``seconds``."""
    with varsync.connect(url, **options) as container:
        container.report_as(reader, ttl=30)
        container.pull(timeout=30)
        time.sleep(seconds)


class ReaderRegistryTests(_Base):
    """Who holds which version."""

    #: Seconds an entry lives in the expiry test.
    TTL = 1.0

    @pytest.fixture
    def registry_url(self, make_tables: TableMaker) -> str:
        """A store with table ``variables`` of the small nest, empty."""
        return make_tables({"variables": SMALL})

    @pytest.fixture
    def learner(self, registry_url: str, connect: Callable[..., Any]) -> Any:
        return connect(registry_url)

    @staticmethod
    def _needs_reader_registry(backend_cls: type[Backend]) -> None:
        if not backend_cls.supports_reader_registry:
            pytest.skip("backend does not declare supports_reader_registry")

    def test_without_a_registry_the_calls_say_so(
        self, store: Any, backend_cls: type[Backend]
    ) -> None:
        if backend_cls.supports_reader_registry:
            pytest.skip("backend declares supports_reader_registry")
        with pytest.raises(varsync.UnsupportedError, match="reader registry"):
            store.readers()
        with pytest.raises(varsync.UnsupportedError, match="reader registry"):
            store.report_as("actor-1")
        with pytest.raises(varsync.UnsupportedError):
            store.wait_for_readers(1, 1, timeout=0)

    def test_readers_report_the_version_they_hold(
        self,
        learner: Any,
        connect: Callable[..., Any],
        registry_url: str,
        backend_cls: type[Backend],
    ) -> None:
        self._needs_reader_registry(backend_cls)
        store, url = learner, registry_url
        assert store.readers() == []
        store.push(filled(SMALL, 1))
        actors = [connect(url) for _ in range(3)]
        for number, actor in enumerate(actors):
            actor.report_as(f"actor-{number}")
        actors[0].pull()
        actors[1].pull_if_newer(0)
        actors[2].update(filled(SMALL, 0))
        store.push(filled(SMALL, 2))
        actors[0].pull()
        held = store.wait_for_readers(1, 3, timeout=10)
        assert sorted(r.reader for r in held) == ["actor-0", "actor-1", "actor-2"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            versions = {r.reader: r.version for r in store.readers()}
            if versions.get("actor-0") == 2:
                break
            time.sleep(0.01)
        assert versions == {"actor-0": 2, "actor-1": 1, "actor-2": 1}
        info = {r.reader: r for r in store.readers()}
        assert info["actor-1"].lag(store.version()) == 1
        assert info["actor-0"].lag(2) == 0
        assert all(r.host and r.pid > 0 and r.reported <= r.expires for r in info.values())

    def test_a_reader_that_stops_expires(
        self,
        learner: Any,
        connect: Callable[..., Any],
        registry_url: str,
        backend_cls: type[Backend],
    ) -> None:
        self._needs_reader_registry(backend_cls)
        store, url = learner, registry_url
        store.push(filled(SMALL, 1))
        actor = connect(url)
        actor.report_as("short-lived", ttl=self.TTL)
        actor.pull()
        assert [r.reader for r in store.wait_for_readers(1, 1, timeout=10)] == ["short-lived"]
        # still reported while alive: the thread refreshes it before it expires
        time.sleep(self.TTL * 1.5)
        assert [r.reader for r in store.readers()] == ["short-lived"]
        actor.close()
        deadline = time.monotonic() + self.TTL * 1.5  # the same bound, on the condition
        while store.readers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.readers() == []

    def test_wait_for_readers_times_out_naming_who_holds_what(
        self,
        learner: Any,
        connect: Callable[..., Any],
        registry_url: str,
        backend_cls: type[Backend],
    ) -> None:
        self._needs_reader_registry(backend_cls)
        store, url = learner, registry_url
        store.push(filled(SMALL, 1))
        actor = connect(url)
        actor.report_as("slow-actor")
        actor.pull()
        store.wait_for_readers(1, 1, timeout=10)
        store.push(filled(SMALL, 2))
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError, match="slow-actor at 1"):
            store.wait_for_readers(2, 1, timeout=0.3)
        assert time.monotonic() - started >= 0.3
        with pytest.raises(varsync.ConfigurationError):
            store.wait_for_readers(2, 0)

    def test_a_report_of_an_earlier_history_is_never_counted(
        self,
        learner: Any,
        connect: Callable[..., Any],
        registry_url: str,
        new_history: Callable[[str, str], None] | None,
        backend_cls: type[Backend],
    ) -> None:
        """A reader holding version 3 of a table whose store then lost it: the table made
        again and pushed past 3 is another history, and the reader holds none of it.
        Neither ``readers`` nor ``wait_for_readers`` may count its report (the old
        weights), and its reporter stops sending it; once it pulls the new history, it
        is counted again."""
        self._needs_reader_registry(backend_cls)
        if new_history is None:
            pytest.skip("no new_history fixture: the suite cannot restart this backend's history")
        store, url = learner, registry_url
        for number in (1, 2, 3):
            store.push(filled(SMALL, number))
        actor = connect(url)
        actor.report_as("old-weights", ttl=self.TTL)  # a report round every TTL / 3
        assert actor.pull_if_newer(0)[0] == 3
        assert [r.version for r in store.wait_for_readers(3, 1, timeout=10)] == [3]
        new_history(url, "variables")
        writer = connect(url)
        writer.create_table("variables", SMALL)
        for number in range(1, 6):  # the new history passes the number the actor holds
            writer.push(filled(SMALL, 10 + number))
        # several of the actor's report rounds pass while the learners look
        with pytest.raises(varsync.PullTimeoutError):
            writer.wait_for_readers(1, 1, timeout=self.TTL * 2)
        for learning in (writer, store):
            assert learning.readers() == []
        assert (
            writer.backend.readers("variables", math.inf) == {}
        )  # the reporter stopped sending it
        assert int(actor.pull()["train_step"]) == 15  # the actor takes the new history's value
        held = writer.wait_for_readers(5, 1, timeout=10)
        assert [(r.reader, r.version) for r in held] == [("old-weights", 5)]
        assert [r.version for r in store.readers()] == [5]

    def test_a_learner_waits_for_readers_in_other_processes(
        self,
        learner: Any,
        registry_url: str,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        self._needs_reader_registry(backend_cls)
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        store, url = learner, registry_url
        store.push(filled(SMALL, 1))
        context = multiprocessing.get_context("spawn")
        children = [
            context.Process(target=_read_as, args=(url, dict(connect_options), f"p{i}", 20))
            for i in range(2)
        ]
        for child in children:
            child.start()
        try:
            held = store.wait_for_readers(1, 2, timeout=60)
            assert sorted(r.reader for r in held) == ["p0", "p1"]
            assert {r.pid for r in held} == {c.pid for c in children}
        finally:
            for child in children:
                child.kill()
                child.join(30)
