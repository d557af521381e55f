"""Option parsing shared by every backend: integers, booleans, timeouts, ``host:port``.

A backend's options come from keyword arguments and from the URL's query string, so each
may arrive as text (``"5"``, ``"true"``, ``"none"``) or as a Python value. These parsers
take both and raise :class:`~varsync.ConfigurationError` naming the option, the value and
what was expected. They are public through :mod:`varsync.backend`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from varsync._errors import ConfigurationError

__all__ = [
    "MAX_TIMEOUT",
    "HostPort",
    "parse_int",
    "parse_bool",
    "parse_timeout",
    "parse_host_port",
    "refuse_unknown",
]

MAX_TIMEOUT = 2**31 - 1
"""Seconds (68 years) beyond which a timeout means no bound: sockets, threads and Reverb's
whole-second deadlines cannot count further."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NO_BOUND = ("none", "inf", "infinity", "forever")


def parse_int(
    value: Any,
    name: str,
    low: int | None = None,
    high: int | None = None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """``value`` (an int, an integral float, or their text, as a URL's query string gives
    it; never a ``bool``) as an int of at least ``minimum`` and at most ``maximum``
    (``None``: no bound), else :class:`ConfigurationError` naming ``name`` and the range.
    ``minimum`` and ``maximum`` are bounds, not defaults: a default is the caller's
    (``options.pop("keep", 2)``). (``low`` and ``high``, the same bounds given by
    position, are 0.2's form, deprecated.)"""
    if low is not None or high is not None:
        warnings.warn(
            "parse_int(value, name, low, high) is deprecated: pass the bounds by keyword, "
            "parse_int(value, name, minimum=..., maximum=...)",
            DeprecationWarning,
            stacklevel=2,
        )
        minimum = low if minimum is None else minimum
        maximum = high if maximum is None else maximum
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{name}={value!r} is not an integer") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        if minimum is not None and maximum is not None:
            bound = f"between {minimum} and {maximum}"
        else:
            bound = f">= {minimum}" if minimum is not None else f"<= {maximum}"
        raise ConfigurationError(f"{name}={value!r} is out of range; expected {bound}")
    return number


def parse_bool(value: Any, name: str) -> bool:
    """``value`` as a bool: ``True``/``False`` or the text 1/0, true/false, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean; expected true or false")


def parse_timeout(value: Any, name: str) -> float | None:
    """Seconds as a float; ``None``, ``inf`` or ``"none"`` mean no bound."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in _NO_BOUND:
            return None
        try:
            value = float(value)
        except ValueError:
            raise ConfigurationError(
                f"{name}={value!r} is not a number of seconds; expected e.g. {name}=5 "
                f"or {name}=none for no bound"
            ) from None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and math.isnan(value))
    ):
        raise ConfigurationError(f"{name}={value!r} is not a number of seconds")
    if value < 0:
        raise ConfigurationError(f"{name}={value!r} is negative; expected seconds >= 0")
    return None if value > MAX_TIMEOUT else float(value)


class HostPort(NamedTuple):
    """A server's address from a URL."""

    host: str
    """The host name or address, IPv6 without brackets (as sockets take it)."""
    port: int

    @property
    def address(self) -> str:
        """``host:port``, an IPv6 address in brackets (``[::1]:6379``), for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_host_port(
    url: str,
    *,
    default_host: str | None = None,
    default_port: int | None = None,
    example: str,
) -> HostPort:
    """The host and port of ``url`` (``scheme://[user@]host:port/...``); IPv6 addresses
    are written in brackets, ``[::1]:8000``. A missing part takes its default; without a
    default it is an error, as is a port that is not a number in 1..65535. ``example`` is
    a valid URL, quoted in the message."""
    hostport = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # an unclosed IPv6 bracket, a port that is no number or too large
        raise ConfigurationError(
            f"the URL has a malformed port in {hostport!r}; expected a number in 1..65535, "
            f"e.g. {example}"
        ) from None
    if port is None:
        port = default_port
    elif port == 0:
        raise ConfigurationError(
            f"the URL has port 0 in {hostport!r}; expected a number in 1..65535, e.g. {example}"
        )
    host = parts.hostname or default_host
    if hostport.startswith("[") and "]" not in hostport:
        host = None
    if not host or port is None:
        missing = "host" if not host else "port"
        raise ConfigurationError(
            f"the URL names no {missing} ({hostport or 'nothing'} after '//'); expected "
            f"e.g. {example}"
        )
    return HostPort(host, port)


def refuse_unknown(options: dict[str, Any], known: Collection[str], backend: str) -> None:
    """Raise :class:`ConfigurationError` if ``options`` holds a name not in ``known``,
    listing the backend's options and the common ones."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        own = ", ".join(known) + ", and " if known else ""
        raise ConfigurationError(
            f"the {backend} backend takes no option(s) {unknown}; its options are "
            f"{own}timeout, namespace"
        )
