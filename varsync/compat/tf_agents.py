"""A drop-in for TF-Agents' ``ReverbVariableContainer``: change one import.

    # from tf_agents.experimental.distributed.reverb_variable_container import (
    #     ReverbVariableContainer, TRAIN_STEP_KEY, POLICY_KEY)
    from varsync.compat.tf_agents import ReverbVariableContainer, TRAIN_STEP_KEY, POLICY_KEY

Same constructor, methods, return types and exceptions as TF-Agents 0.19's class, over
varsync's Reverb backend (tables stay interchangeable), and the same waits that
distributed programs started in any order rely on: the constructor waits for the server
to come up, and ``pull``/``update`` of an empty table wait for a push, both without bound
by default (``wait_for_server=``, ``wait_for_push=``: seconds, then ``ConnectionError`` /
``TimeoutError``), logging every few seconds what they wait for. A reader whose server
goes away waits for it to come back as TF-Agents' does. Every single request to the
server is bounded by ``timeout`` (default 30 s), where TF-Agents' can hang on a server
that accepts but never answers. ``container`` gives the full varsync API (versions,
``pull_if_newer``, ``wait_for``). docs/migrating-from-tf-agents.md lists every difference.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

import numpy as np
import tensorflow as tf

import varsync
from varsync import (
    BackendConnectionError,
    ConcurrentPushError,
    PullTimeoutError,
    SignatureMismatchError,
)
from varsync._config import DEFAULT_TIMEOUT
from varsync._server_wait import LOG_EVERY, describe_wait, parse_wait_for_server
from varsync.backend import deadline_after, remaining

__all__ = ["ReverbVariableContainer", "DEFAULT_TABLE", "TRAIN_STEP_KEY", "POLICY_KEY"]

DEFAULT_TABLE = "variables"
TRAIN_STEP_KEY = "train_step"
POLICY_KEY = "policy_variables"

log = logging.getLogger(__name__)

#: Connection failures in a row, each after the server answered again, before a pull or
#: update gives up (a server that answers but fails every request is not "restarting").
_RECONNECTS = 3

T = TypeVar("T")


class ReverbVariableContainer:
    """Pushes and pulls nests of variables through tables of a Reverb server.

    Raises at construction, as TF-Agents does: ``KeyError`` if a listed table does not
    exist, ``TypeError`` if it has no signature, ``ValueError`` if its ``max_size`` is
    not 1 (varsync's errors subclass these). ``wait_for_server``: seconds to wait for a
    server that does not answer (at construction, and for a reader whose server went
    away); ``None`` (default) waits as long as it takes, ``0`` fails at once.
    ``wait_for_push``: seconds ``pull``/``update`` wait on an empty table; ``None``
    (default) as long as it takes. ``timeout`` bounds each request to the server.
    """

    def __init__(
        self,
        server_address: str,
        table_names: Iterable[str] = (DEFAULT_TABLE,),
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        wait_for_server: Any = None,
        wait_for_push: Any = None,
    ) -> None:
        self._url = server_address if "://" in server_address else f"reverb://{server_address}"
        self._address = self._url.split("://", 1)[1]
        self._timeout = timeout
        self._wait_for_server = parse_wait_for_server(wait_for_server)
        self._wait_for_push = parse_wait_for_server(wait_for_push, "wait_for_push")
        self._reconnect_lock = threading.Lock()
        self._lost = False  # a reconnect failed: the next call makes one first
        #: The full varsync API on this connection (a new one after a reconnect).
        self.container = self._connect(self._wait_for_server)
        self._signatures = {}
        try:
            for table in table_names:
                self._signatures[table] = self.container.signature(table)
        except BaseException:
            self.container.close()
            raise

    def push(self, values: Any, table: str = DEFAULT_TABLE) -> None:
        """Pushes a nest of tensors, variables or arrays into ``table``.

        ``KeyError`` for a table not given at construction;
        ``tf.errors.InvalidArgumentError`` when the nest's structure (sequence types
        aside) or dtypes differ from the table's signature; ``ConnectionError`` while the
        server is down (a push after it restarted goes through, as with TF-Agents').
        """
        self._check_table(table)
        try:
            try:  # its version goes unused: the backend need not ask for it (Reverb)
                self._live()._push_unversioned(values, table)
            except BackendConnectionError as exc:
                # Maybe restarted: one retry on a new connection if it answers now (a
                # push that landed twice only repeats the latest value); if it does not,
                # this error, as TF-Agents' push raises at once while the server is down.
                try:
                    self._reconnect(bound=0)
                except BackendConnectionError:
                    raise exc from None
                self.container._push_unversioned(values, table)
        except SignatureMismatchError as exc:
            raise tf.errors.InvalidArgumentError(None, None, str(exc)) from exc
        except ConcurrentPushError:
            pass  # published; only its version is unknown, and push returns none

    def pull(self, table: str = DEFAULT_TABLE) -> Any:
        """Pulls ``table``'s value as a nest of tensors shaped like its signature,
        waiting for a push while the table is empty (see ``wait_for_push``)."""
        self._check_table(table)
        values = self._when_filled(table, lambda: self._live().pull(table, timeout=0))
        return tf.nest.map_structure(_to_tensor, values)

    def update(self, variables: Any, table: str = DEFAULT_TABLE) -> None:
        """Pulls ``table`` and assigns the values into ``variables`` (``tf.Variable``s),
        waiting for a push while the table is empty (see ``wait_for_push``).

        ``KeyError`` for an unknown table; ``ValueError`` when the variables' structure
        or dtypes do not match. Every variable is assigned, as TF-Agents' class does (not
        only the leaves changed since the last update: ``docs/delta.md``).
        """
        self._check_table(table)
        self._when_filled(
            table, lambda: self._live().update(variables, table, timeout=0, delta_only=False)
        )

    def _check_table(self, table: str) -> None:
        if table not in self._signatures:
            raise KeyError(
                f"Could not find the table {table}. Available tables: {list(self._signatures)}"
            )

    # -- waits ---------------------------------------------------------------------

    def _connect(self, bound: float | None) -> varsync.VariableContainer:
        return varsync.connect(self._url, timeout=self._timeout, wait_for_server=bound)

    def _live(self) -> varsync.VariableContainer:
        """The connection, made again first (one attempt) if the last reconnect failed."""
        if self._lost:
            self._reconnect(bound=0)
        return self.container

    def _reconnect(self, bound: float | None) -> None:
        """Replace the connection by a new one, waiting up to ``bound`` for the server.

        The old one is closed first. gRPC shares a connection to an address among the
        clients of a process, and with it its reconnect backoff, which grows to seconds
        while the server is down: a client made while the old one lives waits that out,
        past a short ``timeout``, however long the server has been back. If connecting
        fails, the next call connects again first (:meth:`_live`)."""
        with self._reconnect_lock:
            log.warning(
                "lost the Reverb server at %s; connecting again (%s)",
                self._address,
                describe_wait(bound),
            )
            self._lost = True
            self.container.close()
            self.container = self._connect(bound)
            self._lost = False

    def _when_filled(self, table: str, read: Callable[[], T]) -> T:
        """``read()`` (a pull that does not wait for pushes) once the table holds a value:
        waits up to ``wait_for_push`` while it is empty, and for the server (up to
        ``wait_for_server``) while it does not answer, as TF-Agents' pull blocks."""
        deadline = deadline_after(self._wait_for_push)
        started = time.monotonic()
        logged_at = -math.inf
        reconnects = 0
        while True:
            try:
                try:
                    return read()
                except PullTimeoutError as exc:
                    # A slow transfer, not a wait, unless the table was empty when read
                    # (a push may have landed since: the next read takes it)
                    if not exc.still_empty and self._live().version(table) != 0:
                        raise
                left = remaining(deadline)
                if left <= 0:
                    raise PullTimeoutError(
                        f"Reverb table {table!r} at {self._address} is still empty after "
                        f"{self._wait_for_push:g} s (wait_for_push={self._wait_for_push:g}); "
                        "is the learner pushing? Wait longer with a larger wait_for_push, "
                        "or None for no bound."
                    ) from None
                now = time.monotonic()
                if now - logged_at >= LOG_EVERY:
                    log.warning(
                        "waiting for a push to the empty table %r at %s (%.0f s so far, %s)",
                        table,
                        self._address,
                        now - started,
                        describe_wait(self._wait_for_push),
                    )
                    logged_at = now
                with contextlib.suppress(PullTimeoutError):
                    self._live().wait_for(0, table, timeout=min(left, LOG_EVERY))
                reconnects = 0
            except BackendConnectionError:
                reconnects += 1
                if reconnects > _RECONNECTS:
                    raise
                self._reconnect(self._wait_for_server)


