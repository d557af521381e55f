"""Security: Redis with a password, with the ACL users docs/redis.md gives (verbatim), and
with TLS against a certificate made by the tests; credentials never shown in errors, logs
or reprs, for every URL form that can carry them; Reverb's unauthenticated gRPC, as
documented. Servers are real, started on 127.0.0.1 and stopped by the tests."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional
from urllib.parse import quote

import numpy as np
import pytest

import varsync
from fixtures.redis import ENV_TLS_BINARY, RedisServer, _supports_tls

pytest.importorskip("redis")

ROOT = Path(__file__).resolve().parents[3]
MB = 1 << 20
VALUES = {"w": np.arange(3 * MB // 4, dtype=np.float32), "step": np.int64(7)}  # 3 MB


def round_trip(writer: Any, reader: Any, pushes: int = 3) -> None:
    """create, push (past ``keep``, so retired chunks are deleted too), a ``wait_for``
    woken by a push, ``pull`` and ``pull_if_newer``: the whole surface, end to end."""
    writer.create_table("variables", VALUES)
    for _ in range(pushes):
        version = writer.push(VALUES)
    woken: Dict[str, Any] = {}
    waiting = threading.Event()

    def wait() -> None:
        waiting.set()
        try:
            woken["version"] = reader.wait_for(version, timeout=20)
        except Exception as exc:  # examined below
            woken["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(10)
    assert writer.push(VALUES) == version + 1
    thread.join(30)
    assert woken == {"version": version + 1}
    pulled = reader.pull()
    assert np.array_equal(pulled["w"], VALUES["w"]) and int(pulled["step"]) == 7
    assert reader.pull_if_newer(version + 1) is None
    version_now, again = reader.pull_if_newer(0)
    assert version_now == version + 1 and np.array_equal(again["w"], VALUES["w"])


# -- requirepass ---------------------------------------------------------------------------------

PASSWORD = "pw-9f3c:@/ &=?#%"  # URL-special characters, percent-encoded where needed


@pytest.mark.parametrize("form", ["userinfo", "default-user", "query", "keyword"])
def test_a_password_protected_server_works_end_to_end(redis_servers: Any, form: str) -> None:
    server = redis_servers(password=PASSWORD)
    encoded = quote(PASSWORD, safe="")
    url, options = {
        "userinfo": (server.url.replace("redis://", f"redis://:{encoded}@"), {}),
        "default-user": (server.url.replace("redis://", f"redis://default:{encoded}@"), {}),
        "query": (f"{server.url}?password={encoded}", {}),
        "keyword": (server.url, {"password": PASSWORD}),
    }[form]
    with varsync.connect(url, chunk_size=MB, **options) as writer, varsync.connect(
        url, **options
    ) as reader:
        round_trip(writer, reader)
        assert encoded not in repr(writer) and PASSWORD not in repr(writer)


# -- ACL users, as docs/redis.md gives them -----------------------------------------------------------


def documented_acl_lines(version: str) -> Dict[str, str]:
    """The ``ACL SETUSER`` lines docs/redis.md gives for Redis ``version`` (the fenced block
    after its "**Redis <version>**" paragraph), by user."""
    text = (ROOT / "docs" / "redis.md").read_text()
    security = text[text.index("## Security"):]
    paragraph = security.index(f"**Redis {version}**")
    block = re.search(r"^```\n(.*?)^```", security[paragraph:], flags=re.MULTILINE | re.DOTALL)
    assert block, f"no fenced block after **Redis {version}** in docs/redis.md"
    lines = re.findall(r"^ACL SETUSER .+$", block.group(1), flags=re.MULTILINE)
    users = {line.split()[2]: line for line in lines}
    expected = {"7": {"learner", "actor"}, "6.2": {"learner", "actor", "reporter"}}[version]
    assert set(users) == expected, lines
    return users


def redis_version(server: Any) -> str:
    """``"7"`` or ``"6.2"``: which of the documented blocks applies to ``server``."""
    with server.client() as admin:
        major = admin.info("server")["redis_version"].split(".")[0]
    return "7" if int(major) >= 7 else "6.2"


def apply_acl(server: Any, line: str) -> None:
    with server.client() as admin:
        admin.execute_command(*shlex.split(line))


def with_documented_users(server: Any) -> Any:
    for line in documented_acl_lines(redis_version(server)).values():
        apply_acl(server, line)
    return server


def _redis7(tmp_path: Path) -> Iterator[RedisServer]:
    """A plain (non-TLS) Redis 7 server, from the TLS-capable binary, or skip."""
    binary = os.environ.get(ENV_TLS_BINARY)
    if not binary or not _supports_tls(binary):
        pytest.skip(f"{ENV_TLS_BINARY} names no Redis 7 binary (make test sets it)")
    server = RedisServer(binary, tmp_path / "redis7").start()
    try:
        with server.client() as admin:
            major = int(admin.info("server")["redis_version"].split(".")[0])
        if major < 7:
            pytest.skip(f"{binary} is Redis {major}")
        yield server
    finally:
        server.stop()


def _redis62(redis_servers: Any) -> Any:
    server = redis_servers()
    with server.client() as admin:
        if not admin.info("server")["redis_version"].startswith("6."):
            pytest.skip("the default test server is not Redis 6")
    return server


@pytest.fixture(params=["redis-6.2", "redis-7"])
def acl_server(request: Any, redis_servers: Any, tmp_path: Path) -> Iterator[Any]:
    """A server of each major version the tests have, with the users documented for it."""
    if request.param == "redis-6.2":
        servers: Iterator[Any] = iter([_redis62(redis_servers)])
    else:
        servers = _redis7(tmp_path)
    yield with_documented_users(next(servers))
    next(servers, None)


@pytest.fixture
def acl_server_7(tmp_path: Path) -> Iterator[Any]:
    """A Redis 7 server with the users documented for Redis 7."""
    for server in _redis7(tmp_path):
        yield with_documented_users(server)


@pytest.fixture
def acl_server_62(redis_servers: Any) -> Any:
    """A Redis 6.2 server with the users documented for Redis 6.2."""
    return with_documented_users(_redis62(redis_servers))


def user_url(server: Any, user: str, db: int = 0) -> str:
    return server.url.replace("redis://", f"redis://{user}:{user}-password@")[: -1] + str(db)


def user_client(server: Any, user: str) -> Any:
    """A plain redis-py client as a documented user: what that user can do by hand."""
    import redis

    return redis.Redis(host="127.0.0.1", port=server.port, username=user,
                       password=f"{user}-password")


def test_the_documented_acl_users_work_end_to_end_and_no_further(acl_server: Any) -> None:
    learner, actor = user_url(acl_server, "learner"), user_url(acl_server, "actor")
    with varsync.connect(learner, namespace="team", chunk_size=MB, keep=1) as writer, \
            varsync.connect(actor, namespace="team") as reader:
        round_trip(writer, reader, pushes=4)
        assert reader.tables() == ["variables"] and reader.table_info().version == 5
        with pytest.raises(varsync.AuthenticationError, match="ACL"):
            reader.push(VALUES)  # actors read and wait, never publish
        with pytest.raises(varsync.AuthenticationError):
            reader.create_table("mine", VALUES)
        # The table vanishes (the server lost it): the learner creates it again, under ACL.
        with acl_server.client() as admin:
            admin.flushall()
        with pytest.raises(varsync.TableResetError):
            reader.pull_if_newer(5)
        assert writer.push(VALUES) == 1  # a new history (docs/redis.md)
        assert reader.pull()["step"] == 7
    for user in ("learner", "actor"):  # nothing outside its namespace
        with varsync.connect(user_url(acl_server, user), namespace="other") as outside:
            with pytest.raises(varsync.AuthenticationError, match="ACL|permission"):
                outside.create_table("variables", VALUES)
            with pytest.raises(varsync.AuthenticationError):
                outside.tables()


def test_another_database_needs_select_as_the_documentation_says(acl_server: Any) -> None:
    with pytest.raises(varsync.AuthenticationError):
        varsync.connect(user_url(acl_server, "learner", db=3), namespace="team")
    apply_acl(acl_server, "ACL SETUSER learner +select")
    apply_acl(acl_server, "ACL SETUSER actor +select")
    with varsync.connect(user_url(acl_server, "learner", db=3), namespace="team",
                         chunk_size=MB) as writer, \
            varsync.connect(user_url(acl_server, "actor", db=3), namespace="team") as reader:
        round_trip(writer, reader, pushes=1)


def test_on_redis_7_a_read_only_key_pattern_keeps_actors_from_writing(acl_server_7: Any) -> None:
    """docs/redis.md: with Redis 7, ``%R~varsync:team:*`` makes the actor's key access
    read-only, even with write commands added to its line; the actor still reads and
    waits."""
    apply_acl(acl_server_7, "ACL SETUSER actor +set +hset +del")
    with varsync.connect(user_url(acl_server_7, "learner"), namespace="team",
                         chunk_size=MB) as writer, \
            varsync.connect(user_url(acl_server_7, "actor"), namespace="team") as reader:
        round_trip(writer, reader, pushes=1)
        with pytest.raises(varsync.AuthenticationError):
            reader.push(VALUES)
        assert writer.version() == 2


# -- the reader registry under the documented ACL users ---------------------------------------

TABLE_KEY = "varsync:team:variables"  # the keys of table "variables" of namespace "team"


def learner_and_actor(server: Any, actor: str = "actor") -> Any:
    """A learner that created table ``variables`` and pushed version 1, and an actor, both
    as documented users."""
    learner = varsync.connect(user_url(server, "learner"), namespace="team", chunk_size=MB)
    learner.create_table("variables", VALUES)
    assert learner.push(VALUES) == 1
    return learner, varsync.connect(user_url(server, actor), namespace="team")


def test_on_redis_7_the_documented_actor_reports_and_writes_no_other_readers_entry(
    acl_server_7: Any,
) -> None:
    from redis.exceptions import NoPermissionError

    from varsync._backends.redis.readers import REPORT

    learner, actor = learner_and_actor(acl_server_7)
    with learner, actor:
        actor.report_as("actor")
        assert actor.pull()["step"] == 7
        held = learner.wait_for_readers(1, 1, timeout=20)
        assert [(r.reader, r.version) for r in held] == [("actor", 1)]
        with pytest.raises(varsync.AuthenticationError):
            actor.push(VALUES)  # it reports, and still cannot publish
        assert learner.version() == 1
        with user_client(acl_server_7, "actor") as raw:
            bob = f"{TABLE_KEY}:reader:bob"
            with pytest.raises(NoPermissionError):
                raw.set(bob, "{}")  # another reader's entry
            with pytest.raises(NoPermissionError):  # the same, by the report script
                raw.eval(REPORT.text, 2, bob, f"{TABLE_KEY}:readers:exp",
                         f"{TABLE_KEY}:head", "bob", "{}", 60_000)
            with pytest.raises(NoPermissionError):
                raw.set(f"{TABLE_KEY}:readers:exp", "x")  # the index, as another type
            with pytest.raises(NoPermissionError):
                raw.zadd(f"{TABLE_KEY}:reader:actor", {"x": 1})  # its entry, likewise
            with pytest.raises(NoPermissionError):
                raw.hset(f"{TABLE_KEY}:head", "version", "9")  # the table
        assert [r.reader for r in learner.readers()] == ["actor"]


def test_an_index_entry_without_its_own_entry_key_is_never_counted(acl_server: Any) -> None:
    """Whoever may report can add any id to a table's index (Redis 7: the actor; 6.2: the
    reporter): a listing counts only the ids whose entry key is there. On Redis 7 the
    actor's own key pattern (``…:*:reader:actor``) also matches keys whose id is not
    ``actor``, which are not ids as varsync encodes them: never counted either."""
    reporter = "actor" if redis_version(acl_server) == "7" else "reporter"
    learner, actor = learner_and_actor(acl_server, reporter)
    with learner, actor:
        actor.report_as(reporter)
        actor.pull()
        assert [r.reader for r in learner.wait_for_readers(1, 1, timeout=20)] == [reporter]
        with user_client(acl_server, reporter) as raw:
            record = raw.get(f"{TABLE_KEY}:reader:{reporter}")
            assert json.loads(record)["version"] == 1
            index = f"{TABLE_KEY}:readers:exp"
            raw.zadd(index, {"mallory": 2**50, "eve:reader:" + reporter: 2**50})
            raw.set(f"{TABLE_KEY}:reader:eve:reader:{reporter}", record)
        assert [r.reader for r in learner.readers()] == [reporter]
        with pytest.raises(varsync.PullTimeoutError):
            learner.wait_for_readers(1, 2, timeout=0.5)
        with acl_server.client() as admin:
            assert admin.zscore(index, "mallory") is None  # the listing dropped it


def test_on_redis_6_2_the_documented_users_do_what_the_documentation_says(
    acl_server_62: Any, caplog: Any,
) -> None:
    caplog.set_level(logging.WARNING, logger="varsync")
    """The learner lists readers; the read-only actor pulls, and its reports are refused
    (logged, never raised); the reporter reports, and, as the documentation warns, can
    also write any key of the namespace."""
    learner, actor = learner_and_actor(acl_server_62)
    with learner, actor, varsync.connect(user_url(acl_server_62, "reporter"),
                                         namespace="team") as reporter:
        actor.report_as("actor")
        reporter.report_as("reporter")
        assert actor.pull()["step"] == 7 and reporter.pull()["step"] == 7
        held = learner.wait_for_readers(1, 1, timeout=20)
        assert [(r.reader, r.version) for r in held] == [("reporter", 1)]
        assert "reader 'actor' could not report" in caplog.text
        with pytest.raises(varsync.AuthenticationError):
            actor.push(VALUES)
        with user_client(acl_server_62, "reporter") as raw:
            assert raw.set(f"{TABLE_KEY}:reader:bob", "{}")  # another reader's entry
            assert raw.set(f"{TABLE_KEY}:head", "gone")  # the table itself
        with pytest.raises(varsync.VarsyncError):
            learner.version()


# -- TLS ------------------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(redis_servers: Any) -> Any:
    """A TLS-only server with a certificate for 127.0.0.1 from a CA the test made, a
    password, and the documented ACL users."""
    return with_documented_users(redis_servers(tls=True, password=PASSWORD))


def test_tls_with_a_password_and_acl_users_works_end_to_end(tls_server: Any) -> None:
    ca = f"ssl_ca_certs={tls_server.tls['ca']}"
    learner = tls_server.url.replace("rediss://", "rediss://learner:learner-password@")
    actor = tls_server.url.replace("rediss://", "rediss://actor:actor-password@")
    with varsync.connect(f"{learner}?{ca}", namespace="team", chunk_size=MB) as writer, \
            varsync.connect(f"{actor}?{ca}", namespace="team") as reader:
        round_trip(writer, reader)
    admin_url = tls_server.url.replace("rediss://", f"rediss://:{quote(PASSWORD, safe='')}@")
    with varsync.connect(f"{admin_url}?{ca}", namespace="team") as admin:
        assert admin.version() == 4


@pytest.mark.parametrize("case", ["unknown CA", "wrong host name", "plain to a TLS port",
                                  "no CA file"])
def test_tls_refuses_what_it_cannot_verify_at_once(
    tls_server: Any, tmp_path: Path, case: str
) -> None:
    from fixtures.redis import _make_certificates

    other_ca = _make_certificates(tmp_path)["ca"]
    url = tls_server.url.replace("rediss://", f"rediss://:{quote(PASSWORD, safe='')}@")
    url = {
        "unknown CA": f"{url}?ssl_ca_certs={other_ca}",
        "wrong host name": url.replace("127.0.0.1", "localhost") + f"?ssl_ca_certs={tls_server.tls['ca']}",
        "plain to a TLS port": url.replace("rediss://", "redis://"),
        "no CA file": f"{url}?ssl_ca_certs={tmp_path / 'missing.pem'}",
    }[case]
    with pytest.raises(varsync.BackendConnectionError) as caught:
        varsync.connect(url, timeout=5)
    assert_no_secret(caught.value, [PASSWORD, quote(PASSWORD, safe="")])


# -- credentials never shown -------------------------------------------------------------------------

SECRET = "Sekr3t-XyZ-99"
# Named, not written inline where used: Python 3.13's tracebacks print a call's whole
# source, which would show the literal (the test's own text, not varsync's output).
AMPERSAND_SECRET = "Sekr3t-&XyZ-99"
ENCODED_SECRET = "Sekr3t%2DXyZ%2D99"  # the same, percent-encoded


def assert_no_secret(error: BaseException, secrets: List[str]) -> None:
    """Neither the error, nor any error in its chain, nor its formatted traceback shows
    a secret."""
    shown = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    chain: List[BaseException] = []
    current: Optional[BaseException] = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    texts = [shown] + [str(e) for e in chain] + [repr(e) for e in chain]
    for secret in secrets:
        assert not any(secret in text for text in texts), f"{secret!r} shown in {texts}"


def _dead_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def credential_cases(server: Any) -> Dict[str, Callable[[], Any]]:
    """Calls that fail, each with credentials in a URL form of some backend."""
    port = server.port
    dead = _dead_port()
    redis_at = f"127.0.0.1:{port}/0"
    store = uuid.uuid4().hex
    return {
        "redis userinfo, wrong password": lambda: varsync.connect(f"redis://u:{SECRET}@{redis_at}"),
        "redis userinfo, encoded": lambda: varsync.connect(f"redis://u:{ENCODED_SECRET}@{redis_at}"),
        "redis password only": lambda: varsync.connect(f"redis://:{SECRET}@{redis_at}"),
        "redis query password": lambda: varsync.connect(f"redis://{redis_at}?password={SECRET}"),
        "redis keyword password": lambda: varsync.connect(f"redis://{redis_at}", password=SECRET),
        "redis, server down": lambda: varsync.connect(f"redis://u:{SECRET}@127.0.0.1:{dead}/0", timeout=2),
        "redis, bad option": lambda: varsync.connect(f"redis://u:{SECRET}@{redis_at}?keep=many"),
        "redis, unknown option": lambda: varsync.connect(f"redis://u:{SECRET}@{redis_at}?colour=red"),
        "redis, bad port": lambda: varsync.connect(f"redis://u:{SECRET}@127.0.0.1:port/0"),
        "redis, bad IPv6 host": lambda: varsync.connect(f"redis://u:{SECRET}@[::1/0"),
        "redis, option twice": lambda: varsync.connect(f"redis://{redis_at}?password={SECRET}&password=x"),
        "redis, unparsable query": lambda: varsync.connect(f"redis://{redis_at}?password={SECRET}&oops"),
        "redis, '&' in a query password": lambda: varsync.connect(
            f"redis://{redis_at}?password={AMPERSAND_SECRET}"),
        "rediss, ssl_password twice": lambda: varsync.connect(
            f"rediss://{redis_at}?ssl_password={SECRET}&ssl_password={SECRET}"),
        "rediss, ssl_password and a bad option": lambda: varsync.connect(
            f"rediss://{redis_at}?ssl_password={SECRET}&ssl_cert_reqs=maybe"),
        "rediss, token option twice": lambda: varsync.connect(
            f"rediss://{redis_at}?token={SECRET}&token=x"),
        "reverb userinfo, server down": lambda: varsync.connect(f"reverb://u:{SECRET}@localhost:{dead}", timeout=2),
        "reverb userinfo, bad option": lambda: varsync.connect(f"reverb://u:{SECRET}@localhost:{dead}?x=1"),
        "memory userinfo, no store": lambda: varsync.connect(f"memory://u:{SECRET}@"),
        "memory userinfo, missing table": lambda: varsync.connect(f"memory://u:{SECRET}@{store}").pull("nope"),
        "shm userinfo, no store": lambda: varsync.connect(f"shm://u:{SECRET}@"),
        "shm userinfo, bad root": lambda: varsync.connect(f"shm://u:{SECRET}@{store}?root=/no/such"),
        "any scheme, unknown": lambda: varsync.connect(f"nosuch://u:{SECRET}@host"),
    }


def test_credentials_never_appear_in_errors_logs_or_stderr(
    redis_servers: Any, caplog: Any, capfd: Any
) -> None:
    server = redis_servers(password="the-right-one")
    caplog.set_level(logging.DEBUG)
    secrets = [SECRET, ENCODED_SECRET, "XyZ-99"]
    failed = 0
    for case, call in credential_cases(server).items():
        try:
            call()
        except varsync.VarsyncError as exc:
            assert_no_secret(exc, secrets)
            failed += 1
        else:
            raise AssertionError(f"{case}: expected an error")
    assert failed == len(credential_cases(server))
    logged = caplog.text + "".join(r.getMessage() for r in caplog.records)
    out, err = capfd.readouterr()  # at the file descriptors: native libraries' logs too
    for secret in secrets:
        assert secret not in logged and secret not in out and secret not in err


def test_credentials_never_appear_in_reprs_info_or_logs_of_working_containers(
    redis_servers: Any, reverb_servers: Any, caplog: Any, capfd: Any, request: Any
) -> None:
    """Containers that work, for every URL form that can carry a password (a server
    that asks for one, and the backends that have no use for one and ignore it): their
    reprs, table_info, the errors of failing calls, the warning of a table that vanished,
    and everything logged or written to stderr."""
    server = redis_servers(password=SECRET)
    caplog.set_level(logging.DEBUG)
    store = uuid.uuid4().hex
    urls = [
        server.url.replace("redis://", f"redis://default:{SECRET}@"),
        server.url.replace("redis://", f"redis://:{ENCODED_SECRET}@"),
        f"{server.url}?password={SECRET}",
        f"memory://u:{SECRET}@{store}",
    ]
    if varsync_shm_available():
        import varsync_shm

        urls.append(f"shm://u:{SECRET}@{store}")
        request.addfinalizer(lambda: varsync_shm.remove_store(store))
    reverb_url = reverb_servers({"variables": VALUES}).url
    urls.append(reverb_url.replace("reverb://", f"reverb://u:{SECRET}@"))
    seen: List[str] = []
    for url in urls:
        with varsync.connect(url, timeout=2) as c:
            c.create_table("variables", VALUES)
            c.push(VALUES)
            info = c.table_info()
            seen += [repr(c), repr(c.backend), str(info), repr(info), str(info.details),
                     str(c.backend.describe_options()), c.backend.url]
            for call in (lambda: c.pull("missing"), lambda: c.wait_for(1, timeout=0.1),
                         lambda: c.pull_if_newer(5)):
                try:
                    call()
                except varsync.VarsyncError as exc:
                    assert_no_secret(exc, [SECRET, ENCODED_SECRET])
        seen.append(repr(c))  # closed
    with varsync.connect(urls[0], timeout=2) as c:  # a table that vanished: a warning
        assert c.version() == 3  # one push per Redis URL form above; the table is known
        with server.client() as admin:
            admin.flushall()
        c.push(VALUES)
    assert "vanished" in caplog.text
    out, err = capfd.readouterr()
    for text in seen + [caplog.text, out, err]:
        assert SECRET not in text and ENCODED_SECRET not in text, text


def varsync_shm_available() -> bool:
    try:
        import varsync_shm  # noqa: F401
    except ImportError:
        return False
    return True


# -- Reverb: unauthenticated gRPC, as documented ---------------------------------------------------


def test_reverb_serves_anyone_on_every_interface_as_the_documentation_says(
    reverb_servers: Any,
) -> None:
    """The documents warn that Reverb listens on every interface without authentication;
    this checks both facts, so the warning stays true (and is dropped if it stops being)."""
    server = reverb_servers({"variables": {"w": np.zeros(3, np.float32)}})
    listening = set()
    for table in ("/proc/net/tcp6", "/proc/net/tcp"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port = local.rsplit(":", 1)
                if state == "0A" and int(port, 16) == server.port:  # LISTEN
                    listening.add(address)
    assert listening, "the Reverb server's port is not listening"
    assert listening <= {"00000000000000000000000000000000", "00000000"}, listening  # :: / 0.0.0.0
    with varsync.connect(server.url, timeout=10) as anyone:  # no credentials asked
        assert anyone.push({"w": np.ones(3, np.float32)}) == 1
    reverb_doc = (ROOT / "docs" / "reverb.md").read_text()
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    for text in (reverb_doc, guarantees):
        assert "no authentication" in text and "every interface" in text
        assert "scripts/loopback-only" in text
