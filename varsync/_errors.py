"""Every error varsync raises, under one root.

    VarsyncError
    ├── ConfigurationError (ValueError)        bad URL, option or argument
    │   └── UnknownBackendError                no backend for that URL scheme
    ├── MissingDependencyError (ImportError)   a backend's optional extra is not installed
    ├── TableNotFoundError (KeyError)          no table of that name
    ├── LeafPathError (KeyError)               a leaf path not in the table's signature
    ├── TableExistsError (ValueError)          create_table with another signature
    ├── TableConfigurationError (ValueError)   a server-side table varsync cannot use
    ├── MissingSignatureError (TypeError)      a server-side table without a signature
    ├── SignatureError (ValueError)            a signature or example nest varsync cannot use
    ├── SignatureMismatchError (ValueError)    values that do not fit the table's signature
    ├── ItemTooLargeError (ValueError)         a push over the engine's size limit
    ├── CorruptDataError (ValueError)          stored bytes or metadata that do not add up
    ├── TableResetError (RuntimeError)         the table's history restarted (data lost)
    ├── ConcurrentPushError (RuntimeError)     published, but its version is unknown (two writers)
    ├── PullTimeoutError (TimeoutError)        a bounded wait ran out
    │   └── ShardTimeoutError                  a sharded version not complete in time
    ├── UnsupportedError (NotImplementedError) the backend lacks an optional ability
    └── BackendConnectionError (ConnectionError)   the engine cannot be reached
        └── AuthenticationError                    the engine refused the credentials

Each specific error also subclasses the built-in a TF-Agents user already catches, so
``except KeyError`` around ``push(..., table=...)`` keeps working.

Backends turn their driver's exceptions into these in one place, with
:func:`translate_errors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

__all__ = [
    "VarsyncError",
    "ConfigurationError",
    "UnknownBackendError",
    "MissingDependencyError",
    "TableNotFoundError",
    "LeafPathError",
    "TableExistsError",
    "TableConfigurationError",
    "MissingSignatureError",
    "SignatureError",
    "SignatureMismatchError",
    "ItemTooLargeError",
    "CorruptDataError",
    "TableResetError",
    "ConcurrentPushError",
    "PullTimeoutError",
    "ShardTimeoutError",
    "UnsupportedError",
    "BackendConnectionError",
    "AuthenticationError",
    "PluginWarning",
    "translate_errors",
    "translated_error",
]


class VarsyncError(Exception):
    """Root of every error varsync raises."""


class ConfigurationError(VarsyncError, ValueError):
    """A URL, option or argument is malformed or out of range."""


class UnknownBackendError(ConfigurationError):
    """No installed backend handles the URL's scheme."""


class MissingDependencyError(VarsyncError, ImportError):
    """A backend needs an optional dependency that is not installed."""


class TableNotFoundError(VarsyncError, KeyError):
    """The named table does not exist."""

    def __str__(self) -> str:
        # KeyError.__str__ would show the message in quotes, as a repr.
        return str(self.args[0]) if self.args else ""


class LeafPathError(VarsyncError, KeyError):
    """A leaf path (``push_leaves``) that is not in the table's signature; the message
    names the nearest valid paths."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TableExistsError(VarsyncError, ValueError):
    """``create_table`` named an existing table with a different signature."""


class TableConfigurationError(VarsyncError, ValueError):
    """A table exists on the server but is configured so varsync cannot use it."""


class MissingSignatureError(VarsyncError, TypeError):
    """A table exists on the server but carries no signature."""


class SignatureError(VarsyncError, ValueError):
    """A signature, spec or example nest that cannot describe a table (bad dtype, unknown
    shape, unsortable or non-string/int dict keys, ``None`` leaves)."""


class SignatureMismatchError(VarsyncError, ValueError):
    """Values do not match the table's signature (structure, dtype or shape)."""


class ItemTooLargeError(VarsyncError, ValueError):
    """A push is larger than the engine can carry; nothing was sent."""


class CorruptDataError(VarsyncError, ValueError):
    """Stored data or metadata is inconsistent, foreign or of an unknown format."""


class TableResetError(VarsyncError, RuntimeError):
    """The table is at a lower version than one the caller holds: its history restarted
    (for example the server lost its data). Versions from before are meaningless now;
    ``pull()`` or ``pull_if_newer(0)`` resynchronises."""


class ConcurrentPushError(VarsyncError, RuntimeError):
    """A push was published, but another writer pushed to the table at the same moment
    and the engine cannot tell which of the new versions is this one (Reverb). Raised
    rather than returning a number another writer may also be given."""

    def __init__(self, message: str, *, low: int, high: int) -> None:
        super().__init__(message)
        #: This push's version is one of ``low..high``.
        self.low = low
        self.high = high


class PullTimeoutError(VarsyncError, TimeoutError):
    """A bounded wait (pull of an empty table, wait_for, a slow server) ran out."""

    #: True when the pull found the table empty and its wait for a first push ran out
    #: (nothing was there to transfer), not when a transfer was too slow.
    still_empty: bool = False


class ShardTimeoutError(PullTimeoutError):
    """``push_shard``: the version of a training step did not get every rank's part within
    the timeout. Nothing was published: readers keep the previous whole version, and the
    step's parts are overwritten by the next step's. ``missing`` names the ranks whose
    part of ``step`` had not arrived."""

    def __init__(self, message: str, *, step: int, missing: list[int]) -> None:
        super().__init__(message)
        #: The training step that was abandoned.
        self.step = step
        #: The ranks whose part of it had not arrived.
        self.missing = missing


class UnsupportedError(VarsyncError, NotImplementedError):
    """The backend does not have the optional ability a call needs (e.g. leaf versions
    for ``leaf_versions``); the message says which, and what to use instead."""


class PluginWarning(UserWarning):
    """A varsync plugin failed to load or registered something invalid (a warning, not
    an error: the other plugins keep working)."""


class BackendConnectionError(VarsyncError, ConnectionError):
    """The storage engine could not be reached or dropped the connection."""


class AuthenticationError(BackendConnectionError):
    """The storage engine refused the credentials or the permissions are missing."""


ErrorMap = Mapping[type[BaseException], type[VarsyncError]]


@contextlib.contextmanager
def translate_errors(mapping: ErrorMap, where: str) -> Iterator[None]:
    """Re-raise driver exceptions as varsync errors, naming ``where`` (an address).

    ``mapping`` goes from a driver exception class to a varsync error class; the first
    entry the exception is an instance of wins, so list subclasses first. varsync's own
    errors pass through untouched.
    """
    try:
        yield
    except BaseException as exc:
        error = translated_error(mapping, where, exc)
        if error is exc:
            raise
        raise error from exc


def translated_error(mapping: ErrorMap, where: str, exc: BaseException) -> BaseException:
    """The error :func:`translate_errors` raises for ``exc``: ``exc`` itself if it is a
    varsync error or in no entry of ``mapping``. For a hot path that catches its driver's
    exceptions itself (the context manager measured ~12 us a call around a request)."""
    if isinstance(exc, VarsyncError):
        return exc
    for driver_type, varsync_type in mapping.items():
        if isinstance(exc, driver_type):
            return varsync_type(f"{where}: {type(exc).__name__}: {exc}")
    return exc
