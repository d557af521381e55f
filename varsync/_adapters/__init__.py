"""Framework adapters: TensorFlow, PyTorch, JAX (and any plugin's) values beside numpy.

Adapters register through the ``varsync_register_adapters`` hook (:mod:`varsync._hookspecs`)
as ``"module:ATTRIBUTE"`` strings with the top-level modules of their framework. An
adapter is imported only when one of those modules is already imported *and* a value the
core does not know turns up, so ``import varsync`` imports no framework, and a framework's
values can only exist once it is imported.

What the core asks of an adapter is :class:`Adapter`; the optional parts have defaults
here (:func:`assign_all`, :func:`structure`, :func:`rebuild`, :func:`from_numpy`).
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from varsync import _nest as nest_lib
from varsync._errors import ConfigurationError, PluginWarning
from varsync._nest import EMPTY, Ordered

__all__ = [
    "EMPTY",
    "Ordered",
    "Adapter",
    "AdapterEntry",
    "AdapterRegistry",
    "adapter_for",
    "assign_all",
    "from_numpy",
    "from_numpy_all",
    "get_adapter_registry",
    "install",
    "leaves_and_key",
    "rebuild",
    "reset_adapter_registry",
    "structure",
    "to_numpy",
]


class Adapter(Protocol):
    """What the core needs from a framework's values, variables and specs.

    Required: :meth:`handles`, :meth:`shape_and_dtype`, :meth:`to_numpy`,
    :meth:`is_assignable`, :meth:`assign`. Optional (the core checks with ``getattr``):

    - ``assign_all(targets, arrays)``: assign many at once (one ``no_grad`` block, one
      batched copy); default: :meth:`assign` for each.
    - ``to_numpy_all(values)``: many values' contents at once, for a push (TensorFlow
      variables in one graph call), each as :meth:`to_numpy` gives it; default:
      :meth:`to_numpy` for each. The core checks every value's shape and dtype first.
    - ``structure(nest, targets=False)``: the nest with the framework's containers turned
      into plain ones (a ``torch.nn.Module`` into its ``state_dict``, a JAX pytree into
      dicts, :class:`~varsync._nest.Ordered` mappings, tuples and namedtuples, ``None``
      into :data:`~varsync._nest.EMPTY`), in the framework's own flatten order. Called on
      any nest one of whose leaves the adapter handles; default: the nest as it is.
    - ``from_numpy(array, like)``: a pulled array as a value of the kind ``like`` is, for
      ``pull(..., like=...)``; default: the array. ``from_numpy_all(arrays, likes)``
      converts many at once (one batched transfer); default: ``from_numpy`` for each.
    - ``rebuild(like, leaves)``: the nest ``like`` is, rebuilt from converted leaves in
      flat order; default: ``like``'s plain structure (``structure(like)``) rebuilt.
    - ``leaves_and_key(like)``: ``(key, leaves)``, a hashable key of ``like``'s structure
      and its leaves in flat order, so that a container checks each structure once (the
      adapter must then have ``rebuild``); default: ``like`` is checked at every pull.
    """

    def handles(self, value: Any) -> bool:
        """True for the framework's tensors, variables, specs and containers."""

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        """The shape and numpy dtype of a value, variable or spec."""

    def to_numpy(self, value: Any) -> Any:
        """A value or variable's current contents as a numpy array, without copying where
        the memory allows it (specs: ``TypeError``)."""

    def is_assignable(self, target: Any) -> bool:
        """True when ``update`` can assign into ``target`` in place."""

    def assign(self, target: Any, array: Any) -> None:
        """Assign ``array`` into the variable ``target``."""


@dataclass(frozen=True)
class AdapterEntry:
    """One registered adapter: ``target`` is ``"module:ATTRIBUTE"`` (an object with the
    :class:`Adapter` methods); ``modules`` the top-level modules of its framework."""

    name: str
    target: str
    modules: tuple[str, ...]
    source: str


