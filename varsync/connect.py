"""``varsync.connect``: a URL (or ``VARSYNC_URL``, or the embedded default) to a container."""

from __future__ import annotations

from typing import Any, Optional

from varsync.config import resolve
from varsync.container import VariableContainer
from varsync.registry import backend_class

__all__ = ["connect"]


def connect(url: Optional[str] = None, **options: Any) -> VariableContainer:
    """A :class:`VariableContainer` on the backend the URL's scheme names.

    ``url``: ``memory://name``, ``reverb://host:port``, ``redis://host:port/db``, or a
    plugin's ``scheme://...``; ``None`` reads ``VARSYNC_URL``, then uses
    ``memory://default``. Options common to every backend: ``timeout`` (seconds bounding
    every wait, default 30; ``None`` for no bound) and ``namespace`` (isolates tables).
    Other options are the backend's own and may also come from the URL's query string.
    """
    settings = resolve(url, options)
    cls = backend_class(settings.scheme)
    backend = cls(
        settings.url,
        timeout=settings.timeout,
        namespace=settings.namespace,
        **settings.options,
    )
    return VariableContainer(backend, timeout=settings.timeout)
