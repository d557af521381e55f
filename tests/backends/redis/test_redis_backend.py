"""The redis backend: the conformance suite against a real redis-server, exactly as a third
party would run it, plus what is particular to Redis: the stored signature, values over
512 MB, maxmemory, a server that is down, hung, password-protected or restricted by ACL,
a server that lost its data, corrupt chunks, and waits woken by the server."""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
import tracemalloc
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest

import varsync
from varsync.testing import ConformanceTests
from varsync.backend import assert_bit_equal, check_consistent, filled
from varsync.testing._base import SMALL
from fixtures.redis import command_calls, dead_url, table_head

redis = pytest.importorskip("redis")

MB = 1 << 20


class TestRedisConformance(ConformanceTests):
    """The suite against the session's shared server (its URL's netloc is the server's
    own host:port, which the suite's proxy tests put a proxy in front of)."""

    @pytest.fixture
    def url(self, redis_namespace: Any) -> str:
        return redis_namespace()

    @pytest.fixture
    def server_pid(self, shared_redis_server: Any) -> Optional[int]:
        return None if shared_redis_server is None else shared_redis_server.pid

    @pytest.fixture
    def new_history(self, redis_url: str) -> Callable[[str, str], None]:
        """The table's keys deleted, as a server that lost its data; the suite then
        creates it again (a new epoch)."""

        def restart(url: str, table: str) -> None:
            with varsync.connect(url) as container:
                pattern = container.backend.keys(table).head[: -len("head")] + "*"
            with redis.Redis.from_url(redis_url.split("?")[0]) as admin:
                for key in list(admin.scan_iter(match=pattern, count=1000)):
                    admin.delete(key)

        return restart

    @pytest.fixture
    def leak_counts(self, redis_url: str) -> Callable[[], Dict[str, int]]:
        def counts() -> Dict[str, int]:  # the server's clients, this one included
            with redis.Redis.from_url(redis_url.split("?")[0]) as admin:
                return {"server connections": admin.info("clients")["connected_clients"]}

        return counts


class TestRedisConformanceInSmallChunks(TestRedisConformance):
    """The suite again with 4 KiB chunks, so most values span many chunks and most
    chunks hold pieces of several arrays; keep=0 retires versions as soon as possible."""

    #: The 10,000-version retention test runs in full above; here, with tiny chunks, 2,000.
    RETAINED_VERSIONS = 2_000

    @pytest.fixture
    def url(self, redis_namespace: Any) -> str:
        return redis_namespace(chunk_size=4096, keep=0)


@pytest.fixture
def server(redis_servers: Any) -> Any:
    """A server of this test's own."""
    return redis_servers()


def keys_of(server: Any, pattern: str = "*") -> List[str]:
    with server.client() as client:
        return sorted(k.decode() for k in client.scan_iter(match=pattern, count=1000))


# -- the signature ---------------------------------------------------------------------------


def test_the_signature_is_stored_with_the_table_as_the_cores_json(server: Any) -> None:
    url = server.url + "?namespace=sig"
    with varsync.connect(url) as store:
        store.create_table("variables", SMALL)
    with server.client() as client:
        head = client.hgetall("varsync:sig:variables:head")
    document = json.loads(head[b"sig"])
    assert document["format"] == "varsync.signature"
    assert head[b"version"] == b"0" and head[b"fmt"] == b"1"
    with varsync.connect(url) as reader:  # connecting to an existing table reads it
        assert varsync.flatten(reader.signature()) == varsync.flatten(SMALL)


def test_create_table_with_another_signature_never_overwrites(server: Any) -> None:
    url = server.url + "?namespace=race"
    signatures = [{"x": varsync.Spec((n,), "float32")} for n in range(1, 9)]
    outcomes: List[Any] = [None] * len(signatures)
    start = threading.Barrier(len(signatures))

    def create(index: int) -> None:
        with varsync.connect(url) as store:
            start.wait(10)
            try:
                outcomes[index] = store.create_table("t", signatures[index])
            except varsync.TableExistsError as exc:
                outcomes[index] = exc

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(signatures))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [i for i, o in enumerate(outcomes) if not isinstance(o, Exception)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, varsync.TableExistsError) for i, o in enumerate(outcomes) if i != winners[0])
    with varsync.connect(url) as store:
        assert varsync.flatten(store.signature("t")) == varsync.flatten(signatures[winners[0]])


# -- large values, zero copy -------------------------------------------------------------------


