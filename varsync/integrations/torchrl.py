"""A TorchRL weight-sync scheme whose transport is a varsync URL (docs/torchrl.md).

:class:`VarsyncWeightSyncScheme` subclasses TorchRL's ``WeightSyncScheme``, the extension
point its collectors take through ``weight_sync_schemes={"policy": scheme}`` (multi-process
collectors: the trainer sends) and ``weight_recv_schemes={"policy": scheme}`` (any
collector: it receives).

- The sender creates the table from the policy's ``state_dict`` and keeps what it was
  given (TorchRL's base class holds models by weak reference only; a collector built with
  a ``policy_factory`` alone gets a policy made by it). It publishes once when it connects
  and on every ``send``, which, like TorchRL's own schemes (``sync=True``), returns once
  every worker it knows of reports in varsync's reader registry, as
  ``f"{model_id}-worker-{i}"``, that it applied the version; ``sync=False``: once stored.
- Each receiver waits up to ``timeout`` for the table and its first version and loads it
  (a policy TorchRL sent stateless, on the meta device, is given real tensors). Then a
  thread applies each newer version in place as it comes (``background=True``), or newer
  versions are applied between batches (``background=False``): on ``receive()``, and in a
  multi-process collector's workers before each batch (the collector's
  ``pre_collect_hook``). After applying, it tells its collector (which bumps its policy
  version), then reports the version.
- When the store starts a new history (``varsync.TableResetError``) the receiver forgets
  its version, logs one warning, and loads the table's next value whole.
"""

from __future__ import annotations

import collections
import collections.abc
import os
import threading
import time
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase  # type: ignore[import-not-found, unused-ignore]
from torchrl._utils import logger as torchrl_logger  # type: ignore[import-not-found, unused-ignore]
from torchrl.weight_update import WeightSyncScheme  # type: ignore[import-not-found, unused-ignore]

import varsync
from varsync import _readers as readers_lib
from varsync._config import redact
from varsync._errors import (
    ConfigurationError,
    PullTimeoutError,
    SignatureError,
    TableResetError,
)
from varsync.backend import SupportsReaderRegistry

__all__ = ["VarsyncWeightSyncScheme", "VarsyncTransport"]

_POLL_INTERVAL = 0.5
_ONE_TABLE = (
    "one varsync table serves every worker: send one set of weights for all of them "
    "(update_policy_weights_(policy)), or give each group of workers a collector and a "
    "scheme (table) of its own"
)


class VarsyncTransport:
    """The data plane of :class:`VarsyncWeightSyncScheme`: one varsync table.

    Follows TorchRL's ``TransportBackend`` protocol (``send_weights``,
    ``receive_weights``, ``setup_connection_and_weights_on_*``). One transport serves
    every worker, like TorchRL's shared-memory transport: the store is the rendezvous.
    """

    def __init__(self, scheme: VarsyncWeightSyncScheme) -> None:
        self._scheme = scheme

    def send_weights(self, weights: Any) -> None:
        self._scheme._publish(weights)

    def receive_weights(
        self,
        timeout: float | None = None,
        *,
        weights: Any = None,
        model: Any = None,
        strategy: Any = None,
    ) -> Any:
        if timeout and not self._scheme._wait_newer(timeout):
            return None
        return self._scheme._apply_newer()

    def setup_connection_and_weights_on_sender(self) -> None:
        self._scheme._publish(None)

    def setup_connection_and_weights_on_receiver(
        self,
        *,
        worker_idx: Any = None,
        weights: Any = None,
        model: Any = None,
        strategy: Any = None,
    ) -> Any:
        return self._scheme._first_weights()


