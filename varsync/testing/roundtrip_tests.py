"""Round trips: values come back bit-exact, in the signature's structure, and neither
changing what was pushed nor what was pulled changes the table."""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import numpy as np
import pytest

import varsync
from varsync._backends.base import Backend
from varsync._spec import ML_DTYPE_NAMES
from varsync.testing._base import SMALL, TableMaker, _Base
from varsync.testing.values import assert_bit_equal, every_bit_pattern, filled

__all__ = ["RoundTripTests", "DTYPE_VALUES", "Point", "ml_dtype_values"]

Point = collections.namedtuple("Point", ["x", "y"])

#: Every dtype a TF-Agents user pushes, with values that stress bit-exactness.
DTYPE_VALUES: dict[str, list[Any]] = {
    "bool": [True, False, True],
    "int8": [-128, 127, 0, -1],
    "int16": [-32768, 32767, 0, -1],
    "int32": [-(2**31), 2**31 - 1, 0, -1],
    "int64": [-(2**63), 2**63 - 1, 0, -1],
    "uint8": [0, 255, 1, 128],
    "uint16": [0, 65535, 1, 32768],
    "uint32": [0, 2**32 - 1, 1, 2**31],
    "uint64": [0, 2**64 - 1, 1, 2**63],
    "float16": [0.0, -0.0, np.inf, -np.inf, np.nan, 6.0e-8, 65504.0],
    "float32": [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0e-45, 3.4e38],
    "float64": [0.0, -0.0, np.inf, -np.inf, np.nan, 5.0e-324, 1.7e308],
    "complex64": [0j, complex(np.nan, -0.0), complex(np.inf, 1.0e-45), 1 + 2j],
    "complex128": [0j, complex(-0.0, np.nan), complex(5.0e-324, -np.inf), 1 - 2j],
}


def ml_dtype_values(name: str) -> dict[str, np.ndarray]:
    """Values of one of :data:`~varsync._spec.ML_DTYPE_NAMES` that stress bit-exactness:
    every bit pattern of the dtype (every NaN payload, both zeros and infinities, every
    subnormal) in a 2-d array, a 0-d array and an empty one."""
    bits = every_bit_pattern(name)
    return {
        "every_bit_pattern": bits.reshape(16, -1),
        "zero_d": bits[-1:].reshape(()).copy(),  # every bit set
        "empty": bits[:0].reshape(0, 3),
    }


