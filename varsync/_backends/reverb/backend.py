"""The ``reverb://host:port`` backend: :class:`ReverbBackend`, a client of one Reverb
server whose variables tables are fixed when the server starts."""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, final
from urllib.parse import urlsplit

import numpy as np

from varsync._backends.reverb.engine import (
    DRIVER_ERRORS,
    nested_structure_coder,
    reverb,
    schema_pb2,
    translated,
    translation,
)
from varsync._backends.reverb.sampling import SamplingPool
from varsync._backends.reverb.tables import (
    HOW_TO_CONFIGURE,
    check_table_info,
    check_tf_nest_structure,
    insert_count,
    label_of,
    labelled_version,
    version_of,
)
from varsync._backends.reverb.versions import Followed, ServerRuns, own_version
from varsync._signature import from_json, signature_of, to_json
from varsync._spec import ML_DTYPE_NAMES
from varsync.backend import (
    Backend,
    BackendConnectionError,
    ConfigurationError,
    Head,
    PullTimeoutError,
    Read,
    Spec,
    TableNotFoundError,
    deadline_after,
    parse_host_port,
    parse_wait_for_server,
    refuse_unknown,
    remaining,
    request_timeout,
    retry_until_up,
)

__all__ = ["ReverbBackend", "MAX_PUSH_BYTES"]

#: gRPC's hard limit on one message is 2 GiB; keep headroom for the request's framing.
MAX_PUSH_BYTES = 2**31 - 64 * 2**20

