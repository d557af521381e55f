"""Spec: the fixed shape and numpy dtype of one leaf of a table, and the dtypes varsync
stores (:data:`SUPPORTED_DTYPES`).

A signature is a nest of specs (see :mod:`varsync.signature`); this module is what every
part of it builds on, so it depends on nothing of varsync but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Tuple

import numpy as np

from varsync.errors import SignatureError

__all__ = ["Spec", "SUPPORTED_DTYPES", "canonical_dtype", "native_dtype"]

SUPPORTED_DTYPES: Tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)
_SUPPORTED_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)


def native_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (the order varsync stores and compares)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def canonical_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a native-byte-order numpy dtype varsync stores, or ``SignatureError``."""
    try:
        resolved = native_dtype(np.dtype(dtype))
    except TypeError as exc:
        raise SignatureError(
            f"{dtype!r} is not a dtype ({exc}); expected one of {_SUPPORTED_NAMES}"
        ) from None
    if resolved not in SUPPORTED_DTYPES:
        raise SignatureError(
            f"dtype {resolved} cannot be stored; expected one of {_SUPPORTED_NAMES}"
        )
    return resolved


@dataclass(frozen=True)
class Spec:
    """A fixed shape and a dtype: what one leaf of a table holds."""

    shape: Tuple[int, ...]
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
