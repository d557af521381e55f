"""varsync as a vLLM weight-transfer engine: rollout engines serve a trainer's weights from
a varsync table, whole versions only, each one known by its number (docs/vllm.md).

Worker side, :class:`VarsyncWeightTransferEngine`, registered with vLLM's own
``WeightTransferEngineFactory`` as ``"varsync"`` by the ``vllm.general_plugins`` entry
point (:func:`register`), which vLLM loads in each of its processes. Chosen with
``LLM(..., weight_transfer_config={"backend": "varsync"})``; then, from the driver:

- ``init_weight_transfer_engine({"url": ..., "table": ..., "timeout": ...})``: connect.
- ``start_weight_update``, ``update_weights({"min_version": v, "timeout": t})``,
  ``finish_weight_update``: one update. ``update_weights`` waits up to ``t`` for a version
  newer than the one served (and at least ``v``), fetches it completely, checks it, and
  only then loads it through the model's own ``load_weights`` (vLLM's name mapping: the
  trainer's transformers names work as they are). Only the leaves changed since the
  version served are fetched and loaded (``pull_if_newer(held=...)``). On any failure or
  timeout nothing has been loaded: the engine serves its previous version, whole, and
  the caller gets the error within ``t``.
- ``finish_weight_update`` reports the version served in varsync's reader registry (as
  ``reader``), so that a trainer can ``wait_for_readers(v, n)``.

:func:`update_llm` drives the four phases of a synchronous ``vllm.LLM`` and sets its
``weight_version`` (which vLLM stamps on every output) to the varsync version.

Trainer side, :class:`WeightPublisher`: pushes a transformers/PyTorch model or
``state_dict`` (float32 or bfloat16, or cast to ``dtype``) to the table. vLLM's trainer
engine API drives the inference side over its own control channel; varsync's store is the
rendezvous instead, so the trainer needs no handle on the engines.

This module imports torch and vLLM: ``import varsync`` does not import it.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    layerwise_groups,
)
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

import varsync
from varsync import _readers as readers_lib
from varsync._adapters.torch import _tensor_of
from varsync._config import redact
from varsync._errors import ConfigurationError, PullTimeoutError, TableResetError, VarsyncError
from varsync.backend import SupportsReaderRegistry

__all__ = [
    "BACKEND",
    "VarsyncInitInfo",
    "VarsyncUpdateInfo",
    "VarsyncWeightTransferEngine",
    "WeightPublisher",
    "WeightUpdateError",
    "last_update",
    "register",
    "update_llm",
    "served_version",
]

BACKEND = "varsync"
DEFAULT_TABLE = "policy"
_TABLE_POLL = 0.05  # seconds between looks for a table not created yet


def register() -> None:
    """Register the engine with vLLM's factory as ``"varsync"`` (the
    ``vllm.general_plugins`` entry point; vLLM may call it more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    with contextlib.suppress(ValueError):  # registered already, by an earlier call
        WeightTransferEngineFactory.register_engine(
            BACKEND, __name__, "VarsyncWeightTransferEngine"
        )


@dataclass
class VarsyncInitInfo(WeightTransferInitInfo):
    """What ``init_weight_transfer_engine`` takes: the store's ``url``, the ``table``,
    ``timeout`` (seconds, the default bound of each update) and ``reader`` (the id this
    engine reports in the reader registry; default ``vllm-<host>:<pid>``)."""

    url: str = ""
    table: str = DEFAULT_TABLE
    timeout: float = 60.0
    reader: str | None = None


@dataclass
class VarsyncUpdateInfo(WeightTransferUpdateInfo):
    """What ``update_weights`` takes: ``min_version`` (wait for at least this version;
    0: any version newer than the one served) and ``timeout`` (this update's bound in
    seconds; ``None``: the init info's)."""

    min_version: int = 0
    timeout: float | None = None


class WeightUpdateError(VarsyncError, RuntimeError):
    """An update failed: the engine serves its previous version, whole (nothing of the
    new one was loaded, or what was is put back), unless the message says putting it back
    failed too, when the next update loads a whole version. The cause is chained
    (``__cause__``)."""


