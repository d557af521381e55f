"""Waiting for a server that is not up yet: the ``wait_for_server`` option, and its loop.

Programs of a distributed job start in any order, so a client may come up before its
server. With ``wait_for_server`` a backend retries its first connection until the server
answers, logging every few seconds, instead of failing at once. Generic: a backend hands
:func:`retry_until_up` one connection attempt and the bound parsed by
:func:`parse_wait_for_server`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, TypeVar

from varsync._backends.base import deadline_after, remaining
from varsync._errors import BackendConnectionError, ConfigurationError
from varsync._options import parse_timeout

__all__ = ["parse_wait_for_server", "describe_wait", "retry_until_up", "LOG_EVERY"]

log = logging.getLogger(__name__)

#: Seconds between two "still waiting" log lines.
LOG_EVERY = 5.0

T = TypeVar("T")

_FOREVER = ("true", "yes", "on", "forever", "none", "inf", "infinity")
_NEVER = ("false", "no", "off")


def parse_wait_for_server(value: Any, name: str = "wait_for_server") -> float | None:
    """Seconds to wait for a server that does not answer yet: ``0.0`` fails at once,
    ``None`` waits without bound. Takes ``False``/``0`` (do not wait), ``True``/``None``
    (no bound), seconds, or the same as text from a URL (``true``, ``forever``, ``60``)."""
    if value is None or value is True:
        return None
    if value is False:
        return 0.0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _FOREVER:
            return None
        if text in _NEVER:
            return 0.0
    try:
        return parse_timeout(value, name)
    except ConfigurationError:
        raise ConfigurationError(
            f"{name}={value!r} is not a wait: expected seconds (e.g. {name}=60), true or "
            f"forever to wait as long as it takes, or false to fail at once"
        ) from None


def describe_wait(bound: float | None) -> str:
    """``bound`` in words, for messages."""
    if bound is None:
        return "no bound"
    return f"up to {bound:g} s" if bound else "no wait"


def retry_until_up(
    attempt: Callable[[float], T], *, address: str, bound: float | None, what: str = "server"
) -> T:
    """``attempt(seconds_left)``'s result (``seconds_left``: of the wait; ``inf`` if
    unbounded or a single attempt), retried while it raises
    :class:`BackendConnectionError` for up to ``bound`` seconds (``None``: no bound; ``0``:
    one attempt). Logs a warning naming ``address`` at the first failure and every
    :data:`LOG_EVERY` seconds after. Only connection errors are retried: anything else,
    a ``KeyboardInterrupt`` too, ends the wait at once."""
    deadline = deadline_after(bound)
    started = time.monotonic()
    logged_at = -math.inf
    pause = 0.05
    while True:
        try:  # a single attempt (bound 0) keeps the attempt's own limits
            result = attempt(math.inf if bound == 0 else remaining(deadline))
        except BackendConnectionError as exc:
            left = remaining(deadline)
            if left <= 0:
                if bound == 0:
                    raise BackendConnectionError(
                        f"{exc} To wait for a {what} that is still starting, pass "
                        "wait_for_server=<seconds> (or True: no bound)."
                    ) from exc
                raise BackendConnectionError(
                    f"{exc} Gave up after waiting {time.monotonic() - started:.1f} s for it "
                    f"(wait_for_server={bound:g})."
                ) from exc
            now = time.monotonic()
            if now - logged_at >= LOG_EVERY:
                log.warning(
                    "waiting for the %s at %s to answer (%.0f s so far, %s): %s",
                    what,
                    address,
                    now - started,
                    describe_wait(bound),
                    exc,
                )
                logged_at = now
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)
            continue
        if logged_at > -math.inf:
            log.info(
                "the %s at %s answered after %.1f s", what, address, time.monotonic() - started
            )
        return result
