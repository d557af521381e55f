"""A TorchRL weight-sync scheme whose transport is a varsync URL.

:class:`VarsyncWeightSyncScheme` subclasses TorchRL's ``WeightSyncScheme``
(``torchrl.weight_update``), the extension point its collectors take through
``weight_sync_schemes={"policy": scheme}`` (multi-process collectors: the trainer sends)
and ``weight_recv_schemes={"policy": scheme}`` (any collector: it receives). Swapping
TorchRL's own transport for varsync is swapping the scheme::

    scheme = VarsyncWeightSyncScheme("redis://learner:6379/0", "policy")
    collector = MultiSyncCollector([make_env] * 4, policy, frames_per_batch=64,
                                   total_frames=-1, weight_sync_schemes={"policy": scheme})
    ...
    collector.update_policy_weights_(policy)   # one push, whatever the number of workers

- The sender (the trainer, or the main process of a multi-process collector) creates the
  table from the policy's ``state_dict`` when it is initialised, publishes the weights
  once when it connects and on every ``send`` (``collector.update_policy_weights_``).
  ``send`` returns once the push is stored; it does not wait for the workers.
- Each receiver (a collector's worker, or a collector in another program) waits up to
  ``timeout`` for the table and its first version, loads it into its policy (a policy
  TorchRL sent stateless, on the meta device, is given real tensors), then a background
  thread waits for newer versions and copies each into the policy in place, under
  ``torch.no_grad()`` (``load_state_dict``: parameters stay the same ``Parameter``
  objects). A version is applied only when it is newer than the one held. With
  ``background=False`` the receiver applies newer weights only when asked
  (``collector.receive_weights()`` / ``scheme.receive()``).
- One table serves every reader: ``worker_ids`` has no meaning here.
- When the store starts a new history (``varsync.TableResetError``: e.g. a Redis server
  restarted without persistence, the trainer's next push making the table again) the
  receiver forgets its version, logs one warning, and loads the table's current value
  whole as soon as there is one, whatever its number; until then it keeps its weights.

Like TorchRL's own ``MultiProcessWeightSyncScheme``, the background thread copies while
the worker may be running its policy; a batch collected across an update may mix
versions. Use ``background=False`` and ``receive()`` between batches to avoid that.

``memory://`` stores live in one process: use it between a trainer and a single-process
collector of the same process; multi-process collectors need ``shm://`` or ``redis://``.
"""

from __future__ import annotations

import collections
import collections.abc
import os
import threading
import time
from typing import Any, Dict, Optional

import torch
from tensordict import TensorDict, TensorDictBase  # type: ignore[import-not-found, unused-ignore]
from torchrl._utils import logger as torchrl_logger  # type: ignore[import-not-found, unused-ignore]
from torchrl.weight_update import WeightSyncScheme  # type: ignore[import-not-found, unused-ignore]

import varsync
from varsync.config import redact
from varsync.errors import (
    ConfigurationError,
    PullTimeoutError,
    SignatureError,
    TableResetError,
)

__all__ = ["VarsyncWeightSyncScheme", "VarsyncTransport"]

_POLL_INTERVAL = 0.5


class VarsyncTransport:
    """The data plane of :class:`VarsyncWeightSyncScheme`: one varsync table.

    Follows TorchRL's ``TransportBackend`` protocol (``send_weights``,
    ``receive_weights``, ``setup_connection_and_weights_on_*``). One transport serves
    every worker, like TorchRL's shared-memory transport: the store is the rendezvous.
    """

    def __init__(self, scheme: "VarsyncWeightSyncScheme") -> None:
        self._scheme = scheme

    def send_weights(self, weights: Any) -> None:
        self._scheme._publish(weights)

    def receive_weights(
        self,
        timeout: Optional[float] = None,
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
        self, *, worker_idx: Any = None, weights: Any = None, model: Any = None,
        strategy: Any = None,
    ) -> Any:
        return self._scheme._first_weights()