def test_an_array_larger_than_redis_512_mb_value_limit_round_trips(server: Any) -> None:
    count = 600 * MB // 8  # 600 MiB of uint64 in one array
    with varsync.connect(server.url, timeout=120) as store:
        store.create_table("big", {"w": varsync.Spec((count,), "uint64")})
        values = np.arange(count, dtype=np.uint64)
        assert store.push({"w": values}, table="big") == 1
        del values
        pulled = store.pull("big")["w"]
        step = 8 * MB
        for start in range(0, count, step):  # compare in slices: no 600 MB temporaries
            expected = np.arange(start, min(count, start + step), dtype=np.uint64)
            assert np.array_equal(pulled[start : start + step], expected), f"differs after {start}"
        del pulled
        gc.collect()
    with server.client() as client:
        client.flushall()


def test_push_sends_array_memory_without_copying_it(server: Any) -> None:
    values = {"w": np.random.default_rng(1).standard_normal(16 * MB // 4).astype(np.float32)}
    with varsync.connect(server.url) as store:
        store.create_table("variables", values)
        store.push(values)  # connections are made, scripts cached
        tracemalloc.start()
        try:
            store.push(values)
            _, push_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            pulled = store.pull()
            _, pull_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert push_peak < 2 * MB, f"a 16 MiB push allocated {push_peak} bytes"
    assert pull_peak < 16 * MB + 2 * MB, f"a 16 MiB pull allocated {pull_peak} bytes"
    assert_bit_equal(pulled, values)


def test_a_pull_whose_version_is_retired_mid_read_starts_again_from_the_head(
    redis_namespace: Any, monkeypatch: Any
) -> None:
    url = redis_namespace(chunk_size=4096, keep=0)
    # Three chunks: a version of one small chunk comes with its head (the peek script),
    # read in the same atomic step, so no push can retire it between the two.
    three_chunks = {"w": varsync.Spec((3000,), "float32")}
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", three_chunks)
        writer.push(filled(three_chunks, 1))
        fetch = reader.backend.reader.fetch
        whole = fetch.whole
        retire = [2, 3]  # pushed between the reader's head read and its chunk reads

        def fetch_after_newer_pushes(*args: Any) -> Any:
            while retire:
                writer.push(filled(three_chunks, retire.pop(0)))
            return whole(*args)

        monkeypatch.setattr(fetch, "whole", fetch_after_newer_pushes)
        version, values = reader.pull_if_newer(0)
        assert (version, check_consistent(values)) == (3, 3)
        assert reader.table_info().details["pulls_restarted"] == 1


# -- change detection and waiting --------------------------------------------------------------


def test_pull_if_newer_when_nothing_changed_is_one_small_request(server: Any) -> None:
    values = {"w": np.ones(8 * MB // 4, np.float32)}
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", values)
        version = store.push(values)
        assert store.pull_if_newer(version) is None  # the server has the peek script now
        before = command_calls(admin)
        for _ in range(10):
            assert store.pull_if_newer(version) is None
            assert store.version() == version
        after = command_calls(admin)
    changed = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    changed.pop("info", None)
    # Each pull_if_newer: the peek script, whose one HMGET finds nothing newer (no GET);
    # each version: one HMGET.
    assert changed == {"evalsha": 10, "hmget": 20}


def test_wait_for_blocks_on_the_server_and_wakes_on_a_push(server: Any) -> None:
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
        before = command_calls(admin)
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=2.5)
        idle = {k: command_calls(admin)[k] - before.get(k, 0) for k in ("xread", "hmget")}
        assert 1 <= idle["xread"] <= 4 and idle["hmget"] <= 5, idle  # blocked, not polling

        result: Dict[str, Any] = {}
        blocked = threading.Event()

        def wait() -> None:
            blocked.set()
            result["version"] = store.wait_for(1, timeout=30)

        thread = threading.Thread(target=wait)
        thread.start()
        blocked.wait(5)
        with varsync.connect(server.url) as writer:
            writer.push(filled(SMALL, 2))
        thread.join(10)
        assert not thread.is_alive() and result == {"version": 2}


# -- failures ----------------------------------------------------------------------------------


def test_maxmemory_makes_the_push_fail_and_keeps_the_previous_version(redis_servers: Any) -> None:
    server = redis_servers(config=["--maxmemory", "48mb", "--maxmemory-policy", "noeviction"])
    small = {"w": varsync.Spec((1 * MB,), "uint8")}
    with varsync.connect(server.url, chunk_size=MB) as store:
        store.create_table("variables", small)
        store.push({"w": np.full(MB, 1, np.uint8)})
        store.create_table("huge", {"w": varsync.Spec((96 * MB,), "uint8")})
        with pytest.raises(varsync.ItemTooLargeError, match="maxmemory"):
            store.push({"w": np.full(96 * MB, 2, np.uint8)}, table="huge")
        assert store.version("huge") == 0
        assert store.version() == 1
        assert_bit_equal(store.pull(), {"w": np.full(MB, 1, np.uint8)})
        assert store.push({"w": np.full(MB, 3, np.uint8)}) == 2  # the memory came back
        assert_bit_equal(store.pull(), {"w": np.full(MB, 3, np.uint8)})
    chunks = keys_of(server, "varsync::huge:d:*")
    assert chunks == [], f"the failed push left {len(chunks)} chunks behind"


def test_a_refused_chunk_whose_publish_script_followed_it_publishes_nothing(
    redis_servers: Any,
) -> None:
    # One chunk, so the publish script is sent right behind it, before its refusal is
    # read. The second push needs 60 MB: the version stored, the chunk, and the query
    # buffer Redis makes as large as the chunk it read (no spare yet: nothing retired).
    server = redis_servers(config=["--maxmemory", "48mb", "--maxmemory-policy", "noeviction"])
    with varsync.connect(server.url, chunk_size=64 * MB, keep=0) as store:
        store.create_table("variables", {"w": varsync.Spec((20 * MB,), "uint8")})
        assert store.push({"w": np.full(20 * MB, 1, np.uint8)}) == 1
        with pytest.raises(varsync.ItemTooLargeError, match="maxmemory"):
            store.push({"w": np.full(20 * MB, 2, np.uint8)})
        assert store.version() == 1
        assert_bit_equal(store.pull(), {"w": np.full(20 * MB, 1, np.uint8)})
        current = table_head(server)["data"]
    assert [k.split(":")[4] for k in keys_of(server, "varsync::variables:d:*")] == [current]


def test_a_server_that_is_down_is_a_connection_error(server: Any) -> None:
    url = server.url
    server.stop()
    started = time.monotonic()
    with pytest.raises(varsync.BackendConnectionError) as caught:
        varsync.connect(url, timeout=3)
    assert time.monotonic() - started < 6  # bounded by the timeout, no retries for seconds
    assert "127.0.0.1" in str(caught.value)


def test_a_server_that_goes_down_is_a_connection_error_within_the_timeout(server: Any) -> None:
    store = varsync.connect(server.url, timeout=3)
    try:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
        server.stop()
        for call in (lambda: store.pull_if_newer(1), lambda: store.push(filled(SMALL, 2)),
                     lambda: store.wait_for(1, timeout=5), store.pull):
            started = time.monotonic()
            with pytest.raises(varsync.BackendConnectionError):
                call()
            assert time.monotonic() - started < 6
    finally:
        store.close()


def test_a_server_that_never_answers_is_a_connection_error_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(varsync.BackendConnectionError, match="[Tt]imeout|timed out"):
            varsync.connect(f"redis://127.0.0.1:{port}/0", timeout=1)
        assert time.monotonic() - started < 4


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_a_wrong_or_missing_password_is_an_authentication_error_at_once(
    redis_servers: Any, password: Any
) -> None:
    server = redis_servers(password="s3cret-pass")
    url = server.url.replace("redis://", f"redis://:{password}@") if password else server.url
    started = time.monotonic()
    with pytest.raises(varsync.AuthenticationError) as caught:
        varsync.connect(url, timeout=10)
    assert time.monotonic() - started < 3  # refused at once, not after retries
    assert "wrong-password" not in str(caught.value) and "s3cret" not in str(caught.value)
    with varsync.connect(server.url.replace("redis://", "redis://:s3cret-pass@")) as store:
        assert "s3cret" not in repr(store) and "s3cret" not in str(store.backend.describe_options())


# The command sets docs/redis.md gives for a learner (writes) and for actors (read only).
WRITER_COMMANDS = (
    "+ping +hmget +hget +smembers +get +xread +set +setrange +strlen +rename +pexpire +unlink "
    "+eval +evalsha +hset +exists +del +sadd +persist +xadd +xrevrange +info"
)
READER_COMMANDS = "+ping +hmget +hget +smembers +get +xread"


def test_an_acl_user_limited_to_its_prefix_and_the_documented_commands_works(
    server: Any,
) -> None:
    with server.client() as admin:
        for user, commands in (("learner", WRITER_COMMANDS), ("actor", READER_COMMANDS)):
            admin.execute_command(
                "ACL", "SETUSER", user, "reset", "on", f">{user}-pw", "~varsync:team:*",
                *commands.split(),
            )
    url = server.url.replace("redis://", "redis://learner:learner-pw@")
    actor_url = server.url.replace("redis://", "redis://actor:actor-pw@")
    values = {"w": np.arange(5 * MB // 4, dtype=np.float32), "step": np.int64(3)}
    with varsync.connect(url, namespace="team", chunk_size=MB) as writer, varsync.connect(
        actor_url, namespace="team"
    ) as reader:
        writer.create_table("variables", values)
        for step in range(5):  # past keep: retired chunks are recycled, then deleted too
            writer.push(values)
        assert reader.wait_for(0, timeout=5) == 5
        assert_bit_equal(reader.pull(), values)
        assert reader.pull_if_newer(5) is None and reader.tables() == ["variables"]
        assert reader.table_info().version == 5
        with pytest.raises(varsync.AuthenticationError):  # actors cannot publish
            reader.push(values)
        assert writer.version() == 5
    with varsync.connect(url, namespace="other") as outside:
        with pytest.raises(varsync.AuthenticationError, match="ACL|permission"):
            outside.create_table("variables", values)


def test_checksums_are_zlibs_crc32_whichever_implementation_computes_them() -> None:
    import zlib

    from varsync._backends.redis.wire import checksum as _crc32

    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    views = [memoryview(data)[:1000], memoryview(data)[1000:]]
    assert _crc32(views) == zlib.crc32(data)


def test_tls_with_a_ca_certificate(redis_servers: Any) -> None:
    server = redis_servers(tls=True)
    url = f"{server.url}?ssl_ca_certs={server.tls['ca']}&chunk_size=65536"
    values = {"w": np.random.default_rng(2).standard_normal(300_000).astype(np.float32)}
    with varsync.connect(url) as store:
        store.create_table("variables", values)
        store.push(values)
        assert_bit_equal(store.pull(), values)
    with pytest.raises(varsync.BackendConnectionError):  # a certificate it cannot verify
        varsync.connect(server.url, timeout=3)
    unverified = f"{server.url}?ssl_cert_reqs=none&ssl_check_hostname=false"
    with varsync.connect(unverified) as store:  # encrypted, server not authenticated
        assert_bit_equal(store.pull(), values)


# -- a server that lost its data ----------------------------------------------------------------


def test_a_restart_without_persistence_never_lets_readers_accept_an_older_value(
    server: Any,
) -> None:
    with varsync.connect(server.url, timeout=5) as writer, varsync.connect(
        server.url, timeout=5
    ) as reader:
        writer.create_table("variables", SMALL)
        for number in (1, 2, 3):
            writer.push(filled(SMALL, number))
        held, values = reader.pull_if_newer(0)
        assert held == 3 and check_consistent(values) == 3
        server.restart()

        with pytest.raises(varsync.TableResetError):
            reader.pull_if_newer(held)
        with pytest.raises(varsync.TableResetError):
            reader.wait_for(held, timeout=5)
        assert reader.version() == 0
        # The writer carries on: the table comes back, under a new epoch.
        for number in (11, 12, 13, 14):
            writer.push(filled(SMALL, number))
        assert writer.version() == 4
        # Version 4 is above the 3 the reader holds, but of another history: refused.
        with pytest.raises(varsync.TableResetError, match="new history"):
            reader.pull_if_newer(held)
        with pytest.raises(varsync.TableResetError):
            reader.wait_for(held, timeout=5)
        assert check_consistent(reader.pull()) == 14  # pull() resynchronises
        assert reader.pull_if_newer(4) is None


def test_a_flushall_wakes_a_waiting_reader_with_a_reset_instead_of_hanging(server: Any) -> None:
    with varsync.connect(server.url) as store, server.client() as admin:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
        result: Dict[str, Any] = {}

        def wait() -> None:
            try:
                result["version"] = store.wait_for(1, timeout=30)
            except Exception as exc:
                result["error"] = exc

        thread = threading.Thread(target=wait)
        thread.start()
        admin.flushall()
        thread.join(10)
        assert not thread.is_alive(), "wait_for hung after the server lost its data"
        assert isinstance(result.get("error"), varsync.TableResetError), result


def test_a_server_back_on_an_older_snapshot_starts_a_new_history(server: Any) -> None:
    # No save points: the SAVE below is the only snapshot, and a restart loads it.
    with varsync.connect(server.url, timeout=5) as writer, varsync.connect(
        server.url, timeout=5
    ) as reader:
        writer.create_table("variables", SMALL)
        for number in (1, 2):
            writer.push(filled(SMALL, number))
        with server.client() as admin:
            admin.save()  # the snapshot holds version 2
        for number in (3, 4, 5):
            writer.push(filled(SMALL, number))
        assert reader.pull_if_newer(0)[0] == 5
        server.restart()  # back to version 2

        with pytest.raises(varsync.TableResetError):
            reader.pull_if_newer(5)
        stale_version, stale = reader.pull_if_newer(0)
        assert stale_version == 2 and check_consistent(stale) == 2
        # The writer, which published 5, notices and starts a new history past it.
        assert writer.push(filled(SMALL, 6)) == 6
        with pytest.raises(varsync.TableResetError):
            reader.pull_if_newer(stale_version)
        assert check_consistent(reader.pull()) == 6


def test_an_events_stream_ahead_of_the_head_is_started_again(server: Any) -> None:
    # A stream whose top entry is past the head's version (the two out of step) refuses
    # the push's entry: the publish script starts the stream again, and waits still wake.
    with varsync.connect(server.url, timeout=5) as writer, varsync.connect(
        server.url, timeout=5
    ) as reader:
        writer.create_table("variables", SMALL)
        assert writer.push(filled(SMALL, 1)) == 1
        events = "varsync::variables:events"
        with server.client() as admin:
            admin.xadd(events, {"v": "1000"}, id="1000-1")
            assert writer.push(filled(SMALL, 2)) == 2
            assert [entry_id for entry_id, _ in admin.xrange(events)] == [b"2-1"]
        done: Dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: done.update(v=reader.wait_for(2, timeout=20)))
        waiter.start()
        assert writer.push(filled(SMALL, 3)) == 3
        waiter.join(30)
        assert done == {"v": 3}
        assert check_consistent(reader.pull()) == 3


# -- corrupt or foreign data -------------------------------------------------------------------


@pytest.fixture
def pushed(server: Any) -> Any:
    """A table ``variables`` at version 1 (two chunks of 64 KiB) and the admin client."""
    url = server.url + "?namespace=c&chunk_size=65536"
    values = {"w": np.arange(30_000, dtype=np.float32)}
    store = varsync.connect(url)
    store.create_table("variables", values)
    store.push(values)
    admin = server.client()
    chunk = sorted(keys_of(server, "varsync:c:variables:d:*"))[0]
    yield store, admin, chunk
    store.close()
    admin.close()


def test_a_chunk_changed_in_place_fails_its_checksum(pushed: Any) -> None:
    store, admin, chunk = pushed
    admin.setrange(chunk, 1000, b"\x7f\x7f\x7f\x7f")
    with pytest.raises(varsync.CorruptDataError, match="checksum"):
        store.pull()


@pytest.mark.parametrize("size", ["short", "same-length", "empty"])
def test_a_chunk_replaced_by_foreign_bytes_is_corrupt_data(pushed: Any, size: str) -> None:
    store, admin, chunk = pushed
    length = {"short": 5, "same-length": admin.strlen(chunk), "empty": 0}[size]
    admin.set(chunk, b"x" * length)
    with pytest.raises(varsync.CorruptDataError):
        store.pull()


@pytest.mark.parametrize("change", ["in place", "short", "foreign"])
def test_a_small_version_read_with_its_head_is_checked_as_any_chunk(
    server: Any, change: str
) -> None:
    # One chunk of at most PEEK_BYTES comes back with the head (the peek script): the
    # same checks of its length, header and checksum as a chunk read on its own.
    with varsync.connect(server.url + "?namespace=p") as store, server.client() as admin:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
        assert check_consistent(store.pull()) == 1
        (chunk,) = keys_of(server, "varsync:p:variables:d:*")
        if change == "in place":
            admin.setrange(chunk, 30, b"\x7f\x7f\x7f\x7f")
        else:
            admin.set(chunk, b"x" * (5 if change == "short" else admin.strlen(chunk)))
        with pytest.raises(varsync.CorruptDataError, match="checksum" if change == "in place" else ""):
            store.pull()


def test_a_small_pull_is_one_round_trip(server: Any) -> None:
    with varsync.connect(server.url) as writer, varsync.connect(server.url) as reader, \
            server.client() as admin:
        writer.create_table("variables", SMALL)
        writer.push(filled(SMALL, 1))
        assert reader.pull_if_newer(0)[0] == 1  # the server has the peek script now
        writer.push(filled(SMALL, 2))
        before = command_calls(admin)
        version, values = reader.pull_if_newer(1)
        after = command_calls(admin)
    assert (version, check_consistent(values)) == (2, 2)
    ran = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # one request: the script, which reads the head and the version's one chunk
    assert {k: n for k, n in ran.items() if n and k != "info"} == {
        "evalsha": 1, "hmget": 1, "get": 1}


def test_a_small_push_is_answered_by_one_string_after_its_chunk(
    server: Any, monkeypatch: Any
) -> None:
    # A small push sends its chunk's SET and the publish script together. Redis 6 writes
    # a script's table reply with a write(2) of its own after the SET's +OK (a table's
    # length is deferred); one string goes out with the +OK.
    from varsync._backends.redis import wire

    answers: List[Any] = []
    read = wire.Wire.reply

    def reply(self: Any) -> Any:
        answers.append(read(self))
        return answers[-1]

    monkeypatch.setattr(wire.Wire, "reply", reply)
    with varsync.connect(server.url + "?namespace=s") as store:
        store.create_table("variables", SMALL)
        assert store.push(filled(SMALL, 1)) == 1  # the server has the publish script now
        answers.clear()
        assert store.push(filled(SMALL, 2)) == 2
        epoch = table_head(server, namespace="s")["epoch"]
        assert answers == [f"published 2 {epoch}".encode()]
        assert check_consistent(store.pull()) == 2


def test_a_chunk_deleted_under_the_current_version_is_corrupt_data_not_a_hang(pushed: Any) -> None:
    store, admin, chunk = pushed
    admin.delete(chunk)
    with pytest.raises(varsync.CorruptDataError, match="missing"):
        store.pull(timeout=5)


@pytest.mark.parametrize(
    "field, value",
    [("layout", "garbage"), ("layout", "1:2:3"), ("version", "-4"), ("fmt", "99"),
     ("sig", "{not json")],
)
def test_a_malformed_head_is_corrupt_data(server: Any, pushed: Any, field: str, value: str) -> None:
    _, admin, _ = pushed
    admin.hset("varsync:c:variables:head", field, value)
    with varsync.connect(server.url + "?namespace=c") as reader:
        with pytest.raises(varsync.CorruptDataError):
            reader.pull(timeout=5)


def test_foreign_keys_under_the_prefix_are_corrupt_data(server: Any) -> None:
    with server.client() as admin:
        admin.set("varsync:f:variables:head", "not a hash")
        admin.hset("varsync:f:other:head", "owner", "someone else")
    with varsync.connect(server.url + "?namespace=f") as store:
        for call in (
            lambda: store.pull("variables", timeout=1),
            lambda: store.create_table("variables", SMALL),
            lambda: store.create_table("other", SMALL),
        ):
            with pytest.raises(varsync.CorruptDataError, match="prefix"):
                call()


# -- options -------------------------------------------------------------------------------------


def test_namespaces_and_prefixes_isolate_tables(redis_namespace: Any) -> None:
    url = redis_namespace()
    namespace = url.split("namespace=")[1]
    with varsync.connect(url) as a, varsync.connect(url, prefix="other") as b, varsync.connect(
        url, namespace=namespace + "x"
    ) as c:
        a.create_table("variables", SMALL)
        assert b.tables() == [] and c.tables() == []
        assert a.tables() == ["variables"]


def test_table_names_with_separators_stay_apart(redis_namespace: Any) -> None:
    with varsync.connect(redis_namespace()) as store:
        names = ["a:b", "a", "a:b:head", "tables", "ünï cödé/{x}*"]
        for index, name in enumerate(names):
            store.create_table(name, {"x": varsync.Spec((index + 1,), "int32")})
            store.push({"x": np.full(index + 1, index, np.int32)}, table=name)
        assert store.tables() == sorted(names)
        for index, name in enumerate(names):
            assert_bit_equal(store.pull(name), {"x": np.full(index + 1, index, np.int32)})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"chunk_size": "12"}, "chunk_size"),
        ({"keep": "-1"}, "keep"),
        ({"db": "x"}, "db"),
        ({"colour": "blue"}, "colour"),
        ({"ssl_ca_certs": "/ca.pem"}, "rediss://"),
        ({"socket_timeout": "soon"}, "socket_timeout"),
    ],
)
def test_bad_options_are_configuration_errors(redis_url: str, options: Any, message: str) -> None:
    with pytest.raises(varsync.ConfigurationError, match=message):
        varsync.connect(redis_url.split("?")[0], **options)