class VarsyncWeightSyncScheme(WeightSyncScheme):  # type: ignore[misc, unused-ignore]
    """Synchronises one model (e.g. ``"policy"``) through the varsync table ``table``
    at ``url`` (any varsync URL: ``redis://``, ``shm://``, ``memory://``, ...).

    ``timeout`` (seconds) bounds the receiver's wait for the table and its first version
    at start-up, a confirmed ``send``'s wait for the workers, and every push and pull (it
    is also the store's own timeout). ``sync``: ``send`` returns once every worker applied
    the version (``True``, TorchRL's default) or once it is stored (``False``).
    ``background``: receivers apply newer versions as they come (``True``) or between
    batches (``False``). ``poll_interval`` is how long the background receiver waits for
    a push before it looks whether it was asked to stop (a push wakes it at once).
    ``connect_options`` go to :func:`varsync.connect` (e.g. ``namespace=``).

    The scheme is pickled to the collector's workers; each side connects on first use.
    """

    def __init__(
        self,
        url: str,
        table: str = "policy",
        *,
        timeout: float = 30.0,
        poll_interval: float = _POLL_INTERVAL,
        background: bool = True,
        sync: bool = True,
        **connect_options: Any,
    ) -> None:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigurationError(f"expected a varsync URL (scheme://...), got {url!r}")
        if not isinstance(table, str) or not table:
            raise ConfigurationError(f"table must be a non-empty str, got {table!r}")
        if not timeout or timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout!r}")
        if poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be > 0, got {poll_interval!r}")
        super().__init__(strategy="tensordict")
        self.url = url
        self.table = table
        self.timeout = float(timeout)
        self.poll_interval = float(poll_interval)
        self.background = bool(background)
        self.sync = bool(sync)
        self._connect_options: dict[str, Any] = dict(connect_options)
        self._store: varsync.VariableContainer | None = None
        self._held = 0  # the version this side last published or applied
        self._sender_pid: int | None = None
        self._source: Any = None  # sender: what send() publishes when given nothing
        self._workers = 0  # sender: how many workers a confirmed send waits for
        self._reader = ""  # receiver: its id in the reader registry
        self._reporter: readers_lib.Reporter | None = None
        self._apply_lock = threading.RLock()
        self._shared_transport = VarsyncTransport(self)

    def __repr__(self) -> str:
        side = (
            "sender"
            if self.initialized_on_sender
            else "receiver"
            if self.initialized_on_receiver
            else "not initialised"
        )
        return f"<{type(self).__name__} {self.url} table={self.table!r} {side} v{self._held}>"

    # -- what collectors call ----------------------------------------------------------

    @property
    def version(self) -> int:
        """The version this side last published (sender) or applied (receiver)."""
        return self._held

    @property
    def context(self) -> Any:
        """The collector this side serves (TorchRL's base keeps it by weak reference)."""
        return WeightSyncScheme.context.fget(self)

    @context.setter
    def context(self, context: Any) -> None:
        WeightSyncScheme.context.fset(self, context)
        if context is not None and self._applies_before_each_batch():
            _ApplyBeforeEachBatch.install(self, context)

    def create_transport(self, **kwargs: Any) -> VarsyncTransport:
        return VarsyncTransport(self)

    def _init_on_sender_impl(
        self,
        *,
        model_id: str | None = None,
        context: Any = None,
        model: Any = None,
        weights: Any = None,
        num_workers: int | None = None,
        devices: Any = None,
        params_map: Any = None,
        **kwargs: Any,
    ) -> None:
        if params_map is not None:
            raise ConfigurationError(
                f"{type(self).__name__} got params_map= (weights per worker): {_ONE_TABLE}"
            )
        self.model_id = model_id or "policy"
        if context is not None:
            self.context = context
        if model is not None:
            self.model = model
        self._source = weights if weights is not None else model
        self._workers = _count_workers(context, num_workers, devices)
        self._sender_pid = os.getpid()
        store = self._connected()
        self._check_confirmable(store, context)
        store.create_table(self.table, self._as_nest(None, for_table=True))

    def _init_on_receiver_impl(
        self,
        *,
        model_id: str,
        context: Any = None,
        worker_idx: int | None = None,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        if self._copied_from_sender() and self.url.split("://", 1)[0] == "memory":
            raise ConfigurationError(
                f"{self.url} is a store of the trainer's process (pid {self._sender_pid}), "
                f"and this receiver runs in process {os.getpid()}: a multi-process collector "
                "needs a store its workers share, e.g. shm://NAME or redis://HOST:PORT/DB"
            )
        self.model_id = model_id
        if context is not None and worker_idx is None:
            worker_idx = getattr(context, "worker_idx", None)
        self.worker_idx = worker_idx
        self._reader = (
            self._worker_reader(worker_idx)
            if worker_idx is not None
            else f"{model_id}-{readers_lib.reader_id()}"
        )
        if model is not None:
            self.model = model
        if context is not None:
            self.context = context

    def _setup_connection_and_weights_on_sender_impl(
        self, *, worker_idx: int | None = None, weights: Any = None
    ) -> None:
        self._publish(weights)

    def _setup_connection_and_weights_on_receiver_impl(
        self, *, worker_idx: int | None = None
    ) -> None:
        backend = self._connected().backend
        if isinstance(backend, SupportsReaderRegistry) and self._reporter is None:
            self._reporter = readers_lib.Reporter(backend, self._reader, readers_lib.DEFAULT_TTL)
        self._first_weights()
        if self.background:
            self._start_background_receiver()

    def send(self, weights: Any = None, worker_ids: Any = None) -> int:  # type: ignore[override, unused-ignore]
        """Publish ``weights`` (``None``: the sender's model; an ``nn.Module``, a
        ``TensorDict`` of its weights or a ``state_dict``); with ``sync``, wait until
        every worker applied it. Return the new version."""
        if not self.initialized_on_sender:
            raise RuntimeError("Must be initialized on sender before sending weights")
        if not self.synchronized_on_sender:
            raise RuntimeError("Must be synchronized on sender before sending weights")
        if worker_ids is not None:
            raise ConfigurationError(
                f"{type(self).__name__} cannot address workers {worker_ids!r}: {_ONE_TABLE}"
            )
        version = self._publish(weights)
        if self.sync and self._workers:
            self._confirm(version)
        return version

    def receive(self, timeout: float | None = None) -> TensorDictBase | None:
        """Apply the table's latest version if it is newer than the one held; return
        the policy's weights then, else ``None``. ``timeout``: wait up to that many
        seconds for a newer version (``None`` or 0: look once, do not wait)."""
        if not self.initialized_on_receiver:
            raise RuntimeError("Must be initialized on receiver before receiving weights")
        if not self.synchronized_on_receiver:
            raise RuntimeError("Must be synchronized on receiver before receiving weights")
        if timeout and not self._wait_newer(timeout):
            return None
        if self._apply_newer() is None:
            return None
        return TensorDict.from_module(self.model)

    def shutdown(self) -> None:
        super().shutdown()  # stops the background receiver (it wakes within poll_interval)
        reporter, self._reporter = getattr(self, "_reporter", None), None
        if reporter is not None:
            reporter.close()  # its entry expires after the registry's ttl
        store, self._store = getattr(self, "_store", None), None
        if store is not None:
            store.close()

    # -- pickling: the connection, the threads and the sender's model stay behind -----------

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_store=None, _apply_lock=None, _source=None, _reporter=None, _held=0)
        state["_shared_transport"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._apply_lock = threading.RLock()
        self._shared_transport = VarsyncTransport(self)

    # -- the sender ------------------------------------------------------------------------

    def _connected(self) -> varsync.VariableContainer:
        if self._store is None:
            self._store = varsync.connect(self.url, timeout=self.timeout, **self._connect_options)
        return self._store

    def _check_confirmable(self, store: varsync.VariableContainer, context: Any) -> None:
        """Refuse what would make every confirmed ``send`` time out."""
        if not (self.sync and self._workers):
            return
        if not isinstance(store.backend, SupportsReaderRegistry):
            raise ConfigurationError(
                f"{redact(self.url)} keeps no reader registry, so send() cannot learn that the "
                "workers applied a version: pass sync=False (send returns once the push is "
                "stored), or use a store with one (shm://, redis://)"
            )
        if not self.background and hasattr(context, "num_workers"):
            raise ConfigurationError(
                "with background=False the workers of a multi-process collector apply a "
                "newer version when they start their next batch, which the collector asks "
                "for only after update_policy_weights_ returns: send() cannot wait for it. "
                "Pass sync=False with background=False, or keep background=True for "
                "confirmed updates"
            )

    def _worker_reader(self, worker_idx: int) -> str:
        return f"{self.model_id or 'policy'}-worker-{worker_idx}"

    def _sender_model(self) -> Any:
        """What ``send()`` publishes when given nothing: the model or weights given to
        ``init_on_sender``, else the collector's policy, else one made by the collector's
        policy factory (kept here: nothing else holds it)."""
        if self._source is not None:
            return self._source
        context = self.context
        try:
            model = self.model
        except AttributeError:  # the collector holds no policy (a policy_factory)
            model = None
        if model is None and context is not None:
            model = getattr(context, "_fallback_policy", None)
        if model is None and context is not None:
            model = self._source = _made_by_factory(context)
        if not isinstance(model, torch.nn.Module):
            raise ConfigurationError(
                f"{type(self).__name__} found no policy module to publish (got "
                f"{type(model).__name__}): give the collector a policy or a policy_factory, "
                "or call init_on_sender(model=policy)"
            )
        return model

    def _as_nest(self, weights: Any, for_table: bool = False) -> Any:
        """What to push: a module as itself (its ``state_dict``); a ``TensorDict`` or a
        mapping of weights as an ``OrderedDict`` in the table's key order."""
        if weights is None:
            weights = self._sender_model()
        if isinstance(weights, torch.nn.Module):
            return weights
        if isinstance(weights, dict) and weights and all(isinstance(k, int) for k in weights):
            raise ConfigurationError(
                f"{type(self).__name__} got weights per worker (for workers "
                f"{sorted(weights)}): {_ONE_TABLE}"
            )
        if isinstance(weights, TensorDictBase):
            weights = weights.flatten_keys(".").to_dict()
        if not isinstance(weights, collections.abc.Mapping):
            raise TypeError(
                "weights must be an nn.Module, a TensorDict or a state_dict, got "
                f"{type(weights).__name__}"
            )
        if for_table:
            return collections.OrderedDict(weights)
        keys = list(self._connected().signature(self.table).keys())
        missing = [k for k in keys if k not in weights]
        extra = [k for k in weights if k not in keys]
        if missing or extra:
            raise SignatureError(
                f"weights for table {self.table!r} at {self.url} do not match its policy: "
                f"missing {missing}, unexpected {extra}"
            )
        return collections.OrderedDict((k, weights[k]) for k in keys)

    def _publish(self, weights: Any) -> int:
        self._held = self._connected().push(self._as_nest(weights), self.table)
        return self._held

    def _confirm(self, version: int) -> None:
        """Wait until every worker reports holding ``version`` or newer; raise a
        :class:`PullTimeoutError` naming the others after ``timeout``. The registry is
        read every 0.5 to 4 ms (``wait_for_readers`` backs off to 0.1 s, which would add up
        to its own length to a confirmation taking milliseconds), by reader id: a reader
        that is not one of the workers (another program's) does not count."""
        expected = [self._worker_reader(i) for i in range(self._workers)]
        store = self._connected()
        deadline = time.monotonic() + self.timeout
        interval = 0.0005
        listed: dict[str, int] = {}
        why = ""
        while True:
            left = deadline - time.monotonic()
            try:
                listed = {
                    r.reader: r.version for r in store.readers(self.table, timeout=max(left, 0.001))
                }
            except PullTimeoutError as exc:  # the store did not answer within the time left
                why = f" (the last listing of the readers failed: {exc})"
            behind = [r for r in expected if listed.get(r, 0) < version]
            if not behind:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(interval, left))
            interval = min(interval * 2, 0.004)
        said = ", ".join(
            f"{r} (holds version {listed[r]})" if r in listed else f"{r} (no report)"
            for r in behind
        )
        raise PullTimeoutError(
            f"{len(behind)} of the {self._workers} workers did not confirm version {version} "
            f"of table {self.table!r} at {redact(self.url)} within {self.timeout:g} s: "
            f"{said}{why}. A worker applies each version and reports it; one that died, "
            "hangs or cannot reach the store does not. The version is stored: pass a "
            "larger timeout=, or sync=False to publish without waiting"
        )

    # -- the receiver ----------------------------------------------------------------------

    def _copied_from_sender(self) -> bool:
        """Whether this is a copy of a sender's scheme in another process: a worker of
        the trainer's multi-process collector."""
        return self._sender_pid is not None and self._sender_pid != os.getpid()

    def _applies_before_each_batch(self) -> bool:
        return self.initialized_on_receiver and not self.background and self._copied_from_sender()

    def _wait_for_table(self, deadline: float) -> None:
        store = self._connected()
        while self.table not in store.tables():
            if time.monotonic() >= deadline:
                raise PullTimeoutError(
                    f"no table {self.table!r} at {self.url} after {self.timeout:g} s: the "
                    "trainer's scheme creates it (init_on_sender) and publishes to it"
                )
            time.sleep(0.05)

    def _first_weights(self) -> Any:
        """Wait (up to ``timeout``) for the table and a first version; apply it."""
        deadline = time.monotonic() + self.timeout
        self._wait_for_table(deadline)
        try:
            self._connected().wait_for(
                0, self.table, timeout=max(deadline - time.monotonic(), 0.001)
            )
        except PullTimeoutError:
            raise PullTimeoutError(
                f"table {self.table!r} at {self.url} has no weights after {self.timeout:g} s:"
                " the sender publishes when it connects (collectors do that at start-up)"
            ) from None
        return self._apply_newer(cascade=False)

    def _wait_newer(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a version newer than the one held (in a new
        history: for any version); whether one came."""
        deadline = time.monotonic() + timeout
        store = self._connected()
        while True:
            held = self._held
            try:
                store.wait_for(held, self.table, timeout=max(deadline - time.monotonic(), 0.001))
            except PullTimeoutError:
                return False
            except TableResetError:
                if not held:  # not a history a pull can follow (another signature)
                    raise
                self._forget_history(held)
                continue
            return True

    def _forget_history(self, held: int) -> None:
        """The store started a new history since this side applied ``held``: hold
        nothing, so that its current value is loaded whole, whatever its number."""
        with self._apply_lock:
            if self._held != held:  # another call already did
                return
            self._held = 0
        torchrl_logger.warning(
            f"{type(self).__name__} ({redact(self.url)}, table {self.table!r}): the store "
            f"started a new history since version {held} (it lost its data: a restart "
            "without persistence?); loading its current value, or its next push"
        )

    def _apply_newer(self, cascade: bool = True) -> int | None:
        """Load the latest version into the model if it is newer than the one held (in
        a new history: whatever its number), tell the collector, report it; return it,
        else ``None``. Reports go out in the order of the versions applied."""
        with self._apply_lock:
            held = self._held
            try:
                version = self._load_newer(held)
            except TableResetError:
                if not held:
                    raise
                self._forget_history(held)
                version = self._load_newer(0)
            if version is None:
                return None
            self._held = version
            history = self._connected()._histories.epoch_of(self.table, version)
            if cascade:
                self._cascade()
            if self._reporter is not None:  # applied, and the collector knows: confirmed
                self._reporter.held(self.table, version, history)
        return version

    def _load_newer(self, held: int) -> int | None:
        """Load the latest version into the model if it is newer than ``held``; return
        it, else ``None``. ``held`` 0: every tensor, from the store."""
        model, store = self.model, self._connected()
        if any(t.is_meta for t in model.state_dict().values()):
            # TorchRL sent the policy stateless: its tensors are made from the pull.
            got = store.pull_if_newer(held, self.table, like=model)
            if got is None:
                return None
            version, state = got
            model.load_state_dict(state, assign=True)
            return int(version)
        try:  # one look, which raises TableResetError in a new history, whatever its number
            store.wait_for(held, self.table, timeout=0)
        except PullTimeoutError:
            return None
        # In place, one copy from the store into each tensor (store.update), rather
        # than pull(like=) and load_state_dict: two copies.
        return store.update(model, self.table, delta_only=held > 0)

    def _cascade(self) -> None:
        """Tell the receiving collector, as TorchRL's own schemes do (it re-applies the
        weights to its policy if that is a copy, and bumps its PolicyVersion)."""
        context = self.context
        if context is not None and hasattr(context, "update_policy_weights_"):
            context.update_policy_weights_(
                model_id=self.model_id or "policy",
                policy_or_weights=TensorDict.from_module(self.model),
            )

    def _background_receive_loop(self) -> None:
        stop = self._stop_event
        while not stop.is_set():
            try:
                if self._wait_newer(self.poll_interval):
                    self._apply_newer()
            except Exception as exc:  # keep serving; TorchRL's schemes log and go on
                if stop.is_set():
                    break
                torchrl_logger.warning(
                    f"{type(self).__name__} ({self.url}, table {self.table!r}): {exc!r}"
                )
                stop.wait(self.poll_interval)


class _ApplyBeforeEachBatch:
    """A worker collector's ``pre_collect_hook`` under ``background=False``: apply the
    table's newer version, if there is one, before the batch starts; then run the hook
    the collector had. A failure is logged and the batch runs on the weights held, as
    the background receiver does."""

    def __init__(self, scheme: VarsyncWeightSyncScheme, then: Any) -> None:
        self.scheme = scheme
        self.then = then

    @classmethod
    def install(cls, scheme: VarsyncWeightSyncScheme, collector: Any) -> None:
        if not hasattr(collector, "pre_collect_hook"):
            raise ConfigurationError(
                f"background=False: {type(collector).__name__} has no pre_collect_hook, so "
                "this worker has no point between batches to apply newer weights at; use "
                "background=True"
            )
        hook = collector.pre_collect_hook
        if isinstance(hook, cls) and hook.scheme is scheme:
            return
        collector.pre_collect_hook = cls(scheme, hook)

    def __call__(self) -> None:
        try:
            self.scheme.receive()
        except Exception as exc:
            torchrl_logger.warning(
                f"{type(self.scheme).__name__} ({self.scheme.url}, table "
                f"{self.scheme.table!r}): {exc!r}"
            )
        if self.then is not None:
            self.then()


def _count_workers(context: Any, num_workers: int | None, devices: Any) -> int:
    """How many workers a confirmed ``send`` waits for: ``num_workers=``, one per device of
    ``devices=`` (TorchRL's own arguments), else the collector's workers; 0: none known."""
    if num_workers is not None:
        count: Any = num_workers
    elif devices is not None:
        count = len(devices)
    else:
        count = getattr(context, "num_workers", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigurationError(f"num_workers must be an int >= 0, got {count!r}")
    return count


def _made_by_factory(collector: Any) -> Any:
    """A policy made by the collector's policy factory, or ``None`` without one. Distinct
    factories per worker are refused: they need weights per worker."""
    factories = getattr(collector, "policy_factory", None)
    if callable(factories):
        factories = [factories]
    factories = [f for f in factories or () if f is not None]
    if not factories:
        return None
    if any(f is not factories[0] for f in factories):
        raise ConfigurationError(
            f"the collector's policy_factory holds {len(factories)} factories, not one "
            f"for all its workers: distinct policies need weights per worker, and {_ONE_TABLE}"
        )
    return factories[0]()
