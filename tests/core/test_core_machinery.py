"""The generic machinery the core owns for every backend (varsync.backend): option
parsers, the history rule, the one wait loop over ``block``, and ``read`` called with or
without the specs, as the backend's protocol version takes it."""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import varsync
from varsync import backend as vb

# -- options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, host, port, address",
    [
        ("x://localhost:8000", "localhost", 8000, "localhost:8000"),
        ("x://user:pw@db.internal:6380/0", "db.internal", 6380, "db.internal:6380"),
        ("x://[::1]:8000", "::1", 8000, "[::1]:8000"),
        ("x://10.0.0.2:65535", "10.0.0.2", 65535, "10.0.0.2:65535"),
    ],
)
def test_host_and_port_come_from_the_url_ipv6_in_brackets(url, host, port, address) -> None:
    parsed = vb.parse_host_port(url, example="x://host:1")
    assert (parsed.host, parsed.port, parsed.address) == (host, port, address)


def test_missing_parts_take_their_defaults() -> None:
    assert vb.parse_host_port("x://", default_host="localhost", default_port=7, example="e") == (
        "localhost", 7
    )
    assert vb.parse_host_port("x://[::1]", default_port=7, example="e").address == "[::1]:7"


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("x://localhost", "names no port"),
        ("x://:8000", "names no host"),
        ("x://localhost:0", "port 0"),
        ("x://localhost:99999", "malformed port"),
        ("x://localhost:http", "malformed port"),
        ("x://[::1:8000", "malformed port|names no host"),
    ],
)
def test_a_bad_host_or_port_names_what_is_wrong_and_an_example(url, fragment) -> None:
    try:
        vb.parse_host_port(url, example="x://host:1")
    except ValueError as exc:  # urlsplit's own, for an unclosed bracket, is one too
        assert isinstance(exc, varsync.ConfigurationError), f"{type(exc).__name__}: {exc}"
        assert pytest.importorskip("re").search(fragment, str(exc)), str(exc)
        assert "x://host:1" in str(exc)
    else:
        raise AssertionError(f"{url} was accepted")


@pytest.mark.parametrize("text, value", [("3", 3), (3, 3), (3.0, 3), ("0", 0)])
def test_ints_from_text_or_values(text, value) -> None:
    assert vb.parse_int(text, "keep", minimum=0, maximum=10) == value


@pytest.mark.parametrize("bad", [True, "3.5", 3.5, "many", None, "11", -1])
def test_bad_ints_are_refused_with_their_range(bad) -> None:
    with pytest.raises(varsync.ConfigurationError, match="keep="):
        vb.parse_int(bad, "keep", minimum=0, maximum=10)


@pytest.mark.parametrize(
    "text, value", [("true", True), ("ON", True), ("0", False), (False, False)]
)
def test_bools_from_text_or_values(text, value) -> None:
    assert vb.parse_bool(text, "tls") is value


def test_bounds_given_by_position_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="minimum=..., maximum="):
        assert vb.parse_int("3", "keep", 0, 10) == 3
    with pytest.warns(DeprecationWarning), pytest.raises(varsync.ConfigurationError):
        vb.parse_int("11", "keep", 0, 10)


def test_a_bad_bool_says_what_is_expected() -> None:
    with pytest.raises(varsync.ConfigurationError, match="tls='maybe' is not a boolean"):
        vb.parse_bool("maybe", "tls")


def test_timeouts_take_seconds_or_no_bound() -> None:
    assert vb.parse_timeout("2.5", "timeout") == 2.5
    assert vb.parse_timeout("none", "timeout") is None
    assert vb.parse_timeout(float("inf"), "timeout") is None
    with pytest.raises(varsync.ConfigurationError, match="negative"):
        vb.parse_timeout(-1, "timeout")


def test_unknown_options_are_listed_with_the_known_ones() -> None:
    vb.refuse_unknown({"keep": 1}, ["keep", "root"], "dirstore")
    with pytest.raises(varsync.ConfigurationError) as err:
        vb.refuse_unknown({"kep": 1}, ["keep", "root"], "dirstore")
    assert "['kep']" in str(err.value) and "keep, root, and timeout, namespace" in str(err.value)


# -- histories: the core's one rule ------------------------------------------------------

from varsync.backend import Head  # noqa: E402
from varsync._history import UNKNOWN, Histories  # noqa: E402


def test_the_first_epoch_is_adopted_and_the_same_one_changes_nothing() -> None:
    histories = Histories("x://h:1")
    assert histories.epoch_of("t", 5) is UNKNOWN
    histories.check("t", 5, Head(5, "a"))  # nothing known yet: numbers alone
    assert histories.epoch_of("t", 5) == "a"
    histories.check("t", 5, Head(6, "a"))


def test_a_new_epoch_is_a_reset_for_a_holder_and_adopted_by_a_fresh_reader() -> None:
    histories = Histories("x://h:1")
    histories.check("t", 0, Head(3, "a"))
    with pytest.raises(varsync.TableResetError, match="since you read version 7") as err:
        histories.check("t", 7, Head(2, "b"))
    assert "epoch a -> b" in str(err.value) and "is at version 2" in str(err.value)
    assert histories.epoch_of("t", 7) == "a"  # every holder of an old version hears of it
    with pytest.raises(varsync.TableResetError):  # a bigger number of the new history too
        histories.check("t", 7, Head(9, "b"))
    histories.check("t", 0, Head(2, "b"))  # a reader holding nothing moves on
    assert histories.epoch_of("t", 2) == "b"
    histories.forget("t")
    assert histories.epoch_of("t", 2) is UNKNOWN