def test_the_database_comes_from_the_url_path(server: Any) -> None:
    with varsync.connect(server.url.replace("/0", "/3")) as store:
        store.create_table("variables", SMALL)
    with server.client(db=3) as admin:
        assert admin.exists("varsync::variables:head")
    with pytest.raises(varsync.ConfigurationError, match="database"):
        varsync.connect(server.url.replace("/0", "/3"), db=4)


# -- recycling: large pushes overwrite the spare version's chunks in place ----------------------

SIX_MIB = {"w": varsync.Spec((6 * MB,), "uint8")}
RECYCLE_FROM = 4 * MB  # recycle_from below its default (256 MiB): these tables stay small


def _setrange_calls(server: Any) -> int:
    with server.client() as admin:
        return command_calls(admin).get("setrange", 0)


def test_large_pushes_overwrite_the_spare_versions_chunks_in_place(server: Any) -> None:
    with varsync.connect(server.url, chunk_size=MB, recycle_from=RECYCLE_FROM) as store:
        store.create_table("variables", SIX_MIB)
        for number in (1, 2, 3):
            store.push({"w": np.full(6 * MB, number, np.uint8)})
        details = store.table_info().details
        chunks = details["chunks"]
        assert chunks == 7 and details["spare_version"]  # version 1, retired past keep=1
        spare_token = table_head(server)["spare"].split(":")[0]
        assert len(keys_of(server, f"varsync::variables:d:{spare_token}:*")) == chunks
        assert _setrange_calls(server) == 0

        assert store.push({"w": np.full(6 * MB, 4, np.uint8)}) == 4
        assert _setrange_calls(server) == chunks  # every chunk written in place
        assert keys_of(server, f"varsync::variables:d:{spare_token}:*") == []  # renamed
        assert_bit_equal(store.pull(), {"w": np.full(6 * MB, 4, np.uint8)})
        # current, one kept, the new spare (version 2): all persistent, nothing else
        head = table_head(server)
        tokens = {head["data"], head["retained"].split(":")[0], head["spare"].split(":")[0]}
        assert len(tokens) == 3
        with server.client() as admin:
            chunk_keys = keys_of(server, "varsync::variables:d:*")
            assert len(chunk_keys) == 3 * chunks
            assert {k.split(":")[4] for k in chunk_keys} == tokens
            assert all(admin.pttl(k) == -1 for k in chunk_keys)
        for number in range(5, 9):  # steady state: the same memory, over and over
            store.push({"w": np.full(6 * MB, number, np.uint8)})
        assert_bit_equal(store.pull(), {"w": np.full(6 * MB, 8, np.uint8)})
        assert len(keys_of(server, "varsync::variables:d:*")) == 3 * chunks
        assert _setrange_calls(server) == 5 * chunks


