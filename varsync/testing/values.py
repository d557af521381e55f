"""Values for testing and measuring a backend, without pytest: nests whose every element
holds one number, the check that a pulled nest holds one version only, and bit-exact
comparison, and every bit pattern of a narrow dtype. The conformance suite, varsync's
own tests, its benchmarks and its soak use these; so can a backend author's (the first
three are re-exported by :mod:`varsync.backend`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from varsync import _nest as nest_lib
from varsync._spec import canonical_dtype

__all__ = ["filled", "check_consistent", "assert_bit_equal", "every_bit_pattern"]


def filled(signature: Any, value: int) -> Any:
    """A nest of ``signature``'s structure whose every element equals ``value``."""
    return nest_lib.map_structure(lambda s: np.full(s.shape, value, s.dtype), signature)


def check_consistent(values: Any) -> int:
    """The one number every element of a :func:`filled` nest holds; fails on a mix."""
    numbers = {int(x) for leaf in nest_lib.flatten(values) for x in np.unique(leaf)}
    assert len(numbers) == 1, f"a pull mixed versions: elements hold {sorted(numbers)}"
    return numbers.pop()


def assert_bit_equal(got: Any, expected: Any) -> None:
    """Same structure, and every leaf of the same dtype, shape and bytes."""
    got_leaves = nest_lib.flatten_with_paths(got)
    expected_leaves = nest_lib.flatten_with_paths(expected)
    assert [p for p, _ in got_leaves] == [p for p, _ in expected_leaves]
    for (path, g), (_, e) in zip(got_leaves, expected_leaves):
        e = np.asarray(e)
        where = nest_lib.format_path(path)
        assert isinstance(g, np.ndarray), f"{where}: pulled {type(g).__name__}, not an array"
        assert g.dtype == e.dtype.newbyteorder("="), f"{where}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"{where}: shape {g.shape} != {e.shape}"
        assert g.tobytes() == e.astype(g.dtype).tobytes(), f"{where}: bytes differ" + (
            _first_difference(g, e.astype(g.dtype))
        )


def every_bit_pattern(dtype: Any) -> np.ndarray:
    """A 1-d array of ``dtype`` (1 or 2 bytes wide: ``"bfloat16"``, ``"float8_e5m2"``,
    ``"float16"``, ...) holding each of its bit patterns once, in order: every NaN
    payload, both zeros and infinities, every subnormal."""
    resolved = canonical_dtype(dtype)
    if resolved.itemsize > 2:
        raise ValueError(f"{resolved.name} is {resolved.itemsize} bytes wide; expected 1 or 2")
    bits = np.dtype(f"u{resolved.itemsize}")
    return np.arange(2 ** (8 * resolved.itemsize), dtype=bits).view(resolved)


def _first_difference(got: np.ndarray, expected: np.ndarray) -> str:
    """Where two arrays of one dtype and shape first differ, as bit patterns."""
    if got.dtype.itemsize not in (1, 2, 4, 8) or got.size == 0:
        return ""
    bits = np.dtype(f"u{got.dtype.itemsize}")
    g, e = got.reshape(-1).view(bits), expected.reshape(-1).view(bits)
    at = int(np.flatnonzero(g != e)[0])
    width = 2 * got.dtype.itemsize
    return f" (first at flat index {at}: bits 0x{int(g[at]):0{width}x} != 0x{int(e[at]):0{width}x})"