#: The backend's own options (besides timeout and namespace); see docs/reverb.md.
_OPTIONS = ("wait_for_server",)
#: What the URL must look like, quoted in its errors.
_URL_FORM = "reverb://host:port (reverb://localhost:8000)"
#: Samples a pull takes at most while pushes keep landing between count and sample.
_SAMPLE_ATTEMPTS = 3
#: Server-info requests a version check makes at most when the connection was cut, and
#: the pause before the second (doubling after): gRPC reconnects within them.
_INFO_ATTEMPTS = 4
_INFO_PAUSE = 0.05
#: Table infos a head is read from at most while each answer fits two server runs
#: (:meth:`.versions.ServerRuns.epoch`): the last is taken for the later run.
_RUN_ATTEMPTS = 3
#: The ml_dtypes types TensorFlow 2.15 has (``tf.bfloat16``, ``tf.dtypes.experimental``'s
#: float8 types): the ones a Reverb table signature can hold (docs/reverb.md).
STORED_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@final
class ReverbBackend(Backend):
    """A client of one Reverb server; its variables tables are fixed at server start.

    No ability of the protocol: Reverb has no change notification (the core polls
    :meth:`head`), no leaf versions and no reader registry."""

    supports_create_table = False
    shared_across_processes = True
    supports_concurrent_writers = False  # see versions.own_version
    max_push_bytes = MAX_PUSH_BYTES
    supported_ml_dtypes = STORED_ML_DTYPES

    def __init__(self, url: str, *, timeout: float | None, namespace: str, **options: Any):
        refuse_unknown(options, _OPTIONS, "reverb")
        #: Seconds to wait for a server that does not answer yet (None: no bound).
        self.wait_for_server = parse_wait_for_server(options.pop("wait_for_server", False))
        super().__init__(url, timeout=timeout, namespace=namespace, **options)
        server = parse_host_port(url, example=_URL_FORM)
        path = urlsplit(url).path
        if path not in ("", "/"):
            raise ConfigurationError(
                f"the Reverb URL {self.url!r} has a path ({path!r}); a Reverb server has "
                f"nothing to choose by path, so the URL is {_URL_FORM}"
            )
        self.address = server.address
        self._endpoint = (server.host, server.port)
        self._writers: dict[str, Any] = {}
        self._writer_lock = threading.Lock()
        self._runs = ServerRuns(self.address)
        self._followed = Followed()  # the runs the writers and kept samplers were made in
        self._sampler = SamplingPool(self.address)
        self._client = retry_until_up(  # fail now, with the address, if nothing answers
            self._connect,
            address=self.address,
            bound=self.wait_for_server,
            what="Reverb server",
        )

    def _connect(self, seconds_left: float) -> Any:
        """A client of the server once it has answered one request within ``seconds_left``.
        A new client each attempt: one whose channel failed retries only after gRPC's
        backoff, which grows to minutes."""
        self._probe(limit=min(5.0, max(seconds_left, 0.1)))
        # The failed attempt's client goes first: gRPC shares a connection among the live
        # clients of an address, and a new one would wait out the old one's backoff.
        self._client = None
        self._client = reverb.Client(self.address)
        limit = min(math.inf if self.timeout is None else self.timeout, max(seconds_left, 1.0))
        self._server_info(time.monotonic() + limit)
        return self._client

    def _probe(self, limit: float = 5.0) -> None:
        """Fail fast when nothing listens: Reverb's own calls wait out their deadline."""
        limit = limit if self.timeout is None else min(self.timeout, limit)
        try:
            socket.create_connection(self._endpoint, timeout=max(limit, 0.1)).close()
        except OSError as exc:
            raise BackendConnectionError(
                f"no Reverb server answers at {self.address}: {exc}. Is the server "
                "running, and is the address right?"
            ) from exc

    @property
    def _idle_workers(self) -> list[Any]:
        """The warm sampling threads (for tests)."""
        return self._sampler.idle

    # -- requests --------------------------------------------------------------------

    def _server_info(self, deadline: float = math.inf) -> dict[str, Any]:
        """Every table's info by server table name, as ``schema_pb2.TableInfo`` protos;
        bounded by ``deadline`` and the container's timeout. One table's: :meth:`_info`."""
        infos = (schema_pb2.TableInfo.FromString(blob) for blob in self._info_blobs(deadline))
        return {info.name: info for info in infos}

    def _info_blobs(self, deadline: float) -> list[bytes]:
        """Every table's info, serialized: Reverb's ServerInfo answer, bounded by
        ``deadline`` and the container's timeout (Reverb takes whole seconds, 0 meaning
        no bound). Reverb has no request for one table's info: every call answers them all.

        The raw protos, not ``reverb.Client.server_info``: that one decodes every table's
        signature in Python, which measured 0.5 ms -> 9 ms per call once a 500-leaf
        table is on the server; version checks need none of it. Each version check makes
        this request, so it catches Reverb's exceptions itself: ``translated`` as a
        context manager measured ~12 us more per request (of ~150 us on loopback).
        """
        end = min(deadline, deadline_after(self.timeout))
        for attempt in range(_INFO_ATTEMPTS):
            left = request_timeout(end, None)
            try:
                blobs: list[bytes] = self._client._client.ServerInfo(
                    0 if left is None else max(1, math.ceil(left))
                )
                return blobs
            except DRIVER_ERRORS as exc:
                error = translation(self.address, "asking for the server's tables", exc)
                if error is exc:
                    raise
                # A connection cut since the last call fails the next ones at once
                # ("Socket closed", "Transport closed") until gRPC has reconnected: this
                # request is idempotent, so ask again after a pause, within its bound.
                pause = _INFO_PAUSE * 2**attempt
                if attempt + 1 == _INFO_ATTEMPTS or remaining(end) <= pause:
                    raise error from exc
                time.sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _translated(self, doing: str) -> AbstractContextManager[None]:
        return translated(self.address, doing)

    def _table_name(self, name: str) -> str:
        return f"{self.namespace}/{name}" if self.namespace else name

    def _info(self, name: str, deadline: float = math.inf) -> Any | None:
        """Table ``name``'s info, the others' not decoded; ``None`` if it has none."""
        return _one_info(self._info_blobs(deadline), self._table_name(name))

    def _checked_info(self, name: str, deadline: float = math.inf) -> Any:
        info = self._info(name, deadline)
        if info is None:
            raise TableNotFoundError(
                f"Reverb table {self._table_name(name)!r} is gone from {self.address} "
                "(the server restarted with other tables?)"
            )
        return info

    def _look(self, name: str, deadline: float) -> tuple[Any, Head, float]:
        """Table ``name``'s info, the :class:`Head` it shows (the version, and the server
        run it counts in: :class:`.versions.ServerRuns`) and when it was asked for. An
        answer so slow that it fits two runs is asked again (rare: it took longer than a
        run lasted)."""
        for attempt in range(_RUN_ATTEMPTS):
            asked_at = time.monotonic()
            info = self._checked_info(name, deadline)
            epoch = self._runs.epoch(info, asked_at, settle=attempt + 1 == _RUN_ATTEMPTS)
            if epoch is not None:
                return info, Head(version_of(info), epoch), asked_at
        raise AssertionError("unreachable: the last attempt settles")

    # -- tables ----------------------------------------------------------------------

    def signature(self, name: str) -> str | None:
        info = self._info(name)
        if info is None:
            return None
        decoded = (
            nested_structure_coder.decode_proto(info.signature)
            if info.HasField("signature")
            else None
        )
        check_table_info(self._table_name(name), info, self.address, decoded)
        return to_json(signature_of(decoded))

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        check_tf_nest_structure(from_json(signature))
        stored = self.signature(name)
        if stored is None:
            raise TableNotFoundError(
                f"Reverb table {self._table_name(name)!r} does not exist at {self.address}, "
                "and Reverb cannot add tables to a running server: they are fixed when the "
                f"server starts. {HOW_TO_CONFIGURE}"
            )
        return stored

    def tables(self) -> list[str]:
        prefix = f"{self.namespace}/" if self.namespace else ""
        return sorted(
            n[len(prefix) :] for n in self._server_info() if n.startswith(prefix) and n != prefix
        )

    def details(self, name: str) -> dict[str, Any]:
        info = self._checked_info(name)
        return {
            "address": self.address,
            "server_table": info.name,
            "current_size": info.current_size,
            "inserts": insert_count(info),
        }

    # -- data ------------------------------------------------------------------------

    def head(self, name: str, deadline: float) -> Head:
        return self._look(name, deadline)[1]

    def write(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> Head:
        table = self._table_name(name)
        with self._writer_lock:
            before, was = self._insert(name, table, arrays, specs, deadline)
            # The count again: the insert is ours if it rose by exactly one (the lock
            # keeps this container's other pushes out of the window, not other writers').
            after, head, _ = self._look(name, deadline)
        restarted = head.epoch != was.epoch or insert_count(after) < insert_count(before)
        return Head(own_version(table, before, after, restarted), head.epoch)

    def write_unversioned(
        self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec], deadline: float
    ) -> None:
        # The same insert, labelled from the count read before it as every push is, but
        # without the request after it that only numbers the push for its caller.
        with self._writer_lock:
            self._insert(name, self._table_name(name), arrays, specs, deadline)

    def _insert(
        self,
        name: str,
        table: str,
        arrays: Sequence[np.ndarray],
        specs: Sequence[Spec],
        deadline: float,
    ) -> tuple[Any, Head]:
        """Insert ``arrays`` as the table's item (under the writer lock), labelled with the
        version the count read first says it will be (:func:`.tables.label_of`); return
        that table info and head. A flushed insert has landed: a pull after it sees it."""
        before, head, asked_at = self._look(name, deadline)
        if self._followed.moved(("write", table), head.epoch, before, asked_at):
            # A writer's stream to a server that restarted does not recover.
            _close_quietly(self._writers.pop(table, None))
        label = label_of(insert_count(before) + 1)
        limit = request_timeout(deadline, self.timeout)
        # (ml_dtypes' types are user-defined dtypes, isbuiltin 2: asked first, as a
        # dtype's name takes ~40x as long to make)
        if any(s.dtype.isbuiltin != 1 and s.dtype.name in ML_DTYPE_NAMES for s in specs):
            self._insert_natively(table, before, arrays, label, limit)
        else:
            self._append(table, arrays, label, limit)
        return before, head

    def _append(
        self, table: str, arrays: Sequence[np.ndarray], label: float, limit: float | None
    ) -> None:
        """Push through the table's long-lived trajectory writer (under the writer lock),
        with the priority ``label`` (:func:`.tables.label_of`), within ``limit`` seconds."""
        writer = self._writers.get(table)
        if writer is None:
            writer = self._open_writer(table)
        try:
            writer.append(list(arrays))
            # A one-step trajectory (not a squeezed column), exactly what TF-Agents writes.
            writer.create_item(table, label, [column[-1:] for column in writer.history])
            writer.flush(timeout_ms=_milliseconds(limit))
        except BaseException as exc:
            # The writer's stream may be broken, or (interrupted) still hold this item:
            # start the next push on a new one, so nothing of this one lands later.
            self._writers.pop(table, None)
            _close_quietly(writer)
            # (translated here, not by a context manager around every push: see _info_blobs)
            error = translation(self.address, f"pushing to table {table!r}", exc)
            if error is exc:
                raise
            raise error from exc

    def _insert_natively(
        self, table: str, info: Any, arrays: Sequence[np.ndarray], label: float, limit: float | None
    ) -> None:
        """Push an item holding a bfloat16 or float8 array (under the writer lock).

        Reverb's Python writer refuses those dtypes ("Unsupported numpy type"), and an
        item of their bit patterns as unsigned ints is one TF-Agents' sample op refuses
        (the table signature says bfloat16): so Reverb's TensorFlow insert op, the one
        TF-Agents' pushes use, stores them as the dtypes they are. It has no timeout of its
        own; it runs on a sampling worker, abandoned after ``limit`` seconds.
        """
        if not self._sampler.insert(info, list(arrays), label, limit):
            raise BackendConnectionError(
                f"pushing to Reverb table {table!r} at {self.address} took longer than "
                f"{limit} s; the insert was abandoned (it may still land)"
            )

    def _open_writer(self, table: str) -> Any:
        """A new trajectory writer for ``table``, kept for its next pushes (one long-lived
        writer per table measured about twice as fast as one per insert)."""
        with self._translated(f"opening a writer for table {table!r}"):
            writer = self._client.trajectory_writer(num_keep_alive_refs=1, validate_items=False)
        self._writers[table] = writer
        return writer

    def read(self, name: str, newer_than: int, deadline: float, specs: Sequence[Spec]) -> Read:
        # ``specs`` go unused: a sample asks for the dtypes of the server's signature as it
        # is now, which a container's cached specs may no longer be.
        info, head, asked_at = self._look(name, deadline)
        if self._followed.moved(("sample", info.name), head.epoch, info, asked_at):
            self._sampler.forget(info.name)  # kept samplers of a server run that is gone
        if head.version <= newer_than:
            return Read(head, None)
        for attempt in range(_SAMPLE_ATTEMPTS):
            last = attempt == _SAMPLE_ATTEMPTS - 1
            # The last attempt holds this container's writer lock: its own pushes (other
            # threads) cannot land in between; only another process's still can.
            with self._writer_lock if last else contextlib.nullcontext():
                if last:
                    info, head, _ = self._look(name, deadline)
                arrays, label = self._sample(info, deadline)
                if labelled_version(label) == head.version:
                    # The writer's label names the count read before the sample: exactly
                    # this insert (see labelled_version), without asking again.
                    return Read(head, arrays)
                # Else only a count unchanged across the sample says which insert was
                # sampled (one that moved means the item may be newer than ``head``), or
                # a label between the counts before and after it: the sampled insert is
                # one of those, and its label names it (a raced push's, at most it: a
                # newer value under the older number, as docs/guarantees.md allows);
                # either within one server run.
                again, after, _ = self._look(name, deadline)
            if after.epoch == head.epoch:
                if insert_count(again) == insert_count(info):
                    return Read(head, arrays)
                labelled = labelled_version(label)
                if head.version <= labelled <= after.version:
                    return Read(Head(labelled, head.epoch), arrays)
            sampled_as, info, head = head, again, after
        # A writer out-pushing the sampler: the value is at least as new as the count read
        # before its sample, never older (docs/guarantees.md, Reverb).
        return Read(sampled_as, arrays)

    def _sample(self, info: Any, deadline: float) -> tuple[list[np.ndarray], float]:
        """The table's single item and its priority; :class:`PullTimeoutError` at
        ``deadline`` (or after the backend's timeout), the sample abandoned (see
        :mod:`.sampling`)."""
        limit = request_timeout(deadline, self.timeout)
        sampled = self._sampler.sample(info, limit, self._client)
        if sampled is None:
            self._probe(limit=0.5)  # a server that is gone is no timeout
            raise PullTimeoutError(
                f"sampling Reverb table {info.name!r} at {self.address} took longer than "
                f"{limit} s (did the server restart empty?); the sample was abandoned"
            )
        return sampled

    def close(self) -> None:
        with self._writer_lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            _close_quietly(writer)
        self._sampler.close()
        # The gRPC channel too: while it lived, a new client of this address would share
        # its connection, and wait out that connection's reconnect backoff.
        self._client = None

    def describe_options(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "namespace": self.namespace,
            "server": self.address,
            "wait_for_server": self.wait_for_server,
        }


def _one_info(blobs: list[bytes], table: str) -> Any | None:
    """``table``'s info among ServerInfo's serialized ones, the others not decoded (a blob
    holds its table's name as it is, UTF-8 bytes); ``None`` if it has none."""
    needle = table.encode()
    for blob in blobs:
        if needle in blob:
            info = schema_pb2.TableInfo.FromString(blob)
            if info.name == table:
                return info
    return None


def _milliseconds(timeout: float | None) -> int | None:
    """A timeout as Reverb's flush takes it: whole milliseconds in a C int, or no bound."""
    if timeout is None or timeout * 1000 > 2**31 - 1:  # over 24 days: no bound
        return None
    return max(1, int(timeout * 1000))


def _close_quietly(writer: Any) -> None:
    if writer is None:
        return
    with contextlib.suppress(Exception):  # a writer whose server is gone: not the cause
        writer.close()
