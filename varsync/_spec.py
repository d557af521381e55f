"""Spec: the fixed shape and numpy dtype of one leaf of a table, and the dtypes varsync
stores: numpy's own (:data:`SUPPORTED_DTYPES`) and bfloat16 and the float8 types of the
``ml_dtypes`` package (:data:`ML_DTYPE_NAMES`).

A signature is a nest of specs (see :mod:`varsync._signature`); this module is what every
part of it builds on, so it depends on nothing of varsync but its errors. ``ml_dtypes``
is imported only when a dtype or name of it is seen, never by ``import varsync``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from varsync._errors import SignatureError

__all__ = [
    "Spec",
    "SUPPORTED_DTYPES",
    "ML_DTYPE_NAMES",
    "canonical_dtype",
    "native_dtype",
    "is_ml_dtype",
]

SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)

#: The dtypes of the ``ml_dtypes`` package varsync stores (JAX's and TensorFlow's
#: bfloat16 and float8 types), by the names that stored signatures give them: each is
#: ``np.dtype(getattr(ml_dtypes, name))``, whose ``.name`` is ``name``. Those that
#: ml_dtypes 0.2 (TensorFlow 2.15's) and every later version have.
ML_DTYPE_NAMES: tuple[str, ...] = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
)

_SUPPORTED_NAMES = ", ".join([*(d.name for d in SUPPORTED_DTYPES), *ML_DTYPE_NAMES])


def native_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (the order varsync stores and compares)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def canonical_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a native-byte-order numpy dtype varsync stores, or ``SignatureError``.

    Takes what ``np.dtype`` takes, and the names of :data:`ML_DTYPE_NAMES` (``"bfloat16"``,
    which numpy knows only once ``ml_dtypes`` is imported)."""
    if isinstance(dtype, str) and dtype in ML_DTYPE_NAMES:
        return _ml_dtype(dtype)
    try:
        resolved = native_dtype(np.dtype(dtype))
    except TypeError as exc:
        raise SignatureError(
            f"{dtype!r} is not a dtype ({exc}); expected one of {_SUPPORTED_NAMES}"
        ) from None
    if resolved in SUPPORTED_DTYPES:
        return resolved
    if resolved.name in ML_DTYPE_NAMES:
        if resolved == _ml_dtype(resolved.name):
            return resolved
        raise SignatureError(
            f"dtype {resolved.name} ({resolved.type.__module__}.{resolved.type.__name__}) "
            f"is not ml_dtypes.{resolved.name}, the one varsync stores"
        )
    raise SignatureError(f"dtype {resolved} cannot be stored; expected one of {_SUPPORTED_NAMES}")


def is_ml_dtype(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is one of :data:`ML_DTYPE_NAMES` (never imports ``ml_dtypes``:
    without it imported, no array has such a dtype)."""
    module = sys.modules.get("ml_dtypes")
    return (
        module is not None
        and dtype.name in ML_DTYPE_NAMES
        and dtype == np.dtype(getattr(module, dtype.name))
    )


def _ml_dtype(name: str) -> np.dtype:
    try:
        module = importlib.import_module("ml_dtypes")
    except ImportError as exc:
        raise SignatureError(
            f"dtype {name} needs the package ml_dtypes ({exc}); pip install 'ml_dtypes>=0.2'"
        ) from None
    kind = getattr(module, name, None)
    if kind is None:
        raise SignatureError(
            f"dtype {name} is not in the installed ml_dtypes "
            f"{getattr(module, '__version__', '?')}; upgrade it (pip install -U ml_dtypes)"
        )
    dtype: np.dtype[Any] = np.dtype(kind)
    return dtype


@dataclass(frozen=True)
class Spec:
    """A fixed shape and a dtype: what one leaf of a table holds."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape: Sequence[int], dtype: Any) -> None:
        try:
            dims = tuple(int(d) for d in shape)
            well_formed = all(d >= 0 and d == s for d, s in zip(dims, shape))
        except (TypeError, ValueError, OverflowError):  # None, "a", nan, inf
            well_formed = False
        if not well_formed:
            raise SignatureError(
                f"Spec shape {shape!r} is not fully defined; expected a sequence of "
                "non-negative ints (variables have known shapes)"
            )
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", canonical_dtype(dtype))

    @property
    def size(self) -> int:
        """How many elements an array of this spec holds (1 for a scalar, 0 if a
        dimension is 0)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """How many bytes an array of this spec holds: ``size`` times the dtype's
        itemsize, with no header or padding (what a push of this leaf moves)."""
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"Spec(shape={self.shape}, dtype={self.dtype.name})"