class AdapterRegistry:
    """Adapters by framework. Plugins receive one in ``varsync_register_adapters``."""

    def __init__(self) -> None:
        self._entries: dict[str, AdapterEntry] = {}
        self._by_module: dict[str, AdapterEntry] = {}
        self._loaded: dict[str, Adapter] = {}
        self._failed: dict[str, str] = {}
        # type -> the adapter that last handled a value of it: asked first next time (a
        # lookup by module and a load check cost ~3 us a leaf, most of a 500-variable
        # update's checks). Its ``handles`` still decides, for every value.
        self._by_type: dict[type, Adapter] = {}
        self._source = "built-in"
        self._lock = threading.Lock()

    def add(self, name: str, target: str, *, modules: Sequence[str]) -> None:
        """Register the adapter ``target`` (``"module:ATTRIBUTE"``) for the values of the
        framework whose top-level modules are ``modules``: the framework itself first,
        then any others its types live in (``["jax", "jaxlib", "flax"]``: ``__module__``
        up to the first dot). It is imported the first time such a value is seen, never
        before the framework (``modules[0]``) is. The first adapter registered for a
        module keeps it."""
        if target.count(":") != 1:
            raise ConfigurationError(f"adapter target {target!r} must be 'module:ATTRIBUTE'")
        if isinstance(modules, str) or not modules:
            raise ConfigurationError(
                f"adapter {name!r} must name its framework's modules as a list, got {modules!r}"
            )
        entry = AdapterEntry(name, target, tuple(modules), self._source)
        if name in self._entries:
            warnings.warn(
                f"{entry.source} registers the {name!r} adapter again; keeping "
                f"{self._entries[name].target} from {self._entries[name].source}",
                PluginWarning,
                stacklevel=2,
            )
            return
        self._entries[name] = entry
        for module in entry.modules:
            self._by_module.setdefault(module, entry)

    @property
    def entries(self) -> dict[str, AdapterEntry]:
        return dict(self._entries)

    def adapter_for(self, value: Any) -> Adapter | None:
        """The adapter that handles ``value``, or ``None`` (numpy, Python scalars, ...)."""
        kind = type(value)
        if kind in _PLAIN:
            return None
        known = self._by_type.get(kind)
        if known is not None and known.handles(value):
            return known
        entry = self._by_module.get(kind.__module__.partition(".")[0])
        if entry is not None:
            adapter = self._load(entry)
            if adapter is not None and adapter.handles(value):
                self._by_type[kind] = adapter
                return adapter
        # A type defined outside the framework (a torch.nn.Module subclass, a dataclass
        # registered as a JAX pytree): ask each adapter whose framework is imported.
        for other in self._entries.values():
            if other is entry:
                continue
            adapter = self._load(other)
            if adapter is not None and adapter.handles(value):
                self._by_type[kind] = adapter
                return adapter
        return None

    def active(self) -> bool:
        """True once any registered framework is imported (before that, no value can be
        one of theirs)."""
        return any(e.modules[0] in sys.modules for e in self._entries.values())

    def may_own_structures(self) -> bool:
        """Whether an adapter may own a nest's structure (see :func:`structure`): one loaded
        that has a ``structure``, or one whose framework is imported but that is not
        loaded yet (a walk over the nest's leaves then finds out, loading it)."""
        for entry in self._entries.values():
            if entry.modules[0] not in sys.modules or entry.name in self._failed:
                continue
            adapter = self._loaded.get(entry.name)
            if adapter is None or hasattr(adapter, "structure"):
                return True
        return False

    def _load(self, entry: AdapterEntry) -> Adapter | None:
        adapter = self._loaded.get(entry.name)
        if adapter is not None:
            return adapter
        if entry.name in self._failed or entry.modules[0] not in sys.modules:
            return None
        with self._lock:
            if entry.name not in self._loaded:
                module_name, _, attribute = entry.target.partition(":")
                try:
                    self._loaded[entry.name] = getattr(
                        importlib.import_module(module_name), attribute
                    )
                except Exception as exc:  # a broken adapter must not break the others
                    self._failed[entry.name] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"varsync adapter {entry.name!r} ({entry.target}, from "
                        f"{entry.source}) failed to load and is skipped: {exc}",
                        PluginWarning,
                        stacklevel=3,
                    )
                    return None
            return self._loaded[entry.name]


