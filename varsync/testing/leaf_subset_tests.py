"""Reads of chosen leaves (:class:`~varsync.backend.SupportsLeafSubsets`): a reader of
some leaves of a version (some blocks of a sharded table's part) gets those alone, of
one version, bit-exact.

Backends declaring the ability are held to it: the chosen leaves changed since
``newer_than`` come bit-exact and every other leaf is ``None``; the head and every
leaf version come as ``read_leaves`` gives them; repeats and order of the indices do
not matter; an index outside the table's leaves is a ``ConfigurationError`` naming it;
a leaf held as element patches comes whole; and a read while a writer pushes never
mixes two versions. Backends without it skip these tests (the core reads every leaf
changed since and drops the rest).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

import varsync
from varsync._backends.base import Backend, SupportsElementDeltas, SupportsLeafSubsets
from varsync.testing._base import TableMaker, _Base
from varsync.testing.element_delta_tests import _first, _step, patch_table
from varsync.testing.leaf_version_tests import DELTA, DELTA_SPECS, _leaf, _nest
from varsync.testing.values import assert_bit_equal

__all__ = ["LeafSubsetTests", "BLOCKS"]

#: The table of the mixing test: leaves of a sharded part's blocks, 1 MiB in all (more
#: than an engine answers with its head, several chunks where chunks are small).
BLOCKS = {f"block{i}": varsync.Spec((256, 256), "float32") for i in range(4)}
BLOCK_SPECS = varsync.flatten(BLOCKS)
#: Each push of the mixing test's writer changes these blocks (every fifth, all of them:
#: a whole write), so that a version's blocks are of several pushes.
_BLOCK_SCHEDULE = ([0, 1, 2, 3], [0], [1, 3], [2], [0, 2])


def _block_versions(version: int) -> list[int]:
    """Each block's leaf version (and the number it is filled with) at ``version``."""
    numbers = [1] * len(BLOCK_SPECS)
    for k in range(2, version + 1):
        for index in _BLOCK_SCHEDULE[k % len(_BLOCK_SCHEDULE)]:
            numbers[index] = k
    return numbers


