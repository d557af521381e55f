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

varsync's built-in backends register through this same hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from varsync.registry import BackendRegistry

PROJECT = "varsync"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def varsync_register_backends(registry: "BackendRegistry") -> None:
    """Add backends to ``registry`` with ``registry.add(scheme, "module:Class", ...)``.

    Name each backend class as a ``"module:Class"`` string: it is imported only when a URL
    with its scheme is first connected to, so registering costs nothing and an uninstalled
    optional dependency only matters to those who use it. Do not import the storage
    engine's client here.
    """