def test_small_pushes_keep_no_spare(server: Any) -> None:
    with varsync.connect(server.url, chunk_size=MB, recycle_from=RECYCLE_FROM) as store:
        store.create_table("variables", {"w": varsync.Spec((3 * MB,), "uint8")})
        for number in range(1, 5):
            store.push({"w": np.full(3 * MB, number, np.uint8)})
        assert not store.table_info().details["spare_version"]
        assert len(keys_of(server, "varsync::variables:d:*")) == 2 * 4  # current + kept
    assert _setrange_calls(server) == 0


def test_a_spare_of_another_layout_is_deleted_and_the_push_writes_afresh(server: Any) -> None:
    with varsync.connect(server.url, chunk_size=MB, recycle_from=RECYCLE_FROM) as first:
        first.create_table("variables", SIX_MIB)
        for number in (1, 2, 3):
            first.push({"w": np.full(6 * MB, number, np.uint8)})
        spare_token = table_head(server)["spare"].split(":")[0]
    with varsync.connect(server.url, chunk_size=2 * MB) as second:  # other chunks
        assert second.push({"w": np.full(6 * MB, 4, np.uint8)}) == 4
        assert_bit_equal(second.pull(), {"w": np.full(6 * MB, 4, np.uint8)})
    assert _setrange_calls(server) == 0
    assert keys_of(server, f"varsync::variables:d:{spare_token}:*") == []
    with server.client() as admin:  # every chunk left belongs to a version the head names
        head = table_head(server)
        named = {head["data"], *(i.split(":")[0] for i in head["retained"].split(",") if i)}
        if head.get("spare"):
            named.add(head["spare"].split(":")[0])
        chunk_keys = keys_of(server, "varsync::variables:d:*")
        assert {k.split(":")[4] for k in chunk_keys} == named
        assert all(admin.pttl(k) == -1 for k in chunk_keys)


