"""Sampling a table's single item on warm worker threads, within a timeout (and, on the
same threads and clients, inserting the items Reverb's Python writer cannot send).

The sample runs on a worker thread, so that a server that vanished between the version
check and the sample cannot block the caller past its timeout. Items up to
``PYBIND_MAX_BYTES`` are sampled by Reverb's pybind sampler, larger ones by its TensorFlow
op. The op's eager dispatch costs about 0.5 ms a call, which measured 1.6x the pybind
sampler's whole sample at 1 KB and 1.7x at 100 KB; but the pybind sampler copies every
tensor into a new numpy array, while the op's arrays are views of the tensors it produced,
which measured about 30% faster on a 40 MB pull (fresh memory, faulted in each time) and
10% at 10 MB. Workers are long-lived and reused: a thread started per pull measured about
10 ms slower on 40 MB. A pull takes an idle worker or
starts one, so concurrent pulls still run in parallel; a worker whose sample overran its
timeout is abandoned, never reused.

Items up to ``STREAM_MAX_BYTES`` are sampled from long-lived pybind samplers, one per
pull running at the same time, kept between pulls (:class:`_Streams`): opening a sampler
asks the server first, a round trip that measured about a third of a small pull. A kept
sampler holds one sample taken ahead, before the next pull began, perhaps of a content
replaced since without the count showing it (a ``reset`` and as many pushes again): each
pull drops it and returns the sample after, so that a pull's sample is always taken after
the pull read the table's count, as with a sampler opened per pull.

Reverb 0.14's Python writer takes only numpy's own dtypes ("Unsupported numpy type" for
bfloat16 and float8), so an item holding one is inserted by Reverb's TensorFlow insert op,
the one TF-Agents' own pushes use, which stores the tensors' dtypes as they are
(:meth:`SamplingPool.insert`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import weakref
from typing import Any, Callable

import numpy as np

from varsync._adapters.tensorflow import numpy_view
from varsync._backends.reverb.engine import gen_reverb_ops, nested_structure_coder, tf, translated
from varsync._spec import ML_DTYPE_NAMES

__all__ = ["SamplingPool", "PYBIND_MAX_BYTES", "STREAM_MAX_BYTES"]

#: The largest item sampled by the pybind sampler (see above: measured faster up to 1 MB,
#: even at 4 MB, slower from 10 MB).
PYBIND_MAX_BYTES = 4 << 20
#: The largest item sampled from a kept sampler (see above), whose dropped sample taken
#: ahead is a second copy of the item on the wire for every pull.
STREAM_MAX_BYTES = 1 << 20
#: Kept samplers a forked child inherited: never freed (freeing one waits for its
#: threads, which the child does not have).
_ORPHANS: list[Any] = []
#: Numbers for TensorFlow-side clients' shared names, unique in the process.
_CLIENT_NUMBERS = itertools.count()


class SamplingPool:
    """The sampling threads and TensorFlow-side Reverb clients of one backend."""

    def __init__(self, address: str) -> None:
        self.address = address
        #: Warm workers, waiting for a pull.
        self.idle: list[_Worker] = []
        # (server table, signature proto) -> (TensorFlow client handle, dtypes, by pybind,
        # from a kept sampler); see _client
        self._clients: dict[tuple[str, bytes], tuple[Any, list[Any], bool, bool]] = {}
        self._streams = _Streams()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        # also when never closed (not at interpreter exit: the process frees all anyway)
        weakref.finalize(self, _release, self.idle, self._clients, self._streams).atexit = False

    def sample(
        self, info: Any, limit: float | None, client: Any
    ) -> tuple[list[np.ndarray], float] | None:
        """The single item of ``info``'s table, as arrays, and its priority; ``None`` if
        the sample took longer than ``limit`` seconds (``None``: no bound) and was
        abandoned. ``client``: the backend's ``reverb.Client``, whose pybind sampler takes
        small items."""
        table = info.name
        handle, dtypes, by_pybind, streamed = self._client(info)
        if streamed:
            sample = self._streams.sampling(table, client._client)
        elif by_pybind:
            pybind = client._client

            def sample() -> Any:  # holds nothing of self: an idle worker would keep it alive
                return _taken(pybind.NewSampler(table, 1, 1))  # one sample, one in flight
        else:

            def sample() -> Any:
                _, _, _, priority, _, data = gen_reverb_ops.reverb_client_sample(
                    handle, table, dtypes
                )
                return [numpy_view(tensor) for tensor in data], float(priority)

        finished, result = self._on_a_worker(sample, limit, f"pulling from table {table!r}")
        return result if finished else None

    def insert(
        self, info: Any, arrays: list[np.ndarray], priority: float, limit: float | None
    ) -> bool:
        """Insert ``arrays`` as one item of ``info``'s table with Reverb's
        TensorFlow op, as TF-Agents does; ``False`` if the insert took longer than
        ``limit`` seconds (``None``: no bound) and was abandoned (it may still land)."""
        table = info.name
        handle, _, _, _ = self._client(info)
        tensors = [tf.constant(array) for array in arrays]  # before the worker: no race

        def insert() -> None:  # holds nothing of self, as sample() does
            gen_reverb_ops.reverb_client_insert(
                handle, tensors, tf.constant([table]), tf.constant([priority], tf.float64)
            )

        finished, _ = self._on_a_worker(insert, limit, f"pushing to table {table!r}")
        return finished

    def _on_a_worker(
        self, fn: Callable[[], Any], limit: float | None, doing: str
    ) -> tuple[bool, Any]:
        """``(True, fn())`` run on a warm worker, or ``(False, None)`` once ``limit``
        seconds pass (the worker is then abandoned); ``fn``'s error, translated."""
        worker: _Worker | None = None
        try:
            with self._lock:
                if self._pid != os.getpid():  # a forked child has none of the threads
                    self.idle.clear()
                    self._pid = os.getpid()
                worker = self.idle.pop() if self.idle else None
            if worker is None:
                worker = _Worker(f"varsync-reverb-sample-{self.address}")
            call = worker.submit(fn)
            finished = call.done.acquire(timeout=-1 if limit is None else limit)
        except BaseException:  # interrupted: the sample may still run, so never reuse it
            if worker is not None:
                worker.retire()
            raise
        if not finished:
            worker.retire()  # exits once the abandoned call returns, if ever
            return False, None
        with self._lock:
            if self._closed:
                worker.retire()
            else:
                self.idle.append(worker)
        if call.error is not None:
            with translated(self.address, doing):
                raise call.error
        return True, call.result

    def close(self) -> None:
        """Retire the idle workers (busy ones once their sample ends) and free the
        clients."""
        with self._lock:
            self._closed = True
            _release(self.idle, self._clients, self._streams)

    def forget(self, table: str) -> None:
        """Free the kept samplers of ``table`` (its server restarted: they belong to the
        run that is gone)."""
        self._streams.forget(table)

    def _client(self, info: Any) -> tuple[Any, list[Any], bool, bool]:
        """A TensorFlow-side Reverb client for sampling ``info``'s table, the dtypes of
        the table's columns in flat order, whether its items go by the pybind sampler
        (at most ``PYBIND_MAX_BYTES``, and only numpy's own dtypes: it has no others), and
        whether from a kept one (at most ``STREAM_MAX_BYTES``).

        Reverb's sample op checks the dtypes asked for against the table signatures its
        client read from the server on first use, and never reads them again. So each
        (table, signature) gets a client of its own: a server restarted at the same
        address with a changed table gets a new client, never a stale check. Decoding a
        large signature takes milliseconds, so that too happens once per signature.
        """
        key = (info.name, info.signature.SerializeToString(deterministic=True))
        with self._lock:
            known = self._clients.get(key)
            if known is not None:
                return known
            for old in [k for k in self._clients if k[0] == info.name]:
                _destroy_quietly(self._clients.pop(old)[0])
        decoded = nested_structure_coder.decode_proto(info.signature)
        specs = tf.nest.flatten(decoded)
        dtypes = [spec.dtype for spec in specs]
        nbytes = sum(spec.shape.num_elements() * spec.dtype.size for spec in specs)
        by_pybind = nbytes <= PYBIND_MAX_BYTES and not any(
            dtype.name in ML_DTYPE_NAMES for dtype in dtypes
        )
        with translated(self.address, "creating a TensorFlow client"):
            handle = gen_reverb_ops.reverb_client(
                server_address=self.address,
                shared_name=f"varsync-{id(self):x}-{next(_CLIENT_NUMBERS)}",
            )
        with self._lock:
            raced = self._clients.setdefault(
                key, (handle, dtypes, by_pybind, by_pybind and nbytes <= STREAM_MAX_BYTES)
            )
        if raced[0] is not handle:  # another pull made one meanwhile: use that one
            _destroy_quietly(handle)
        return raced


