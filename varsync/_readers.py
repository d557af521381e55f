"""Who holds which version: readers report what they hold, learners list them and wait.

A container that was asked to (:meth:`VariableContainer.report_as`) reports, per table,
the version it last handed out and the history (epoch) it belongs to: its reader id, host,
process, the version, its history and when. The
reports go out from one background thread, so a pull never waits for one: a pull only
notes the version (a dict assignment) and wakes the thread. The thread sends the latest
note of each table, and sends every table's again every ``ttl / 3`` seconds so the
entries stay alive while the reader does; an entry of a reader that stopped (closed,
killed, cut off) expires ``ttl`` seconds after its last report. A report that fails is
logged and tried again on the next round: reporting never raises into the reader.

Histories: a version means something only in its history (a Redis server restarted
without its data, an shm store made again, start their tables at 1 again). A report
names its history; ``readers`` and ``wait_for_readers`` count only the reports of the
table's history now (the epoch of the store's ``Backend.head``), and a reporter
whose table has left the history of its note stops reporting it, until its container
hands out a version of the new one. Every request is bounded: a listing by its call's
timeout, a report round by the refresh interval (``ttl / 3``).

The backend stores the entries (``SupportsReaderRegistry``: ``report_reader`` and
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
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Callable

from varsync._backends.base import Backend, SupportsReaderRegistry, deadline_after, remaining
from varsync._errors import (
    ConfigurationError,
    CorruptDataError,
    PullTimeoutError,
    UnsupportedError,
)

__all__ = [
    "ReaderInfo",
    "Reporter",
    "parse_records",
    "require_registry",
    "wait_until_held",
    "history_key",
    "of_history",
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
    #: The history (epoch) the version belongs to, as text (``None``: a store whose tables
    #: never restart, or a report from varsync before 0.3).
    history: str | None = None

    def lag(self, version: int) -> int:
        """Versions this reader is behind a table at ``version``."""
        return max(version - self.version, 0)


def parse_records(table: str, records: dict[str, str]) -> list[ReaderInfo]:
    """The backend's entries as :class:`ReaderInfo`, sorted by reader id; an entry that is
    not a record varsync writes raises :class:`CorruptDataError`."""
    out = []
    for reader, text in records.items():
        try:
            fields = json.loads(text)
            out.append(
                ReaderInfo(
                    reader=str(reader),
                    host=str(fields["host"]),
                    pid=int(fields["pid"]),
                    version=int(fields["version"]),
                    at=float(fields["at"]),
                    reported=float(fields["reported"]),
                    expires=float(fields["expires"]),
                    history=_history_field(fields.get("epoch")),
                )
            )
        except (ValueError, KeyError, TypeError):
            raise CorruptDataError(
                f"table {table!r}: reader entry {reader!r} is not a varsync reader record: "
                f"{str(text)[:80]!r}"
            ) from None
    return sorted(out, key=lambda info: info.reader)


def _history_field(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"epoch {value!r} is not text")


def history_key(epoch: Hashable) -> str | None:
    """A history (epoch) as the text a report stores: ``None`` stays ``None``; a tuple
    (shm's file identity) joins its fields, anything else is ``str``."""
    if epoch is None:
        return None
    if isinstance(epoch, tuple):
        return ":".join(str(part) for part in epoch)
    return str(epoch)


def of_history(readers: list[ReaderInfo], epoch: Hashable) -> list[ReaderInfo]:
    """The entries whose version belongs to the history ``epoch`` (the table's now)."""
    key = history_key(epoch)
    return [r for r in readers if r.history == key]


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
        self.registry = require_registry(backend)
        self.reader = reader
        self.ttl = float(ttl)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, float, str | None]] = {}
        self._sent: dict[str, tuple[int, float, str | None]] = {}
        self._left: dict[str, str | None] = {}  # table -> history it left, told once
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def held(self, table: str, version: int, history: Hashable = None) -> None:
        """This container handed out ``version`` of ``table``, of the history (epoch)
        ``history``: note it, wake the thread."""
        key = history_key(history)
        with self._lock:
            known = self._held.get(table)
            if known is not None and known[0] == version and known[2] == key:
                return
            self._held[table] = (version, time.time(), key)
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
            deadline = time.monotonic() + refresh  # a stopped server: one round
            for table, note in held.items():
                if not due and self._sent.get(table) == note:
                    continue
                if due and not self._still_current(table, note, deadline):
                    continue
                self._report(table, *note, deadline)
            if due:
                next_round = time.monotonic() + refresh

    def _still_current(
        self, table: str, note: tuple[int, float, str | None], deadline: float
    ) -> bool:
        """Whether the table is still in the history of ``note`` (asked of the store on
        each refresh round). If it left it, the note is dropped: reporting its version
        would tell a learner that this reader holds a version of the new history. An
        unanswered question keeps the note (the report itself will fail and be retried)."""
        try:
            now = history_key(self.backend.head(table, deadline).epoch)
        except Exception as exc:  # as a failed report: logged, tried again next round
            log.warning(
                "reader %r could not check the history of table %r: %s", self.reader, table, exc
            )
            return True
        if now == note[2]:
            return True
        with self._lock:
            if self._held.get(table) == note:
                del self._held[table]
        self._sent.pop(table, None)
        if self._left.get(table) != note[2]:
            self._left[table] = note[2]
            log.warning(
                "reader %r stops reporting version %d of table %r: the table started a new "
                "history since (the store lost or replaced its data); it reports again "
                "once this container pulls a version of the new one",
                self.reader,
                note[0],
                table,
            )
        return False

    def _report(
        self, table: str, version: int, at: float, history: str | None, deadline: float
    ) -> None:
        now = time.time()
        record = json.dumps(
            {
                "host": self.host,
                "pid": self.pid,
                "version": version,
                "at": at,
                "reported": now,
                "expires": now + self.ttl,
                "epoch": history,
            }
        )
        try:
            self.registry.report_reader(table, self.reader, record, self.ttl, deadline)
        except Exception as exc:  # never into the reader; the next round tries again
            log.warning(
                "reader %r could not report version %d of table %r: %s",
                self.reader,
                version,
                table,
                exc,
            )
            self._sent.pop(table, None)
        else:
            self._sent[table] = (version, at, history)

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


