"""Values for testing and measuring a backend, without pytest: nests whose every element
holds one number, the check that a pulled nest holds one version only, and bit-exact
comparison. The conformance suite, varsync's own tests, its benchmarks and its soak use
these; so can a backend author's (they are re-exported by :mod:`varsync.backend`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from varsync import nest as nest_lib

__all__ = ["filled", "check_consistent", "assert_bit_equal"]


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
        assert g.tobytes() == e.astype(g.dtype).tobytes(), f"{where}: bytes differ"
