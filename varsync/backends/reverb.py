"""``reverb://host:port``: variables in the tables of a Reverb server (extra ``reverb``).

Tables are the ones TF-Agents' ``ReverbVariableContainer`` uses: ``max_size=1``,
``max_times_sampled=0``, a ``MinSize(1)`` rate limiter and the variables' specs as the
signature. Either container reads what the other wrote.

- **Version** = the table's count of completed inserts (from ``server_info``: one small
  request, whatever the table's size). TF-Agents' pushes count too. The count restarts
  when the server restarts, so a reader that holds a version and finds the server
  restarted (its insert count went down, or its table worker started later) gets
  ``TableResetError`` instead of an older value, an endless wait, or a new value
  ignored because the new count reached its number again.
- **Push** goes through one long-lived trajectory writer per table: measured about twice
  as fast as a new writer per insert (``client.insert``, TF-Agents' ``TFClient.insert``);
  see ``benchmarks/``. The version returned is the insert count read right after the
  push was confirmed. Before each push the table's insert count and age are checked: a
  writer whose server restarted is replaced, so the push after a restart goes through.
- **Pull** checks the count first (an empty table is never sampled, so it never blocks),
  then samples the single item on a (reused) worker thread bounded by the timeout.
- **Size**: Reverb aborts the client process when one insert request exceeds gRPC's 2 GB
  limit, so pushes above :data:`MAX_PUSH_BYTES` are refused before anything is sent.
- Reverb has no change notification: ``wait`` polls the count (growing interval, 50 ms
  at most).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import numpy as np

try:
    import reverb
    from reverb.cc import schema_pb2
    from reverb.cc.ops import gen_reverb_ops
    import tensorflow as tf
    from tensorflow.python.saved_model import nested_structure_coder
except ImportError as exc:  # pragma: no cover - exercised where the extra is missing
    from varsync.errors import MissingDependencyError

    raise MissingDependencyError(
        f"the reverb:// backend needs dm-reverb and TensorFlow ({exc.name} is missing); "
        'install them with: pip install "varsync[reverb]" (Linux x86-64, Python 3.9-3.11)'
    ) from exc

from varsync import signature as sig
from varsync.adapters.tensorflow import numpy_view
from varsync.backends.base import Backend, Snapshot, deadline_after, remaining
from varsync.errors import (
    BackendConnectionError,
    ConcurrentPushError,
    ConfigurationError,
    MissingSignatureError,
    PullTimeoutError,
    TableConfigurationError,
    TableNotFoundError,
    TableResetError,
    VarsyncError,
)
from varsync.server_wait import parse_wait_for_server, retry_until_up
from varsync.signature import Spec

__all__ = ["ReverbBackend", "MAX_PUSH_BYTES", "check_table_info"]

#: gRPC's hard limit on one message is 2 GiB; keep headroom for the request's framing.
MAX_PUSH_BYTES = 2**31 - 64 * 2**20

#: Seconds a table worker's start may seem to move before it counts as a restart: its six
#: state times are reported in whole milliseconds, and a restarted server started (at
#: least) the old one's lifetime later.
_RESTART_SLACK = 0.01
#: The backend's own options (besides timeout and namespace); see docs/reverb.md.
_OPTIONS = ("wait_for_server",)
#: Samples a pull takes at most while pushes keep landing between count and sample.
_SAMPLE_ATTEMPTS = 3

HOW_TO_CONFIGURE = (
    "varsync.reverb.serve({name: signature}) builds such a server; by hand: "
    "reverb.Table(name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(), "
    "rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0, "
    "signature=<nest of tf.TensorSpec>)"
)


def check_table_info(name: str, info: Any, address: str, signature: Any) -> None:
    """Raise if the server's table (``info``, a ``schema_pb2.TableInfo``; ``signature``,
    its decoded signature or ``None``) cannot hold variables the way TF-Agents' do."""
    where = f"Reverb table {name!r} at {address}"
    if info.max_size != 1:
        raise TableConfigurationError(
            f"{where} has max_size={info.max_size}; a variables table holds exactly the "
            f"latest value, so max_size must be 1. {HOW_TO_CONFIGURE}"
        )
    if info.max_times_sampled != 0:
        raise TableConfigurationError(
            f"{where} has max_times_sampled={info.max_times_sampled}; items would vanish "
            f"after being pulled, so it must be 0 (unlimited). {HOW_TO_CONFIGURE}"
        )
    limiter = info.rate_limiter_info
    if limiter.min_size_to_sample != 1 or limiter.max_diff < 1e300:
        raise TableConfigurationError(
            f"{where} has a rate limiter that can block pulls (min_size_to_sample="
            f"{limiter.min_size_to_sample}, max_diff={limiter.max_diff}); use MinSize(1). "
            f"{HOW_TO_CONFIGURE}"
        )
    if signature is None or not tf.nest.flatten(signature):
        raise MissingSignatureError(
            f"{where} has no signature (or one without leaves); varsync (like TF-Agents) "
            f"needs the variables' specs as the table signature. {HOW_TO_CONFIGURE}"
        )