@pytest.mark.parametrize("damage", ["current", "retained", "malformed"])
def test_a_head_whose_spare_is_damaged_never_costs_a_readable_version(
    server: Any, damage: str
) -> None:
    with varsync.connect(server.url, chunk_size=MB, recycle_from=RECYCLE_FROM) as store:
        store.create_table("variables", SIX_MIB)
        for number in (1, 2):
            store.push({"w": np.full(6 * MB, number, np.uint8)})
        head = table_head(server)
        retained = head["retained"].split(",")[0]
        spare = {
            "current": f"{head['data']}:{head['layout']}",
            "retained": retained,
            "malformed": "not a token:1:2:3",
        }[damage]
        with server.client() as admin:
            admin.hset("varsync::variables:head", "spare", spare)
        before = set(keys_of(server, "varsync::variables:d:*"))
        assert store.push({"w": np.full(6 * MB, 3, np.uint8)}) == 3
        assert_bit_equal(store.pull(), {"w": np.full(6 * MB, 3, np.uint8)})
        assert _setrange_calls(server) == 0  # nothing was overwritten in place
        # version 2 (the one current before) is kept, with every chunk it had
        kept = table_head(server)["retained"].split(",")[0].split(":")[0]
        assert kept == head["data"]
        assert {k for k in before if f":{kept}:" in k} <= set(keys_of(server, "varsync::variables:d:*"))


