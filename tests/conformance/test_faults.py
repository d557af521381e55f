"""Faults injected into real servers and real processes, per backend where they apply.

- a server stopped while a writer and readers run, then restarted;
- a server that comes back empty (Redis without persistence, Reverb without checkpoint);
- a writer process SIGKILLed in the middle of a large push;
- a reader process SIGKILLed in the middle of a pull;
- a checkpointed Reverb server SIGKILLed and restarted from its checkpoint.

Every nest pushed here holds one number in every element of every leaf (the writer's count
of successful pushes), so a reader can tell a torn value, and an older value taken for a
newer one, from the value alone. Processes are started with "spawn", synchronised with
events and queues, every wait is bounded, and every process is stopped at teardown.
Per-backend details already covered elsewhere (tests/backends/redis/test_redis_backend.py,
tests/backends/reverb/test_reverb_backend.py, plugins/varsync-shm/tests/) are not repeated here.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import varsync
from fixtures.redis import table_head

CONTEXT = multiprocessing.get_context("spawn")

#: The nest the running writers and readers exchange (about 130 KB).
NEST = {
    "policy": [varsync.Spec((128, 256), "float32"), varsync.Spec((256,), "float32")],
    "normaliser": {"mean": varsync.Spec((16,), "float64"), "count": varsync.Spec((), "int64")},
}
TIMEOUT = 2.0
"""The timeout of every container in these tests; calls must end within it (plus slack)."""
SLACK = 3.0
MB = 1 << 20


def filled(signature: Any, number: int) -> Any:
    return varsync._nest.map_structure(lambda s: np.full(s.shape, number, s.dtype), signature)


def content_of(values: Any) -> int:
    """The one number a :func:`filled` nest holds; ``AssertionError`` on a torn value."""
    numbers = set()
    for leaf in varsync.flatten(values):
        numbers.update(int(x) for x in np.unique(leaf))
    assert len(numbers) == 1, f"a pull mixed values: elements hold {sorted(numbers)[:6]}"
    return numbers.pop()


def big(megabytes: int) -> Dict[str, Any]:
    """A nest of two float32 arrays of ``megabytes`` in total."""
    half = megabytes * MB // 8
    return {"a": varsync.Spec((half,), "float32"), "b": varsync.Spec((half,), "float32")}


# -- writer and reader loops, in a process or a thread ------------------------------------------


def _work(role: str, name: str, url: str, options: Dict[str, Any], events: Any, stop: Any) -> None:
    """Push (``role="writer"``) or pull (``"poll"``: ``pull_if_newer``; ``"wait"``:
    ``wait_for`` then ``pull_if_newer``) until ``stop`` is set, reporting every call as
    ``(name, kind, started, seconds, detail)``: kind ``ok`` (detail: ``(version, number)``
    or ``None``), ``idle`` (a wait that timed out), ``reset`` (``TableResetError``),
    ``error`` (detail: the error's type name) or ``wrong`` (anything a correct backend
    never does: a torn value, an older value taken for newer, an unexpected exception).
    The writer numbers its pushes on from the number in the table."""

    def report(kind: str, started: float, detail: Any = None) -> None:
        events.put((name, kind, started, time.monotonic() - started, detail))

    try:
        store = varsync.connect(url, **options)
    except Exception as exc:  # reported to the test
        report("wrong", time.monotonic(), f"connect: {type(exc).__name__}: {exc}")
        return
    held, held_number = 0, 0
    with store:
        number = content_of(store.pull()) + 1 if role == "writer" and store.version() else 1
        for _ in range(1_000_000):  # bounded; the test sets ``stop`` long before
            if stop.is_set():
                return
            started = time.monotonic()
            try:
                if role == "writer":
                    version = store.push(filled(NEST, number))
                    report("ok", started, (version, number))
                    number += 1
                    stop.wait(0.01)  # pace the writer: readers should see most versions
                    continue
                if role == "wait":
                    try:
                        store.wait_for(held, timeout=TIMEOUT / 2)
                    except varsync.PullTimeoutError:
                        report("idle", started)
                        continue
                got = store.pull_if_newer(held)
                if got is None:
                    report("ok", started)
                    stop.wait(0.005)
                    continue
                version, values = got
                value = content_of(values)
                if held and value < held_number:  # equal: a push retried after an error
                    report("wrong", started, f"took {value} (version {version}) for newer "
                                             f"than {held_number} (version {held})")
                held, held_number = version, value
                report("ok", started, (version, value))
            except varsync.TableResetError:
                held, held_number = 0, 0  # resynchronise: the next pull_if_newer(0)
                report("reset", started)
            except varsync.VarsyncError as exc:
                report("error", started, type(exc).__name__)
                stop.wait(0.05)  # back off while the server is away
            except AssertionError as exc:
                report("wrong", started, str(exc))
            except Exception as exc:
                report("wrong", started, f"{type(exc).__name__}: {exc}")
                return


class Workers:
    """Writer and reader loops (processes or threads) and the log of what they report."""

    def __init__(self, url: str, options: Dict[str, Any], roles: Dict[str, str],
                 processes: bool) -> None:
        self.events: Any = CONTEXT.Queue() if processes else queue.Queue()
        self.stop = CONTEXT.Event() if processes else threading.Event()
        self.log: List[Tuple[str, str, float, float, Any]] = []
        self.names = list(roles)
        self.runners: List[Any] = []
        for name, role in roles.items():
            args = (role, name, url, options, self.events, self.stop)
            if processes:
                runner: Any = CONTEXT.Process(target=_work, args=args, daemon=True)
            else:
                runner = threading.Thread(target=_work, args=args, daemon=True)
            runner.start()
            self.runners.append(runner)

    def drain_until(self, condition: Callable[["Workers"], bool], seconds: float,
                    what: str) -> None:
        """Collect reports until ``condition(self)`` holds; fail after ``seconds``."""
        deadline = time.monotonic() + seconds
        while not condition(self):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not within {seconds} s: {what}\n{self.summary()}")
            try:
                self.log.append(self.events.get(timeout=min(left, 0.5)))
            except queue.Empty:
                pass

    def of(self, name: str, kind: str, since: float = 0.0, until: float = float("inf")) -> List[Any]:
        return [e for e in self.log if e[0] == name and e[1] == kind and since <= e[2] < until]

    def summary(self) -> str:
        lines = []
        for name in self.names:
            kinds: Dict[str, int] = {}
            for event in self.log:
                if event[0] == name:
                    kinds[event[1]] = kinds.get(event[1], 0) + 1
            lines.append(f"  {name}: {kinds}")
        return "\n".join(lines)

    def close(self) -> None:
        self.stop.set()
        for runner in self.runners:
            runner.join(30)
        for runner in self.runners:
            if isinstance(runner, multiprocessing.process.BaseProcess) and runner.is_alive():
                runner.kill()
                runner.join(10)
        for _ in range(100_000):  # what was reported before they stopped
            try:
                self.log.append(self.events.get_nowait())
            except queue.Empty:
                break


@pytest.fixture
def workers() -> Iterator[Callable[..., Workers]]:
    started: List[Workers] = []

    def start(url: str, options: Dict[str, Any], roles: Dict[str, str], processes: bool) -> Workers:
        group = Workers(url, options, roles, processes)
        started.append(group)
        return group

    yield start
    for group in started:
        group.close()


# -- Reverb servers in child processes, which can be killed -------------------------------------


def _serve_reverb(tables: Dict[str, Any], port: int, checkpoint_dir: Optional[str],
                  ready: Any, stop: Any) -> None:
    from varsync.reverb_server import serve

    with serve(tables, port=port, checkpoint_dir=checkpoint_dir) as server:
        ready.put(server.port)
        stop.wait(600)  # bounded: the test stops or kills this process long before


class ReverbProcess:
    """A Reverb server in a child process: started, stopped, or SIGKILLed like a crash."""

    def __init__(self, tables: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> None:
        self.tables = tables
        self.checkpoint_dir = checkpoint_dir
        self.port = 0
        self.process: Optional[Any] = None
        self._stop: Any = None

    @property
    def url(self) -> str:
        return f"reverb://localhost:{self.port}"

    def start(self) -> "ReverbProcess":
        """Start, on the same port as before if it ran before."""
        ready = CONTEXT.Queue()
        self._stop = CONTEXT.Event()
        self.process = CONTEXT.Process(
            target=_serve_reverb,
            args=(self.tables, self.port, self.checkpoint_dir, ready, self._stop),
            daemon=True,
        )
        self.process.start()
        self.port = ready.get(timeout=120)
        return self

    def checkpoint(self) -> None:
        import reverb

        reverb.Client(f"localhost:{self.port}").checkpoint()

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(30)

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self._stop.set()
            self.process.join(30)
        self.kill()


@pytest.fixture
def reverb_process() -> Iterator[Callable[..., ReverbProcess]]:
    pytest.importorskip("reverb")
    started: List[ReverbProcess] = []

    def start(tables: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> ReverbProcess:
        server = ReverbProcess(tables, checkpoint_dir).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _keys(server: Any, pattern: str = "*") -> Dict[str, int]:
    """Every key matching ``pattern`` and its remaining time to live in ms (-1: none)."""
    with server.client() as admin:
        return {k.decode(): admin.pttl(k) for k in admin.scan_iter(match=pattern, count=1000)}


# -- a server stopped, then restarted --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["redis", "reverb"])
def test_a_server_stopped_under_a_writer_and_readers_fails_their_calls_in_time_and_they_resume(
    backend: str, request: Any, workers: Any, tmp_path: Any
) -> None:
    """Writer and readers keep running across the outage: while the server is away every
    call fails with BackendConnectionError within its timeout; once it is back, the next
    pushes succeed and the readers get them, without being restarted themselves.

    Redis is stopped with SIGTERM (it saves its RDB) and restarted from it; Reverb is
    SIGKILLed after a checkpoint and restarted from it, so versions pushed between the
    checkpoint and the crash are lost, and readers that held one are told (reset)."""
    if backend == "redis":
        server = request.getfixturevalue("redis_servers")(persistent=True)
        url, processes = server.url, True
        with varsync.connect(url) as store:
            store.create_table("variables", NEST)
            store.push(filled(NEST, 1))
    else:
        server = request.getfixturevalue("reverb_process")({"variables": NEST}, str(tmp_path))
        url, processes = server.url, False  # threads: each reader has its own client
        with varsync.connect(url, timeout=10) as store:
            store.push(filled(NEST, 1))
    group = workers(url, {"timeout": TIMEOUT},
                    {"writer": "writer", "poller": "poll", "waiter": "wait"}, processes)
    group.drain_until(lambda g: all(len(g.of(n, "ok")) >= 3 for n in g.names), 120,
                      "every worker ran")

    stopped = time.monotonic()
    if backend == "reverb":
        server.checkpoint()
        server.kill()
    else:
        server.stop()
    group.drain_until(lambda g: all(g.of(n, "error", since=stopped) for n in g.names), 30,
                      "every worker saw the outage")
    restarted = time.monotonic()
    server.start()
    group.drain_until(
        lambda g: all(len(g.of(n, "ok", since=restarted)) >= 3 for n in g.names)
        and _readers_caught_up(g, restarted),
        60, "every worker resumed after the restart",
    )
    group.close()

    log = group.log
    assert [e for e in log if e[1] == "wrong"] == []
    outage = [e for e in log if e[1] == "error" and stopped <= e[2] < restarted]
    assert outage and {e[4] for e in outage} == {"BackendConnectionError"}, outage[:5]
    slow = [e for e in log if e[3] > TIMEOUT + SLACK]
    assert slow == [], f"calls that outlived their {TIMEOUT} s timeout: {slow[:5]}"
    if backend == "redis":  # the RDB holds every version: nobody had to resynchronise
        assert [e for e in log if e[1] == "reset"] == []


def _readers_caught_up(group: Workers, since: float) -> bool:
    """Each reader holds a number the writer pushed after ``since``."""
    pushed = [e[4][1] for e in group.of("writer", "ok", since=since)]
    if not pushed:
        return False
    first = min(pushed)
    return all(
        any(e[4] is not None and e[4][1] >= first for e in group.of(n, "ok", since=since))
        for n in ("poller", "waiter")
    )


# -- a server that comes back empty ------------------------------------------------------------------


class _Blocked(threading.Thread):
    """A call run in a thread, so the test can restart the server under it."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.started_call = threading.Event()

    def run(self) -> None:
        self.started_call.set()
        try:
            self.result = self.call()
        except BaseException as exc:  # examined by the test
            self.error = exc


