"""TensorFlow values: tensors, variables (plain and ``tf.distribute``) and ``TensorSpec``s.

Imported by :mod:`varsync._adapters` only when such a value is seen, so TensorFlow is
already loaded by then.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

import numpy as np
import tensorflow as tf

from varsync._errors import SignatureError

__all__ = ["ADAPTER", "TensorFlowAdapter"]


class TensorFlowAdapter:
    def handles(self, value: Any) -> bool:
        # tf.distribute variables (Mirrored, ...) are tf.Variables too.
        return type(value) is _PLAIN_VARIABLE or isinstance(
            value, (tf.Tensor, tf.Variable, tf.TensorSpec)
        )

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        shape = value.shape
        if not isinstance(shape, tf.TensorShape):
            shape = tf.TensorShape(shape)
        dims = shape.as_list() if shape.rank is not None else [None]
        if None in dims:
            raise SignatureError(
                f"TensorFlow shape {shape} is not fully defined; variables need known shapes"
            )
        dtype = _NUMPY_DTYPES.get(value.dtype)
        if dtype is None:  # once per TensorFlow dtype (~2.5 us a leaf otherwise)
            dtype = _NUMPY_DTYPES[value.dtype] = np.dtype(tf.as_dtype(value.dtype).as_numpy_dtype)
        return tuple(dims), dtype

    def to_numpy(self, value: Any) -> Any:
        if isinstance(value, tf.TensorSpec):
            raise TypeError(f"{value!r} is a spec, not a value")
        if not isinstance(value, tf.Tensor):
            value = value.read_value()  # plain and tf.distribute variables alike
        return numpy_view(value)

    def to_numpy_all(self, values: Sequence[Any]) -> list[Any]:
        """Many values' contents: plain variables read in one graph call when there are
        many (as :meth:`assign_all` assigns them; one eager ``read_value`` each cost
        ~0.1 ms of Python and op dispatch, most of a small drop-in push), each by the bare
        read op when few (~22 us each against ~200 us for the graph call, whatever the
        count: they broke even at about 10, measured with 4 to 500), the rest one by one."""
        indices = [i for i, value in enumerate(values) if type(value) is _PLAIN_VARIABLE]
        out: list[Any] = [None] * len(values)
        if len(indices) >= _READ_BATCH_FROM:
            read = _cached("read", [values[i] for i in indices], _reader)
            for index, tensor in zip(indices, read()):
                out[index] = numpy_view(tensor)
        elif _read_variable_op is not None:
            for index in indices:
                variable = values[index]
                out[index] = numpy_view(_read_variable_op(variable.handle, variable.dtype))
        return [self.to_numpy(v) if a is None else a for v, a in zip(values, out)]

    def is_assignable(self, target: Any) -> bool:
        return isinstance(target, tf.Variable)

    def assign(self, target: Any, array: Any) -> None:
        target.assign(array)

    def assign_elements(self, target: Any, positions: np.ndarray, value: np.ndarray) -> None:
        """Write the elements of ``value`` at the flat ``positions`` into the variable
        with ``scatter_nd_update``: the variable keeps its buffer, and only those
        elements are sent to its device."""
        if not positions.size:
            return
        shape = tuple(int(d) for d in target.shape)
        indices = np.stack(np.unravel_index(positions, shape), axis=-1) if shape else None
        if indices is None:  # a scalar: one element
            target.assign(value)
            return
        target.scatter_nd_update(indices, value.reshape(-1)[positions])

    def assign_all(self, targets: Sequence[Any], arrays: Sequence[np.ndarray]) -> None:
        """Assign many variables in one graph call: the arrays of each dtype travel as one
        buffer, split and assigned inside a ``tf.function`` made once per set of
        variables (one eager ``assign`` each costs ~40 us of Python and op dispatch; a
        500-variable policy took 25x longer that way). Few variables, or distributed
        ones, are assigned one by one."""
        if len(targets) < _BATCH_FROM or not all(type(t) is _PLAIN_VARIABLE for t in targets):
            for target, array in zip(targets, arrays):
                target.assign(array)
            return
        assigner = _cached("assign", targets, _Assigner)
        buffers = [
            np.concatenate([arrays[i].reshape(-1) for i in group]) if group else None
            for group in assigner.groups
        ]
        assigner.function(buffers)


_BATCH_FROM = 4
_READ_BATCH_FROM = 10  # see to_numpy_all
#: numpy's dtype of each TensorFlow dtype seen.
_NUMPY_DTYPES: dict[Any, np.dtype] = {}
try:  # tf.Variable's concrete class (distributed variables are other classes)
    from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _PLAIN_VARIABLE
except ImportError:  # pragma: no cover - a TensorFlow that moved it: no batching
    _PLAIN_VARIABLE = None
try:  # the read op itself, without read_value's layers (see to_numpy_all)
    from tensorflow.python.ops.gen_resource_variable_ops import (
        read_variable_op as _read_variable_op,
    )
except ImportError:  # pragma: no cover - a TensorFlow that moved it: read_value instead
    _read_variable_op = None
_CACHE_SIZE = 16  # assigners and readers of the last few variable sets
T = TypeVar("T")


class _Assigner:
    """A ``tf.function`` assigning one set of variables from one flat buffer per dtype."""

    def __init__(self, variables: Sequence[Any]) -> None:
        by_dtype: dict[Any, list[int]] = {}
        for index, variable in enumerate(variables):
            by_dtype.setdefault(variable.dtype, []).append(index)
        self.groups = list(by_dtype.values())
        dtypes = list(by_dtype)
        sizes = [[int(np.prod(variables[i].shape)) for i in g] for g in self.groups]
        shapes = [variables[i].shape for i in range(len(variables))]
        signature = [tf.TensorSpec([sum(s)], d) for s, d in zip(sizes, dtypes)]
        held = list(variables)  # the function holds the variables, as the cache does

        @tf.function(input_signature=[signature], autograph=False)
        def assign(buffers: Any) -> None:
            for buffer, group, group_sizes in zip(buffers, self.groups, sizes):
                for index, part in zip(group, tf.split(buffer, group_sizes)):
                    held[index].assign(tf.reshape(part, shapes[index]))

        # The concrete function: calling it skips the polymorphic function's argument
        # binding and trace lookup, measured 0.43x the call of 4 variables, 0.7x of 500.
        self.function = assign.get_concrete_function()


def _reader(variables: Sequence[Any]) -> Any:
    """A ``tf.function`` returning the values of ``variables``, in order."""
    held = list(variables)

    @tf.function(input_signature=[], autograph=False)
    def read() -> Any:
        return [variable.read_value() for variable in held]

    return read.get_concrete_function()  # as _Assigner's: 0.6x the call of 4 variables


_CACHE: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()


def _cached(kind: str, variables: Sequence[Any], make: Callable[[Sequence[Any]], T]) -> T:
    """The cached ``make(variables)`` (an assigner or a reader) of these variables: the
    last few sets are kept, since a learner or actor moves the same variables again and
    again. A cached entry holds its variables, so an id in its key cannot be reused by
    another variable."""
    key = (kind, *(id(v) for v in variables))
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    made = make(variables)
    with _CACHE_LOCK:
        _CACHE[key] = made
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return made


def numpy_view(tensor: Any) -> np.ndarray:
    """A CPU tensor's memory as a numpy array, without copying: ``Tensor.numpy()`` copies,
    ``_numpy()`` does not (the array keeps the tensor alive; a scalar comes back as a numpy
    scalar, made a 0-d array here). A variable assigned later gets a new buffer
    (TensorFlow copies on write while another reference to the old one exists), so a view
    of a variable's value stays intact."""
    try:
        return np.asarray(tensor._numpy())
    except AttributeError:  # pragma: no cover - a TensorFlow without the private method
        return np.asarray(tensor.numpy())


ADAPTER = TensorFlowAdapter()