def _destroy_quietly(handle: Any) -> None:
    """Free a TensorFlow-side Reverb client (its gRPC channel); a sample still running on
    it keeps it alive until the sample ends.

    With Reverb 0.14 this frees nothing once the client has sampled: its sample op takes
    a reference to the client on every call and never gives it back
    (``reverb/cc/ops/client.cc``: ``LookupResource`` without ``Unref``), so the client and
    its channel live until the process exits, and once their server is gone the channel
    reconnects with backoff for ever, each attempt holding a socket for a moment (likely
    the sockets the fault tests see closed late). Sharing clients between backends would
    bound their number, but a client reused after its server restarted waits out its
    channel's backoff: a pull right after a restart timed out."""
    with contextlib.suppress(Exception):  # best effort, at close
        tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def _release(
    workers: list[_Worker],
    clients: dict[Any, tuple[Any, list[Any], bool, bool]],
    streams: _Streams,
) -> None:
    """Retire idle sampling workers, free sampling clients (emptying both) and close the
    kept samplers."""
    while workers:
        workers.pop().retire()
    while clients:
        _destroy_quietly(clients.popitem()[1][0])
    streams.close()


class _Streams:
    """The kept pybind samplers of one pool's tables, each idle between two pulls (see
    the module's docstring). Thread-safe; a forked child drops its parent's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}
        self._pid = os.getpid()
        self._closed = False

    def sampling(self, table: str, pybind: Any) -> Callable[[], tuple[list[np.ndarray], float]]:
        """A sample of ``table`` to run on a worker: from a kept sampler (its sample taken
        ahead dropped) or a new one, kept again once it sampled."""
        with self._lock:
            self._forked()
            kept = self._idle.get(table)
            sampler = kept.pop() if kept else None

        def sample() -> tuple[list[np.ndarray], float]:  # holds nothing of the pool
            if sampler is None:
                opened = pybind.NewSampler(table, -1, 1)  # no end, one sample ahead
            else:
                opened = sampler
                opened.GetNextTrajectory()  # taken before this pull began: dropped
            taken = _taken(opened)
            self._give(table, opened)  # a sampler that failed is not kept: freed
            return taken

        return sample

    def _give(self, table: str, sampler: Any) -> None:
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._idle.setdefault(table, []).append(sampler)

    def forget(self, table: str) -> None:
        with self._lock:
            self._forked()
            kept = self._idle.pop(table, [])
        kept.clear()  # outside the lock: a sampler freed waits for its thread

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._forked()
            kept, self._idle = self._idle, {}
        kept.clear()

    def _forked(self) -> None:
        """(Under the lock.) In a forked child: the parent's samplers are never freed."""
        if self._pid != os.getpid():
            _ORPHANS.extend(s for kept in self._idle.values() for s in kept)
            self._idle.clear()
            self._pid = os.getpid()