@pytest.mark.parametrize("backend", ["redis", "reverb"])
def test_a_server_back_empty_is_a_reset_for_readers_never_an_older_value_nor_a_hang(
    backend: str, request: Any
) -> None:
    """Readers holding version 3 of the lost history, a reader blocked in ``wait_for``
    and one blocked in ``pull`` of an empty table across the restart: none hangs, none
    takes a value of the new history for newer than what it holds (even when the new
    history's version numbers reach and pass the old ones), and each is told."""
    tables = {"variables": NEST, "late": NEST}
    if backend == "redis":
        server = request.getfixturevalue("redis_servers")()  # no persistence
        url = server.url
        with varsync.connect(url) as store:
            for name, signature in tables.items():
                store.create_table(name, signature)

        def restart_empty() -> None:
            server.restart()
    else:
        start = request.getfixturevalue("reverb_servers")
        server = start(tables)
        url = server.url

        def restart_empty() -> None:
            _until_reverb_server_age(url, 0.1)
            server.stop()
            start(tables, port=server.port)

    options = {"timeout": TIMEOUT * 4}
    with varsync.connect(url, **options) as writer, varsync.connect(url, **options) as reader, \
            varsync.connect(url, **options) as waiter, varsync.connect(url, **options) as puller:
        for number in (1, 2, 3):
            writer.push(filled(NEST, number))
        assert writer.version("late") == 0  # the writer knows both tables
        held, values = reader.pull_if_newer(0)
        assert content_of(values) == 3
        blocked_wait = _Blocked(lambda: waiter.wait_for(held))
        blocked_pull = _Blocked(lambda: puller.pull("late"))
        for call in (blocked_wait, blocked_pull):
            call.start()
            assert call.started_call.wait(10)

        restart_empty()
        # The new history: numbers 4.. under versions that reach the reader's again.
        for number in (4, 5, 6, 7):
            writer.push(filled(NEST, number))
        writer.push(filled(NEST, 40), table="late")

        for call in (blocked_wait, blocked_pull):
            call.join(TIMEOUT * 4 + SLACK)
            assert not call.is_alive(), "a call blocked across the restart hung"
        assert isinstance(blocked_wait.error, (varsync.TableResetError,
                                                varsync.BackendConnectionError)), blocked_wait.error
        if blocked_pull.error is None:  # it waited through the restart for the first push
            assert content_of(blocked_pull.result) == 40
        else:
            assert isinstance(blocked_pull.error, varsync.BackendConnectionError), blocked_pull.error

        for call in (lambda: reader.pull_if_newer(held), lambda: reader.wait_for(held, timeout=1)):
            with pytest.raises(varsync.TableResetError, match="pull()"):
                call()
        version, values = reader.pull_if_newer(0)  # resynchronised
        assert content_of(values) == 7
        assert reader.pull_if_newer(version) is None


