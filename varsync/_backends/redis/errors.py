"""redis-py's exceptions (and the bulk socket's), mapped to varsync errors here and nowhere
else: :func:`translated` around every call, :func:`reply_error` for an error reply read
off the socket directly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis import exceptions as rx

from varsync.backend import (
    AuthenticationError,
    BackendConnectionError,
    ConfigurationError,
    CorruptDataError,
    ErrorMap,
    ItemTooLargeError,
    PullTimeoutError,
    VarsyncError,
    translate_errors,
)

DRIVER_ERRORS: ErrorMap = {
    rx.AuthenticationError: AuthenticationError,
    getattr(rx, "AuthorizationError", rx.AuthenticationError): AuthenticationError,
    rx.NoPermissionError: AuthenticationError,
    rx.AuthenticationWrongNumberOfArgsError: AuthenticationError,
    rx.OutOfMemoryError: ItemTooLargeError,
    rx.ReadOnlyError: ConfigurationError,
    # a Redis Cluster's slot still in migration, or its slot map in flux, after the wait
    rx.TryAgainError: BackendConnectionError,
    rx.ClusterDownError: BackendConnectionError,
    rx.AskError: BackendConnectionError,  # MovedError too
    rx.ConnectionError: BackendConnectionError,
    rx.TimeoutError: BackendConnectionError,
    OSError: BackendConnectionError,  # the raw socket of bulk transfers
    rx.RedisError: VarsyncError,
}

OOM_HINT = (
    "the server reached its maxmemory; nothing was published and the table keeps its "
    "previous version. Raise maxmemory (a table needs about (keep + 2) x its size, see "
    "docs/redis.md) or free memory"
)

# Error replies by their first word, as redis-py classifies them.
_REPLY_ERRORS = (
    ("OOM", rx.OutOfMemoryError),
    ("NOPERM", rx.NoPermissionError),
    ("NOAUTH", rx.AuthenticationError),
    ("WRONGPASS", rx.AuthenticationError),
    ("READONLY", rx.ReadOnlyError),
    ("LOADING", rx.BusyLoadingError),
    ("MASTERDOWN", rx.MasterDownError),
    ("NOSCRIPT", rx.NoScriptError),
    ("TRYAGAIN", rx.TryAgainError),
    ("CLUSTERDOWN", rx.ClusterDownError),
    ("CROSSSLOT", rx.ClusterCrossSlotError),
)
# A Redis Cluster's redirections: the reply's words after the code are the slot and the
# node, which redis-py's exceptions parse.
_REDIRECTIONS = (("MOVED ", rx.MovedError), ("ASK ", rx.AskError))


class OutOfTime(Exception):
    """A request outlived the deadline of the call that made it (:func:`translated`
    makes it a :class:`PullTimeoutError`)."""


def reply_error(line: bytes) -> BaseException:
    """The exception for a reply line that is not the one expected (not raised)."""
    if line[:1] != b"-":
        return rx.InvalidResponse(f"unexpected reply {line[:60]!r}")
    text = line[1:].decode("utf-8", "replace")
    for word, redirection in _REDIRECTIONS:
        if text.startswith(word):
            with contextlib.suppress(ValueError):
                return redirection(text[len(word) :])
    for code, kind in _REPLY_ERRORS:
        if text.startswith(code):
            return kind(text)
    return rx.ResponseError(text)


def reclassified(exc: rx.RedisError) -> BaseException | None:
    """Errors redis-py reports as a plain ``ResponseError`` (or wrapped in a script
    error) that mean something specific."""
    text = str(exc)
    if "OOM command not allowed" in text:
        return rx.OutOfMemoryError(f"{OOM_HINT} ({text})")
    if "NOPERM" in text or "no permissions" in text or "can't run this command" in text:
        return rx.NoPermissionError(
            f"{text} (the ACL user lacks a command or key varsync needs; see the ACL "
            "line in docs/redis.md)"
        )
    if "WRONGTYPE" in text:
        return CorruptDataError(
            f"a key holds another kind of value than varsync stores there ({text}); is "
            "something else using this key prefix? Use another prefix or namespace."
        )
    return None


@contextlib.contextmanager
def translated(doing: str, address: str) -> Iterator[None]:
    """Turn redis-py's (and the bulk socket's) exceptions into varsync errors that say
    what was being done (``doing``) at which server."""
    with translate_errors(DRIVER_ERRORS, f"{doing} at {address}"):
        try:
            yield
        except OutOfTime as exc:
            raise PullTimeoutError(
                f"{doing} at {address}: {exc}; pass a longer timeout, or check that the "
                "server is not hung or overloaded"
            ) from None
        except rx.RedisError as exc:
            better = reclassified(exc)
            if better is None:
                raise
            if isinstance(better, VarsyncError):
                raise type(better)(f"{doing} at {address}: {better}") from exc
            raise better from exc
