"""The plugin host: pluggy's plugin manager, the plugins found through the ``varsync``
entry-point group, and the registries built by calling their hooks.

This module depends on the registries (:mod:`varsync._registry`, :mod:`varsync._adapters`),
never the reverse: importing :mod:`varsync` wires :func:`build_backends` and
:func:`build_adapters` into them, and each builds its registry on first use. Hooks are
called through ``pm.hook``. Each plugin is registered *guarded*: its hook functions run
with the registry told whose entries they add, and a failure is a
:class:`~varsync.PluginWarning` that skips that plugin, never the others. The built-in
backends and adapters register through the same hooks, first (``tryfirst``), so they keep
their schemes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import types
import warnings
from typing import Any, Callable

import pluggy

from varsync import _adapters as adapters
from varsync import _hookspecs as hookspecs
from varsync import _registry as registry
from varsync._errors import PluginWarning

__all__ = ["build_adapters", "build_backends", "plugin_manager", "reset"]

BUILTIN = "built-in"
#: The built-in plugins: the backends', then the framework adapters'.
_BUILTIN_PLUGINS = ("varsync._backends", "varsync._adapters.builtin")
_HOOKS = ("varsync_register_backends", "varsync_register_adapters")

_MANAGER: pluggy.PluginManager | None = None
_LOCK = threading.Lock()


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    found = importlib.metadata.entry_points()
    if hasattr(found, "select"):
        return list(found.select(group=hookspecs.PROJECT))
    return list(found.get(hookspecs.PROJECT, ()))  # Python 3.9


def _source_of(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return f"entry point {entry_point.name}"
    return f"{dist.metadata['Name']} {dist.version}"


def _warn_broken(name: str, source: str, exc: BaseException) -> None:
    warnings.warn(
        f"varsync plugin {name!r} from {source} failed to load and was skipped: "
        f"{type(exc).__name__}: {exc}",
        PluginWarning,
        stacklevel=4,
    )


def _guarded(plugin: Any, name: str, source: str, builtin: bool) -> Any:
    """``plugin``'s hook implementations, each wrapped to run under ``source`` (the
    registry it is given records it with every entry) and to turn its failure into a
    warning; built-ins run first."""
    hooks: dict[str, Callable[..., None]] = {}
    for hook in _HOOKS:
        function = getattr(plugin, hook, None)
        opts = getattr(function, f"{hookspecs.PROJECT}_impl", None)
        if function is None or opts is None:
            continue

        def guarded(registry: Any, _function: Any = function) -> None:
            registry._source = source
            try:
                _function(registry=registry)
            except Exception as exc:
                _warn_broken(name, source, exc)
            finally:
                registry._source = BUILTIN

        guarded.__name__ = hook
        setattr(guarded, f"{hookspecs.PROJECT}_impl", {**opts, "tryfirst": builtin})
        hooks[hook] = guarded
    return types.SimpleNamespace(**hooks)


def plugin_manager() -> pluggy.PluginManager:
    """The plugin manager, with the built-ins and every entry point's plugin registered
    (built once, until :func:`reset`)."""
    global _MANAGER
    with _LOCK:
        if _MANAGER is not None:
            return _MANAGER
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        for module in _BUILTIN_PLUGINS:
            plugin = importlib.import_module(module)
            manager.register(_guarded(plugin, module, BUILTIN, True), name=module)
        # pluggy calls the last registered first: registered in reverse, the plugins run
        # in the entry points' order, and the first to add a scheme keeps it
        for entry_point in reversed(_entry_points()):
            source = _source_of(entry_point)
            name = f"{source}: {entry_point.name}"
            if manager.has_plugin(name):
                continue  # the same distribution found twice on sys.path
            try:
                plugin = entry_point.load()
            except Exception as exc:  # a broken plugin must not break the others
                _warn_broken(entry_point.name, source, exc)
                continue
            manager.register(_guarded(plugin, entry_point.name, source, False), name=name)
        _MANAGER = manager
        return manager


def build_backends() -> registry.BackendRegistry:
    """A backend registry filled by every plugin's ``varsync_register_backends``."""
    backends = registry.BackendRegistry()
    plugin_manager().hook.varsync_register_backends(registry=backends)
    return backends


def build_adapters() -> adapters.AdapterRegistry:
    """An adapter registry filled by every plugin's ``varsync_register_adapters``."""
    made = adapters.AdapterRegistry()
    plugin_manager().hook.varsync_register_adapters(registry=made)
    return made


def reset() -> None:
    """Forget the plugin manager and the adapter registry: the next registry built scans
    the entry points again."""
    global _MANAGER
    with _LOCK:
        _MANAGER = None
    adapters.reset_adapter_registry()


registry.install(build_backends, reset)
adapters.install(build_adapters)