def test_an_shm_store_deleted_under_its_readers_is_a_reset_never_an_older_value() -> None:
    """shm's "server back empty": the store's files deleted (``remove_store``) while a
    writer and readers hold it. Holders are told; nobody hangs; the writer's pushes fail
    until it creates the table again, then the readers resynchronise."""
    varsync_shm = pytest.importorskip("varsync_shm")
    name = f"faults-{uuid.uuid4().hex}"
    url = f"shm://{name}"
    try:
        with varsync.connect(url, timeout=TIMEOUT) as writer, varsync.connect(
            url, timeout=TIMEOUT
        ) as reader:
            writer.create_table("variables", NEST)
            for number in (1, 2, 3):
                writer.push(filled(NEST, number))
            held, values = reader.pull_if_newer(0)
            assert (held, content_of(values)) == (3, 3)
            assert varsync_shm.remove_store(name)

            for call in (lambda: reader.pull_if_newer(held), lambda: reader.wait_for(held)):
                with pytest.raises(varsync.TableResetError):
                    call()
            with pytest.raises(varsync.PullTimeoutError):
                reader.pull(timeout=0.2)  # an empty table: it waits, boundedly
            with pytest.raises(varsync.BackendConnectionError):
                writer.push(filled(NEST, 4))  # its table's files are gone
            writer.create_table("variables", NEST)
            assert writer.push(filled(NEST, 5)) == 1
            with pytest.raises(varsync.TableResetError):
                reader.pull_if_newer(held)
            assert content_of(reader.pull()) == 5
    finally:
        varsync_shm.remove_store(name)


