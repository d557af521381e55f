"""The soak's faulty half (``python -m tools.soak --faults on|both``): the same writer and
readers, with interrupts and lost replies, the soak's checks kept, and a count of what the
faults left behind.

- **Interrupts** (``varsync.testing.faults.Interrupter``, seeded): 20 % of the writer's
  pushes and 10 % of each reader's calls (``wait_for``, ``pull_if_newer``) get a
  KeyboardInterrupt at a random moment within 1.2 x the call's median duration, measured
  in the warm-up. An Interrupter works in a main thread only: on reverb, redis and shm
  the writer and each reader are processes and all are interrupted; on memory the writer
  runs in the soak's main thread and is interrupted, its readers (threads) are not.
- **Lost replies** (redis, reverb): the writer and each reader reach the server through
  a ``Proxy`` of their own (in the soak's process) that cuts the connection instead of
  forwarding 1 % of replies. ``BackendConnectionError`` and ``PullTimeoutError`` are
  survived faults; any other exception is an error.
- After an interrupted or failed push the writer reads ``version()`` to learn whether
  push n was published (the version is n) or not (it is n - 1, and n is pushed again),
  so push n is still version n; any other version is inconsistent.
- Left behind: open fds and threads (Python's, and the OS's) of the writer and of each
  reader at the end against after the warm-up (and half way); redis: the server's
  connected clients and keys; shm: the files in the store's directory. Fds or threads
  grown beyond the conformance suite's allowance (4) and still growing in the second
  half, or clients or files grown beyond it, fail the soak. Redis keys are shown, not
  checked: the chunks of a push whose answer was lost stay until their TTL (docs/redis.md).
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import os
import queue
import random
import statistics
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

import varsync
from varsync.testing.faults import Interrupter, Proxy, open_fds
from varsync.testing.values import filled

from .clean import CONTEXT, WARM_UP, check_pull, nest
from .servers import Server, rss_kib

PUSH_FRACTION = 0.2  # of the writer's pushes interrupted
CALL_FRACTION = 0.1  # of each reader's calls interrupted
LOST_REPLIES = 0.01  # of each proxy's replies
TRANSIENT = (varsync.BackendConnectionError, varsync.PullTimeoutError)


def resources() -> dict[str, Any]:
    """What this process holds that a fault could leak."""
    gc.collect()
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            kind = (
                target.split(":[")[0]
                if target.startswith(("socket", "pipe"))
                else (target if ":" in target else os.path.dirname(target))
            )
            if not kind.startswith("/proc"):  # a listdir of /proc/self/fd, this one's too
                kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "fds": open_fds(),
        "threads": threading.active_count(),
        "os threads": len(os.listdir("/proc/self/task")),
        "fd kinds": kinds,
    }


class Faults:
    """Runs a loop's calls, some of them interrupted; counts what happened."""

    def __init__(self, interrupter: Interrupter | None, fraction: float, seed: int) -> None:
        self.interrupter = interrupter
        self.fraction = fraction
        self.random = random.Random(seed)
        self.times: dict[str, list[float]] = {}
        self.typical: dict[str, float] = {}
        self.active = False
        self.interrupted = 0
        self.survived: dict[str, int] = {}

    def start(self) -> None:
        """Faults from now on, interrupts timed by the medians measured so far."""
        self.typical = {kind: statistics.median(times) for kind, times in self.times.items()}
        self.active = True

    def survive(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.survived[name] = self.survived.get(name, 0) + 1

    def call(self, kind: str, fn: Callable[[], Any]) -> tuple[str, Any]:
        """``("done", result)``, ``("interrupted", None)`` or ``("failed", exc)`` for a
        survived fault; any other exception propagates."""
        try:
            if self.active and self.interrupter and self.random.random() < self.fraction:
                after = self.random.uniform(0, 1.2 * self.typical.get(kind, 0.001))
                done, result = self.interrupter.call(fn, after)
                if not done:
                    self.interrupted += 1
                    return "interrupted", None
                return "done", result
            started = time.perf_counter()
            result = fn()
            if not self.active and result is not None:  # a pull that returned a value
                self.times.setdefault(kind, []).append(time.perf_counter() - started)
            return "done", result
        except TRANSIENT as exc:
            self.survive(exc)
            return "failed", exc

    def report(self, outcome: dict[str, Any]) -> None:
        outcome["interrupted"] = self.interrupted
        outcome["fired"] = self.interrupter.fired if self.interrupter else 0
        outcome["survived"] = self.survived
        outcome["typical_ms"] = {k: round(v * 1e3, 3) for k, v in self.typical.items()}


def version_after_fault(store: Any, faults: Faults, seconds: float = 60.0) -> int:
    """The table's version, asked again on transient errors for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return int(store.version())
        except TRANSIENT as exc:
            faults.survive(exc)
            if time.monotonic() > deadline:
                raise


def _interrupter(stack: contextlib.ExitStack, interrupt: bool, seed: int) -> Interrupter | None:
    return stack.enter_context(Interrupter(seed)) if interrupt else None


def faulty_writer(
    url: str,
    options: dict[str, Any],
    signature: Any,
    ready: Any,
    go: Any,
    seconds: float,
    report: Any,
    final: Any,
    release: Any,
    seed: int,
    interrupt: bool,
) -> None:
    outcome: dict[str, Any] = {
        "role": "writer",
        "pushes": 0,
        "errors": [],
        "wrong": [],
        "published_unheard": 0,
        "pushed_again": 0,
    }
    if interrupt and threading.current_thread() is not threading.main_thread():
        raise RuntimeError("faulty_writer interrupts from a main thread only")
    number = 0  # the last push known published (as version == number)
    reported = False
    faulthandler.dump_traceback_later(seconds + 100)  # where a call hangs, if one does
    try:
        with varsync.connect(url, **options) as store, contextlib.ExitStack() as stack:
            if type(store.backend).supports_create_table:
                store.create_table("variables", signature)
            else:  # Reverb: the server has it
                store.signature()
            values = [filled(signature, n) for n in (0, 1)]
            ready.put("writer")
            go.wait(600)
            faults = Faults(_interrupter(stack, interrupt, seed), PUSH_FRACTION, seed)
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                if not faults.active and time.monotonic() - start >= WARM_UP:
                    outcome["rss_start"], outcome["held_start"] = rss_kib(), resources()
                    faults.start()
                if "held_mid" not in outcome and time.monotonic() - start >= seconds / 2:
                    outcome["held_mid"] = resources()
                trying = number + 1
                buffers = values[trying % 2]
                for leaf in varsync.flatten(buffers):
                    leaf[...] = trying
                status, version = faults.call("push", functools.partial(store.push, buffers))
                if status != "done":  # was it published? the version says
                    version = version_after_fault(store, faults)
                    if version == number:
                        outcome["pushed_again"] += 1
                        continue
                    if version == trying:
                        outcome["published_unheard"] += 1
                if version != trying:
                    outcome["wrong"].append(f"push {trying} ({status}): version {version}")
                    if status != "done":
                        break  # the numbering is lost: later checks would only repeat it
                number = outcome["pushes"] = trying
            outcome["held_end"], outcome["rss_end"] = resources(), rss_kib()
            outcome["seconds"] = time.monotonic() - start
            faults.report(outcome)
            final.value = number
            report.put(outcome)
            reported = True
            if release is not None:  # connected while the server's side is counted
                release.wait(300)
    except Exception as exc:  # reported
        final.value = number
        _failed(outcome, exc, reported, report, ready)
    finally:
        faulthandler.cancel_dump_traceback_later()


def faulty_reader(
    url: str,
    options: dict[str, Any],
    mode: str,
    index: int,
    ready: Any,
    go: Any,
    seconds: float,
    report: Any,
    final: Any,
    release: Any,
    seed: int,
    interrupt: bool,
) -> None:
    outcome: dict[str, Any] = {
        "role": f"reader-{index} ({mode})",
        "pulls": 0,
        "polls": 0,
        "errors": [],
        "wrong": [],
    }
    reported = False
    if threading.current_thread() is threading.main_thread():  # one per process
        faulthandler.dump_traceback_later(seconds + 100)
    try:
        with varsync.connect(url, **options) as store, contextlib.ExitStack() as stack:
            store.signature()
            ready.put(f"reader-{index}")
            go.wait(600)
            faults = Faults(_interrupter(stack, interrupt, seed), CALL_FRACTION, seed)
            start = time.monotonic()
            held, held_number = 0, 0
            # Past the writer, without interrupts, until this reader has its last push.
            while time.monotonic() - start < seconds + 60:
                elapsed = time.monotonic() - start
                if not faults.active and WARM_UP <= elapsed < seconds:
                    outcome["rss_start"], outcome["held_start"] = rss_kib(), resources()
                    faults.start()
                if "held_mid" not in outcome and elapsed >= seconds / 2:
                    outcome["held_mid"] = resources()
                if elapsed >= seconds:
                    faults.active = False
                    if 0 <= final.value <= held:
                        break
                if mode == "wait":
                    wait = functools.partial(store.wait_for, held, timeout=1.0)
                    status, _ = faults.call("wait", wait)
                    if status != "done":
                        continue
                status, got = faults.call("pull", functools.partial(store.pull_if_newer, held))
                if status != "done":
                    continue
                if got is None:
                    outcome["polls"] += 1
                    time.sleep(0.0005)  # a poller's cadence, not synchronisation
                    continue
                held, held_number = check_pull(outcome, got[0], got[1], held, held_number)
                del got
            outcome["held_end"], outcome["rss_end"] = resources(), rss_kib()
            outcome["last_version"] = held
            faults.report(outcome)
            report.put(outcome)
            reported = True
            release.wait(300)
    except Exception as exc:  # reported
        _failed(outcome, exc, reported, report, ready)
    finally:
        if threading.current_thread() is threading.main_thread():
            faulthandler.cancel_dump_traceback_later()


def _failed(
    outcome: dict[str, Any], exc: Exception, reported: bool, report: Any, ready: Any
) -> None:
    """Reports an exception: in the outcome, or after it (closing the container)."""
    error = f"{type(exc).__name__}: {exc}"
    if reported:
        report.put({"role": outcome["role"], "late": error})
    else:
        outcome["errors"].append(error)
        report.put(outcome)
        ready.put(outcome["role"])  # if it was not ready yet


# -- what the server's side holds -----------------------------------------------------------


def url_via(url: str, proxy: Proxy) -> str:
    """The same store reached through ``proxy``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + f"{proxy.host}:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def server_side(server: Any) -> Callable[[], dict[str, int]]:
    """Counts on the server's side that faults must not grow."""
    if server.backend == "redis":
        import redis

        def clients() -> dict[str, int]:
            with redis.Redis(*server.address) as client:  # not counted: itself
                return {
                    "redis clients": int(client.info("clients")["connected_clients"]) - 1,
                    "redis keys": int(client.dbsize()),
                }

        return clients
    if server.backend == "shm":
        path = server.store_path
        return lambda: {"shm files": sum(len(files) for _, _, files in os.walk(path))}
    return dict


class _StartReaders:
    """A ``ready`` queue for a writer in this thread: its put starts the readers."""

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start

    def put(self, _: Any) -> None:
        self.start()


# -- one backend --------------------------------------------------------------------------------


def soak_with_faults(
    backend: str, seconds: float, readers: int, megabytes: float, seed: int
) -> dict[str, Any]:
    signature = nest(megabytes)
    server = Server(backend, signature)
    options: dict[str, Any] = {"timeout": 10}
    in_process = backend == "memory"  # the writer in this main thread, readers as threads
    context = CONTEXT
    ready: Any = queue.Queue() if in_process else context.Queue()
    report: Any = queue.Queue() if in_process else context.Queue()
    go: Any = threading.Event() if in_process else context.Event()
    release: Any = threading.Event() if in_process else context.Event()
    final = context.Value("q", -1)
    proxies: list[Proxy] = []
    runners: list[Any] = []
    outcomes: list[dict[str, Any]] = []
    counted = server_side(server)
    held: dict[str, Any] = {}

    def url() -> str:
        if server.address is None:
            return server.url
        proxies.append(Proxy(*server.address))
        return url_via(server.url, proxies[-1])

    def start(target: Callable[..., None], *args: Any) -> None:
        runner = (threading.Thread if in_process else context.Process)(
            target=target, args=args, daemon=True
        )
        runner.start()
        runners.append(runner)

    def start_readers() -> None:
        for index in range(readers):
            mode = "wait" if index == 0 else "poll"
            start(
                faulty_reader,
                url(),
                options,
                mode,
                index,
                ready,
                go,
                seconds,
                report,
                final,
                release,
                seed + 1 + index,
                not in_process,
            )
        for _ in range(readers):
            ready.get(timeout=300)
        go.set()

    def faults_on() -> None:
        held["server_start"] = {**counted(), "memory": server.memory()}
        for index, proxy in enumerate(proxies):
            proxy.lose_replies(LOST_REPLIES, seed=seed + 100 + index)

    late: list[str] = []

    def collect(item: dict[str, Any]) -> None:
        if "late" in item:
            late.append(f"{item['role']}: {item['late']}")
        else:
            outcomes.append(item)

    try:
        if in_process:
            faults_on()  # nothing to count on the server's side, no proxy
            faulty_writer(
                server.url,
                options,
                signature,
                _StartReaders(start_readers),
                go,
                seconds,
                report,
                final,
                None,
                seed,
                True,
            )
        else:
            start(
                faulty_writer,
                url(),
                options,
                signature,
                ready,
                go,
                seconds,
                report,
                final,
                release,
                seed,
                True,
            )
            ready.get(timeout=300)  # the table exists before readers connect
            start_readers()
            time.sleep(WARM_UP)  # as the workers' warm-up: then faults
            faults_on()
        deadline = time.monotonic() + seconds + 150
        while len(outcomes) < readers + 1 and time.monotonic() < deadline:
            try:
                collect(report.get(timeout=1))
            except queue.Empty:
                continue
            if outcomes and outcomes[-1]["role"] == "writer":
                for proxy in proxies:
                    proxy.heal()  # the readers catch up
        held["server_end"] = {**counted(), "memory": server.memory()}
    finally:
        release.set()
        go.set()
        for runner in runners:
            runner.join(30)
            if not in_process and runner.is_alive():
                runner.kill()
                runner.join(10)
        with contextlib.suppress(queue.Empty):
            while True:
                collect(report.get(timeout=0.1))
        held["server_after_exit"] = counted()
        for proxy in proxies:
            proxy.close()
        server.stop()
    start_kib = held.get("server_start", {}).pop("memory", 0)
    end_kib = held.get("server_end", {}).pop("memory", 0)
    return {
        "backend": backend,
        "faults": True,
        "seconds": seconds,
        "megabytes": megabytes,
        "outcomes": outcomes,
        "expected_reports": readers + 1,
        "server": server.memory_name,
        "server_kib": (start_kib, end_kib),
        "lost": sum(p.lost for p in proxies),
        "server_counts": (
            held.get("server_start", {}),
            held.get("server_end", {}),
            held.get("server_after_exit", {}),
        ),
        "late_errors": late,
    }
