"""JAX values: ``jax.Array`` leaves in any pytree, and ``jax.ShapeDtypeStruct`` specs.

Imported by :mod:`varsync._adapters` only when such a value is seen, so JAX is already
loaded by then.

- A nest with JAX arrays in it is walked by ``jax.tree_util`` itself, so the table's flat
  order is ``jax.tree_util.tree_leaves`` order: dict keys sorted, ``OrderedDict`` in its
  own order, registered dataclasses, ``flax.nnx.State``, optax states and any registered
  node in the order their flatten function gives. ``None`` is a node without leaves.
- The signature records the structure in plain terms a reader without the treedef can
  rebuild: dicts (``OrderedDict``s in order), lists, tuples, namedtuples (optax states
  stay the user's namedtuple classes when imported), and for any other registered node a
  namedtuple of its class name and attribute names (a dataclass, an ``nnx.Param``), or a
  dict of its keys (``nnx.State``). ``pull(like=tree)`` returns ``tree``'s own pytree
  type, rebuilt with its treedef, with ``jax.Array`` leaves placed as ``tree``'s are.
- JAX arrays are immutable: ``update`` cannot assign into them and says so. Pull a new
  tree instead: ``params = store.pull(like=params)``; with flax nnx,
  ``nnx.update(model, store.pull(like=nnx.state(model)))``.
- A CPU ``jax.Array`` is read with ``np.asarray``, which shares its buffer: no copy.
"""

from __future__ import annotations

import collections
import collections.abc
from typing import Any

import jax
import numpy as np

from varsync import _nest as nest_lib
from varsync._signature_json import namedtuple_type
from varsync._spec import Spec

__all__ = ["ADAPTER", "JaxAdapter"]

_REGISTRY = jax.tree_util.default_registry
_LEAVES = (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic, Spec, bool, int, float, complex)


class JaxAdapter:
    not_assignable = (
        "JAX arrays are immutable, so update cannot assign into them; pull a new tree "
        "instead with tree = store.pull(like=tree), or with flax nnx: "
        "nnx.update(model, store.pull(like=nnx.state(model)))"
    )

    def handles(self, value: Any) -> bool:
        if isinstance(value, (jax.Array, jax.ShapeDtypeStruct)):
            return True
        if isinstance(value, _LEAVES) or value is None:
            return False
        return _REGISTRY.flatten_one_level(value) is not None  # a registered pytree node

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        if not isinstance(value, (jax.Array, jax.ShapeDtypeStruct)):
            raise TypeError(f"a {type(value).__name__} is a pytree node, not one value")
        return tuple(int(d) for d in value.shape), np.dtype(value.dtype)

    def to_numpy(self, value: Any) -> Any:
        if isinstance(value, jax.ShapeDtypeStruct):
            raise TypeError(f"{value!r} is a spec, not a value")
        if not isinstance(value, jax.Array):
            raise TypeError(f"a {type(value).__name__} is a pytree node, not one value")
        return np.asarray(value)

    def is_assignable(self, target: Any) -> bool:
        return False

    def assign(self, target: Any, array: Any) -> None:
        raise TypeError(self.not_assignable)

    def from_numpy(self, array: np.ndarray, like: Any) -> Any:
        # Keep the like leaf's placement, and its committedness: an array placed on the
        # default device without being committed to it is not the same input to a jitted
        # function as a committed one (each pulled tree would cost every such function a
        # new compilation the first time it sees one).
        return self.from_numpy_all([array], [like])[0]

    def from_numpy_all(self, arrays: list[np.ndarray], likes: list[Any]) -> list[Any]:
        """Two ``jax.device_put`` calls at most for a whole tree (one per leaf cost 70 %
        of a 50-leaf pull): the uncommitted leaves together on the default device, the
        committed ones each with its like's sharding."""
        out: list[Any] = [None] * len(arrays)
        free = [i for i, like in enumerate(likes) if not getattr(like, "committed", False)]
        placed = [i for i, like in enumerate(likes) if getattr(like, "committed", False)]
        if free:
            for i, value in zip(free, jax.device_put([arrays[i] for i in free])):
                out[i] = value
        if placed:
            shardings = [likes[i].sharding for i in placed]
            for i, value in zip(placed, jax.device_put([arrays[i] for i in placed], shardings)):
                out[i] = value
        return out

    def structure(self, nest: Any, targets: bool = False) -> Any:
        return _plain(nest)

    def leaves_and_key(self, like: Any) -> tuple[Any, list[Any]]:
        leaves, treedef = jax.tree_util.tree_flatten(like)
        return treedef, leaves

    def rebuild(self, like: Any, leaves: list[Any]) -> Any:
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


def _plain(node: Any) -> Any:
    """``node`` in varsync's nest vocabulary, its leaves in ``jax.tree_util`` order."""
    if node is None:
        return nest_lib.EMPTY
    if isinstance(node, _LEAVES):
        return node
    flat = _REGISTRY.flatten_one_level_with_keys(node)
    if flat is None:
        return node  # a leaf JAX does not know: the core reports it
    children, _ = flat
    keys = [key for key, _ in children]
    values = [_plain(child) for _, child in children]
    kind = type(node)
    if nest_lib.is_namedtuple(node):
        return kind(*values)
    if kind is list:
        return values
    if kind is tuple:
        return tuple(values)
    if keys and all(isinstance(k, jax.tree_util.GetAttrKey) for k in keys):
        names = [k.name for k in keys]
        return namedtuple_type(kind.__name__, names, kind.__module__)(*values)
    if all(isinstance(k, jax.tree_util.DictKey) for k in keys):
        names = [k.key for k in keys]
        if isinstance(node, collections.OrderedDict) or names != _sorted_or_none(names):
            return nest_lib.Ordered(zip(names, values))
        return dict(zip(names, values))
    if isinstance(node, collections.abc.Mapping) and not keys:
        return {}
    return tuple(values)


def _sorted_or_none(names: list[Any]) -> Any:
    try:
        return sorted(names)
    except TypeError:
        return None


ADAPTER = JaxAdapter()