class VarsyncWeightTransferEngine(WeightTransferEngine[VarsyncInitInfo, VarsyncUpdateInfo]):
    """vLLM worker-side engine: loads whole varsync versions into the served model."""

    init_info_cls = VarsyncInitInfo
    update_info_cls = VarsyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store: varsync.VariableContainer | None = None
        self._info: VarsyncInitInfo | None = None
        self._reporter: readers_lib.Reporter | None = None
        self.weight_version = 0  # the varsync version the model holds; 0: none loaded
        self._history: Any = None  # its epoch, for the registry
        self._loaded_whole = False  # a whole version went in: deltas apply from here
        self._held: Mapping[str, np.ndarray] = {}  # the nest it came in, for deltas
        self.last_update: dict[str, float] = {}  # seconds and bytes of the last update

    # -- the four phases -----------------------------------------------------------------

    def init_transfer_engine(self, init_info: VarsyncInitInfo) -> None:
        if not isinstance(init_info.url, str) or not init_info.url:
            raise ConfigurationError(
                "the varsync engine needs the store's url in its init info, e.g. "
                "init_weight_transfer_engine({'url': 'redis://127.0.0.1:6379/0', "
                "'table': 'policy'}), the URL and table the trainer pushes to"
            )
        timeout = init_info.timeout
        if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ConfigurationError(
                f"timeout must be a finite number of seconds > 0, got {timeout!r}"
            )
        self.shutdown()  # a new table (or store): nothing of it is loaded yet
        self.weight_version, self._loaded_whole, self._held = 0, False, {}
        store = varsync.connect(init_info.url, timeout=timeout)
        try:
            backend = store.backend
            if isinstance(backend, SupportsReaderRegistry):
                reader = init_info.reader or f"vllm-{readers_lib.reader_id()}"
                self._reporter = readers_lib.Reporter(backend, reader, readers_lib.DEFAULT_TTL)
        except BaseException:
            store.close()
            raise
        self._store, self._info = store, init_info

    def start_weight_update(self) -> None:
        self._connected()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # receive_weights loads synchronously on the model's device; the base class's
        # torch.accelerator.synchronize() is for engines whose transfers are asynchronous
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: VarsyncUpdateInfo) -> None:
        store, info = self._connected()
        timeout = info.timeout if update_info.timeout is None else update_info.timeout
        if not (isinstance(timeout, (int, float)) and 0 <= timeout < math.inf):
            raise ConfigurationError(f"timeout must be a finite number of seconds, got {timeout!r}")
        started = time.perf_counter()
        try:
            version, nest, changed = self._fetch(
                store, info.table, update_info.min_version, timeout
            )
            fetched = time.perf_counter()
            loaded = self._load(nest, changed)
        except WeightUpdateError:
            raise  # from _put_back: it says what the engine serves
        except VarsyncError as exc:
            raise WeightUpdateError(
                f"varsync engine ({redact(info.url)}, table {info.table!r}): no new weights "
                f"loaded, the engine still serves version {self.weight_version} whole: "
                f"{exc}"
            ) from exc
        self.weight_version = version
        self._history = store._histories.epoch_of(info.table, version)
        self._held, self._loaded_whole = nest, True
        self.last_update = {
            "version": float(version),
            "fetch_s": fetched - started,
            "load_s": time.perf_counter() - fetched,
            "bytes_fetched": float(sum(nest[n].nbytes for n in changed)),
            "bytes_loaded": float(loaded),
        }

    def finish_weight_update(self) -> None:
        if self._reporter is not None and self.weight_version and self._info is not None:
            self._reporter.held(self._info.table, self.weight_version, self._history)

    def shutdown(self) -> None:
        reporter, self._reporter = self._reporter, None
        store, self._store = self._store, None
        if reporter is not None:
            reporter.close()  # its entry expires after the registry's ttl
        if store is not None:
            store.close()

    # -- the steps -----------------------------------------------------------------------

    def _connected(self) -> tuple[varsync.VariableContainer, VarsyncInitInfo]:
        if self._store is None or self._info is None:
            raise ConfigurationError(
                "the varsync engine is not initialised: call init_weight_transfer_engine"
                "({'url': ..., 'table': ...}) first (llm.collective_rpc("
                "'init_weight_transfer_engine', kwargs={'init_info': {...}}))"
            )
        return self._store, self._info

    def _fetch(
        self, store: varsync.VariableContainer, table: str, min_version: int, timeout: float
    ) -> tuple[int, Mapping[str, np.ndarray], list[str]]:
        """Wait for a version newer than the one served (and at least ``min_version``)
        and fetch it completely, within ``timeout``: ``(version, nest, changed names)``.
        After a whole version was loaded only the leaves changed since are fetched; the
        nest holds the previous arrays for the others."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            # every request this update sends is bounded by its deadline: the calls
            # that take no timeout (tables, signature) use the container's
            store.timeout = max(1e-3, deadline - time.monotonic())
            return store.timeout

        try:
            # the engine may start before the trainer: wait for its table
            while not self.weight_version:
                left()  # bounds store.tables()
                if table in store.tables():
                    break
                if deadline <= time.monotonic():
                    raise PullTimeoutError(
                        f"no table {table!r} after {timeout:g} s: the trainer creates it "
                        "with its first push (WeightPublisher.push)"
                    )
                time.sleep(min(_TABLE_POLL, left()))
            seen = 0  # the latest version seen of the table's history, 0: none yet
            while True:
                held = self._held if self._loaded_whole else None
                served = self.weight_version if held is not None else 0
                wanted = max(served, min_version - 1)
                try:
                    # wait on versions this container saw, never on min_version - 1: the
                    # table may be below it (the trainer has not pushed it yet), which
                    # a wait given a version would take for a history that went back
                    seen = max(seen, served)
                    while seen <= wanted:
                        seen = store.wait_for(seen, table, timeout=left())
                    got = store.pull_if_newer(served, table, timeout=left(), held=held)
                except PullTimeoutError as exc:
                    raise PullTimeoutError(
                        f"no version of table {table!r} newer than {wanted} could be fetched "
                        f"within {timeout:g} s (is the trainer pushing? {exc})"
                    ) from exc
                except TableResetError:
                    if held is None:
                        raise
                    self._loaded_whole = False  # a new history: load its next version whole
                    seen = 0
                    continue
                if got is not None and got[0] >= min_version:
                    break
        finally:
            store.timeout = self._info.timeout if self._info is not None else timeout
        version, nest = got
        if not isinstance(nest, Mapping) or not all(isinstance(k, str) for k in nest):
            raise ConfigurationError(
                f"table {table!r} holds a {type(nest).__name__}, not a state_dict: push the "
                "model or its state_dict (WeightPublisher.push)"
            )
        for name, array in nest.items():  # whole and as signed: checked before any load
            if not isinstance(array, np.ndarray):
                raise ConfigurationError(f"table {table!r}: leaf {name!r} is not an array")
        if held is None:
            return int(version), nest, list(nest)
        return int(version), nest, [n for n, a in nest.items() if a is not held.get(n)]

    def _load(self, nest: Mapping[str, np.ndarray], changed: list[str]) -> int:
        """Load the layers that hold a changed leaf through vLLM's layerwise reload and the
        model's own ``load_weights`` (its name mapping, its kernel-format processing);
        return the bytes loaded. A layer is loaded whole or not at all: a changed leaf
        brings its decoder layer's other leaves along (vLLM's ``layerwise_groups``).

        On the first load (of a history) the parameters are saved first and restored
        if ``load_weights`` fails or leaves a parameter unloaded. A later load that
        fails (out of memory, an interrupt) puts the served version's values of the same
        layers back through the same path (:meth:`_put_back`): the engine keeps that
        version's arrays for deltas anyway, so this costs no memory."""
        if not changed:
            return 0
        if len(changed) < len(nest):
            wanted = set(changed)
            names = [
                n for group in layerwise_groups(list(nest)) if wanted & set(group) for n in group
            ]
        else:
            names = list(nest)
        weights = _tensors(nest, names)
        first = not self._loaded_whole
        saved = [(p, p.detach().clone()) for p in self.model.parameters()] if first else []
        try:
            loaded = self._reload(weights)
            if first and loaded is not None:
                # a whole version must cover the model, or it would serve a mix
                missing = sorted(set(dict(self.model.named_parameters())) - set(loaded))
                if missing:
                    raise ConfigurationError(
                        f"the table's version does not cover the model: {len(missing)} of "
                        f"its parameters got nothing ({', '.join(missing[:4])}, ...). Push "
                        "the whole model's state_dict (WeightPublisher.push(model))"
                    )
        except BaseException as error:
            if not first:
                self._put_back(names, error)
            with torch.no_grad():  # a first load is undone: the previous weights stay whole
                for parameter, value in saved:
                    parameter.copy_(value)
            raise
        return sum(nest[name].nbytes for name in names)

    def _reload(self, weights: list[tuple[str, Any]]) -> Any:
        """``weights`` into the model through vLLM's layerwise reload and its
        ``load_weights``; what ``load_weights`` answers (the names it loaded)."""
        initialize_layerwise_reload(self.model)
        try:
            return self.model.load_weights(iter(weights))
        finally:
            finalize_layerwise_reload(self.model, self.model_config)

    def _put_back(self, names: list[str], error: BaseException) -> None:
        """A load of ``names`` failed with ``error``: load the served version's values
        of them again, then raise :class:`WeightUpdateError` (an interrupt stays one).
        If that fails too the engine holds no one version: say so, and load the next
        version whole."""
        try:
            self._reload(_tensors(self._held, names))
        except BaseException as again:
            self._loaded_whole = False  # the next update fetches and loads a whole version
            raise WeightUpdateError(
                f"loading a new version failed ({error!r}), and putting version "
                f"{self.weight_version} back failed too ({again!r}): the engine's weights "
                "are not one version until the next update, which loads a whole one"
            ) from error
        if not isinstance(error, Exception):
            raise error  # an interrupt, after the served version was put back
        raise WeightUpdateError(
            f"loading a new version failed ({error!r}); the engine still serves version "
            f"{self.weight_version} whole (its layers were loaded again)"
        ) from error