_PLAIN = frozenset(
    {np.ndarray, bool, int, float, complex, str, bytes, type(None), dict, list, tuple}
) | frozenset(np.sctypeDict.values())

_REGISTRY: AdapterRegistry | None = None
_REGISTRY_LOCK = threading.Lock()
#: Set by the plugin host (``varsync._plugins``) when ``varsync`` is imported.
_BUILD: Callable[[], AdapterRegistry] | None = None


def install(build: Callable[[], AdapterRegistry]) -> None:
    """The plugin host's hand-over: ``build`` makes the registry on first use."""
    global _BUILD
    _BUILD = build


def get_adapter_registry() -> AdapterRegistry:
    """The process-wide adapter registry, built from the plugins on first use."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            if _BUILD is None:  # pragma: no cover - importing varsync installs it
                raise RuntimeError("varsync's plugin host is not installed: import varsync")
            _REGISTRY = _BUILD()
        return _REGISTRY


def reset_adapter_registry() -> None:
    """Forget the adapter registry so the next use scans the entry points again."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        _REGISTRY = None


def adapter_for(value: Any) -> Adapter | None:
    """The adapter for ``value``'s framework, or ``None`` for anything else."""
    kind = type(value)
    if kind in _PLAIN:  # the common case, before any lock or registry
        return None
    registry = _REGISTRY  # built once; the lock only while it is not
    return (registry or get_adapter_registry()).adapter_for(value)


def _owner(nest: Any) -> Any | None:
    """The adapter of the first leaf of ``nest`` that one handles and that has a
    ``structure``; ``None`` when no framework is imported or none is found."""
    if type(nest) in _PLAIN and not isinstance(nest, (dict, list, tuple)):
        return None
    registry = get_adapter_registry()
    if not registry.may_own_structures():  # TensorFlow alone: no walk over 500 leaves
        return None
    for leaf in nest_lib.iter_leaves(nest):
        adapter = adapter_for(leaf)
        if adapter is not None and hasattr(adapter, "structure"):
            return adapter
    return None


def structure(nest: Any, *, targets: bool = False) -> Any:
    """``nest`` with framework containers made plain, in the framework's flatten order
    (see :class:`Adapter`); a nest of numpy values and Python scalars as it is."""
    owner = _owner(nest)
    return nest if owner is None else owner.structure(nest, targets=targets)


def assign_all(targets: Sequence[Any], arrays: Sequence[np.ndarray]) -> None:
    """Assign each array into its target (checked before by
    :func:`varsync._signature.flatten_targets`): numpy arrays by ``np.copyto``, framework
    variables in one batch per adapter."""
    batches: dict[int, tuple[Any, list[Any], list[np.ndarray]]] = {}
    for target, array in zip(targets, arrays):
        if isinstance(target, np.ndarray):
            np.copyto(target, array)
            continue
        adapter = adapter_for(target)
        if adapter is None:  # pragma: no cover - flatten_targets accepted it
            raise TypeError(f"cannot assign into {type(target).__name__}")
        batch = batches.setdefault(id(adapter), (adapter, [], []))
        batch[1].append(target)
        batch[2].append(array)
    for adapter, batch_targets, batch_arrays in batches.values():
        bulk = getattr(adapter, "assign_all", None)
        if bulk is not None:
            bulk(batch_targets, batch_arrays)
        else:
            for target, array in zip(batch_targets, batch_arrays):
                adapter.assign(target, array)


