"""The redis backend under faults, against real redis-server processes: a publish whose
answer is lost, calls interrupted by Ctrl-C at random moments, a paused server under
per-call timeouts, ``timeout=0``, a server back on an older RDB file with a new writer,
a table created again with another signature, and text that cannot go to a server."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

import varsync
from varsync.testing.faults import open_fds, settled_fds
from varsync.backend import check_consistent, filled
from varsync.testing._base import CONSISTENCY, SMALL
from fixtures.redis import ReplyCutter, command_calls, table_head

redis = pytest.importorskip("redis")
from varsync._backends.redis.protocol import PUBLISH as _PUBLISH_SCRIPT  # noqa: E402


@pytest.fixture
def server(redis_servers: Any) -> Any:
    return redis_servers()


def chunk_keys(server: Any) -> List[str]:
    with server.client() as admin:
        return sorted(k.decode() for k in admin.scan_iter(match="varsync::variables:d:*"))


def clients(server: Any) -> int:
    """Connections the server holds, besides the one asking."""
    with server.client() as admin:
        return len(admin.client_list()) - 1




def settles(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (the server notices closed
    connections in its own time)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling the server for a condition, bounded above
    return True


# -- a publish whose answer is lost (item 1) ------------------------------------------------


def test_a_push_whose_publish_answer_is_lost_keeps_what_the_server_published(
    server: Any,
) -> None:
    with ReplyCutter(server.port) as cutter, varsync.connect(server.url) as reader:
        # One chunk: the publish script goes out in the same write as its end, so no
        # chunk's reply comes back before the script has reached the server (with many
        # chunks the cutter could cut an earlier reply while still forwarding the script).
        via = f"redis://127.0.0.1:{cutter.port}/0"
        with varsync.connect(via, timeout=10) as writer:
            writer.create_table("variables", CONSISTENCY)
            assert writer.push(filled(CONSISTENCY, 1)) == 1
            cutter.cut_reply_to(_PUBLISH_SCRIPT.sha.encode())
            with pytest.raises(varsync.BackendConnectionError, match="may have published"):
                writer.push(filled(CONSISTENCY, 2))
            assert cutter.cut == 1
            # The server ran the script: version 2 is published, whole and readable.
            assert reader.version() == 2
            assert check_consistent(reader.pull()) == 2
            head = table_head(server)
            with server.client() as admin:
                current = [k for k in chunk_keys(server) if f":{head['data']}:" in k]
                assert current and all(admin.pttl(k) == -1 for k in current)
            assert writer.push(filled(CONSISTENCY, 3)) == 3  # the writer carries on
        assert check_consistent(reader.pull()) == 3


def test_a_push_that_fails_before_its_publish_deletes_its_own_chunks(server: Any) -> None:
    with ReplyCutter(server.port) as cutter:
        via = f"redis://127.0.0.1:{cutter.port}/0?chunk_size=4096"
        with varsync.connect(via, timeout=10) as writer:
            writer.create_table("variables", CONSISTENCY)
            writer.push(filled(CONSISTENCY, 1))
            before = chunk_keys(server)
            cutter.cut_reply_to(b"$3\r\nSET\r\n")  # a chunk write's answer is lost
            with pytest.raises(varsync.BackendConnectionError):
                writer.push(filled(CONSISTENCY, 2))
            assert cutter.cut == 1
            assert writer.version() == 1
            assert check_consistent(writer.pull()) == 1
            assert chunk_keys(server) == before  # nothing of the failed push is left


# -- interrupts (items 9 and 1) --------------------------------------------------------------


def _interrupted(calls: Dict[str, Callable[[], Any]], rounds: int, seed: int) -> Dict[str, Any]:
    """Each round: one of ``calls``, with a SIGINT sent to this (main) thread at a random
    moment within about that call's usual duration. Returns what happened."""
    rng = random.Random(seed)
    typical = {}
    for name, call in calls.items():  # how long each call usually takes
        started = time.monotonic()
        for _ in range(3):
            with contextlib.suppress(varsync.PullTimeoutError):
                call()
        typical[name] = (time.monotonic() - started) / 3
    main = threading.main_thread().ident
    assert main == threading.get_ident(), "interrupts go to the main thread"
    outcome: Dict[str, Any] = {"interrupted": 0, "returned": [], "raised": []}
    for _ in range(rounds):
        name = rng.choice(sorted(calls))
        timer = threading.Timer(
            rng.uniform(0, 1.5 * typical[name]), signal.pthread_kill, (main, signal.SIGINT)
        )
        try:
            timer.start()
            try:
                outcome["returned"].append((name, calls[name]()))
            except varsync.PullTimeoutError:
                pass  # a wait that timed out: its normal end
            except varsync.VarsyncError as exc:
                outcome["raised"].append((name, exc))
            finally:
                timer.join()  # the signal is sent by the time this returns
        except KeyboardInterrupt:
            outcome["interrupted"] += 1
    return outcome