def _until_reverb_server_age(url: str, seconds: float) -> None:
    """Wait until the Reverb server has run ``seconds``: a restart is told from the same
    server by its later start (within 10 ms it cannot be), and real servers run for far
    longer than the few milliseconds of a test's setup."""
    from varsync._backends.reverb.tables import age_seconds as _age_seconds

    with varsync.connect(url, timeout=10) as store:
        deadline = time.monotonic() + 10
        while _age_seconds(store.backend._server_info()["variables"]) < seconds:
            assert time.monotonic() < deadline
            time.sleep(0.01)  # polling the server for a condition, bounded above


# -- a writer killed in the middle of a large push ------------------------------------------------


def _push_and_stall(backend: str, url: str, signature: Any, number: int, reached: Any,
                    release: Any) -> None:
    """Child: push ``filled(signature, number)`` and stall half way through it (until
    killed): Redis after half its chunks were sent, shm after half its leaves were
    written, Reverb once its data streams to the server (its writer's flush)."""
    if backend == "redis":
        from varsync._backends.redis import wire

        real_parts = wire.chunk_parts

        def stalling_parts(views: Any, chunk: int) -> Any:
            parts = list(real_parts(views, chunk))
            for index, part in enumerate(parts):
                if index == len(parts) // 2:
                    reached.set()
                    release.wait(120)
                yield part

        wire.chunk_parts = stalling_parts  # the module the push looks it up in
    elif backend == "shm":
        from varsync_shm import segment

        real_write = segment.write

        def stalling_write(fd: int, plan: Any, arrays: Any) -> None:
            real_write(fd, plan, arrays[:1] + [np.zeros_like(a) for a in arrays[1:]])
            reached.set()
            release.wait(120)
            real_write(fd, plan, arrays)

        segment.write = stalling_write
    else:
        from reverb import trajectory_writer

        real_flush = trajectory_writer.TrajectoryWriter.flush

        def signalling_flush(self: Any, *args: Any, **kwargs: Any) -> Any:
            reached.set()  # append and create_item are done: the item is streaming
            return real_flush(self, *args, **kwargs)

        trajectory_writer.TrajectoryWriter.flush = signalling_flush
    with varsync.connect(url, timeout=60) as store:
        store.push(filled(signature, number))


