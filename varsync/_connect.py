"""``varsync.connect``: a URL (or ``VARSYNC_URL``, or the embedded default) to a container."""

from __future__ import annotations

from typing import Any

from varsync._config import resolve
from varsync._container import VariableContainer
from varsync._registry import backend_class

__all__ = ["connect"]


def connect(url: str | None = None, **options: Any) -> VariableContainer:
    """A :class:`VariableContainer` on the backend the URL's scheme names.

    ``url``: ``memory://name``, ``reverb://host:port``, ``redis://host:port/db``, or a
    plugin's ``scheme://...``; ``None`` reads ``VARSYNC_URL``, then uses
    ``memory://default``. Options common to every backend: ``timeout`` (seconds bounding
    every wait, default 30; ``None`` for no bound) and ``namespace`` (isolates tables).
    Other options are the backend's own and may also come from the URL's query string.
    ``metrics``: ``True`` or a ``prometheus_client.CollectorRegistry`` records Prometheus
    metrics of the backend's calls (:mod:`varsync._metrics`; off by default, and free then).
    """
    settings = resolve(url, options)
    backend_options = dict(settings.options)
    metrics = backend_options.pop("metrics", None)
    cls = backend_class(settings.scheme)
    backend = cls(
        settings.url,
        timeout=settings.timeout,
        namespace=settings.namespace,
        **backend_options,
    )
    if metrics is not None and metrics is not False:
        try:
            from varsync._metrics import metered

            backend = metered(backend, metrics, settings.scheme)
        except BaseException:
            backend.close()
            raise
    return VariableContainer(backend, timeout=settings.timeout)