#: Below this size a copy costs less than the checks that avoid it.
_ALIAS_FROM_BYTES = 1 << 16


def _to_tensor(array: np.ndarray) -> Any:
    """A pulled array as a tensor; without a copy when its memory allows it.

    ``tf.convert_to_tensor`` always copies. A large, writable, C-contiguous array whose
    memory is 64-byte aligned (what TensorFlow requires of a tensor's buffer; the Reverb
    backend's pulls are views of tensors, so theirs always is) is handed over through
    DLPack instead, and the tensor keeps the array alive. The pulled arrays belong to
    this call alone, so nothing else sees the shared memory.
    """
    if (
        array.nbytes >= _ALIAS_FROM_BYTES
        and array.flags.writeable
        and array.flags.c_contiguous
        and array.ctypes.data % 64 == 0
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # a dtype DLPack does not carry: copy it instead
            pass
    return _copied_tensor(array)


def _copied_tensor(array: np.ndarray) -> Any:
    """``tf.convert_to_tensor(array)``, made the way it makes one in eager mode without
    its dispatch and conversion-registry layers (a third of its cost measured on a small
    array: most of a small pull's conversion); through it where that way is missing."""
    if _eager_context is None:  # pragma: no cover - a TensorFlow that moved them
        return tf.convert_to_tensor(array)
    ctx = _eager_context()
    if not ctx.executing_eagerly():  # pragma: no cover - pulls run eagerly
        return tf.convert_to_tensor(array)
    ctx.ensure_initialized()
    return _EagerTensor(array, ctx.device_name, None)


try:  # what _copied_tensor makes tensors with
    from tensorflow.python.eager.context import context as _eager_context
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - a TensorFlow that moved them
    _eager_context = None
