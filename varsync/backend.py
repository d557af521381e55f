"""Everything a backend plugin needs, in one module: ``from varsync.backend import ...``.

A plugin imports from this module and from :mod:`varsync` only. What is here is the
stable protocol (see ``docs/plugins.md``, "What is stable"): names are added, deprecated
for a minor release with a ``DeprecationWarning``, then removed; never changed silently.

- the protocol: :class:`Backend`, :data:`Snapshot`, the table's :class:`Spec`;
- registration: :data:`hookimpl` and :class:`BackendRegistry`, the object the
  ``varsync_register_backends`` hook receives;
- errors: every varsync error, and :func:`translate_errors` to turn a driver's exceptions
  into them;
- time: :func:`deadline_after`, :func:`remaining`, and the core's wait loop
  (:func:`wait_for_change`, over your :meth:`Backend.block`); :func:`current_deadline`,
  the deadline of the core's call a method without a timeout argument runs in (set by
  :func:`deadline_scope`): bound your requests by it too;
- a table's history: :class:`Histories` and :func:`reset_error`, the one rule and message
  for a store that lost or replaced its data;
- options: :func:`parse_int`, :func:`parse_bool`, :func:`parse_timeout`,
  :func:`parse_host_port` (IPv6 in brackets), :func:`refuse_unknown`, and the
  ``wait_for_server`` option's :func:`parse_wait_for_server` with :func:`retry_until_up`;
- text: :func:`redact` (a URL without its secrets) and :func:`check_text`;
- for a plugin's own tests and benchmarks: :func:`filled`, :func:`check_consistent`,
  :func:`assert_bit_equal` (loaded on first use; the conformance suite itself is
  :mod:`varsync.testing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from varsync.backends.base import (
    BLOCK_SLICE,
    POLL_MAX,
    POLL_START,
    Backend,
    LeafSnapshot,
    Snapshot,
    current_deadline,
    deadline_after,
    deadline_scope,
    read_snapshot,
    remaining,
    wait_for_change,
)
from varsync.config import check_text, redact
from varsync.errors import (
    AuthenticationError,
    BackendConnectionError,
    ConcurrentPushError,
    ConfigurationError,
    CorruptDataError,
    ErrorMap,
    ItemTooLargeError,
    MissingDependencyError,
    PullTimeoutError,
    TableConfigurationError,
    TableExistsError,
    TableNotFoundError,
    TableResetError,
    UnsupportedError,
    VarsyncError,
    translate_errors,
    translated_error,
)
from varsync.history import Histories, reset_error
from varsync.hookspecs import hookimpl
from varsync.options import (
    MAX_TIMEOUT,
    HostPort,
    parse_bool,
    parse_host_port,
    parse_int,
    parse_timeout,
    refuse_unknown,
)
from varsync.registry import BackendRegistry, reset_registry
from varsync.server_wait import parse_wait_for_server, retry_until_up
from varsync.signature import Spec

if TYPE_CHECKING:  # at run time, loaded on first use by __getattr__ below
    from varsync.testing.values import assert_bit_equal, check_consistent, filled

__all__ = [
    # the protocol
    "Backend",
    "Snapshot",
    "LeafSnapshot",
    "Spec",
    # registration
    "hookimpl",
    "BackendRegistry",
    "reset_registry",
    # errors
    "VarsyncError",
    "ConfigurationError",
    "TableNotFoundError",
    "TableExistsError",
    "TableConfigurationError",
    "TableResetError",
    "ConcurrentPushError",
    "ItemTooLargeError",
    "CorruptDataError",
    "PullTimeoutError",
    "BackendConnectionError",
    "AuthenticationError",
    "MissingDependencyError",
    "UnsupportedError",
    "ErrorMap",
    "translate_errors",
    "translated_error",
    # time and waits
    "deadline_after",
    "remaining",
    "wait_for_change",
    "read_snapshot",
    "BLOCK_SLICE",
    "current_deadline",
    "deadline_scope",
    "POLL_START",
    "POLL_MAX",
    "MAX_TIMEOUT",
    # histories
    "Histories",
    "reset_error",
    # options
    "HostPort",
    "parse_int",
    "parse_bool",
    "parse_timeout",
    "parse_host_port",
    "refuse_unknown",
    "parse_wait_for_server",
    "retry_until_up",
    # text
    "redact",
    "check_text",
    # test values
    "filled",
    "check_consistent",
    "assert_bit_equal",
]

_TEST_VALUES = ("filled", "check_consistent", "assert_bit_equal")


def __getattr__(name: str) -> Any:
    # The test helpers live in varsync.testing, whose package imports pytest: only when used.
    if name in _TEST_VALUES:
        from varsync.testing import values

        return getattr(values, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