class RoundTripTests(_Base):
    """Values come back bit-exact, in the signature's structure."""

    def test_every_supported_dtype_round_trips_bit_exactly(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {name: np.array(items, dtype=name) for name, items in DTYPE_VALUES.items()}
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_every_declared_ml_dtype_round_trips_bit_exactly(
        self, make_tables: TableMaker, connect: Any, backend_cls: type[Backend]
    ) -> None:
        declared = backend_cls.supported_ml_dtypes
        unknown = sorted(set(declared) - set(ML_DTYPE_NAMES))
        assert not unknown, (
            f"supported_ml_dtypes names {unknown}, which varsync does not store; it stores "
            f"{list(ML_DTYPE_NAMES)}"
        )
        if not declared:
            pytest.skip("backend declares no supported_ml_dtypes")
        values = {name: ml_dtype_values(name) for name in ML_DTYPE_NAMES if name in declared}
        container = connect(make_tables({"variables": values}))
        assert container.push(values) == 1
        assert_bit_equal(container.pull(), values)
        targets = {
            name: {key: np.zeros(v.shape, v.dtype) for key, v in leaves.items()}
            for name, leaves in values.items()
        }
        assert container.update(targets) == 1
        assert_bit_equal(targets, values)

    def test_scalars_zero_d_and_zero_size_arrays_round_trip(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {
            "python_int": 7,
            "python_float": 0.5,
            "python_bool": True,
            "numpy_scalar": np.float32(2.5),
            "zero_d": np.array(-3, dtype=np.int16),
            "empty": np.zeros((0,), np.float32),
            "empty_2d": np.zeros((3, 0), np.int64),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_python_scalars_take_the_table_dtype(self, store: Any) -> None:
        values = {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)], "train_step": 12}
        store.push(values)
        pulled = store.pull()
        assert pulled["train_step"].dtype == np.int64
        assert int(pulled["train_step"]) == 12

    def test_non_contiguous_and_big_endian_inputs_round_trip(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        base = np.arange(48, dtype=np.float64).reshape(6, 8)
        values = {
            "strided": base[::2, ::3],
            "transposed": base.T,
            "fortran": np.asfortranarray(base),
            "big_endian": np.arange(5, dtype=">i4"),
            "big_endian_float": np.linspace(-1, 1, 7).astype(">f8"),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        pulled = container.pull()
        assert_bit_equal(pulled, values)
        assert all(leaf.dtype.isnative for leaf in varsync.flatten(pulled))

    def test_nested_structure_comes_back_in_the_signature_structure(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {
            "b": [np.zeros(2, np.float32), (np.int32(1), np.ones((1, 1), np.float64))],
            "a": {"z": np.uint8(3), "y": Point(x=np.float32(1), y=[np.int64(2)])},
            "c": (),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        pulled = container.pull()
        assert isinstance(pulled, dict)
        assert sorted(pulled) == ["a", "b", "c"]
        assert isinstance(pulled["b"], list)
        assert isinstance(pulled["b"][1], tuple)
        point = pulled["a"]["y"]
        assert type(point).__name__ == "Point"
        assert point._fields == ("x", "y")
        assert isinstance(point.y, list)
        assert pulled["c"] == ()
        assert_bit_equal(pulled, values)

    def test_list_and_tuple_are_interchangeable_in_pushes(self, store: Any) -> None:
        as_tuple = {
            "policy": (np.ones((3, 2), np.float32), np.ones(2, np.float32)),
            "train_step": 1,
        }
        store.push(as_tuple)
        pulled = store.pull()
        assert isinstance(pulled["policy"], list)  # the signature's type, not the push's
        assert_bit_equal(pulled["policy"], [np.ones((3, 2), np.float32), np.ones(2, np.float32)])

    def test_changing_pushed_arrays_afterwards_does_not_change_the_table(self, store: Any) -> None:
        values = filled(SMALL, 4)
        store.push(values)
        values["policy"][0][...] = -1
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_changing_pulled_arrays_does_not_change_the_table(self, store: Any) -> None:
        store.push(filled(SMALL, 4))
        for leaf in varsync.flatten(store.pull()):
            if leaf.flags.writeable:
                leaf[...] = 9
            else:
                with pytest.raises(ValueError, match="read-only"):
                    leaf[...] = 9
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_unlocking_a_pulled_arrays_base_does_not_change_the_table(self, store: Any) -> None:
        store.push(filled(SMALL, 4))
        for leaf in varsync.flatten(store.pull()):
            array: Any = leaf
            while isinstance(array, np.ndarray):  # the leaf, then every array it views
                with contextlib.suppress(ValueError):  # refused: as for memory the store shares
                    array.flags.writeable = True
                if array.flags.writeable:
                    array.reshape(-1).view(np.uint8)[...] = 0x5A
                array = array.base
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_update_assigns_in_place_into_numpy_arrays(self, store: Any) -> None:
        store.push(filled(SMALL, 6))
        targets = filled(SMALL, 0)
        originals = varsync.flatten(targets)
        assert store.update(targets) == 1
        assert all(a is b for a, b in zip(varsync.flatten(targets), originals))
        assert_bit_equal(targets, filled(SMALL, 6))

    def test_update_checks_every_variable_before_assigning_any(self, store: Any) -> None:
        store.push(filled(SMALL, 6))
        targets = filled(SMALL, 0)
        targets["train_step"] = np.zeros((), np.int32)  # wrong dtype, last in flat order
        with pytest.raises(varsync.SignatureMismatchError):
            store.update(targets)
        assert not targets["policy"][0].any()
        assert not targets["policy"][1].any()

    def test_large_nest_round_trips(self, make_tables: TableMaker, connect: Any) -> None:
        rng = np.random.default_rng(0)
        values = {
            "big": rng.standard_normal((1024, 2048)).astype(np.float32),  # 8 MiB
            "small": rng.integers(0, 100, size=7),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_many_variables_round_trip(self, make_tables: TableMaker, connect: Any) -> None:
        values = {f"layer_{i:03d}": np.full((i % 7 + 1,), i, np.float32) for i in range(500)}
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)
