"""What the container checks at its edges, before anything is written or returned: a
table name, a version number, a push's size against its backend's limit, and the arrays
a backend returns against the table's specs (a backend's bug or damaged data is a
:class:`CorruptDataError`, never an array of another shape handed to the caller)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from varsync import _signature as sig
from varsync._backends.base import Backend
from varsync._config import check_text
from varsync._errors import ConfigurationError, CorruptDataError, ItemTooLargeError

__all__ = ["table_name", "version", "push_size", "read_leaves"]


def table_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"table name must be a non-empty str, got {name!r}")
    check_text(name, "table name")


def version(number: Any) -> int:
    """A version a caller holds, as an int (0: none)."""
    if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or number < 0:
        raise ConfigurationError(f"version must be an int >= 0, got {number!r}")
    return int(number)


def push_size(table: str, backend: Backend, arrays: list[np.ndarray]) -> None:
    limit = backend.max_push_bytes
    if limit is not None:
        total = sum(a.nbytes for a in arrays)
        if total > limit:
            raise ItemTooLargeError(
                f"push to {table!r} is {total} bytes; {type(backend).__name__} accepts "
                f"at most {limit} bytes per push. Nothing was sent. Split the variables "
                "over several tables, or use a backend without this limit."
            )


def read_leaves(
    table: str,
    version: int,
    arrays: Sequence[np.ndarray | None],
    specs: Sequence[sig.Spec],
    whole: bool = False,
) -> list[np.ndarray | None]:
    """A read's arrays verified against ``specs`` (a delta read's: ``None`` for leaves
    not fetched; ``whole``: a whole read, where every leaf must be there)."""
    if len(arrays) != len(specs):
        raise CorruptDataError(
            f"table {table!r} returned {len(arrays)} "
            f"{'arrays' if whole else 'places'} for a signature of "
            f"{len(specs)} leaves (version {version})"
        )
    for index, (array, spec) in enumerate(zip(arrays, specs)):
        if array is not None or whole:
            _leaf(table, version, index, array, spec)
    return list(arrays)


def _leaf(table: str, version: int, index: int, array: Any, spec: sig.Spec) -> None:
    if not isinstance(array, np.ndarray) or array.shape != spec.shape or array.dtype != spec.dtype:
        raise CorruptDataError(
            f"table {table!r} version {version}: leaf {index} is "
            f"{getattr(array, 'dtype', type(array).__name__)} "
            f"{getattr(array, 'shape', '')}, the signature says {spec}"
        )
