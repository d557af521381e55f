"""Connections to one server, and every request made on them: each on a connection taken
and given back safely (an interrupt at any line leaves nothing half read in the pool),
each bounded in time by the socket timeout and by the deadline of the call that made it."""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import os
import select
import socket
import time
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

import redis
from redis import exceptions as rx
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from varsync._backends.redis.errors import OutOfTime
from varsync._backends.redis.options import Settings
from varsync._backends.redis.protocol import Script
from varsync.backend import HostPort, remaining

#: Error replies that mean this server is not (or no longer) what it was taken for: a
#: replica where a primary was expected, or a replica cut off from its primary.
MOVED_ROLE = (rx.ReadOnlyError, rx.MasterDownError)

T = TypeVar("T")


#: Forks this process is from: a pool made before a fork drops its connections in the
#: child (counted here rather than asking getpid, a system call, on every request).
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Pool:
    """Idle connections of one backend, taken and given back without counting: one that
    an interrupt drops between the two is closed when it is collected and costs nothing
    else (redis-py's pool counts its connections, and loses slots that way). A
    connection comes back clean (every reply read) or disconnected, never dirty."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._idle: collections.deque[Any] = collections.deque()
        self._forks = _forks

    def take(self) -> Any:
        if self._forks != _forks:  # forked: the parent's sockets are not ours
            self._idle, self._forks = collections.deque(), _forks
        try:
            return self._idle.pop()
        except IndexError:
            return self._make()

    def take_new(self) -> Any:
        return self._make()

    def give_back(self, conn: Any, clean: bool) -> None:
        if not clean:
            conn.disconnect()
        self._idle.append(conn)

    def disconnect(self) -> None:
        with contextlib.suppress(IndexError):
            while True:
                self._idle.pop().disconnect()


class Client:
    """Requests to one server (``server``, else the one ``settings`` name), over a
    :class:`Pool` of redis-py connections (RESP2: the bulk transfers of :mod:`.wire`
    speak it on their sockets). ``before(deadline)`` runs before each request (a
    :class:`~.topology.Topology` locates the primary there), ``failed(exc)`` on each
    lost connection or refusal that may mean the server changed role.

    ``retries`` is one layer: a small command is sent at most ``retries + 1`` times in
    all, each time on a connection made in one try, and a bulk transfer's new connection
    is made in at most ``retries + 1`` tries (redis-py's own retries are off: under ours
    they multiplied, ``retries`` squared tries and pauses for a call with no deadline)."""

    def __init__(
        self,
        settings: Settings,
        server: HostPort | None = None,
        before: Callable[[float], None] | None = None,
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.socket_timeout = settings.socket_timeout
        self.connect_timeout = settings.connect_timeout
        self.retries = settings.retries
        self.server = server or settings.server
        self._before, self._failed = before, failed
        self._backoff = ExponentialBackoff(cap=0.5, base=0.05)
        connection = redis.SSLConnection if settings.tls else redis.Connection
        self.pool = Pool(
            lambda: connection(
                host=self.server.host,
                port=self.server.port,
                db=settings.db,
                username=settings.username,
                password=settings.password,
                socket_timeout=settings.socket_timeout,
                socket_connect_timeout=settings.connect_timeout,
                retry=Retry(NoBackoff(), 0),  # tries again in _again, not in redis-py
                protocol=2,
                **settings.ssl,
            )
        )

    def move_to(self, server: HostPort) -> None:
        """Send every request from now on to ``server`` (a failover moved the primary)."""
        if server != self.server:
            self.server = server
            self.pool.disconnect()

    def _again(self, deadline: float, attempt: Callable[[], T], tries: int) -> T:
        """``attempt()``, again after a lost or refused connection up to ``tries`` more
        times, pausing by the backoff first; never pausing past ``deadline``. A refused
        password or ACL is final at once."""
        for failures in itertools.count(1):
            try:
                return attempt()
            except (rx.ConnectionError, rx.TimeoutError) as exc:
                if failures > tries or isinstance(exc, rx.AuthenticationError):
                    raise
                pause = self._backoff.compute(failures)
                if remaining(deadline) <= pause:
                    raise
                time.sleep(pause)  # backoff before reconnecting
        raise AssertionError("unreachable")  # pragma: no cover

    def call(
        self, *args: Any, deadline: float = math.inf, retry: bool = True, asking: bool = False
    ) -> Any:
        """One small command's raw reply; tried again on a lost connection up to
        ``retries`` times (``retry=False``: never, for a command that must run once).
        ``asking``: after ``ASKING``, as a Redis Cluster's ASK redirection asks."""

        def command(conn: Any) -> Any:
            if asking:
                conn.send_command("ASKING", check_health=False)
            conn.send_command(*args, check_health=False)
            if asking:
                try:
                    conn.read_response()
                finally:
                    reply = conn.read_response()  # read whole even after an error
                return reply
            return conn.read_response()

        return self._again(
            deadline,
            lambda: self.on_connection(deadline, command, reconnect=False),
            self.retries if retry else 0,
        )

    def script(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        deadline: float = math.inf,
        retry: bool = True,
        asking: bool = False,
    ) -> Any:
        """Run ``script`` by its SHA, sending its text only if the server lacks it."""
        command = (len(keys), *keys, *args)
        try:
            return self.call(
                "EVALSHA", script.sha, *command, deadline=deadline, retry=retry, asking=asking
            )
        except rx.NoScriptError:
            return self.call(
                "EVAL", script.text, *command, deadline=deadline, retry=retry, asking=asking
            )

    def asker(self, deadline: float) -> Callable[..., Any] | None:
        """How a bulk read follows an ASK redirection (:data:`.wire.Ask`): a server
        outside a Redis Cluster never answers one."""
        return None

    def on_connection(
        self,
        deadline: float,
        use: Callable[[Any], Any],
        key: str | None = None,
        reconnect: bool = True,
    ) -> Any:
        """``use(connection)`` on a pooled, connected connection whose every socket
        operation is bounded by ``socket_timeout`` and by what is left until ``deadline``
        (past it: :class:`OutOfTime`). The connection goes back clean, or disconnected
        if ``use`` did not finish: its replies may be half read. ``key``: one of the keys
        ``use`` touches (a Redis Cluster's client sends it to that key's node).
        ``reconnect``: a new connection is made in up to ``retries + 1`` tries (else in
        one: :meth:`call` tries its whole command again)."""
        conn = None
        clean = False
        try:
            if self._before is not None:
                self._before(deadline)
            conn = self.pool.take()
            if (conn.host, conn.port) != self.server:  # made before the primary moved
                conn.disconnect()
                conn = None
                conn = self.pool.take_new()
            if conn._sock is not None and _closed_or_dirty(conn):
                conn.disconnect()  # the server closed it (restarted?) while it was idle
            if conn._sock is None:  # redis-py keeps the connected socket here
                made = conn
                self._again(
                    deadline,
                    lambda: self._connect(made, deadline),
                    self.retries if reconnect else 0,
                )
            bound = self._bound(deadline)
            conn.socket_timeout = bound
            if conn._sock.gettimeout() != bound:  # each settimeout is a system call
                conn._sock.settimeout(bound)
            result = use(conn)
            clean = True
            return result
        except rx.ResponseError as exc:
            clean = True  # an error reply, read whole
            if self._failed is not None and isinstance(exc, MOVED_ROLE):
                self._failed(exc)
            raise
        except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
            if self._failed is not None:
                self._failed(exc)
            if isinstance(exc, rx.TimeoutError) and remaining(deadline) <= 0.01:
                # the deadline's bound, not socket_timeout
                raise OutOfTime("the server did not answer within the call's timeout") from None
            raise
        finally:
            if conn is not None:
                self.pool.give_back(conn, clean)

    def _bound(self, deadline: float) -> float | None:
        """A socket operation's bound now: ``socket_timeout`` or what is left until
        ``deadline``, the shorter; past it, :class:`OutOfTime`."""
        left = remaining(deadline)
        if left <= 0:
            raise OutOfTime("the call's timeout ran out")
        return _least(self.socket_timeout, None if math.isinf(left) else left)

    def _connect(self, conn: Any, deadline: float) -> None:
        """One try to connect ``conn`` (and its handshake), bounded as its requests are."""
        bound = self._bound(deadline)
        conn.socket_timeout = bound
        conn.socket_connect_timeout = _least(self.connect_timeout, bound)
        conn.connect()

    def close(self) -> None:
        self.pool.disconnect()


def _closed_or_dirty(conn: Any) -> bool:
    """Whether an idle connection has something to read: the server closed it, or sent
    what nobody asked for. Either way it cannot carry a request.

    A plain socket shows either on its descriptor: one poll, where redis-py's check
    (below) costs three system calls. It also reads what its parser holds unread, which
    a connection given back clean never has: every use reads its own replies whole. A
    TLS socket may hold decrypted bytes its descriptor does not show."""
    if type(conn._sock) is socket.socket:
        ready = select.poll()
        ready.register(conn._sock, select.POLLIN)
        if not ready.poll(0):
            return False
    try:
        return bool(conn.can_read(timeout=0))
    except (rx.ConnectionError, rx.TimeoutError, OSError):
        return True


def _least(*seconds: float | None) -> float | None:
    """The smallest of these bounds, ``None`` (no bound) being the largest."""
    bounds = [s for s in seconds if s is not None]
    return min(bounds) if bounds else None