def _tensors(nest: Mapping[str, np.ndarray], names: list[str]) -> list[tuple[str, Any]]:
    with warnings.catch_warnings():
        # shm:// and memory:// hand out read-only views; load_weights only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writ")
        return [(name, _tensor_of(nest[name])) for name in names]


def served_version(worker: Any) -> int:
    """The varsync version a vLLM worker's engine serves (0: none loaded): for
    ``llm.collective_rpc(served_version)``."""
    engine = getattr(worker, "weight_transfer_engine", None)
    if not isinstance(engine, VarsyncWeightTransferEngine):
        raise ConfigurationError(
            "this vLLM worker's weight-transfer engine is not varsync's: start vLLM with "
            "weight_transfer_config={'backend': 'varsync'}"
        )
    return engine.weight_version


def last_update(worker: Any) -> dict[str, float]:
    """Seconds and bytes of a worker's last update: ``llm.collective_rpc(last_update)``."""
    engine = getattr(worker, "weight_transfer_engine", None)
    return dict(getattr(engine, "last_update", {}))


def update_llm(llm: Any, *, min_version: int = 0, timeout: float = 60.0) -> int:
    """Load the table's next version (at least ``min_version``) into a synchronous
    ``vllm.LLM`` through the four phases, then set the engine's ``weight_version`` to it
    (vLLM stamps it on outputs); return it. Raises :class:`WeightUpdateError` within
    ``timeout`` (plus vLLM's call overhead) when no whole version could be loaded: the
    engine then serves its previous version."""
    llm.collective_rpc("start_weight_update")
    info = {"min_version": int(min_version), "timeout": float(timeout)}
    llm.collective_rpc("update_weights", kwargs={"update_info": info})  # raises: session over
    llm.collective_rpc("finish_weight_update")
    versions = set(llm.collective_rpc(served_version))
    if len(versions) != 1:
        raise WeightUpdateError(
            f"vLLM's workers serve different varsync versions {sorted(versions)} after an "
            "update: update again"
        )
    version = versions.pop()
    llm.llm_engine.set_weight_version(str(version))
    return int(version)