class LeafSubsetTests(_Base):
    """Reads of chosen leaves: those alone, of one version."""

    #: Pushes of the writer in the mixing test, and the most reads its reader makes.
    SUBSET_PUSHES = 60
    SUBSET_READS = 5_000

    @pytest.fixture
    def subset_url(self, make_tables: TableMaker) -> str:
        return make_tables({"variables": DELTA, "blocks": BLOCKS})

    @pytest.fixture
    def subsets(self, subset_url: str, connect: Callable[..., Any]) -> Any:
        """A container on :meth:`subset_url`: tables ``variables`` (:data:`DELTA`) and
        ``blocks`` (:data:`BLOCKS`), empty."""
        return connect(subset_url)

    @staticmethod
    def _needs_leaf_subsets(backend_cls: type[Backend]) -> None:
        if not issubclass(backend_cls, SupportsLeafSubsets):
            pytest.skip("backend does not declare SupportsLeafSubsets")

    def test_read_leaf_subset_gives_the_chosen_leaves_changed_since(
        self, subsets: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_subsets(backend_cls)
        backend, specs, inf = subsets.backend, DELTA_SPECS, math.inf
        subsets.push(_nest([1] * 5))
        subsets.push_leaves({("a",): _leaf(0, 2)})
        subsets.push_leaves({("c",): _leaf(3, 3), ("step",): _leaf(4, 3)})
        head = backend.head("variables", inf)
        assert head.version == 3
        versions = [2, 1, 1, 3, 3]

        def read(indices: list[int], newer_than: int) -> list[int | None]:
            """The number each leaf given holds (``None``: not given), checking the head,
            the leaf versions and the bytes."""
            got = backend.read_leaf_subset("variables", indices, newer_than, inf, specs)
            assert got.head == head, f"indices {indices}: head {got.head}, not {head}"
            assert list(got.leaf_versions) == versions, f"indices {indices}: leaf versions"
            assert len(got.arrays) == len(specs)
            numbers: list[int | None] = []
            for index, array in enumerate(got.arrays):
                if array is None:
                    numbers.append(None)
                    continue
                number = [2, 1, 1, 3, 3][index]
                assert_bit_equal(array, _leaf(index, number))
                numbers.append(number)
            return numbers

        assert read([0, 3], 0) == [2, None, None, 3, None]
        assert read([1], 0) == [None, 1, None, None, None]
        assert read([1, 2, 3], 1) == [None, None, None, 3, None]  # b's leaves: unchanged since 1
        assert read([0, 1, 4], 2) == [None, None, None, None, 3]
        assert read(list(range(5)), 0) == [2, 1, 1, 3, 3]
        assert read([], 0) == [None] * 5  # the head and leaf versions alone
        assert read([3, 0, 3, 0], 0) == read([0, 3], 0)  # a set: order and repeats ignored
        nothing = backend.read_leaf_subset("variables", [0, 3], 3, inf, specs)
        assert nothing == (head, None, None)

    def test_read_leaf_subset_of_a_whole_version_gives_the_chosen_leaves(
        self, subsets: Any, backend_cls: type[Backend]
    ) -> None:
        """A version written whole (one piece, for engines that store it so), large
        enough that an engine cannot hand it out with its head."""
        self._needs_leaf_subsets(backend_cls)
        rng = np.random.default_rng(5)
        arrays = [rng.standard_normal(s.shape).astype(s.dtype) for s in BLOCK_SPECS]
        version = subsets.push(varsync.unflatten(BLOCKS, arrays), table="blocks")
        for chosen in ([2], [0, 3], [1, 2], []):
            got = subsets.backend.read_leaf_subset("blocks", chosen, 0, math.inf, BLOCK_SPECS)
            assert got.head.version == version
            assert list(got.leaf_versions) == [version] * len(arrays)
            for index, array in enumerate(got.arrays):
                if index in chosen:
                    assert_bit_equal(array, arrays[index])
                else:
                    assert array is None, f"leaf {index} was not chosen, yet given"

    def test_read_leaf_subset_refuses_an_index_outside_the_table(
        self, subsets: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_subsets(backend_cls)
        backend, specs, inf = subsets.backend, DELTA_SPECS, math.inf
        subsets.push(_nest([1] * 5))
        for bad in (5, -1, 99):
            for newer_than in (0, 1):  # also where nothing is newer
                # the message names the index given
                with pytest.raises(varsync.ConfigurationError, match=rf"(?<![\d-]){bad}(?!\d)"):
                    backend.read_leaf_subset("variables", [0, bad], newer_than, inf, specs)
        with pytest.raises(ValueError, match="'1'"):  # ConfigurationError is a ValueError
            backend.read_leaf_subset("variables", ["1"], 0, inf, specs)

    def test_read_leaf_subset_of_patched_leaves_gives_whole_values(
        self, make_tables: TableMaker, connect: Callable[..., Any], backend_cls: type[Backend]
    ) -> None:
        self._needs_leaf_subsets(backend_cls)
        if not issubclass(backend_cls, SupportsElementDeltas):
            pytest.skip("backend does not declare SupportsElementDeltas")
        signature = patch_table(backend_cls)
        weights = connect(make_tables({"weights": signature}))
        weights.configure_table("weights", element_deltas=True)
        specs = varsync.flatten(signature)
        rng = np.random.default_rng(17)
        values = [_first(specs, 17)]
        for _ in range(4):
            values.append(_step(values[-1], rng, 0.01))
        for arrays in values:
            weights.push(varsync.unflatten(signature, arrays), "weights")
        chosen = list(range(0, len(specs), 2))
        for newer_than in (0, 2, 4):
            got = weights.backend.read_leaf_subset("weights", chosen, newer_than, math.inf, specs)
            assert got.head.version == len(values)
            for index, array in enumerate(got.arrays):
                if index not in chosen:
                    assert array is None, f"leaf {index} was not chosen, yet given"
                    continue
                assert isinstance(array, np.ndarray), f"leaf {index}: {type(array).__name__}"
                bits = f"u{array.dtype.itemsize}"
                np.testing.assert_array_equal(
                    array.view(bits), values[-1][index].view(bits), f"leaf {index}"
                )

    def test_read_leaf_subset_never_mixes_versions_while_a_writer_pushes(
        self, subsets: Any, subset_url: str, connect: Callable[..., Any], backend_cls: type[Backend]
    ) -> None:
        """A writer thread pushes blocks, whole and some at a time; a reader reads
        subsets of them, from scratch and since the version it read before, and checks
        each answer: every block given holds the number of the version its head names,
        and every leaf version is that version's."""
        self._needs_leaf_subsets(backend_cls)
        writer = connect(subset_url)
        writer.push(varsync.unflatten(BLOCKS, _filled_blocks([1] * 4)), table="blocks")
        reader = connect(subset_url).backend
        problems: list[str] = []
        done = threading.Event()

        def write() -> None:
            try:
                for k in range(2, self.SUBSET_PUSHES + 1):
                    changed = _BLOCK_SCHEDULE[k % len(_BLOCK_SCHEDULE)]
                    if len(changed) == len(BLOCK_SPECS):
                        nest = varsync.unflatten(BLOCKS, _filled_blocks([k] * 4))
                        writer.push(nest, table="blocks")
                    else:
                        leaves = {(f"block{i}",): _filled_block(k) for i in changed}
                        writer.push_leaves(leaves, table="blocks")
            except Exception as exc:
                problems.append(f"the writer failed: {type(exc).__name__}: {exc}")
            finally:
                done.set()

        thread = threading.Thread(target=write)
        thread.start()
        reads, held = 0, 0
        subsets_read = ([0], [1, 2], [3, 0], [0, 1, 2, 3])
        try:
            deadline = time.monotonic() + 120
            while reads < self.SUBSET_READS and time.monotonic() < deadline:
                finished = done.is_set()
                chosen = subsets_read[reads % len(subsets_read)]
                since = held if reads % 2 else 0
                got = reader.read_leaf_subset("blocks", chosen, since, math.inf, BLOCK_SPECS)
                reads += 1
                if got.arrays is None:
                    if finished:
                        break
                    continue
                version = got.head.version
                expected = _block_versions(version)
                if list(got.leaf_versions) != expected:
                    problems.append(
                        f"version {version}: leaf versions {list(got.leaf_versions)}, "
                        f"not {expected}"
                    )
                for index, array in enumerate(got.arrays):
                    wanted = index in chosen and expected[index] > since
                    if (array is not None) != wanted:
                        problems.append(
                            f"version {version}, chosen {chosen}, since {since}: leaf "
                            f"{index} {'given' if array is not None else 'missing'}"
                        )
                    elif array is not None:
                        numbers = np.unique(array)
                        if numbers.tolist() != [expected[index]]:
                            problems.append(
                                f"version {version}: block {index} holds "
                                f"{numbers[:4].tolist()}, not {expected[index]}: a mix"
                            )
                held = max(held, version)
                if problems or (finished and version == self.SUBSET_PUSHES):
                    break
        finally:
            done.wait(120)
            thread.join(60)
        assert problems[:3] == []
        assert reads > 0
        assert held == self.SUBSET_PUSHES, f"the reader ended at version {held}"


def _filled_block(number: int) -> np.ndarray:
    spec = BLOCK_SPECS[0]
    return np.full(spec.shape, number, spec.dtype)


def _filled_blocks(numbers: list[int]) -> list[np.ndarray]:
    return [_filled_block(n) for n in numbers]