def _taken(sampler: Any) -> tuple[list[np.ndarray], float]:
    """The next sample of a pybind sampler: its columns' single rows and its priority."""
    # key, probability, table size, priority, times sampled; the columns
    sampled = sampler.GetNextTrajectory()
    columns = sampled[sampler.NUM_INFO_TENSORS :]
    return [column[0, ...] for column in columns], float(sampled[3])


class _Call:
    """One function call handed to a :class:`_Worker`: its result or error, once done."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        # Held until the call is done. A plain lock, not an Event: Event.wait runs Python
        # code around its lock that a Ctrl-C can break (RuntimeError, a lock left held).
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None


class _Worker:
    """A daemon thread that runs submitted calls one at a time until retired.

    The thread holds only the queue of calls, never this object, and a finalizer retires
    it when this object is collected: a worker dropped by an interrupt (between its
    creation and the pool's record of it, or between the end of its call and its return
    to the idle list) takes its thread with it instead of leaving it blocked for good.
    """

    def __init__(self, name: str) -> None:
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._calls = calls
        self._retire = weakref.finalize(self, calls.put, None)
        threading.Thread(target=_run, args=(calls,), name=name, daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> _Call:
        call = _Call(fn)
        self._calls.put(call)
        return call

    def retire(self) -> None:
        """Stop after the call in progress (if any); the thread then exits."""
        self._retire()  # once: a later collection of this object adds nothing


def _run(calls: queue.SimpleQueue[_Call | None]) -> None:
    """A worker's thread: run each call until told to stop."""
    while True:
        call = calls.get()
        if call is None:
            return
        try:
            call.result = call.fn()
        except BaseException as exc:  # handed to the caller, who re-raises it
            call.error = exc
        call.done.release()
        call = None  # hold nothing of it while idle