def test_interrupted_calls_leave_the_pool_the_connections_and_the_table_intact(
    server: Any,
) -> None:
    url = server.url + "?chunk_size=4096"
    with varsync.connect(url, timeout=10) as store:
        store.create_table("variables", CONSISTENCY)
        pushed = [store.push(filled(CONSISTENCY, 1))]
        number = [1]

        def push() -> int:
            number[0] += 1
            return store.push(filled(CONSISTENCY, number[0]))

        calls = {
            "push": push,
            "pull": lambda: check_consistent(store.pull()),
            "pull_if_newer": lambda: store.pull_if_newer(0),
            "wait_for": lambda: store.wait_for(store.version(), timeout=0.02),
        }
        store.pull()
        fds, connections = open_fds(), clients(server)
        outcome = _interrupted(calls, rounds=300, seed=11)

        assert outcome["raised"] == []  # no pool exhaustion, no raw or connection errors
        assert outcome["interrupted"] >= 100, outcome["interrupted"]
        versions = [v for name, v in outcome["returned"] if name == "push"]
        assert len(set(versions)) == len(versions) and versions == sorted(versions)
        assert not set(versions) & set(pushed)
        # The table holds one whole version, the last returned or a later one (a push
        # interrupted after its publish was sent may have been published).
        version, values = store.pull_if_newer(0)
        assert version >= max(versions, default=1)
        assert 1 <= check_consistent(values) <= number[0]
        assert push() == store.version()
        fds_after = settled_fds(fds + 3)  # collects dropped connections first
        assert fds_after <= fds + 3, (fds, fds_after)
        assert settles(lambda: clients(server) <= connections + 2), (connections, clients(server))


# -- a paused server under per-call timeouts (item 10) ------------------------------------------


def test_a_paused_server_bounds_each_call_by_its_own_timeout(server: Any) -> None:
    with varsync.connect(server.url, timeout=4) as store:
        store.create_table("variables", SMALL)
        version = store.push(filled(SMALL, 1))
        store.pull()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            for call in (
                lambda: store.pull(timeout=1),
                lambda: store.pull_if_newer(0, timeout=1),
                lambda: store.wait_for(version, timeout=1),
            ):
                started = time.monotonic()
                with pytest.raises(varsync.PullTimeoutError, match="timeout"):
                    call()
                assert time.monotonic() - started < 2.5
            started = time.monotonic()  # no timeout of its own: the container's bounds it
            with pytest.raises(varsync.BackendConnectionError):
                store.version()
            assert time.monotonic() - started < 4 + 2
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert check_consistent(store.pull(timeout=10)) == 1
        assert store.push(filled(SMALL, 2)) == 2


# -- timeout=0 (item 12) ----------------------------------------------------------------------


def test_timeout_zero_returns_what_is_there_and_never_blocks(server: Any) -> None:
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", SMALL)
        version = store.push(filled(SMALL, 1))
        assert check_consistent(store.pull(timeout=0)) == 1
        assert store.pull_if_newer(0, timeout=0)[0] == version
        assert store.wait_for(0, timeout=0) == version
        xreads = command_calls(admin).get("xread", 0)
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(version, timeout=0)
        assert time.monotonic() - started < 1
        store.backend.block("variables", version, time.monotonic())  # its deadline is past
        assert command_calls(admin).get("xread", 0) == xreads  # looked once, never blocked


# -- an older RDB file and a new writer (item 3) ------------------------------------------------


def test_a_push_in_doubt_stays_vouched_for_when_the_next_one_is_in_doubt_too(
    redis_servers: Any,
) -> None:
    """Push P publishes, but its answer is lost (in doubt); the server restarts (its RDB
    holds P); the next push Q, retried across the restart, is in doubt itself when it
    publishes. The writer must still vouch for P: the head after the restart is P's,
    and if only Q's token were remembered, Q would start a new history and every reader
    would be reset for nothing (seen once in a full run of test_faults.py)."""
    server = redis_servers(persistent=True)  # SIGTERM saves the RDB
    with varsync.connect(server.url, timeout=5) as reader:
        with varsync.connect(server.url, timeout=5) as learner:
            learner.create_table("variables", SMALL)
            learner.push(filled(SMALL, 1))
            table = learner.backend.publisher.written("variables")
            first = table.token
            assert learner.push(filled(SMALL, 2)) == 2  # P: published, and then, as if
            p_token = table.token  # its answer had been lost, the writer's state says:
            table.published, table.token, table.in_doubt = 1, first, (p_token,)
            assert reader.pull_if_newer(0)[0] == 2
            server.stop()  # SIGTERM: the RDB holds version 2
            server.start()
            table.doubt("f" * 16)  # Q's token, in doubt before its publish is answered
            assert learner.push(filled(SMALL, 3)) == 3
        newer = reader.pull_if_newer(2)  # the same history: no reset
        assert newer is not None and newer[0] == 3 and check_consistent(newer[1]) == 3