def _large_push_target(backend: str, request: Any, signature: Any) -> Tuple[str, Any]:
    """A URL with table ``variables`` of ``signature`` on a server (or store) of the test's own."""
    if backend == "redis":
        server = request.getfixturevalue("redis_servers")()
        url = server.url + "?chunk_size=1048576&keep=1&recycle_from=4194304"
        with varsync.connect(url) as store:
            store.create_table("variables", signature)
        return url, server
    if backend == "shm":
        pytest.importorskip("varsync_shm")
        import varsync_shm

        name = f"faults-{uuid.uuid4().hex}"
        request.addfinalizer(lambda: varsync_shm.remove_store(name))
        url = f"shm://{name}"
        with varsync.connect(url) as store:
            store.create_table("variables", signature)
        return url, None
    server = request.getfixturevalue("reverb_servers")({"variables": signature})
    return server.url, server


@pytest.mark.parametrize("backend, megabytes", [("redis", 64), ("shm", 64), ("reverb", 256)])
def test_a_writer_killed_mid_push_leaves_the_last_complete_version_and_no_leaks(
    backend: str, megabytes: int, request: Any
) -> None:
    signature = big(megabytes)
    url, server = _large_push_target(backend, request, signature)
    reader = varsync.connect(url, timeout=60)
    request.addfinalizer(reader.close)
    reader.push(filled(signature, 1))  # the last complete version
    assert reader.version() == 1

    reached, release = CONTEXT.Event(), CONTEXT.Event()
    child = CONTEXT.Process(target=_push_and_stall,
                            args=(backend, url, signature, 2, reached, release), daemon=True)
    child.start()
    request.addfinalizer(lambda: (child.kill(), child.join(10)))
    assert reached.wait(120), "the writer process did not get half way through its push"
    if backend == "redis":  # prove the push is under way: some of its chunks are stored
        deadline = time.monotonic() + 30
        while not any(ttl > 0 for ttl in _keys(server, "varsync::variables:d:*").values()):
            assert time.monotonic() < deadline, "no chunk of the push reached the server"
            time.sleep(0.01)  # polling the server for a condition, bounded above
    if backend != "reverb":  # a reader during the push (Reverb's is too quick to catch)
        assert reader.version() == 1 and content_of(reader.pull()) == 1
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    assert reader.version() == 1, "the killed push was published"
    assert content_of(reader.pull()) == 1
    with varsync.connect(url, timeout=60) as writer:  # the next writer publishes normally
        assert writer.push(filled(signature, 3)) == 2
        assert content_of(reader.pull()) == 3
        assert writer.push(filled(signature, 4)) == 3
    version, values = reader.pull_if_newer(2)
    assert version == 3 and content_of(values) == 4

    if backend == "redis":
        _assert_only_retained_chunks_persist(server, keep=1)
    elif backend == "shm":
        files = os.listdir(reader.table_info().details["path"])
        assert not [f for f in files if f.startswith((".fill-", ".link-", ".sig-"))], files
        assert len(reader.table_info().details["segments"]) <= 2
    else:
        assert reader.table_info().details["current_size"] == 1


