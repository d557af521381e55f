"""Nests: flatten and rebuild them in exactly ``tf.nest``'s order, without TensorFlow.

A nest is a leaf, or a mapping, list, tuple, namedtuple, other sequence or attrs instance
of nests.
Mapping values come in sorted key order (``tf.nest`` sorts every mapping's keys, even an
``OrderedDict``'s); the others come in their own order. Strings, bytes, numpy arrays,
sets and ``None`` are leaves, as in ``tf.nest``.

Two nodes come from framework adapters, never from ``tf.nest`` nests: :class:`Ordered`, a
mapping whose flat order is its own (a PyTorch ``state_dict``, a JAX ``OrderedDict``:
both frameworks keep that order), and :data:`EMPTY`, a node with no leaves (JAX's
``None``). Rebuilt, they are a ``collections.OrderedDict`` and ``None``.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import numpy as np

__all__ = [
    "Ordered",
    "EMPTY",
    "is_nested",
    "flatten",
    "iter_leaves",
    "flatten_with_paths",
    "unflatten",
    "map_structure",
    "format_path",
    "sorted_keys",
]

PathEntry = tuple[str, Any]  # ("key", k) for mappings, ("index", i) or ("field", name)
Path = tuple[PathEntry, ...]


class Ordered(dict[Any, Any]):
    """A mapping whose leaves come in its own key order, not sorted (see the module doc).

    Framework adapters make these; a signature holds one where the table was created from
    one, and its flat order is the order of its keys."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Ordered({list(self.items())!r})"


class _Empty:
    """The node with no leaves: JAX's ``None`` (a subtree without leaves, not a value)."""

    __slots__ = ()
    _instance = None

    def __new__(cls) -> _Empty:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EMPTY"

    def __reduce__(self) -> str:
        return "EMPTY"


EMPTY = _Empty()


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def is_attrs(value: Any) -> bool:
    return hasattr(type(value), "__attrs_attrs__")


def is_nested(value: Any) -> bool:
    """True for the containers ``tf.nest`` descends into: mappings, attrs instances and
    sequences other than str and bytes."""
    kind = type(value)
    known = _NESTED_BY_TYPE.get(kind)
    if known is not None:
        return known
    if isinstance(value, (collections.abc.Mapping, list, tuple)) or value is EMPTY:
        nested = True
    elif isinstance(value, collections.abc.Sequence):
        nested = not isinstance(value, (str, bytes))
    else:
        nested = is_attrs(value)
    if len(_NESTED_BY_TYPE) < 4096:
        _NESTED_BY_TYPE[kind] = nested
    return nested


#: What is_nested said of each type seen (it depends on the type alone): an abstract
#: base class's isinstance costs ~1 us, and each leaf of each call was asked twice.
_NESTED_BY_TYPE: dict[type, bool] = {dict: True, list: True, tuple: True, np.ndarray: False}


def sorted_keys(mapping: Mapping[Any, Any]) -> list[Any]:
    """The mapping's keys in ``tf.nest`` order; a clear ``TypeError`` if they cannot sort."""
    try:
        return sorted(mapping)
    except TypeError:
        kinds = sorted({type(k).__name__ for k in mapping})
        raise TypeError(
            "nest mappings need keys that sort against each other (as tf.nest requires); "
            f"got keys of types {', '.join(kinds)}: {list(mapping)!r}"
        ) from None


def children(value: Any) -> list[tuple[PathEntry, Any]]:
    """The (path entry, child) pairs of one nested container, in flatten order."""
    if isinstance(value, Ordered):
        return [(("key", k), v) for k, v in value.items()]
    if isinstance(value, collections.abc.Mapping):
        return [(("key", k), value[k]) for k in sorted_keys(value)]
    if value is EMPTY:
        return []
    if is_namedtuple(value):
        return [(("field", f), v) for f, v in zip(type(value)._fields, value)]
    if is_attrs(value):
        return [(("field", a.name), getattr(value, a.name)) for a in type(value).__attrs_attrs__]
    return [(("index", i), v) for i, v in enumerate(value)]


def flatten_with_paths(nest: Any) -> list[tuple[Path, Any]]:
    """All leaves with their paths, in ``tf.nest.flatten`` order."""
    out: list[tuple[Path, Any]] = []
    _walk(nest, (), out)
    return out


def _walk(value: Any, path: Path, out: list[tuple[Path, Any]]) -> None:
    if not is_nested(value):
        out.append((path, value))
        return
    for entry, child in children(value):
        _walk(child, path + (entry,), out)


def iter_leaves(nest: Any) -> Iterator[Any]:
    """The leaves of ``nest`` in flatten order, one at a time (a search can stop early)."""
    if not is_nested(nest):
        yield nest
        return
    for _, child in children(nest):
        yield from iter_leaves(child)


def flatten(nest: Any) -> list[Any]:
    """The leaves of ``nest`` in ``tf.nest.flatten`` order."""
    return [leaf for _, leaf in flatten_with_paths(nest)]


def unflatten(structure: Any, flat: Sequence[Any]) -> Any:
    """Rebuild ``structure``'s shape from ``flat`` leaves (``tf.nest.pack_sequence_as``)."""
    leaves = iter(flat)
    result = _rebuild(structure, leaves)
    for _ in leaves:
        raise ValueError(
            f"unflatten got more leaves than the structure has ({len(flatten(structure))})"
        )
    return result


def _rebuild(structure: Any, leaves: Iterator[Any]) -> Any:
    if not is_nested(structure):
        try:
            return next(leaves)
        except StopIteration:
            raise ValueError("unflatten got fewer leaves than the structure has") from None
    if structure is EMPTY:
        return None
    if isinstance(structure, Ordered):
        return collections.OrderedDict((k, _rebuild(v, leaves)) for k, v in structure.items())
    if isinstance(structure, collections.abc.Mapping):
        rebuilt = {k: _rebuild(structure[k], leaves) for k in sorted_keys(structure)}
        return _like_mapping(structure, rebuilt)
    values = [_rebuild(child, leaves) for _, child in children(structure)]
    return _like_sequence(structure, values)


def _like_mapping(instance: Mapping[Any, Any], rebuilt: dict[Any, Any]) -> Any:
    kind: Any = type(instance)  # a Mapping subclass, whose constructor may take anything
    ordered = [(k, rebuilt[k]) for k in instance]  # keep the instance's own key order
    if isinstance(instance, collections.defaultdict):
        return kind(instance.default_factory, ordered)
    try:
        return kind(ordered)
    except TypeError:
        return dict(ordered)


def _like_sequence(instance: Any, values: list[Any]) -> Any:
    kind = type(instance)
    if is_namedtuple(instance) or is_attrs(instance):
        return kind(*values)
    if kind in (list, tuple):
        return kind(values)
    try:
        return kind(values)
    except TypeError:
        return list(values) if isinstance(instance, list) else tuple(values)


def map_structure(fn: Callable[..., Any], structure: Any, *others: Any) -> Any:
    """Apply ``fn`` leafwise; ``others`` must have ``structure``'s leaf count and order."""
    flats = [flatten(structure)] + [flatten(o) for o in others]
    return unflatten(structure, [fn(*leaves) for leaves in zip(*flats)])


def format_path(path: Path) -> str:
    """``(("key", "policy"), ("index", 3))`` -> ``['policy'][3]``; ``()`` -> ``<root>``."""
    if not path:
        return "<root>"
    parts = []
    for kind, item in path:
        parts.append(f".{item}" if kind == "field" else f"[{item!r}]")
    return "".join(parts)
