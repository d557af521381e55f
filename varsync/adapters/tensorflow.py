"""TensorFlow values: tensors, variables (plain and ``tf.distribute``) and ``TensorSpec``s.

Imported by :mod:`varsync.adapters` only when such a value is seen, so TensorFlow is
already loaded by then.
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np
import tensorflow as tf

from varsync.errors import SignatureError

__all__ = ["ADAPTER", "TensorFlowAdapter"]


class TensorFlowAdapter:
    def handles(self, value: Any) -> bool:
        # tf.distribute variables (Mirrored, ...) are tf.Variables too.
        return isinstance(value, (tf.Tensor, tf.Variable, tf.TensorSpec))

    def shape_and_dtype(self, value: Any) -> Tuple[Tuple[int, ...], Any]:
        shape = tf.TensorShape(value.shape)
        if not shape.is_fully_defined():
            raise SignatureError(
                f"TensorFlow shape {shape} is not fully defined; variables need known shapes"
            )
        return tuple(shape.as_list()), np.dtype(tf.as_dtype(value.dtype).as_numpy_dtype)

    def to_numpy(self, value: Any) -> Any:
        if isinstance(value, tf.TensorSpec):
            raise TypeError(f"{value!r} is a spec, not a value")
        if not isinstance(value, tf.Tensor):
            value = value.read_value()  # plain and tf.distribute variables alike
        return numpy_view(value)

    def is_assignable(self, target: Any) -> bool:
        return isinstance(target, tf.Variable)

    def assign(self, target: Any, array: Any) -> None:
        target.assign(array)


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
