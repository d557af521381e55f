"""Element deltas (``docs/delta.md``, "Element deltas"): pushes that send the elements
that changed, pulls and updates that apply only them, bit-exact, on every backend.

Every backend is held to the results: after pushes that change a few elements of each
leaf (NaN payloads, -0.0 against +0.0, every bit pattern of the dtypes it stores), a
pull, a ``pull_if_newer(held=)`` and an ``update`` hold exactly the version they are
handed. Backends declaring :class:`~varsync.backend.SupportsElementDeltas` are held to
the ability itself: a patch is written only onto exactly its base, a reader one or more
versions behind gets links that join up and verify (never a gap, never a patch of
another base), a whole write starts a leaf's chain again, and ``read`` and
``read_leaves`` still answer whole values.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import numpy as np
import pytest

import varsync
from varsync._backends.base import Backend, Head, LeafChain, SupportsElementDeltas
from varsync._patches import check_chain, rebuilt_leaf
from varsync.testing._base import TableMaker, _Base
from varsync.testing.fault_tests import _interrupt_rounds
from varsync.testing.values import assert_bit_equal

__all__ = ["ElementDeltaTests", "patch_table"]

#: Writer pushes in the tests of many versions.
STEPS = 6
#: Elements changed per leaf and push, as a share.
SHARE = 0.01
#: Rounds of an interrupted push and an interrupted update.
INTERRUPTED_ROUNDS = 24


def patch_table(backend_cls: type[Backend]) -> dict[str, Any]:
    """The table of these tests: leaves of every width, the ml dtypes the backend stores,
    a leaf too small to patch and a scalar."""
    table: dict[str, Any] = {
        "f32": varsync.Spec((64, 100), "float32"),
        "f64": varsync.Spec((1500,), "float64"),
        "f16": varsync.Spec((4000,), "float16"),
        "i8": varsync.Spec((5000,), "int8"),
        "u64": varsync.Spec((700,), "uint64"),
        "small": varsync.Spec((4,), "float32"),
        "step": varsync.Spec((), "int64"),
    }
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        if name in backend_cls.supported_ml_dtypes:
            table[name] = varsync.Spec((48, 64), name)
    return table


def _bits(dtype: np.dtype) -> type:
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]


def _bits_equal(got: list[Any], want: list[np.ndarray]) -> bool:
    return all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, want))


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(got.view(_bits(got.dtype)), want.view(_bits(want.dtype)))


def _first(specs: list[Any], seed: int) -> list[np.ndarray]:
    """Random bit patterns of every leaf: NaNs with payloads, infinities, -0.0 included."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        raw = rng.integers(0, np.iinfo(_bits(dtype)).max, size=spec.shape, dtype=_bits(dtype))
        out.append(np.ascontiguousarray(raw).view(dtype).reshape(spec.shape))
    return out


def _step(arrays: list[np.ndarray], rng: np.random.Generator, share: float) -> list[np.ndarray]:
    """``arrays`` with about ``share`` of each leaf's elements given new bits (a sign
    bit flipped: -0.0 for +0.0; a NaN's payload), and the scalar counted on."""
    out = []
    for array in arrays:
        new = array.copy()
        flat: np.ndarray = new.reshape(-1).view(_bits(new.dtype))
        if flat.size > 1:
            picked = rng.choice(flat.size, max(1, int(share * flat.size)), replace=False)
            top = np.array(1 << (8 * new.dtype.itemsize - 1), dtype=flat.dtype)
            flat[picked[::2]] ^= top  # the sign bit only
            flat[picked[1::2]] ^= rng.integers(1, 255, picked[1::2].size).astype(flat.dtype)
        else:
            flat += flat.dtype.type(1)
        out.append(new)
    return out


