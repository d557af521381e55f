"""Who holds which version: readers report what they hold, learners list them and wait.

A container that was asked to (:meth:`VariableContainer.report_as`) reports, per table,
the version it last handed out: its reader id, host, process, the version and when. The
reports go out from one background thread, so a pull never waits for one: a pull only
notes the version (a dict assignment) and wakes the thread. The thread sends the latest
note of each table, and sends every table's again every ``ttl / 3`` seconds so the
entries stay alive while the reader does; an entry of a reader that stopped (closed,
killed, cut off) expires ``ttl`` seconds after its last report. A report that fails is
logged and tried again on the next round: reporting never raises into the reader.

The backend stores the entries (``supports_reader_registry``: ``report_reader`` and
``readers``, each one small request); the record is JSON made here, opaque to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from varsync.backends.base import Backend, deadline_after, remaining
from varsync.errors import (
    ConfigurationError,
    CorruptDataError,
    PullTimeoutError,
    UnsupportedError,
)

__all__ = [
    "ReaderInfo", "Reporter", "parse_records", "require_registry", "wait_until_held",
    "DEFAULT_TTL",
]

log = logging.getLogger("varsync.readers")

#: Seconds a reader's entry lives after its last report, unless ``report_as`` says.
DEFAULT_TTL = 30.0
#: Longest a ``close`` waits for the reporting thread to finish its round.
_JOIN_SECONDS = 5.0


@dataclass(frozen=True)
class ReaderInfo:
    """One reader's entry: who, where, which version it holds, and since when."""

    reader: str
    host: str
    pid: int
    version: int
    #: ``time.time()`` when the reader got this version.
    at: float
    #: ``time.time()`` of the report, and when the entry expires without another.
    reported: float
    expires: float

    def lag(self, version: int) -> int:
        """Versions this reader is behind a table at ``version``."""
        return max(version - self.version, 0)


def parse_records(table: str, records: Dict[str, str]) -> List[ReaderInfo]:
    """The backend's entries as :class:`ReaderInfo`, sorted by reader id; an entry that is
    not a record varsync writes raises :class:`CorruptDataError`."""
    out = []
    for reader, text in records.items():
        try:
            fields = json.loads(text)
            out.append(ReaderInfo(
                reader=str(reader), host=str(fields["host"]), pid=int(fields["pid"]),
                version=int(fields["version"]), at=float(fields["at"]),
                reported=float(fields["reported"]), expires=float(fields["expires"]),
            ))
        except (ValueError, KeyError, TypeError):
            raise CorruptDataError(
                f"table {table!r}: reader entry {reader!r} is not a varsync reader record: "
                f"{str(text)[:80]!r}"
            ) from None
    return sorted(out, key=lambda info: info.reader)


class Reporter:
    """The background reports of one container (made by ``report_as``)."""

    def __init__(self, backend: Backend, reader: str, ttl: float) -> None:
        if not isinstance(reader, str) or not reader or len(reader) > 200:
            raise ConfigurationError(
                f"a reader id must be a non-empty str of at most 200 characters, got {reader!r}"
            )
        if not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and 0.05 <= ttl <= 86400):
            raise ConfigurationError(
                f"ttl must be a number of seconds from 0.05 to 86400, got {ttl!r}"
            )
        self.backend = backend
        self.reader = reader
        self.ttl = float(ttl)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._held: Dict[str, Tuple[int, float]] = {}
        self._sent: Dict[str, Tuple[int, float]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    def held(self, table: str, version: int) -> None:
        """This container handed out ``version`` of ``table``: note it, wake the thread."""
        with self._lock:
            known = self._held.get(table)
            if known is not None and known[0] == version:
                return
            self._held[table] = (version, time.time())
            if self._thread is None and not self._stop:
                self._thread = threading.Thread(
                    target=self._run, name=f"varsync-reports-{self.reader}", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        refresh = self.ttl / 3
        next_round = 0.0
        while True:
            self._wake.wait(max(next_round - time.monotonic(), 0.0))
            self._wake.clear()
            with self._lock:
                if self._stop:
                    return
                held = dict(self._held)
            due = time.monotonic() >= next_round
            for table, (version, at) in held.items():
                if not due and self._sent.get(table) == (version, at):
                    continue
                self._report(table, version, at)
            if due:
                next_round = time.monotonic() + refresh

    def _report(self, table: str, version: int, at: float) -> None:
        now = time.time()
        record = json.dumps({
            "host": self.host, "pid": self.pid, "version": version, "at": at,
            "reported": now, "expires": now + self.ttl,
        })
        try:
            self.backend.report_reader(table, self.reader, record, self.ttl)
        except Exception as exc:  # never into the reader; the next round tries again
            log.warning("reader %r could not report version %d of table %r: %s",
                        self.reader, version, table, exc)
            self._sent.pop(table, None)
        else:
            self._sent[table] = (version, at)

    def close(self) -> None:
        """Stop the thread (its entries then expire after ``ttl``)."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(_JOIN_SECONDS)


def reader_id() -> str:
    """A default reader id: host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def require_registry(backend: Backend) -> None:
    """Raise :class:`UnsupportedError` unless ``backend`` keeps a reader registry."""
    if not backend.supports_reader_registry:
        raise UnsupportedError(
            f"{type(backend).__name__} ({backend.url}) keeps no reader registry: no "
            "reader can report what it holds there. Use a backend with one "
            "(memory://, redis://, shm://; docs/guide.md, who holds what)."
        )


def wait_until_held(
    listed: Callable[[], List[ReaderInfo]], table: str, version: int, count: int,
    limit: Optional[float],
) -> List[ReaderInfo]:
    """``wait_for_readers``: the readers ``listed()`` names that hold ``version`` or newer,
    once there are ``count`` of them, looked at with a backoff from 2 ms to 0.1 s; a
    :class:`PullTimeoutError` naming who holds what after ``limit`` seconds."""
    deadline = deadline_after(limit)
    interval = 0.002
    while True:
        seen = listed()
        holding = [r for r in seen if r.version >= version]
        if len(holding) >= count:
            return holding
        left = remaining(deadline)
        if left <= 0:
            raise PullTimeoutError(
                f"table {table!r}: {len(holding)} of the {count} readers asked for hold "
                f"version {version} or newer after {limit:g} s; reporting: "
                f"{describe(seen, version)}"
            )
        time.sleep(min(interval, left))
        interval = min(interval * 2, 0.1)


def describe(readers: List[ReaderInfo], table_version: int) -> str:
    """One line per reader, with its lag: for messages."""
    return ", ".join(
        f"{r.reader} at {r.version} (lag {r.lag(table_version)})" for r in readers
    ) or "none"

