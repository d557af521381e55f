"""Which backend serves which URL scheme: built-ins and plugins, found through pluggy.

Plugins come from the ``varsync`` entry-point group. Each registers backends as
``"module:Class"`` strings, so listing backends imports no storage client; the class is
imported the first time a URL of its scheme is connected to. A plugin that fails to load
is reported with a :class:`PluginWarning` and the others keep working.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from varsync._errors import (
    ConfigurationError,
    MissingDependencyError,
    PluginWarning,
    UnknownBackendError,
)

__all__ = [
    "BackendEntry",
    "install",
    "BackendRegistry",
    "PluginWarning",
    "available_backends",
    "backend_class",
    "get_registry",
    "reset_registry",
]

BUILTIN = "built-in"


@dataclass(frozen=True)
class BackendEntry:
    """One registered backend. ``installed`` says whether its dependencies import."""

    scheme: str
    target: str
    source: str
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    description: str = ""
    missing: tuple[str, ...] = field(default=(), compare=False)

    @property
    def installed(self) -> bool:
        return not self.missing


class BackendRegistry:
    """Backends by scheme. Plugins receive one in ``varsync_register_backends``."""

    def __init__(self) -> None:
        self._entries: dict[str, BackendEntry] = {}
        self._classes: dict[str, type] = {}
        self._source = BUILTIN
        self._lock = threading.Lock()

    def add(
        self,
        scheme: str,
        target: str,
        *,
        requires: Sequence[str] = (),
        extra: str | None = None,
        install_hint: str | None = None,
        description: str = "",
    ) -> None:
        """Register ``target`` (``"module:Class"``) for URLs ``scheme://...``.

        ``requires`` names the top-level modules the backend imports; ``extra`` is
        varsync's pip extra that installs them (built-ins) and ``install_hint`` the
        command to print otherwise. The first backend registered for a scheme keeps it.
        """
        scheme = scheme.lower()
        if not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
            raise ConfigurationError(f"backend scheme {scheme!r} is not a valid URL scheme")
        if target.count(":") != 1:
            raise ConfigurationError(
                f"backend target {target!r} for {scheme}:// must be 'module:Class'"
            )
        hint = install_hint or (f'pip install "varsync[{extra}]"' if extra else "")
        if not hint and requires:
            hint = "pip install " + " ".join(requires)
        entry = BackendEntry(
            scheme=scheme,
            target=target,
            source=self._source,
            requires=tuple(requires),
            install_hint=hint,
            description=description,
            missing=tuple(m for m in requires if importlib.util.find_spec(m) is None),
        )
        previous = self._entries.get(scheme)
        if previous is not None:
            warnings.warn(
                f"{entry.source} registers {scheme}:// again ({target}); keeping "
                f"{previous.target} from {previous.source}",
                PluginWarning,
                stacklevel=2,
            )
            return
        self._entries[scheme] = entry

    @property
    def entries(self) -> Mapping[str, BackendEntry]:
        """A read-only view of the registered backends by scheme."""
        return MappingProxyType(self._entries)

    def backend_class(self, scheme: str) -> type:
        """The backend class for ``scheme``, imported on first use."""
        scheme = scheme.lower()
        entry = self._entries.get(scheme)
        if entry is None:
            raise UnknownBackendError(
                f"no varsync backend for {scheme}://; installed schemes: "
                f"{', '.join(s + '://' for s in sorted(self._entries)) or 'none'}. "
                "Third-party backends are packages with a 'varsync' entry point."
            )
        with self._lock:
            if scheme not in self._classes:
                self._classes[scheme] = _checked_class(entry, _import_target(entry))
            return self._classes[scheme]


def _import_target(entry: BackendEntry) -> type:
    module_name, _, class_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or module_name
        hint = f"; install it with: {entry.install_hint}" if entry.install_hint else ""
        raise MissingDependencyError(
            f"the {entry.scheme}:// backend ({entry.target}, from {entry.source}) could not "
            f"import {missing!r}{hint}"
        ) from exc
    try:
        cls: type = getattr(module, class_name)
    except AttributeError:
        raise ConfigurationError(
            f"the {entry.scheme}:// backend names {entry.target}, but {module_name} has no "
            f"{class_name}; the plugin from {entry.source} is broken"
        ) from None
    return cls


def _checked_class(entry: BackendEntry, cls: type) -> type:
    """The class the registry hands out for ``entry``: ``cls`` if it speaks protocol 1
    and implements every method of the abilities it declares; a 0.2-protocol class
    adapted, once, with a ``DeprecationWarning`` (the one door for old backends)."""
    from varsync._backends import legacy
    from varsync._backends.base import Backend, is_legacy, missing_methods

    where = f"the {entry.scheme}:// backend {entry.target} (from {entry.source})"
    if not isinstance(cls, type):
        raise ConfigurationError(f"{where} is not a class")
    if is_legacy(cls):
        warnings.warn(
            f"{where} is written to the 0.2 Backend protocol, which varsync 0.3 adapts "
            f"and 0.4 will not: {legacy.PORTING}",
            DeprecationWarning,
            stacklevel=4,
        )
        return legacy.adapted(cls)
    if not issubclass(cls, Backend):
        raise ConfigurationError(
            f"{where} does not subclass varsync.backend.Backend (docs/plugins.md)"
        )
    missing = missing_methods(cls)
    if missing:
        raise ConfigurationError(
            f"{where} declares methods it does not implement: "
            + "; ".join(f"{owner}: {', '.join(names)}" for owner, names in missing.items())
        )
    return cls


_REGISTRY: BackendRegistry | None = None
_REGISTRY_LOCK = threading.Lock()
#: Set by the plugin host (``varsync._plugins``) when ``varsync`` is imported: how to
#: build the registry, and how to make the host scan the entry points again.
_BUILD: Callable[[], BackendRegistry] | None = None
_RESET: Callable[[], None] | None = None


def install(build: Callable[[], BackendRegistry], reset: Callable[[], None]) -> None:
    """The plugin host's hand-over: ``build`` makes the registry on first use."""
    global _BUILD, _RESET
    _BUILD, _RESET = build, reset


def get_registry() -> BackendRegistry:
    """The process-wide registry, built on first use."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            if _BUILD is None:  # pragma: no cover - importing varsync installs it
                raise RuntimeError("varsync's plugin host is not installed: import varsync")
            _REGISTRY = _BUILD()
        return _REGISTRY


def reset_registry() -> None:
    """Forget the registries (backends and framework adapters) so the next use scans the
    entry points again."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        _REGISTRY = None
    if _RESET is not None:
        _RESET()


def available_backends() -> list[BackendEntry]:
    """Every registered backend: scheme, source, and whether its dependencies import."""
    return sorted(get_registry().entries.values(), key=lambda e: e.scheme)


def backend_class(scheme: str) -> type[Any]:
    return get_registry().backend_class(scheme)