def _table_keys(server: Any) -> set:
    """The keys table ``variables`` owns now: its set, head and stream, and the chunks of
    the current version, of the previous versions its head retains and of its spare."""
    head = table_head(server)
    count = int(head["layout"].split(":")[2])  # one table, one layout for every version
    kept = [item for item in head["retained"].split(",") + [head.get("spare", "")] if item]
    tokens = [head["data"]] + [item.split(":")[0] for item in kept]
    owned = {"varsync::tables", "varsync::variables:head", "varsync::variables:events"}
    for token in tokens:
        owned.update(f"varsync::variables:d:{token}:{i}" for i in range(count))
    return owned


def _assert_only_retained_chunks_persist(server: Any, keep: int) -> None:
    """Keys without a TTL are the table's own (current version and ``keep`` previous
    ones); any other key is a chunk of the killed writer's push, carrying the one-hour
    TTL of an unpublished push, so it expires."""
    keys, owned = _keys(server), _table_keys(server)
    assert len([k for k in owned if k.endswith(":0")]) == keep + 2  # current, kept, spare
    assert {k for k, ttl in keys.items() if ttl == -1} == owned
    orphans = {k: ttl for k, ttl in keys.items() if k not in owned}
    assert orphans, "the killed writer left no chunk behind: was it killed mid-push?"
    assert all(":d:" in k and 0 < ttl <= 3_600_000 for k, ttl in orphans.items()), orphans


# -- a reader killed in the middle of a pull -----------------------------------------------------


def _pull_and_stall(backend: str, url: str, reached: Any, release: Any) -> None:
    """Child: pull, and be killed in the middle of it: Redis after the first chunk
    arrived (the next is on its way), Reverb during one of a stream of large pulls."""
    if backend == "redis":
        from varsync._backends.redis import wire

        real_crc = wire.checksum

        def stalling_crc(parts: Any) -> int:
            reached.set()
            release.wait(120)
            return real_crc(parts)

        wire.checksum = stalling_crc  # the module the pull looks it up in
    with varsync.connect(url, timeout=60) as store:
        for _ in range(100):  # bounded: the test kills this process during a pull
            if backend == "reverb":
                reached.set()
            store.pull()


