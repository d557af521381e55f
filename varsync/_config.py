"""From ``connect(url, **options)`` to a backend: URL resolution and option parsing.

The URL comes from the argument, else the ``VARSYNC_URL`` environment variable, else the
embedded default ``memory://default``. Options come from the URL's query string and from
keyword arguments; a keyword argument wins over the same name in the query string.
``timeout`` and ``namespace`` are common to every backend; the rest are the backend's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from varsync._errors import ConfigurationError
from varsync._options import MAX_TIMEOUT, parse_timeout

__all__ = [
    "DEFAULT_URL",
    "DEFAULT_TIMEOUT",
    "ENV_URL",
    "Settings",
    "resolve",
    "redact",
    "parse_timeout",
    "check_text",
    "MAX_TIMEOUT",
]

DEFAULT_URL = "memory://default"
ENV_URL = "VARSYNC_URL"
DEFAULT_TIMEOUT = 30.0
"""Seconds any call may wait on a server or for data unless told otherwise."""


@dataclass(frozen=True)
class Settings:
    url: str
    scheme: str
    timeout: float | None
    namespace: str
    options: dict[str, Any]


def resolve(url: str | None, options: dict[str, Any]) -> Settings:
    """The URL and options ``connect`` was given, checked and split."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_URL
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"{redact(str(url))!r} is not a varsync URL; expected scheme://..., e.g. "
            "memory://default, reverb://localhost:8000 or redis://localhost:6379/0"
        )
    check_text(url, "the URL", shown=redact(url))
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"cannot parse the URL {redact(url)!r}: {exc}") from None
    try:
        query: list[tuple[str, str]] | None = parse_qsl(
            parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)
        )
    except ValueError:  # neither shown nor chained: it may quote a password cut at an '&'
        query = None
    if query is None:
        raise ConfigurationError(
            f"cannot parse the query string of the URL {redact(url.split('?', 1)[0])!r}: "
            "options are name=value pairs joined by '&' (percent-encode '&', '=' and '#' "
            "inside a value, such as a password)"
        )
    if not parts.scheme:
        raise ConfigurationError(f"the URL {redact(url)!r} has no scheme")
    merged: dict[str, Any] = {}
    for key, value in query:
        if key in merged:
            raise ConfigurationError(f"option {key!r} appears twice in the URL {redact(url)!r}")
        merged[key] = value
    merged.update(options)
    timeout = parse_timeout(merged.pop("timeout", DEFAULT_TIMEOUT), "timeout")
    if timeout == 0:
        # A container's timeout bounds every request it sends, and no request answers in
        # zero seconds; "do not wait for a push" is a call's timeout=0 (docs/guarantees.md).
        raise ConfigurationError(
            f"timeout=0 for the container at {redact(url)!r} would bound every request to "
            "0 s, so nothing could be read. Pass a positive number of seconds (the default "
            f"is {DEFAULT_TIMEOUT:g}) or timeout=None for no bound; to not wait for a push, "
            "give timeout=0 to the call: pull(timeout=0), wait_for(v, timeout=0)"
        )
    namespace = merged.pop("namespace", "")
    if not isinstance(namespace, str):
        raise ConfigurationError(f"namespace must be a str, got {namespace!r}")
    check_text(namespace, "namespace")
    return Settings(
        # Cut by hand: urlunsplit would turn "dir:///x" into "dir:/x".
        url=url.split("?", 1)[0].split("#", 1)[0],
        scheme=parts.scheme.lower(),
        timeout=timeout,
        namespace=namespace,
        options=merged,
    )


def check_text(text: str, what: str, shown: str | None = None) -> str:
    """``text`` if it is valid Unicode (storable as UTF-8), else :class:`ConfigurationError`.

    A ``str`` can hold lone surrogates (``"\\udc80"``, e.g. from ``os.fsdecode`` of bad
    bytes) that no engine can store; they are refused here, before any backend sees them.
    The message quotes ``shown`` (default: ``text``), e.g. a redacted URL.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{what} {text if shown is None else shown!a} is not valid Unicode: it holds "
            f"the lone surrogate {text[exc.start : exc.end]!a} at position {exc.start}, "
            "which no backend can store; use a name of valid characters"
        ) from None
    return text


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and ``repr``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "://" not in url and "@" in url:
        return "<URL with credentials>"
    if parts.password is not None:
        # From the raw netloc: parts.port raises on a bad port, parts.hostname drops
        # IPv6 brackets and case.
        userinfo, _, host = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    if parts.query:
        query = [
            (k, "***" if _is_secret(k) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query="&".join(f"{k}={v}" for k, v in query))
    if parts.scheme and not parts.netloc and url.startswith(f"{parts.scheme}://"):
        # urlunsplit writes "x:///a/b" as "x:/a/b", a URL connect would refuse
        return f"{parts.scheme}://" + urlunsplit(parts._replace(scheme=""))
    return urlunsplit(parts)


_SECRET_OPTIONS = {"password", "pass", "passwd", "token", "secret", "auth"}
_SECRET_PARTS = ("password", "passwd", "secret", "token")


def _is_secret(option: str) -> bool:
    """Whether a query option's value is a secret (``password``, ``ssl_password``,
    ``access_token``, ...)."""
    name = option.lower()
    return name in _SECRET_OPTIONS or any(part in name for part in _SECRET_PARTS)
