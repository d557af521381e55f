"""The hooks a varsync plugin implements (pluggy project ``varsync``).

A plugin is a module or object with ``@hookimpl`` functions, published through the
``varsync`` entry-point group::

    # pyproject.toml of a plugin
    [project.entry-points.varsync]
    mybackend = "varsync_mybackend.plugin"

    # varsync_mybackend/plugin.py
    import varsync

    @varsync.hookimpl
    def varsync_register_backends(registry):
        registry.add("mine", "varsync_mybackend.backend:MyBackend", requires=["mydriver"])

varsync's built-in backends register through this same hook. Framework adapters
(how to read and assign a framework's tensors) register through
``varsync_register_adapters`` in the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

__all__ = [
    "PROJECT",
    "Registry",
    "hookimpl",
    "hookspec",
    "varsync_register_adapters",
    "varsync_register_backends",
]

PROJECT = "varsync"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Registry(Protocol):
    """What a hook receives: :class:`varsync.backend.BackendRegistry` for
    ``varsync_register_backends``, ``varsync._adapters.AdapterRegistry`` for
    ``varsync_register_adapters``; each takes entries through ``add``."""

    def add(self, name: str, target: str, **details: Any) -> None:
        """Register ``target`` (``"module:Class"`` or ``"module:ATTRIBUTE"``)."""


@hookspec
def varsync_register_backends(registry: Registry) -> None:
    """Add backends to ``registry`` with ``registry.add(scheme, "module:Class", ...)``.

    Name each backend class as a ``"module:Class"`` string: it is imported only when a URL
    with its scheme is first connected to, so registering costs nothing and an uninstalled
    optional dependency only matters to those who use it. Do not import the storage
    engine's client here.
    """


@hookspec
def varsync_register_adapters(registry: Registry) -> None:
    """Add framework adapters to ``registry`` with
    ``registry.add(name, "module:ATTRIBUTE", modules=["myframework"])``.

    ``ATTRIBUTE`` is an object with the methods of :class:`varsync._adapters.Adapter`;
    ``modules`` are the top-level modules of the framework's types. The adapter module is
    imported only once one of those is imported and a value the core does not know is
    seen: do not import the framework here. varsync's TensorFlow, PyTorch and JAX adapters
    register through this same hook (``varsync/_adapters/builtin.py``).
    """