def test_a_version_keeps_the_epoch_it_was_handed_out_in() -> None:
    histories = Histories("x://h:1")
    histories.handed("t", Head(4, "a"))
    histories.check("t", 0, Head(1, "b"))  # another call saw the new history
    assert histories.epoch_of("t", 4) == "a" and histories.epoch_of("t", 9) == "b"
    with pytest.raises(varsync.TableResetError, match="epoch a -> b"):
        histories.check("t", 4, Head(4, "b"))  # the same number, another history
    assert Histories.continues(Head(4, "a"), Head(5, "a"))
    assert not Histories.continues(Head(4, "a"), Head(5, "b"))
    assert not Histories.continues(Head(4, "a"), Head(3, "a"))


def test_the_container_reports_a_version_below_the_held_one_with_the_same_message() -> None:
    with varsync.connect("memory://core-machinery-reset") as store:
        store.create_table("variables", {"w": np.zeros(2, np.float32)})
        store.push({"w": np.ones(2, np.float32)})
        with pytest.raises(varsync.TableResetError, match="started a new history") as err:
            store.pull_if_newer(5)
        assert "is at version 1" in str(err.value)


# -- the wait loop ---------------------------------------------------------------------

import math  # noqa: E402
import time  # noqa: E402

from varsync._waiting import wait_for_change  # noqa: E402


class _Scripted(vb.Backend):
    """A backend whose heads come from a script, recording the deadlines it was given."""

    def __init__(self, versions: List[int], epoch: Any = "e") -> None:
        super().__init__("scripted://x", timeout=5.0, namespace="")
        self.versions = versions
        self.epoch = epoch
        self.looks: List[float] = []
        self.blocks: List[float] = []

    def create_table(self, name: str, signature: str, specs: Sequence[vb.Spec]) -> str:
        return signature

    def signature(self, name: str) -> Optional[str]:
        return None

    def tables(self) -> List[str]:
        return []

    def head(self, name: str, deadline: float) -> vb.Head:
        self.looks.append(deadline)
        version = self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]
        return vb.Head(version, self.epoch)

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[vb.Spec],
              deadline: float) -> vb.Head:
        raise NotImplementedError

    def read(self, name: str, newer_than: int, deadline: float,
             specs: Sequence[vb.Spec]) -> vb.Read:
        return vb.Read(self.head(name, deadline), None)


class _Blocking(_Scripted, vb.SupportsBlockingWait):
    def block(self, name: str, newer_than: int, deadline: float) -> None:
        self.blocks.append(deadline - time.monotonic())


def _wait(backend: vb.Backend, held: int, timeout: float, epoch: Any = UNKNOWN) -> int:
    deadline = time.monotonic() + timeout
    return wait_for_change(backend, "t", held, epoch, deadline, deadline, timeout).version


def test_a_polling_backend_is_looked_at_with_growing_intervals(monkeypatch: Any) -> None:
    sleeps: List[float] = []
    monkeypatch.setattr("varsync._waiting.time.sleep", sleeps.append)
    backend = _Scripted([3] * 8 + [4])
    assert _wait(backend, 3, 10.0) == 4
    assert sleeps[0] == vb.POLL_START and sleeps[1] == 2 * sleeps[0]
    assert sleeps == sorted(sleeps) and max(sleeps) <= vb.POLL_MAX


def test_a_blocking_backend_is_asked_to_block_for_the_time_left_in_slices() -> None:
    backend = _Blocking([3, 3, 4])
    assert _wait(backend, 3, 60.0) == 4
    assert len(backend.blocks) == 2
    assert all(vb.BLOCK_SLICE - 0.5 < s <= vb.BLOCK_SLICE for s in backend.blocks)
    backend = _Blocking([3, 4])
    _wait(backend, 3, 1.0)
    assert 0.5 < backend.blocks[0] <= 1.0


def test_a_wait_returns_a_version_below_the_held_one_at_once() -> None:
    backend = _Blocking([0])
    assert _wait(backend, 3, 10.0) == 0 and backend.blocks == []


def test_a_wait_returns_a_new_epoch_at_the_held_number_at_once() -> None:
    backend = _Blocking([3], epoch="new")
    assert _wait(backend, 3, 10.0, epoch="old") == 3 and backend.blocks == []


def test_a_wait_never_gives_up_before_its_timeout() -> None:
    backend = _Scripted([3])
    started = time.monotonic()
    with pytest.raises(varsync.PullTimeoutError, match="stayed at version 3"):
        _wait(backend, 3, 0.2)
    assert time.monotonic() - started >= 0.2


def test_a_wait_with_timeout_zero_looks_once_within_the_containers_timeout() -> None:
    with varsync.connect("memory://core-machinery-zero", timeout=7) as store:
        store.create_table("variables", {"w": np.zeros(2, np.float32)})
        store.push({"w": np.ones(2, np.float32)})
        looks: List[float] = []
        head = store.backend.head
        store.backend.head = lambda name, deadline: looks.append(deadline) or head(name, deadline)  # type: ignore[method-assign]
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0)
        assert len(looks) == 1 and 6 < looks[0] - time.monotonic() <= 7