def test_a_server_back_on_an_older_rdb_file_with_a_new_writer_never_reuses_a_version(
    server: Any,
) -> None:
    dump, older = server.directory / "dump.rdb", server.directory / "older.rdb"
    with varsync.connect(server.url, timeout=5) as reader:
        with varsync.connect(server.url, timeout=5) as learner:
            learner.create_table("variables", SMALL)
            for number in (1, 2):
                learner.push(filled(SMALL, number))
            with server.client() as admin:
                admin.save()  # the snapshot holds version 2
            shutil.copyfile(dump, older)
            for number in (3, 4, 5):
                learner.push(filled(SMALL, number))
            held, values = reader.pull_if_newer(0)
            assert (held, check_consistent(values)) == (5, 5)
            server.kill()  # a crash: the learner dies with it
        shutil.copyfile(older, dump)
        server.start()

        with varsync.connect(server.url, timeout=5) as learner:  # a new learner
            assert [learner.push(filled(SMALL, n)) for n in (13, 14, 15)] == [3, 4, 5]
        # The server's version 5 is another value than the 5 the reader holds: refused.
        with pytest.raises(varsync.TableResetError, match="new history"):
            reader.pull_if_newer(held)
        with pytest.raises(varsync.TableResetError):
            reader.wait_for(held, timeout=1)
        assert check_consistent(reader.pull()) == 15  # pull() resynchronises
        assert reader.pull_if_newer(5) is None


def test_a_clean_restart_is_no_reset_for_the_writer_that_published_last(server: Any) -> None:
    with varsync.connect(server.url, timeout=5) as reader, varsync.connect(
        server.url, timeout=5
    ) as learner:
        learner.create_table("variables", SMALL)
        for number in (1, 2):
            learner.push(filled(SMALL, number))
        held = reader.pull_if_newer(0)[0]
        epoch = table_head(server)["epoch"]
        with server.client() as admin:
            admin.save()  # everything, as a SIGTERM with persistence saves it
        server.restart()
        assert learner.push(filled(SMALL, 3)) == 3
        assert table_head(server)["epoch"] == epoch  # the same history
        version, values = reader.pull_if_newer(held)
        assert (version, check_consistent(values)) == (3, 3)


# -- a table created again with another signature (item 13) ----------------------------------


def _drop_table(server: Any) -> None:
    with server.client() as admin:
        admin.delete("varsync::variables:head", "varsync::variables:events", "varsync::tables")


def test_pull_after_the_table_is_created_again(server: Any) -> None:
    other = {"w": varsync.Spec((5,), "int32")}
    with varsync.connect(server.url, timeout=5) as reader:
        with varsync.connect(server.url) as learner:
            learner.create_table("variables", SMALL)
            learner.push(filled(SMALL, 1))
        assert check_consistent(reader.pull()) == 1

        _drop_table(server)  # the same signature again: pull() follows it
        with varsync.connect(server.url) as learner:
            learner.create_table("variables", SMALL)
            learner.push(filled(SMALL, 7))
        assert check_consistent(reader.pull()) == 7

        _drop_table(server)  # another signature: this container cannot decode it
        with varsync.connect(server.url) as learner:
            learner.create_table("variables", other)
            learner.push({"w": np.arange(5, dtype=np.int32)})
        with pytest.raises(varsync.TableResetError) as caught:
            reader.pull()
        message = str(caught.value)
        for words in ("'variables'", "created again with another signature",
                      "Connect again", "create the table again"):
            assert words in message, message


# -- text that cannot go to a server (item 15) --------------------------------------------------


@pytest.mark.parametrize(
    "options, named",
    [({"prefix": "var\udcffsync"}, "prefix"), ({"password": "pw\udc80"}, "password"),
     ({"username": "u\ud800"}, "username")],
)
def test_text_that_is_not_utf8_is_a_configuration_error(
    server: Any, options: Dict[str, str], named: str
) -> None:
    with pytest.raises(varsync.ConfigurationError, match=named) as caught:
        varsync.connect(server.url, **options)
    assert "\udc80" not in str(caught.value)  # a password is never shown


def test_a_host_name_that_cannot_be_resolved_as_text_is_a_configuration_error() -> None:
    with pytest.raises(varsync.ConfigurationError, match="host"):
        varsync.connect(f"redis://{'a' * 70}.example:6379/0", timeout=1)