def test_a_push_that_does_not_recycle_frees_the_spare_another_one_left(server: Any) -> None:
    """A spare left by a writer that recycles (or by a release whose threshold was 4 MiB)
    is freed by the next push of a writer that does not: no table keeps a version's worth
    of memory it never reads again."""
    with varsync.connect(server.url, chunk_size=MB, recycle_from=RECYCLE_FROM) as first:
        first.create_table("variables", SIX_MIB)
        for number in (1, 2, 3):
            first.push({"w": np.full(6 * MB, number, np.uint8)})
        spare_token = table_head(server)["spare"].split(":")[0]
        assert keys_of(server, f"varsync::variables:d:{spare_token}:*")
    with varsync.connect(server.url, chunk_size=MB) as second:  # the default: 256 MiB
        assert second.push({"w": np.full(6 * MB, 4, np.uint8)}) == 4
        assert_bit_equal(second.pull(), {"w": np.full(6 * MB, 4, np.uint8)})
    head = table_head(server)
    assert head["spare"] == ""
    assert keys_of(server, f"varsync::variables:d:{spare_token}:*") == []
    assert len(keys_of(server, "varsync::variables:d:*")) == 2 * 7  # current and kept
    assert _setrange_calls(server) == 0


def test_a_server_nobody_answers_is_refused_within_the_timeout_whatever_the_retries() -> None:
    """The first connection's tries, and redis-py's own between them, end within the
    timeout or FIRST_ANSWER_SECONDS, the longer (retries=60 on a dead port once waited
    about retries x retries x 0.5 s, over 30 minutes)."""
    from varsync.testing.faults import call_within

    dead = dead_url()

    def refused() -> None:
        with pytest.raises(varsync.BackendConnectionError):
            varsync.connect(dead, timeout=1, retries=100)

    call_within(15, refused)