class VarsyncWeightSyncScheme(WeightSyncScheme):  # type: ignore[misc, unused-ignore]
    """Synchronises one model (e.g. ``"policy"``) through the varsync table ``table``
    at ``url`` (any varsync URL: ``redis://``, ``shm://``, ``memory://``, ...).

    ``timeout`` (seconds) bounds the receiver's wait for the table and its first version
    at start-up, and every push and pull; it is also the store's own timeout.
    ``poll_interval`` is how long the background receiver waits for a push before it
    looks whether it was asked to stop (a push wakes it at once). ``background``: apply
    newer versions as they come (``True``) or only on :meth:`receive`.
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
        self._connect_options: Dict[str, Any] = dict(connect_options)
        self._store: Optional[varsync.VariableContainer] = None
        self._held = 0  # the version this side last published or applied
        self._sender_pid: Optional[int] = None
        self._apply_lock = threading.RLock()
        self._shared_transport = VarsyncTransport(self)

    def __repr__(self) -> str:
        side = (
            "sender" if self.initialized_on_sender
            else "receiver" if self.initialized_on_receiver else "not initialised"
        )
        return f"<{type(self).__name__} {self.url} table={self.table!r} {side} v{self._held}>"

    # -- what collectors call ----------------------------------------------------------

    @property
    def version(self) -> int:
        """The version this side last published (sender) or applied (receiver)."""
        return self._held

    def create_transport(self, **kwargs: Any) -> VarsyncTransport:
        return VarsyncTransport(self)

    def _init_on_sender_impl(
        self,
        *,
        model_id: Optional[str] = None,
        context: Any = None,
        model: Any = None,
        weights: Any = None,
        **kwargs: Any,
    ) -> None:
        # devices=, num_workers=, params_map=, ctx=: one table serves every worker.
        self.model_id = model_id or "policy"
        if context is not None:
            self.context = context
        if model is not None:
            self.model = model
        self._initial_weights = weights
        self._sender_pid = os.getpid()
        source = weights if weights is not None else self._sender_model()
        self._connected().create_table(self.table, self._as_nest(source, for_table=True))

    def _init_on_receiver_impl(
        self,
        *,
        model_id: str,
        context: Any = None,
        worker_idx: Optional[int] = None,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        if (
            self._sender_pid is not None
            and self._sender_pid != os.getpid()
            and self.url.split("://", 1)[0] == "memory"
        ):
            raise ConfigurationError(
                f"{self.url} is a store of the trainer's process (pid {self._sender_pid}), "
                f"and this receiver runs in process {os.getpid()}: a multi-process collector "
                "needs a store its workers share, e.g. shm://NAME or redis://HOST:PORT/DB"
            )
        self.model_id = model_id
        if context is not None:
            self.context = context
            if worker_idx is None:
                worker_idx = getattr(context, "worker_idx", None)
        self.worker_idx = worker_idx
        if model is not None:
            self.model = model

    def _setup_connection_and_weights_on_sender_impl(
        self, *, worker_idx: Optional[int] = None, weights: Any = None
    ) -> None:
        initial = weights if weights is not None else getattr(self, "_initial_weights", None)
        self._initial_weights = None
        self._publish(initial)

    def _setup_connection_and_weights_on_receiver_impl(
        self, *, worker_idx: Optional[int] = None
    ) -> None:
        self._first_weights()
        if self.background:
            self._start_background_receiver()

    def send(self, weights: Any = None, worker_ids: Any = None) -> int:  # type: ignore[override, unused-ignore]
        """Publish ``weights`` (``None``: the sender's model; an ``nn.Module``, a
        ``TensorDict`` of its weights or a ``state_dict``); return the new version."""
        if not self.initialized_on_sender:
            raise RuntimeError("Must be initialized on sender before sending weights")
        if not self.synchronized_on_sender:
            raise RuntimeError("Must be synchronized on sender before sending weights")
        if worker_ids is not None:
            raise ValueError(
                f"{type(self).__name__} publishes one table that every worker reads; it "
                f"cannot address workers {worker_ids!r}. Use a scheme (table) per group."
            )
        return self._publish(weights)

    def receive(self, timeout: Optional[float] = None) -> Optional[TensorDictBase]:
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
        store, self._store = getattr(self, "_store", None), None
        if store is not None:
            store.close()

    # -- pickling: the connection and the thread stay behind -------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state.update(_store=None, _apply_lock=None, _initial_weights=None, _held=0)
        state["_shared_transport"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self._apply_lock = threading.RLock()
        self._shared_transport = VarsyncTransport(self)

    # -- internals -------------------------------------------------------------------------

    def _connected(self) -> varsync.VariableContainer:
        if self._store is None:
            self._store = varsync.connect(
                self.url, timeout=self.timeout, **self._connect_options
            )
        return self._store

    def _sender_model(self) -> Any:
        try:
            model = self.model
        except AttributeError:
            model = None
        if model is None and self.context is not None:
            model = getattr(self.context, "_fallback_policy", None)
        if not isinstance(model, torch.nn.Module):
            raise ConfigurationError(
                f"{type(self).__name__} found no policy module to publish (got "
                f"{type(model).__name__}): give the collector a policy, or call "
                "init_on_sender(model=policy)"
            )
        return model

    def _as_nest(self, weights: Any, for_table: bool = False) -> Any:
        """What to push: a module as itself (its ``state_dict``); a ``TensorDict`` or a
        mapping of weights as an ``OrderedDict`` in the table's key order."""
        if weights is None:
            weights = self._sender_model()
        if isinstance(weights, torch.nn.Module):
            return weights
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
                store.wait_for(
                    held, self.table, timeout=max(deadline - time.monotonic(), 0.001)
                )
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

    def _apply_newer(self, cascade: bool = True) -> Optional[int]:
        """Load the latest version into the model if it is newer than the one held (in
        a new history: whatever its number); return it, else ``None``."""
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
        if cascade:
            self._cascade()
        return version

    def _load_newer(self, held: int) -> Optional[int]:
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
