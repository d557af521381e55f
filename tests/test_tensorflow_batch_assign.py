"""update into many tf.Variables assigns them in one graph call (one buffer per dtype);
the values are exactly those pulled, whatever the mix of dtypes and shapes."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is installed only in the TF/Reverb environment")

import varsync  # noqa: E402
from varsync.adapters import tensorflow as tf_adapter  # noqa: E402


def values(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    nest = {f"w{i:02d}": rng.standard_normal((i % 5 + 1, 3)).astype(np.float32) for i in range(40)}
    nest["steps"] = [np.int64(seed), rng.integers(0, 9, (4,), dtype=np.int64)]
    nest["mask"] = rng.integers(0, 2, (6,)).astype(bool)
    nest["empty"] = np.zeros((0, 3), np.float32)
    nest["half"] = rng.standard_normal((7,)).astype(np.float16)
    return nest


def test_many_variables_of_mixed_dtypes_are_assigned_exactly() -> None:
    with varsync.connect(f"memory://tf-batch-{uuid.uuid4().hex}") as store:
        store.create_table("policy", values(0))
        variables = tf.nest.map_structure(tf.Variable, values(0))
        tf_adapter._ASSIGNERS.clear()
        for seed in (1, 2, 3):
            store.push(values(seed), "policy")
            store.update(variables, "policy")
            for got, want in zip(tf.nest.flatten(variables), tf.nest.flatten(values(seed))):
                assert got.dtype.as_numpy_dtype == want.dtype
                np.testing.assert_array_equal(got.numpy(), want)
        assert len(tf_adapter._ASSIGNERS) == 1  # one function, made once, for these variables


def test_the_cache_keeps_the_last_few_sets_of_variables() -> None:
    tf_adapter._ASSIGNERS.clear()
    sets = [[tf.Variable(np.zeros(2, np.float32)) for _ in range(5)] for _ in range(12)]
    for variables in sets:
        tf_adapter.ADAPTER.assign_all(variables, [np.full(2, 7, np.float32)] * 5)
        assert all((v.numpy() == 7).all() for v in variables)
    assert len(tf_adapter._ASSIGNERS) == tf_adapter._CACHE_SIZE


@pytest.mark.parametrize("batched", [True, False], ids=["one-device", "mirrored"])
def test_variables_under_a_strategy_are_assigned(batched: bool) -> None:
    """One-device variables are plain ones and go in the batch; mirrored ones (over the
    two logical CPUs tests/reverb_fixtures.py makes) are assigned one by one, by their own
    assign, which updates every replica."""
    if batched:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy(("/cpu:0", "/cpu:1"))
    with strategy.scope():
        variables = [tf.Variable(np.zeros(3, np.float32)) for _ in range(6)]
    tf_adapter._ASSIGNERS.clear()
    tf_adapter.ADAPTER.assign_all(variables, [np.full(3, i, np.float32) for i in range(6)])
    assert [float(v.numpy()[0]) for v in variables] == [0, 1, 2, 3, 4, 5]
    if not batched:
        for variable in variables:
            assert {float(r.numpy()[0]) for r in variable.values} == {float(variable.numpy()[0])}
    assert len(tf_adapter._ASSIGNERS) == (1 if batched else 0)
