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
    assert vb.parse_int(text, "keep", 0, 10) == value


@pytest.mark.parametrize("bad", [True, "3.5", 3.5, "many", None, "11", -1])
def test_bad_ints_are_refused_with_their_range(bad) -> None:
    with pytest.raises(varsync.ConfigurationError, match="keep="):
        vb.parse_int(bad, "keep", 0, 10)


@pytest.mark.parametrize(
    "text, value", [("true", True), ("ON", True), ("0", False), (False, False)]
)
def test_bools_from_text_or_values(text, value) -> None:
    assert vb.parse_bool(text, "tls") is value


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


# -- histories -----------------------------------------------------------------------


def test_the_first_epoch_is_adopted_and_the_same_one_changes_nothing() -> None:
    histories = vb.Histories()
    assert histories.check("t", "a", 5, where="x://h:1") is False
    assert histories.trusted("t") == "a"
    assert histories.check("t", "a", 5, where="x://h:1") is False


def test_a_new_epoch_is_a_reset_for_a_holder_and_adopted_by_a_fresh_reader() -> None:
    histories = vb.Histories()
    histories.check("t", "a", 0, where="x://h:1")
    with pytest.raises(varsync.TableResetError, match="since you read version 7") as err:
        histories.check("t", "b", 7, where="x://h:1", current=2)
    assert "epoch a -> b" in str(err.value) and "is at version 2" in str(err.value)
    assert histories.trusted("t") == "a"  # every holder of an old version hears of it
    assert histories.check("t", "b", 0, where="x://h:1") is True
    assert histories.trusted("t") == "b"
    histories.forget("t")
    assert histories.trusted("t") is None


def test_the_container_reports_a_version_below_the_held_one_with_the_same_message() -> None:
    with varsync.connect("memory://core-machinery-reset") as store:
        store.create_table("variables", {"w": np.zeros(2, np.float32)})
        store.push({"w": np.ones(2, np.float32)})
        with pytest.raises(varsync.TableResetError, match="started a new history") as err:
            store.pull_if_newer(5)
        assert "is at version 1" in str(err.value)


# -- the wait loop ---------------------------------------------------------------------


class _Scripted(vb.Backend):
    """A backend whose versions come from a script, recording how it was asked to block."""

    def __init__(self, versions: List[int], blocking: bool) -> None:
        super().__init__("scripted://x", timeout=5.0, namespace="")
        self.versions = versions
        self.blocks: List[float] = []
        self.supports_blocking_wait = blocking  # type: ignore[misc]

    def create_table(self, name: str, signature: str, specs: Sequence[vb.Spec]) -> str:
        return signature

    def signature(self, name: str) -> Optional[str]:
        return None

    def tables(self) -> List[str]:
        return []

    def version(self, name: str) -> int:
        return self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[vb.Spec]) -> int:
        raise NotImplementedError

    def read(self, name: str, newer_than: int, timeout: Optional[float],
             specs: Sequence[vb.Spec]) -> vb.Snapshot:
        return self.version(name), None

    def block(self, name: str, newer_than: int, seconds: float) -> None:
        self.blocks.append(seconds)


def test_a_polling_backend_is_asked_to_sleep_for_growing_intervals() -> None:
    backend = _Scripted([3] * 8 + [4], blocking=False)
    assert backend.wait("t", 3, 10.0) == 4
    assert backend.blocks[0] == vb.POLL_START
    assert backend.blocks == sorted(backend.blocks) and max(backend.blocks) <= vb.POLL_MAX
    assert backend.blocks[1] == 2 * backend.blocks[0]


def test_a_blocking_backend_is_asked_to_block_for_the_time_left_in_slices() -> None:
    backend = _Scripted([3, 3, 4], blocking=True)
    assert backend.wait("t", 3, 60.0) == 4
    assert len(backend.blocks) == 2 and all(s == vb.BLOCK_SLICE for s in backend.blocks)
    backend = _Scripted([3, 4], blocking=True)
    backend.wait("t", 3, 1.0)
    assert 0.9 < backend.blocks[0] <= 1.0


def test_a_wait_returns_a_version_below_the_held_one_at_once() -> None:
    backend = _Scripted([0], blocking=True)
    assert backend.wait("t", 3, 10.0) == 0 and backend.blocks == []


def test_a_wait_never_gives_up_before_its_timeout() -> None:
    backend = _Scripted([3], blocking=False)
    backend.block = lambda name, newer_than, seconds: threading.Event().wait(seconds)  # type: ignore[method-assign, assignment]
    started = __import__("time").monotonic()
    with pytest.raises(varsync.PullTimeoutError, match="stayed at version 3"):
        backend.wait("t", 3, 0.2)
    assert __import__("time").monotonic() - started >= 0.2


# -- read, with or without specs ----------------------------------------------------------


class _OldRead(_Scripted):
    """A backend of the first protocol: ``read`` without ``specs``."""

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> vb.Snapshot:  # type: ignore[override]
        self.got: Tuple[Any, ...] = (name, newer_than, timeout)
        return 1, [np.zeros(2)]


class _NewRead(_Scripted):
    def read(self, name: str, newer_than: int, timeout: Optional[float],
             specs: Sequence[vb.Spec]) -> vb.Snapshot:
        self.got = (name, newer_than, timeout, specs)
        return 1, [np.zeros(2)]


def test_read_gets_the_specs_where_it_takes_them() -> None:
    specs = [vb.Spec((2,), "float64")]
    new = _NewRead([0], blocking=False)
    vb.read_snapshot(new, "t", 0, 1.0, specs)
    assert new.got == ("t", 0, 1.0, specs)
    old = _OldRead([0], blocking=False)
    vb.read_snapshot(old, "t", 0, 1.0, specs)
    assert old.got == ("t", 0, 1.0)


class _Held(_Scripted):
    def version_within(self, name: str, timeout: Optional[float], held: int = 0) -> int:
        self.looks = getattr(self, "looks", []) + [(timeout, held)]
        return self.version(name)


class _OldLook(_Scripted):
    """A ``version_within`` from before ``held`` was passed."""

    def version_within(self, name: str, timeout: Optional[float]) -> int:  # type: ignore[override]
        self.looks = getattr(self, "looks", []) + [timeout]
        return self.version(name)


def test_the_wait_loop_tells_each_look_the_version_held_where_it_takes_it() -> None:
    backend = _Held([3, 4], blocking=True)
    assert backend.wait("t", 3, 10.0) == 4
    assert [held for _, held in backend.looks] == [3, 3]
    old = _OldLook([3, 4], blocking=True)
    assert old.wait("t", 3, 10.0) == 4 and len(old.looks) == 2


def test_a_wait_with_timeout_zero_looks_once_within_the_backends_own_timeout() -> None:
    backend = _Held([3], blocking=True)
    with pytest.raises(varsync.PullTimeoutError):
        backend.wait("t", 3, 0)
    assert backend.looks == [(None, 3)] and backend.blocks == []