class ReverbBackend(Backend):
    """A client of one Reverb server; its variables tables are fixed at server start."""

    supports_create_table = False
    shared_across_processes = True
    supports_concurrent_writers = False  # see _own_version
    max_push_bytes = MAX_PUSH_BYTES

    def __init__(self, url: str, *, timeout: Optional[float], namespace: str, **options: Any):
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"the reverb backend takes no option(s) {unknown}; its options are "
                f"{', '.join(_OPTIONS)}, and timeout, namespace"
            )
        #: Seconds to wait for a server that does not answer yet (None: no bound).
        self.wait_for_server = parse_wait_for_server(options.pop("wait_for_server", False))
        super().__init__(url, timeout=timeout, namespace=namespace, **options)
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port or parts.path not in ("", "/"):
            raise ConfigurationError(
                f"Reverb URL {self.url!r} must be reverb://host:port, e.g. reverb://localhost:8000"
            )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        self.address = f"{host}:{port}"
        self._endpoint = (parts.hostname, port)
        self._client = retry_until_up(  # fail now, with the address, if nothing answers
            self._connect, address=self.address, bound=self.wait_for_server,
            what="Reverb server",
        )
        self._writers: Dict[str, Any] = {}
        self._writer_lock = threading.Lock()
        # (purpose, server table) -> (latest start time of the server, insert count, when
        # that was answered)
        self._incarnations: Dict[Tuple[str, str], Tuple[float, int, float]] = {}
        self._incarnations_lock = threading.Lock()
        self._idle_workers: List[_Worker] = []  # warm sampling threads, see _sample
        self._workers_lock = threading.Lock()
        self._workers_pid = os.getpid()
        self._closed = False
        # (server table, signature proto) -> (TensorFlow client handle, dtypes); see
        # _sampling_client
        self._sampling_clients: Dict[Tuple[str, bytes], Tuple[Any, List[Any]]] = {}
        # also when never closed (not at interpreter exit: the process frees all anyway)
        weakref.finalize(self, _release, self._idle_workers, self._sampling_clients).atexit = False

    def _connect(self, seconds_left: float) -> Any:
        """A client of the server once it has answered one request within ``seconds_left``.
        A new client each attempt: one whose channel failed retries only after gRPC's
        backoff, which grows to minutes."""
        self._probe(*self._endpoint, limit=min(5.0, max(seconds_left, 0.1)))
        self._client = reverb.Client(self.address)
        limit = min(math.inf if self.timeout is None else self.timeout, max(seconds_left, 1.0))
        self._server_info(timeout=None if math.isinf(limit) else limit)
        return self._client

    def _probe(self, host: str, port: int, limit: float = 5.0) -> None:
        """Fail fast when nothing listens: Reverb's own calls wait out their deadline."""
        limit = limit if self.timeout is None else min(self.timeout, limit)
        try:
            socket.create_connection((host, port), timeout=max(limit, 0.1)).close()
        except OSError as exc:
            raise BackendConnectionError(
                f"no Reverb server answers at {self.address}: {exc}. Is the server "
                "running, and is the address right?"
            ) from exc

    # -- requests --------------------------------------------------------------------

    def _server_info(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Table infos by server table name, as ``schema_pb2.TableInfo`` protos; bounded
        by ``timeout`` (default: the container's). Reverb takes whole seconds, 0 meaning
        no bound.

        The raw protos, not ``reverb.Client.server_info``: that one decodes every table's
        signature in Python, which measured 0.5 ms -> 9 ms per call once a 500-leaf
        table is on the server; version checks need none of it.
        """
        limit = self.timeout if timeout is None else timeout
        seconds = 0 if limit is None else max(1, math.ceil(limit))
        started = time.monotonic()
        try:
            with self._translated("asking for the server's tables"):
                blobs = self._client._client.ServerInfo(seconds)
        except BackendConnectionError:
            # A connection cut since the last call fails the next one at once ("Socket
            # closed") before gRPC reconnects: this request is idempotent, so ask again
            # once, within what is left of its bound.
            left = None if limit is None else limit - (time.monotonic() - started)
            if left is not None and left <= 0:
                raise
            with self._translated("asking for the server's tables"):
                blobs = self._client._client.ServerInfo(
                    0 if left is None else max(1, math.ceil(left))
                )
        infos = (schema_pb2.TableInfo.FromString(blob) for blob in blobs)
        return {info.name: info for info in infos}

    def _sampling_client(self, info: Any) -> Tuple[Any, List[Any]]:
        """A TensorFlow-side Reverb client for sampling ``info``'s table, and the dtypes of
        the table's columns in flat order.

        Reverb's sample op checks the dtypes asked for against the table signatures its
        client read from the server on first use, and never reads them again. So each
        (table, signature) gets a client of its own: a server restarted at the same
        address with a changed table gets a new client, never a stale check. Decoding a
        large signature takes milliseconds, so that too happens once per signature.
        """
        key = (info.name, info.signature.SerializeToString(deterministic=True))
        with self._workers_lock:
            known = self._sampling_clients.get(key)
            if known is not None:
                return known
            for old in [k for k in self._sampling_clients if k[0] == info.name]:
                _destroy_quietly(self._sampling_clients.pop(old)[0])
        decoded = nested_structure_coder.decode_proto(info.signature)
        dtypes = [spec.dtype for spec in tf.nest.flatten(decoded)]
        with self._translated("creating a TensorFlow client"):
            handle = gen_reverb_ops.reverb_client(
                server_address=self.address,
                shared_name=f"varsync-{id(self):x}-{next(_CLIENT_NUMBERS)}",
            )
        with self._workers_lock:
            raced = self._sampling_clients.setdefault(key, (handle, dtypes))
        if raced[0] is not handle:  # another pull made one meanwhile: use that one
            _destroy_quietly(handle)
        return raced

    def _translated(self, doing: str) -> "_ReverbErrors":
        return _ReverbErrors(self.address, doing)

    def _table_name(self, name: str) -> str:
        return f"{self.namespace}/{name}" if self.namespace else name

    def _info(self, name: str, timeout: Optional[float] = None) -> Optional[Any]:
        return self._server_info(timeout).get(self._table_name(name))

    def _checked_info(self, name: str, timeout: Optional[float] = None) -> Any:
        info = self._info(name, timeout)
        if info is None:
            raise TableNotFoundError(
                f"Reverb table {self._table_name(name)!r} is gone from {self.address} "
                "(the server restarted with other tables?)"
            )
        return info

    # -- tables ----------------------------------------------------------------------

    def signature(self, name: str) -> Optional[str]:
        info = self._info(name)
        if info is None:
            return None
        decoded = (
            nested_structure_coder.decode_proto(info.signature)
            if info.HasField("signature")
            else None
        )
        check_table_info(self._table_name(name), info, self.address, decoded)
        return sig.to_json(sig.signature_of(decoded))

    def create_table(self, name: str, signature: str, specs: Sequence[Spec]) -> str:
        stored = self.signature(name)
        if stored is None:
            raise TableNotFoundError(
                f"Reverb table {self._table_name(name)!r} does not exist at {self.address}, "
                "and Reverb cannot add tables to a running server: they are fixed when the "
                f"server starts. {HOW_TO_CONFIGURE}"
            )
        return stored

    def tables(self) -> List[str]:
        prefix = f"{self.namespace}/" if self.namespace else ""
        return sorted(
            n[len(prefix):] for n in self._server_info() if n.startswith(prefix) and n != prefix
        )

    def details(self, name: str) -> Dict[str, Any]:
        info = self._checked_info(name)
        return {
            "address": self.address,
            "server_table": info.name,
            "current_size": info.current_size,
            "inserts": _insert_count(info),
        }

    # -- data ------------------------------------------------------------------------

    def version(self, name: str) -> int:
        return _version_of(self._checked_info(name))

    def version_within(self, name: str, timeout: Optional[float]) -> int:
        return _version_of(self._checked_info(name, timeout))

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> int:
        table = self._table_name(name)
        with self._writer_lock:
            asked_at = time.monotonic()
            before = self._checked_info(name)
            if self._restarted(("write", table), before, asked_at):
                # A writer's stream to a server that restarted does not recover.
                _close_quietly(self._writers.pop(table, None))
            writer = self._writers.get(table)
            if writer is None:
                with self._translated(f"opening a writer for table {table!r}"):
                    writer = self._client.trajectory_writer(
                        num_keep_alive_refs=1, validate_items=False
                    )
                self._writers[table] = writer
            try:
                with self._translated(f"pushing to table {table!r}"):
                    writer.append(list(arrays))
                    # A one-step trajectory (not a squeezed column), exactly what TF-Agents writes.
                    writer.create_item(table, 1.0, [column[-1:] for column in writer.history])
                    writer.flush(timeout_ms=_milliseconds(self.timeout))
            except BaseException:
                # The writer's stream may be broken, or (interrupted) still hold this item:
                # start the next push on a new one, so nothing of this one lands later.
                self._writers.pop(table, None)
                _close_quietly(writer)
                raise
            asked_at = time.monotonic()
            info = self._checked_info(name)
            restarted = self._restarted(("write", table), info, asked_at)  # remember it
        return _own_version(table, before, info, restarted)

    def _restarted(self, key: Tuple[str, str], info: Any, asked_at: float,
                   remember: bool = True) -> bool:
        """True when the server behind ``key`` is not the one last remembered for it: its
        insert count went down, or its table worker (whose state times add up to its age)
        started later. ``info`` was asked for at ``asked_at``, so the worker started
        between ``asked_at - age`` and now ``- age``, however slow the answer."""
        age = _age_seconds(info)
        answered_at = time.monotonic()
        earliest, latest = asked_at - age, answered_at - age
        count = _insert_count(info)
        with self._incarnations_lock:
            seen = self._incarnations.get(key)
            if seen is not None and asked_at < seen[2]:
                # Asked before the remembered answer arrived (another thread's): it may be
                # the older of the two, so a lower count or later start proves nothing.
                return False
            if remember or seen is None:
                self._incarnations[key] = (latest, count, answered_at)
        return seen is not None and (count < seen[1] or earliest - seen[0] > _RESTART_SLACK)

    def _check_same_server(self, name: str, info: Any, asked_at: float, newer_than: int) -> None:
        """A version read from an earlier run of the server means nothing now (its
        versions are counted again), even when the count reaches it again: the holder
        gets TableResetError until it resynchronises with ``newer_than=0``."""
        table = self._table_name(name)
        if self._restarted(("read", table), info, asked_at, remember=newer_than == 0) and newer_than:
            raise TableResetError(
                f"Reverb table {table!r} at {self.address} is on a restarted server (now at "
                f"version {_version_of(info)}) since you read version {newer_than}: versions "
                "are counted again after a restart, so yours means nothing now; pull() to "
                "resynchronise."
            )

    def read(self, name: str, newer_than: int, timeout: Optional[float]) -> Snapshot:
        deadline = deadline_after(timeout)

        def left() -> Optional[float]:  # every request within what is left of the call
            seconds = remaining(deadline)
            return None if math.isinf(seconds) else max(seconds, 0.001)

        asked_at = time.monotonic()
        info = self._checked_info(name, left())
        self._check_same_server(name, info, asked_at, newer_than)
        version = _version_of(info)
        if version <= newer_than:
            return version, None
        for attempt in range(_SAMPLE_ATTEMPTS):
            last = attempt == _SAMPLE_ATTEMPTS - 1
            # The last attempt holds this container's writer lock: its own pushes (other
            # threads) cannot land in between; only another process's still can.
            with self._writer_lock if last else contextlib.nullcontext():
                if last:
                    info = self._checked_info(name, left())
                    version = _version_of(info)
                arrays = self._sample(info, left())
                # Only a count unchanged across the sample says which insert was sampled:
                # one that moved means the item may be newer than ``version``.
                again = self._checked_info(name, left())
            if _insert_count(again) == _insert_count(info):
                return version, arrays
            sampled_as, info, version = version, again, _version_of(again)
        # A writer out-pushing the sampler: the value is at least as new as the count read
        # before its sample, never older (docs/guarantees.md, Reverb).
        return sampled_as, arrays

    def wait(self, name: str, newer_than: int, timeout: Optional[float]) -> int:
        deadline = deadline_after(timeout)

        def check_same_server() -> None:
            seconds = remaining(deadline)
            bound = None if math.isinf(seconds) else max(seconds, 0.001)
            asked_at = time.monotonic()
            self._check_same_server(name, self._checked_info(name, bound), asked_at, newer_than)

        if newer_than:  # before: a restart seen already; after: one during the wait
            check_same_server()
        current = super().wait(name, newer_than, timeout)
        if newer_than and current > newer_than:  # a lower version is reported by the core
            check_same_server()
        return current

    def _sample(self, info: Any, timeout: Optional[float]) -> List[np.ndarray]:
        """The table's single item, sampled on a worker thread so a server that vanished
        between the version check and the sample cannot block the caller past ``timeout``.

        The sample runs as Reverb's TensorFlow op, and the arrays returned are views of
        the tensors it produced: the pybind sampler copies every tensor into a new numpy
        array, which measured about 30% slower on a 40 MB pull (fresh memory, faulted in
        each time). Workers are long-lived and reused: a thread started per pull measured
        about 10 ms slower on 40 MB. A pull takes an idle worker or starts one, so
        concurrent pulls still run in parallel; a worker whose sample overran the timeout
        is abandoned, never reused.
        """
        limit = self.timeout if timeout is None else timeout
        table = info.name
        handle, dtypes = self._sampling_client(info)
        # sample() must not hold self: an idle worker would keep this backend alive

        def sample() -> Any:
            *_, data = gen_reverb_ops.reverb_client_sample(handle, table, dtypes)
            return [numpy_view(tensor) for tensor in data]

        worker: Optional[_Worker] = None
        try:
            with self._workers_lock:
                if self._workers_pid != os.getpid():  # a forked child has none of the threads
                    self._idle_workers.clear()
                    self._workers_pid = os.getpid()
                worker = self._idle_workers.pop() if self._idle_workers else None
            if worker is None:
                worker = _Worker(f"varsync-reverb-sample-{self.address}")
            call = worker.submit(sample)
            finished = call.done.acquire(timeout=-1 if limit is None else limit)
        except BaseException:  # interrupted: the sample may still run, so never reuse it
            if worker is not None:
                worker.retire()
            raise
        if not finished:
            worker.retire()  # exits once the abandoned sample returns, if ever
            self._probe(*self._endpoint, limit=0.5)  # a server that is gone is no timeout
            raise PullTimeoutError(
                f"sampling Reverb table {table!r} at {self.address} took longer than {limit} s "
                "(did the server restart empty?); the sample was abandoned"
            )
        with self._workers_lock:
            if self._closed:
                worker.retire()
            else:
                self._idle_workers.append(worker)
        if call.error is not None:
            with self._translated(f"pulling from table {table!r}"):
                raise call.error
        return call.result

    def close(self) -> None:
        with self._writer_lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            _close_quietly(writer)
        with self._workers_lock:
            self._closed = True
            _release(self._idle_workers, self._sampling_clients)

    def describe_options(self) -> Dict[str, Any]:
        return {
            "timeout": self.timeout,
            "namespace": self.namespace,
            "server": self.address,
            "wait_for_server": self.wait_for_server,
        }


def _milliseconds(timeout: Optional[float]) -> Optional[int]:
    """A timeout as Reverb's flush takes it: whole milliseconds in a C int, or no bound."""
    if timeout is None or timeout * 1000 > 2**31 - 1:  # over 24 days: no bound
        return None
    return max(1, int(timeout * 1000))


def _insert_count(info: Any) -> int:
    return int(info.rate_limiter_info.insert_stats.completed)


def _own_version(table: str, before: Any, after: Any, restarted: bool) -> int:
    """The version of the push made between the table infos ``before`` and ``after``.

    Reverb does not say which insert was ours, only how many there were: the count rose
    by exactly one, or (the server restarted in between) is 1, or another writer pushed
    too and any of the new numbers may be ours. Then :class:`ConcurrentPushError`,
    rather than a number another writer may be given as well.
    """
    low, high = _insert_count(before) + 1, _insert_count(after)
    if high == low or (restarted and high == 1):
        return high
    raise ConcurrentPushError(
        f"the push to Reverb table {table!r} was published, but another writer pushed to "
        f"it at the same time, so its version is one of {low}..{high}. Reverb cannot tell "
        "whose insert was whose: give each writer its own table (or use a backend with "
        "supports_concurrent_writers, such as redis://) if you need exact versions.",
        low=low, high=high,
    )


def _version_of(info: Any) -> int:
    # An empty table is version 0 whatever the counter says (a reset() clears both).
    return _insert_count(info) if info.current_size > 0 else 0


def _age_seconds(info: Any) -> float:
    worker = info.table_worker_time
    busy_and_idle = (  # every state the worker can be in, so the sum is its age
        worker.running_ms + worker.sleeping_ms + worker.sampling_ms + worker.inserting_ms
        + worker.waiting_for_sampling_ms + worker.waiting_for_inserts_ms
    )
    return busy_and_idle / 1000.0


def _close_quietly(writer: Any) -> None:
    if writer is None:
        return
    try:
        writer.close()
    except Exception:  # closing a writer whose server is gone must not mask the cause
        pass


#: Numbers for TensorFlow-side clients' shared names, unique in the process.
_CLIENT_NUMBERS = itertools.count()


def _destroy_quietly(handle: Any) -> None:
    """Free a TensorFlow-side Reverb client (its gRPC channel); a sample still running on
    it keeps it alive until the sample ends."""
    try:
        tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
    except Exception:  # pragma: no cover - best effort, at close
        pass


def _release(workers: List["_Worker"], clients: Dict[Any, Tuple[Any, List[Any]]]) -> None:
    """Retire idle sampling workers and free sampling clients (emptying both)."""
    while workers:
        workers.pop().retire()
    while clients:
        _destroy_quietly(clients.popitem()[1][0])


class _Call:
    """One function call handed to a :class:`_Worker`: its result or error, once done."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        # Held until the call is done. A plain lock, not an Event: Event.wait runs Python
        # code around its lock that a Ctrl-C can break (RuntimeError, a lock left held).
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class _Worker:
    """A daemon thread that runs submitted calls one at a time until retired."""

    def __init__(self, name: str) -> None:
        self._calls: "queue.SimpleQueue[Optional[_Call]]" = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> _Call:
        call = _Call(fn)
        self._calls.put(call)
        return call

    def retire(self) -> None:
        """Stop after the call in progress (if any); the thread then exits."""
        self._calls.put(None)

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call.result = call.fn()
            except BaseException as exc:  # handed to the caller, who re-raises it
                call.error = exc
            call.done.release()
            call = None  # hold nothing of it while idle


class _ReverbErrors:
    """The one place Reverb's exceptions become varsync's, naming the server address."""

    def __init__(self, address: str, doing: str) -> None:
        self.address = address
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> bool:
        if exc is None or isinstance(exc, VarsyncError):
            return False
        text = f"{type(exc).__name__}: {exc}"
        where = f"Reverb server at {self.address} ({self.doing})"
        if isinstance(exc, reverb.errors.DeadlineExceededError) or "Deadline" in str(exc):
            raise BackendConnectionError(f"{where} did not answer in time: {text}") from exc
        if isinstance(exc, (RuntimeError, reverb.errors.ReverbError, tf.errors.OpError)):
            raise BackendConnectionError(f"{where} failed: {text}") from exc
        return False