def require_registry(backend: Backend) -> SupportsReaderRegistry:
    """``backend`` as a reader registry; :class:`UnsupportedError` if it keeps none."""
    if not isinstance(backend, SupportsReaderRegistry):
        raise UnsupportedError(
            f"{type(backend).__name__} ({backend.url}) keeps no reader registry: no "
            "reader can report what it holds there. Use a backend with one "
            "(memory://, redis://, shm://; docs/guide.md, who holds what)."
        )
    return backend


def wait_until_held(
    listed: Callable[[float], list[ReaderInfo]],
    table: str,
    version: int,
    count: int,
    limit: float | None,
) -> list[ReaderInfo]:
    """``wait_for_readers``: the readers ``listed(deadline)`` names that hold ``version`` or newer,
    once there are ``count`` of them, looked at with a backoff from 2 ms to 0.1 s; a
    :class:`PullTimeoutError` naming who holds what after ``limit`` seconds."""
    deadline = deadline_after(limit)
    interval = 0.002
    seen: list[ReaderInfo] | None = None
    while True:
        try:
            seen = listed(deadline)  # each listing's requests end with the call
        except PullTimeoutError:
            if seen is None:
                raise PullTimeoutError(
                    f"table {table!r}: the readers could not be listed within {limit:g} s "
                    "(the server did not answer in time)"
                ) from None
            left = 0.0  # the call's time ran out during a listing: the last one tells
        else:
            holding = [r for r in seen if r.version >= version]
            if len(holding) >= count:
                return holding
            left = remaining(deadline)
        if left <= 0:
            held = sum(1 for r in seen if r.version >= version)
            raise PullTimeoutError(
                f"table {table!r}: {held} of the {count} readers asked for hold "
                f"version {version} or newer after {limit:g} s; reporting: "
                f"{describe(seen, version)}"
            )
        time.sleep(min(interval, left))
        interval = min(interval * 2, 0.1)


def describe(readers: list[ReaderInfo], table_version: int) -> str:
    """One line per reader, with its lag: for messages."""
    return (
        ", ".join(f"{r.reader} at {r.version} (lag {r.lag(table_version)})" for r in readers)
        or "none"
    )