def patch_view(target: Any) -> np.ndarray | None:
    """``target``'s own memory as a writable C-contiguous numpy array, for element
    patches applied in place, or ``None`` where there is none to reach (a variable on an
    accelerator, a ``tf.Variable``): the patch then goes onto a copy that is assigned.
    Numpy arrays are their own view; an adapter offers one with ``patch_view``."""
    if isinstance(target, np.ndarray):
        writable = target.flags.writeable and target.flags.c_contiguous
        return target if writable else None
    adapter = adapter_for(target)
    view = getattr(adapter, "patch_view", None)
    found: np.ndarray | None = None if view is None else view(target)
    return found


def assign_elements_of(target: Any) -> Callable[[Any, np.ndarray, np.ndarray], None] | None:
    """The adapter's ``assign_elements(target, positions, value)`` for ``target``, if it
    has one: write the elements at the flat ``positions`` of ``value`` (the whole new
    value, on the host) into ``target``, leaving the others as they are."""
    if isinstance(target, np.ndarray):
        return None
    found: Callable[[Any, np.ndarray, np.ndarray], None] | None = getattr(
        adapter_for(target), "assign_elements", None
    )
    return found


def patched(target: Any) -> None:
    """Tell ``target``'s framework its memory was changed through :func:`patch_view`
    (torch: the tensor's version counter, as ``copy_`` would bump it)."""
    hook = (
        getattr(adapter_for(target), "patched", None)
        if not isinstance(target, np.ndarray)
        else None
    )
    if hook is not None:
        hook(target)


def to_numpy(value: Any) -> np.ndarray:
    """``value`` (a framework's array or variable, or numpy) as a numpy array on the
    host: itself where it is numpy, a view where its adapter gives one, else a copy."""
    if isinstance(value, np.ndarray):
        return value
    adapter = adapter_for(value)
    return np.asarray(value if adapter is None else adapter.to_numpy(value))


def from_numpy(array: np.ndarray, like: Any) -> Any:
    """``array`` as a value of ``like``'s kind (a torch tensor, a jax.Array), or itself."""
    return from_numpy_all([array], [like])[0]


def from_numpy_all(arrays: Sequence[np.ndarray], likes: Sequence[Any]) -> list[Any]:
    """Each array as a value of its ``like``'s kind, converted in one batch per adapter
    (``from_numpy_all`` where the adapter has it: one ``jax.device_put`` for a whole
    tree); arrays whose like is numpy or a Python scalar stay arrays."""
    out: list[Any] = list(arrays)
    by_type: dict[type, Any | None] = {}
    batches: dict[int, tuple[Any, list[int]]] = {}
    for index, like in enumerate(likes):
        kind = type(like)
        if kind not in by_type:
            by_type[kind] = adapter_for(like)
        adapter = by_type[kind]
        if adapter is not None and hasattr(adapter, "from_numpy"):
            batches.setdefault(id(adapter), (adapter, []))[1].append(index)
    for adapter, indices in batches.values():
        chosen = [arrays[i] for i in indices]
        chosen_likes = [likes[i] for i in indices]
        bulk = getattr(adapter, "from_numpy_all", None)
        if bulk is not None:
            converted = bulk(chosen, chosen_likes)
        else:
            converted = [adapter.from_numpy(a, like) for a, like in zip(chosen, chosen_likes)]
        for index, value in zip(indices, converted):
            out[index] = value
    return out


def leaves_and_key(like: Any) -> tuple[Any, list[Any]] | None:
    """``(key, leaves)`` from the adapter of ``like``'s framework where it has
    ``leaves_and_key``: a hashable key of ``like``'s structure (equal keys: equal
    structures) and its leaves in flat order; else ``None``."""
    owner = _owner(like)
    fast = getattr(owner, "leaves_and_key", None)
    return None if fast is None else fast(like)


def rebuild(like: Any, plain_like: Any, leaves: Sequence[Any]) -> Any:
    """The nest ``like`` is, rebuilt from ``leaves`` (flat order); ``plain_like`` is
    :func:`structure` of ``like``."""
    owner = _owner(like)
    custom = getattr(owner, "rebuild", None)
    if custom is not None:
        return custom(like, list(leaves))
    return nest_lib.unflatten(plain_like, leaves)