class ElementDeltaTests(_Base):
    """Pushes of a few changed elements, and readers that apply only them."""

    @pytest.fixture
    def patch_url(self, make_tables: TableMaker, backend_cls: type[Backend]) -> str:
        return make_tables({"weights": patch_table(backend_cls)})

    @pytest.fixture
    def weights(self, patch_url: str, connect: Callable[..., Any]) -> Any:
        """A container on table ``weights`` of :func:`patch_table`, empty, with element
        deltas on (a backend may default to off: ``element_deltas_default``)."""
        container = connect(patch_url)
        container.configure_table("weights", element_deltas=True)
        return container

    @staticmethod
    def _needs_element_deltas(backend_cls: type[Backend]) -> None:
        if not issubclass(backend_cls, SupportsElementDeltas):
            pytest.skip("backend does not declare SupportsElementDeltas")

    @staticmethod
    def _history(container: Any, seed: int = 7) -> list[list[np.ndarray]]:
        """Version 1 whole, then :data:`STEPS` pushes changing :data:`SHARE` of each
        leaf; the values of each version (index 0: version 1)."""
        specs = varsync.flatten(container.signature("weights"))
        rng = np.random.default_rng(seed)
        values = [_first(specs, seed)]
        for _ in range(STEPS):
            values.append(_step(values[-1], rng, SHARE))
        return values

    def _pushed(
        self, weights: Any, seed: int, whole_at: int = 0
    ) -> tuple[Any, list[Any], list[list[np.ndarray]]]:
        """The backend, the specs and the values of :meth:`_history`, every version pushed
        (version ``whole_at`` with element deltas off)."""
        signature = weights.signature("weights")
        values = self._history(weights, seed)
        for number, arrays in enumerate(values, start=1):
            nest = varsync.unflatten(signature, arrays)
            weights.push(nest, "weights", element_deltas=number != whole_at)
        return weights.backend, varsync.flatten(signature), values

    # -- every backend: the results -------------------------------------------------------

    def test_readers_of_few_changed_elements_end_bit_exact_on_each_version(
        self, weights: Any, connect: Callable[..., Any], patch_url: str
    ) -> None:
        signature = weights.signature("weights")
        values = self._history(weights)
        reader = connect(patch_url)
        targets = varsync.unflatten(signature, [np.zeros_like(a) for a in values[0]])
        skipping = varsync.unflatten(signature, [np.zeros_like(a) for a in values[0]])
        held_version, held = 0, None
        for number, arrays in enumerate(values, start=1):
            assert weights.push(varsync.unflatten(signature, arrays), "weights") == number
            expected = varsync.unflatten(signature, arrays)
            got = reader.pull_if_newer(held_version, "weights", held=held)
            assert got is not None and got[0] == number
            held_version, held = got
            assert_bit_equal(held, expected)
            assert reader.update(targets, "weights") == number
            assert_bit_equal(targets, expected)
            if number % 3 == 0:  # an update three versions behind
                assert reader.update(skipping, "weights") == number
                assert_bit_equal(skipping, expected)
        assert_bit_equal(reader.pull("weights"), varsync.unflatten(signature, values[-1]))
        assert reader.pull_if_newer(held_version, "weights", held=held) is None

    def test_element_deltas_off_still_ends_bit_exact(
        self, weights: Any, connect: Callable[..., Any], patch_url: str
    ) -> None:
        signature = weights.signature("weights")
        values = self._history(weights, seed=3)
        reader = connect(patch_url)
        targets = varsync.unflatten(signature, [np.zeros_like(a) for a in values[0]])
        for number, arrays in enumerate(values, start=1):
            off = number in (3, 4)  # whole leaves in the middle of a chain
            weights.push(varsync.unflatten(signature, arrays), "weights", element_deltas=not off)
            assert reader.update(targets, "weights") == number
            assert_bit_equal(targets, varsync.unflatten(signature, arrays))

    def test_another_writers_push_between_two_patches_is_kept_whole(
        self, weights: Any, connect: Callable[..., Any], patch_url: str
    ) -> None:
        signature = weights.signature("weights")
        values = self._history(weights, seed=5)
        other = connect(patch_url)
        reader = connect(patch_url)
        targets = varsync.unflatten(signature, [np.zeros_like(a) for a in values[0]])
        weights.push(varsync.unflatten(signature, values[0]), "weights")
        weights.push(varsync.unflatten(signature, values[1]), "weights")
        reader.update(targets, "weights")
        other.push(varsync.unflatten(signature, values[3]), "weights")  # not our base
        assert weights.push(varsync.unflatten(signature, values[2]), "weights") == 4
        assert reader.update(targets, "weights") == 4
        assert_bit_equal(targets, varsync.unflatten(signature, values[2]))
        assert_bit_equal(reader.pull("weights"), varsync.unflatten(signature, values[2]))

    # -- backends with the ability ------------------------------------------------------------

    def test_interrupted_patched_pushes_and_updates_end_on_whole_versions(
        self,
        weights: Any,
        connect: Callable[..., Any],
        patch_url: str,
        backend_cls: type[Backend],
    ) -> None:
        """A push or an ``update`` interrupted (Ctrl-C) at a random point: the table holds
        one pushed value whole, and the next ``update`` ends bit-exact on it. (Backends
        without the ability: ``FaultTests`` interrupt their pushes and pulls.)"""
        from varsync.testing.faults import Interrupter

        self._needs_element_deltas(backend_cls)

        signature = weights.signature("weights")
        specs = varsync.flatten(signature)
        rng = np.random.default_rng(21)
        current = _first(specs, 21)
        reader = connect(patch_url)
        targets = varsync.unflatten(signature, [np.zeros_like(a) for a in current])
        pushes: list[float] = []
        updates: list[float] = []

        def timed(times: list[float], call: Callable[[], Any]) -> None:
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)

        def typical(times: list[float]) -> float:
            """As FaultTests time calls: the median of the last few uninterrupted ones,
            so that one slow call on a busy machine does not send most interrupts
            after the call returned."""
            return statistics.median(times[-5:])

        for _ in range(5):  # the typical durations, and copies and chains under way
            current = _step(current, rng, SHARE)
            nest = varsync.unflatten(signature, current)
            timed(pushes, lambda: weights.push(nest, "weights"))  # noqa: B023
            timed(updates, lambda: reader.update(targets, "weights"))
        with Interrupter(seed=23) as interrupter:
            for index in _interrupt_rounds(INTERRUPTED_ROUNDS, interrupter):
                measured = index % 10 == 9  # one round in ten, timed, not interrupted
                new = _step(current, rng, SHARE)
                nest = varsync.unflatten(signature, new)
                if measured:
                    timed(pushes, lambda: weights.push(nest, "weights"))  # noqa: B023
                else:
                    interrupter.call(
                        lambda: weights.push(nest, "weights"),  # noqa: B023 - called at once
                        interrupter.random.uniform(0, 1.2 * typical(pushes)),
                    )
                held = reader.pull("weights")  # published or not, never a mix
                landed = _bits_equal(varsync.flatten(held), new)
                assert landed or _bits_equal(varsync.flatten(held), current), (
                    "after an interrupted push the table holds neither the value pushed "
                    "nor the one before"
                )
                current = new if landed else current
                if measured:
                    timed(updates, lambda: reader.update(targets, "weights"))
                else:
                    interrupter.call(
                        lambda: reader.update(targets, "weights"),
                        interrupter.random.uniform(0, 1.2 * typical(updates)),
                    )
                reader.update(targets, "weights")
                assert_bit_equal(targets, varsync.unflatten(signature, current))
        assert interrupter.fired >= INTERRUPTED_ROUNDS // 4, "too few calls were interrupted"

    def test_a_patch_is_written_only_onto_exactly_its_base(
        self, weights: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_element_deltas(backend_cls)
        from varsync._elements import diff

        backend = weights.backend
        specs = varsync.flatten(weights.signature("weights"))
        values = self._history(weights)
        weights.push(varsync.unflatten(weights.signature("weights"), values[0]), "weights")
        head = backend.head("weights", math.inf)
        weights.push(varsync.unflatten(weights.signature("weights"), values[1]), "weights")
        patch = diff(values[1][0], values[2][0])
        assert patch is not None
        stale = backend.write_patches(
            "weights", {}, {0: patch.to_bytes()}, specs, head, math.inf
        )  # onto version 1: the table is at 2
        assert stale is None
        current = backend.head("weights", math.inf)
        if current.epoch is not None:  # the right version of another history
            other = Head(current.version, ("not", "this", "history"))
            assert (
                backend.write_patches("weights", {}, {0: patch.to_bytes()}, specs, other, math.inf)
                is None
            )
        assert backend.head("weights", math.inf).version == 2
        assert_bit_equal(
            weights.pull("weights"), varsync.unflatten(weights.signature("weights"), values[1])
        )

    def test_readers_behind_get_links_that_join_up_and_verify(
        self, weights: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_element_deltas(backend_cls)
        backend, specs, values = self._pushed(weights, seed=7)
        last = len(values)
        patchable = [i for i, s in enumerate(specs) if s.nbytes >= 1024]
        for newer_than in range(last):
            head, leaf_versions, leaves = backend.read_patches(
                "weights", newer_than, math.inf, specs
            )
            assert head.version == last and leaves is not None and leaf_versions is not None
            for index, leaf in enumerate(leaves):
                assert leaf is not None, f"leaf {index} changed at every version"
                assert leaf_versions[index] == last
                if isinstance(leaf, LeafChain):
                    where = f"leaf {index}, newer than {newer_than}"
                    check_chain(where, leaf, newer_than, leaf_versions[index])
                    held = None if leaf.anchor is not None else values[newer_than - 1][index]
                    got = rebuilt_leaf(leaf, held)
                else:
                    got = np.asarray(leaf)
                _same_bits(got, values[-1][index])
                if newer_than and index in patchable:  # one version behind or more
                    assert isinstance(leaf, LeafChain) and leaf.anchor is None, (
                        f"leaf {index}: a reader at version {newer_than} of a chain of "
                        f"patches since version 1 got {type(leaf).__name__}, not the links"
                    )

    def test_whole_reads_of_patched_leaves_are_whole_values(
        self, weights: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_element_deltas(backend_cls)
        backend, specs, values = self._pushed(weights, seed=11)
        head, arrays = backend.read("weights", 0, math.inf, specs)
        assert head.version == len(values) and arrays is not None
        for got, want in zip(arrays, values[-1]):
            _same_bits(got, want)
        head, _, leaves = backend.read_leaves("weights", 2, math.inf, specs)
        assert leaves is not None
        for got, want in zip(leaves, values[-1]):
            assert isinstance(got, np.ndarray)
            _same_bits(got, want)

    def test_a_whole_write_starts_a_leafs_chain_again(
        self, weights: Any, backend_cls: type[Backend]
    ) -> None:
        self._needs_element_deltas(backend_cls)
        backend, specs, values = self._pushed(weights, seed=13, whole_at=4)
        _, leaf_versions, leaves = backend.read_patches("weights", 2, math.inf, specs)
        assert leaves is not None and leaf_versions is not None
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, LeafChain):  # from a whole value of version 4 or later
                # (after a push without element deltas the writer keeps no copy: its next
                # push is whole too, so the chain may start at version 5)
                assert leaf.anchor is not None and leaf.anchor_version >= 4, (
                    f"leaf {index}: a reader at version 2 was given links across the whole "
                    f"write of version 4 ({leaf.links[0].base}..{leaf.links[-1].version})"
                )
                got = rebuilt_leaf(leaf)
            else:
                assert leaf is not None
                got = np.asarray(leaf)
            _same_bits(got, values[-1][index])
