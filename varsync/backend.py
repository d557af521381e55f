"""Everything a backend plugin needs, in one module: ``from varsync.backend import ...``.

A plugin imports from this module and from :mod:`varsync` only. What is here is the
stable protocol (see ``docs/plugins.md``, "What is stable"): names are added, deprecated
for a minor release with a ``DeprecationWarning``, then removed; never changed silently.

- the protocol (version 1): :class:`Backend`, the answers :class:`Head`, :class:`Read`,
  :class:`LeafRead` and :class:`PatchRead`, the abilities :class:`SupportsBlockingWait`,
  :class:`SupportsLeafVersions`, :class:`SupportsElementDeltas` (with
  :class:`PatchLink`, :class:`LeafChain`, :func:`rebuilt_leaf` and, for tests,
  :func:`element_patch`), :class:`SupportsLeafSubsets` (with :func:`leaf_subset`) and
  :class:`SupportsReaderRegistry`, the table's :class:`Spec`;
- framework adapters (``varsync_register_adapters``, ``docs/adapters.md``):
  :class:`AdapterRegistry`, the :class:`Adapter` protocol, the nest nodes
  :class:`Ordered` and :data:`EMPTY`, and :func:`adapter_for`;
- registration: :data:`hookimpl` and :class:`BackendRegistry`, the object the
  ``varsync_register_backends`` hook receives;
- errors: every varsync error, and :func:`translate_errors` to turn a driver's exceptions
  into them;
- time: every method gets an absolute deadline (``time.monotonic()``, ``inf`` for none);
  :func:`request_timeout` turns it and your own ``timeout`` into one request's seconds,
  :func:`remaining` and :func:`deadline_after` do the arithmetic;
- a table's history: :func:`reset_error`, the message for a store that finds its own
  data replaced (the core compares epochs; a backend only mints them);
- options: :func:`parse_int`, :func:`parse_bool`, :func:`parse_timeout`,
  :func:`parse_host_port` (IPv6 in brackets), :func:`refuse_unknown`, and the
  ``wait_for_server`` option's :func:`parse_wait_for_server` with :func:`retry_until_up`;
- text: :func:`redact` (a URL without its secrets) and :func:`check_text`;
- for a plugin's own tests and benchmarks: :func:`filled`, :func:`check_consistent`,
  :func:`assert_bit_equal` (loaded on first use; the conformance suite itself is
  :mod:`varsync.testing`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from varsync._adapters import EMPTY, Adapter, AdapterRegistry, Ordered, adapter_for
from varsync._backends.base import (
    BLOCK_SLICE,
    POLL_MAX,
    POLL_START,
    Backend,
    Head,
    LeafChain,
    LeafRead,
    PatchLink,
    PatchRead,
    Read,
    SupportsBlockingWait,
    SupportsElementDeltas,
    SupportsLeafSubsets,
    SupportsLeafVersions,
    SupportsReaderRegistry,
    deadline_after,
    leaf_subset,
    remaining,
    request_timeout,
)
from varsync._config import check_text, redact
from varsync._errors import (
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
from varsync._history import reset_error
from varsync._hookspecs import hookimpl
from varsync._options import (
    MAX_TIMEOUT,
    HostPort,
    parse_bool,
    parse_host_port,
    parse_int,
    parse_timeout,
    refuse_unknown,
)
from varsync._patches import element_patch, rebuilt_leaf
from varsync._registry import BackendRegistry, reset_registry
from varsync._server_wait import parse_wait_for_server, retry_until_up
from varsync._signature import Spec

if TYPE_CHECKING:  # at run time, loaded on first use by __getattr__ below
    from varsync.testing.values import assert_bit_equal, check_consistent, filled

__all__ = [
    # the protocol
    "Backend",
    "Head",
    "Read",
    "LeafRead",
    "SupportsBlockingWait",
    "SupportsLeafVersions",
    "SupportsReaderRegistry",
    "SupportsElementDeltas",
    "SupportsLeafSubsets",
    "leaf_subset",
    "PatchLink",
    "LeafChain",
    "PatchRead",
    "rebuilt_leaf",
    "element_patch",
    "Spec",
    # registration
    "hookimpl",
    "BackendRegistry",
    "reset_registry",
    # framework adapters (the hook varsync_register_adapters; docs/adapters.md)
    "AdapterRegistry",
    "Adapter",
    "Ordered",
    "EMPTY",
    "adapter_for",
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
    # time
    "deadline_after",
    "remaining",
    "request_timeout",
    "BLOCK_SLICE",
    "POLL_START",
    "POLL_MAX",
    "MAX_TIMEOUT",
    # histories
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


#: Names of the 0.2 protocol, kept for one release: what each was, and what replaces it.
_DEPRECATED = {
    "Snapshot": "Read (read() answers Read(head, arrays))",
    "LeafSnapshot": "LeafRead (read_leaves() answers LeafRead(head, leaf_versions, arrays))",
    "Histories": "nothing: a backend mints epochs and answers them in each Head; the core "
    "compares them",
    "read_snapshot": "backend.read(name, newer_than, deadline, specs)",
    "wait_for_change": "nothing: the core owns the wait loop over head() and block()",
}


def __getattr__(name: str) -> Any:
    # The test helpers live in varsync.testing, whose package imports pytest: only when used.
    if name in _TEST_VALUES:
        from varsync.testing import values

        return getattr(values, name)
    if name in _DEPRECATED:
        warnings.warn(
            f"varsync.backend.{name} is the 0.2 protocol's, deprecated in 0.3 and removed in "
            f"0.4; use {_DEPRECATED[name]} (docs/plugins.md, 'Porting a 0.2 backend')",
            DeprecationWarning,
            stacklevel=2,
        )
        from varsync._backends import legacy

        return getattr(legacy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