class WeightPublisher:
    """Trainer side: push a transformers/PyTorch model (or its ``state_dict``) to a varsync
    table that vLLM engines load. The table is created from the first push. ``dtype``
    (e.g. ``torch.bfloat16``) casts floating tensors before pushing (a copy); ``None``
    pushes them as they are, without a copy on the CPU."""

    def __init__(
        self,
        url: str,
        table: str = DEFAULT_TABLE,
        *,
        timeout: float = 60.0,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.table = table
        self.dtype = dtype
        self.store = varsync.connect(url, timeout=timeout)
        self._created = False

    def state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        """What :meth:`push` sends: the ``state_dict`` (vLLM's ``load_weights`` names),
        cast to ``dtype``."""
        state = model.state_dict() if isinstance(model, torch.nn.Module) else model
        if self.dtype is None:
            return state
        return type(state)(
            (k, v.to(self.dtype) if v.is_floating_point() else v) for k, v in state.items()
        )

    def push(self, model: Any) -> int:
        """Publish ``model``'s weights; return the new version."""
        state = self.state_dict(model)
        if not self._created:
            self.store.create_table(self.table, state)
            self._created = True
        return self.store.push(state, self.table)

    def wait_for_engines(
        self, version: int, count: int, *, timeout: float | None = None
    ) -> list[readers_lib.ReaderInfo]:
        """Block until ``count`` engines serve ``version`` or newer (their registry
        reports); return them. Raises :class:`varsync.PullTimeoutError` after ``timeout``."""
        return self.store.wait_for_readers(version, count, self.table, timeout=timeout)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> WeightPublisher:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
