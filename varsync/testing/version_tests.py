"""Versions: numbering, change detection, and waits that block until a push and end at
their timeout."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

import varsync
from varsync.testing._base import BLOCKED_SECONDS, SMALL, TableMaker, _Base, _wait_codes
from varsync.testing.blocking import BlockingCall
from varsync.testing.values import assert_bit_equal, check_consistent, filled

__all__ = ["VersionTests"]


class VersionTests(_Base):
    """Versions, change detection and bounded waits."""

    def test_versions_start_at_zero_and_increase_by_push(self, store: Any) -> None:
        assert store.version() == 0
        seen = [store.push(filled(SMALL, i)) for i in range(1, 6)]
        assert seen == [1, 2, 3, 4, 5]
        assert store.version() == 5

    def test_a_push_whose_version_is_dropped_is_numbered_and_stored_as_any(
        self, store: Any
    ) -> None:
        """The backend's ``write_unversioned`` (the TF-Agents drop-in's pushes, which return
        no version) among pushes that number theirs: the same versions and values."""
        store.configure_table(skip_unchanged=False)  # whole writes, with leaf versions too
        assert store.push(filled(SMALL, 1)) == 1
        store._push_unversioned(filled(SMALL, 2))
        assert store.version() == 2
        version, values = store.pull_if_newer(1)
        assert version == 2
        assert_bit_equal(values, filled(SMALL, 2))
        store._push_unversioned(filled(SMALL, 3))
        store._push_unversioned(filled(SMALL, 4))
        assert_bit_equal(store.pull(), filled(SMALL, 4))
        assert store.push(filled(SMALL, 5)) == 5
        assert_bit_equal(store.pull(), filled(SMALL, 5))
        with pytest.raises(varsync.SignatureMismatchError):  # checked before it writes
            store._push_unversioned({"nothing": 1})
        assert store.version() == 5

    def test_pull_if_newer_returns_only_newer_values(self, store: Any) -> None:
        assert store.pull_if_newer(0) is None
        store.push(filled(SMALL, 1))
        version, values = store.pull_if_newer(0)
        assert version == 1
        assert_bit_equal(values, filled(SMALL, 1))
        assert store.pull_if_newer(1) is None
        store.push(filled(SMALL, 2))
        version, values = store.pull_if_newer(1)
        assert version == 2
        assert_bit_equal(values, filled(SMALL, 2))

    def test_a_version_above_the_tables_is_reported_as_a_reset_not_waited_on(
        self, store: Any
    ) -> None:
        store.push(filled(SMALL, 1))
        for call in (lambda: store.pull_if_newer(7), lambda: store.wait_for(7, timeout=20)):
            with pytest.raises(varsync.TableResetError, match="version 1"):
                call()
        assert store.pull_if_newer(0)[0] == 1

    def test_a_whole_version_reader_learns_of_a_new_history_at_its_own_version(
        self,
        make_tables: TableMaker,
        connect: Callable[..., Any],
        new_history: Callable[[str, str], None] | None,
    ) -> None:
        """A reader holding version 3, pulled whole (no ``held=``), of a table the store
        then loses: the table made again and pushed back to version 3 holds another value
        under the same number. ``pull_if_newer(3)`` raises TableResetError or returns the
        new value; never None, which would claim the reader holds the current value."""
        if new_history is None:
            pytest.skip("no new_history fixture: the suite cannot restart this backend's history")
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        for number in (1, 2, 3):
            writer.push(filled(SMALL, number))
        version, values = reader.pull_if_newer(0)
        assert (version, check_consistent(values)) == (3, 3)
        new_history(url, "variables")
        again = connect(url)
        again.create_table("variables", SMALL)
        for number in (11, 12, 13):
            again.push(filled(SMALL, number))
        assert again.version() == 3
        try:
            answer = reader.pull_if_newer(3)
        except varsync.TableResetError:
            answer = reader.pull_if_newer(0)
            assert answer is not None, "after TableResetError, pull_if_newer(0) gave nothing"
        assert answer is not None, (
            "a reader holding version 3 of the old history was told nothing is newer than "
            "version 3 of the new one: whole reads must check the history (epoch) too"
        )
        assert check_consistent(answer[1]) == 13

    def test_pull_of_an_empty_table_times_out(self, store: Any) -> None:
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError) as caught:
            store.pull(timeout=0.3)
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.still_empty  # nothing to transfer, not a slow transfer
        assert time.monotonic() - started < 10  # bounded: it did not hang

    def test_timeout_zero_means_do_not_wait_for_a_push(self, store: Any) -> None:
        for call in (lambda: store.pull(timeout=0), lambda: store.wait_for(0, timeout=0)):
            started = time.monotonic()
            with pytest.raises(varsync.PullTimeoutError):
                call()
            assert time.monotonic() - started < 5
        store.push(filled(SMALL, 2))
        assert_bit_equal(store.pull(timeout=0), filled(SMALL, 2))
        version, values = store.pull_if_newer(0, timeout=0)
        assert version == 1
        assert_bit_equal(values, filled(SMALL, 2))
        assert store.pull_if_newer(1, timeout=0) is None
        assert store.wait_for(0, timeout=0) == 1
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0)
        targets = filled(SMALL, 0)
        assert store.update(targets, timeout=0) == 1
        assert_bit_equal(targets, filled(SMALL, 2))

    def test_wait_for_times_out_when_nothing_is_pushed(self, store: Any) -> None:
        store.push(filled(SMALL, 1))
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0.3)
        assert store.wait_for(0, timeout=0.3) == 1

    def test_wait_for_wakes_when_another_container_pushes(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        writer.push(filled(SMALL, 1))
        waiter = BlockingCall(lambda: reader.wait_for(1, timeout=20), "wait_for(1)")
        # Push only once the waiter is known to be waiting: inside the backend's wait,
        # and still there a while later (a wait that does not block returns meanwhile).
        waiter.wait_until_inside(_wait_codes(reader))
        waiter.assert_still_blocked(BLOCKED_SECONDS)
        assert writer.push(filled(SMALL, 2)) == 2
        assert waiter.result() == 2

    def test_pull_waits_for_the_first_push(self, make_tables: TableMaker, connect: Any) -> None:
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        waiter = BlockingCall(lambda: reader.pull(timeout=20), "pull() of an empty table")
        waiter.wait_until_inside(_wait_codes(reader))
        waiter.assert_still_blocked(BLOCKED_SECONDS)
        writer.push(filled(SMALL, 3))
        assert_bit_equal(waiter.result(), filled(SMALL, 3))

    def test_two_containers_see_each_others_pushes(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": SMALL})
        a, b = connect(url), connect(url)
        assert a.push(filled(SMALL, 1)) == 1
        assert b.version() == 1
        assert b.push(filled(SMALL, 2)) == 2
        version, values = a.pull_if_newer(1)
        assert version == 2
        assert_bit_equal(values, filled(SMALL, 2))