def _count_connects(monkeypatch: Any) -> List[int]:
    """Every socket connect redis-py tries from now on, counted (each is a real try)."""
    tries: List[int] = []
    real = redis.connection.Connection._connect

    def counted(self: Any) -> Any:
        tries.append(1)
        return real(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)
    return tries


@pytest.mark.parametrize("retries", [0, 3])
def test_retries_is_one_layer_a_command_is_tried_retries_plus_one_times(
    monkeypatch: Any, retries: int
) -> None:
    """``retries=N``: a small command on a dead port makes N + 1 tries to connect in all,
    without a deadline too (timeout=None). redis-py's own retries under varsync's made
    (N + 1) squared, each pausing: 16 tries for N = 3, and 3721 (over 30 min) for 60."""
    dead = dead_url()
    tries = _count_connects(monkeypatch)
    with pytest.raises(varsync.BackendConnectionError):
        varsync.connect(dead, timeout=None, retries=retries)
    assert len(tries) == retries + 1


def test_a_refused_password_is_final_at_once_whatever_the_retries(
    redis_servers: Any, monkeypatch: Any
) -> None:
    """An AuthenticationError is a redis-py ConnectionError, which redis-py's own retries
    tried again (with their pauses): one handshake, one answer."""
    server = redis_servers(password="s3cret-pass")
    tries = _count_connects(monkeypatch)
    with pytest.raises(varsync.AuthenticationError):
        varsync.connect(server.url.replace("redis://", "redis://:wrong@"), retries=5)
    assert len(tries) == 1