@pytest.mark.parametrize("backend, megabytes", [("redis", 64), ("reverb", 256)])
def test_a_reader_killed_mid_pull_blocks_neither_writers_nor_other_readers(
    backend: str, megabytes: int, request: Any
) -> None:
    signature = big(megabytes)
    url, server = _large_push_target(backend, request, signature)
    if backend == "redis":
        url = url.replace("keep=1", "keep=0")  # the next push retires what it was reading
    writer = varsync.connect(url, timeout=60)
    request.addfinalizer(writer.close)
    writer.push(filled(signature, 1))
    if backend == "redis":
        with server.client() as admin:
            clients_before = admin.info("clients")["connected_clients"]

    reached, release = CONTEXT.Event(), CONTEXT.Event()
    child = CONTEXT.Process(target=_pull_and_stall, args=(backend, url, reached, release),
                            daemon=True)
    child.start()
    request.addfinalizer(lambda: (child.kill(), child.join(10)))
    assert reached.wait(120), "the reader process did not start pulling"
    if backend == "reverb":  # the first signal comes before its first pull: wait for the next
        reached.clear()
        assert reached.wait(120), "the reader process did not pull again"
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    assert writer.push(filled(signature, 2)) == 2
    assert writer.push(filled(signature, 3)) == 3
    with varsync.connect(url, timeout=60) as other:
        assert content_of(other.pull()) == 3
        assert other.pull_if_newer(3) is None
    if backend == "redis":
        keys = _keys(server)
        assert set(keys) == _table_keys(server) and set(keys.values()) == {-1}, keys
        deadline = time.monotonic() + 30
        with server.client() as admin:  # the server dropped the dead reader's connection
            while admin.info("clients")["connected_clients"] > clients_before:
                assert time.monotonic() < deadline, admin.client_list()
                time.sleep(0.01)  # polling the server for a condition, bounded above


# -- Reverb: a checkpointed server killed and restarted from its checkpoint ------------------------


def test_a_reverb_server_killed_and_restarted_from_its_checkpoint_serves_its_last_version(
    reverb_process: Any, tmp_path: Any
) -> None:
    server = reverb_process({"variables": NEST}, str(tmp_path))
    # Long enough for gRPC to reconnect after the restart (its backoff starts at 1 s).
    options = {"timeout": 20}
    with varsync.connect(server.url, **options) as writer, varsync.connect(
        server.url, **options
    ) as behind, varsync.connect(server.url, **options) as ahead, varsync.connect(
        server.url, timeout=TIMEOUT
    ) as impatient:
        writer.push(filled(NEST, 1))
        writer.push(filled(NEST, 2))
        server.checkpoint()  # holds version 2
        held_behind, _ = behind.pull_if_newer(0)
        writer.push(filled(NEST, 3))  # lost in the crash
        held_ahead, values = ahead.pull_if_newer(0)
        assert (held_behind, held_ahead, content_of(values)) == (2, 3, 3)

        server.kill()
        started = time.monotonic()
        with pytest.raises(varsync.BackendConnectionError):
            impatient.version()  # waits for the server up to its timeout
        assert time.monotonic() - started < TIMEOUT + SLACK
        server.start()  # same port, same checkpoint folder

        with varsync.connect(server.url, **options) as fresh:
            assert fresh.version() == 2
            assert content_of(fresh.pull()) == 2  # the last checkpointed version
        # Both readers learn that the server restarted: a reader's version is a count
        # of inserts, which a restarted server counts again.
        with pytest.raises(varsync.TableResetError):
            ahead.pull_if_newer(held_ahead)
        with pytest.raises(varsync.TableResetError):
            behind.pull_if_newer(held_behind)
        assert writer.push(filled(NEST, 4)) == 3  # the number `ahead` holds, another value
        with pytest.raises(varsync.TableResetError):
            ahead.pull_if_newer(held_ahead)
        with pytest.raises(varsync.TableResetError):
            ahead.wait_for(held_ahead, timeout=1)
        version, values = ahead.pull_if_newer(0)
        assert (version, content_of(values)) == (3, 4)
        assert ahead.pull_if_newer(3) is None
        assert behind.pull() is not None and behind.pull_if_newer(3) is None
