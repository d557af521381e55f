"""update into many tf.Variables assigns them in one graph call (one buffer per dtype),
and a push of many reads them in one; the values are exactly those pulled and pushed,
whatever the mix of dtypes and shapes."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is installed only in the TF/Reverb environment")

import varsync  # noqa: E402
from varsync import SignatureMismatchError  # noqa: E402
from varsync._adapters import tensorflow as tf_adapter  # noqa: E402


def made(kind: str) -> int:
    """How many cached graph functions of ``kind`` ("assign" or "read") exist."""
    return sum(key[0] == kind for key in tf_adapter._CACHE)


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
        tf_adapter._CACHE.clear()
        for seed in (1, 2, 3):
            store.push(values(seed), "policy")
            # every leaf: a delta update assigns the leaves that changed, another set
            store.update(variables, "policy", delta_only=False)
            for got, want in zip(tf.nest.flatten(variables), tf.nest.flatten(values(seed))):
                assert got.dtype.as_numpy_dtype == want.dtype
                np.testing.assert_array_equal(got.numpy(), want)
        assert made("assign") == 1  # one function, made once, for these variables


def test_the_cache_keeps_the_last_few_sets_of_variables() -> None:
    tf_adapter._CACHE.clear()
    sets = [[tf.Variable(np.zeros(2, np.float32)) for _ in range(5)]
            for _ in range(tf_adapter._CACHE_SIZE + 4)]
    for variables in sets:
        tf_adapter.ADAPTER.assign_all(variables, [np.full(2, 7, np.float32)] * 5)
        assert all((v.numpy() == 7).all() for v in variables)
    assert made("assign") == tf_adapter._CACHE_SIZE


@pytest.mark.parametrize("batched", [True, False], ids=["one-device", "mirrored"])
def test_variables_under_a_strategy_are_assigned(batched: bool) -> None:
    """One-device variables are plain ones and go in the batch; mirrored ones (over the
    two logical CPUs tests/fixtures/reverb.py makes) are assigned one by one, by their own
    assign, which updates every replica."""
    if batched:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy(("/cpu:0", "/cpu:1"))
    with strategy.scope():
        variables = [tf.Variable(np.zeros(3, np.float32)) for _ in range(6)]
    tf_adapter._CACHE.clear()
    tf_adapter.ADAPTER.assign_all(variables, [np.full(3, i, np.float32) for i in range(6)])
    assert [float(v.numpy()[0]) for v in variables] == [0, 1, 2, 3, 4, 5]
    if not batched:
        for variable in variables:
            assert {float(r.numpy()[0]) for r in variable.values} == {float(variable.numpy()[0])}
    assert made("assign") == (1 if batched else 0)


def test_a_push_of_many_variables_reads_them_in_one_call_and_keeps_what_it_read() -> None:
    with varsync.connect(f"memory://tf-read-{uuid.uuid4().hex}") as store:
        store.create_table("policy", values(0))
        variables = tf.nest.map_structure(tf.Variable, values(4))
        tf_adapter._CACHE.clear()
        for seed in (5, 6):
            for variable, want in zip(tf.nest.flatten(variables), tf.nest.flatten(values(seed))):
                variable.assign(want)
            version = store.push(variables, "policy")
            for variable in tf.nest.flatten(variables):  # after the push: not what it sent
                variable.assign(tf.zeros_like(variable))
            _, pulled = store.pull_if_newer(version - 1, "policy")
            for got, want in zip(tf.nest.flatten(pulled), tf.nest.flatten(values(seed))):
                np.testing.assert_array_equal(got, want)
        assert made("read") == 1  # one function, made once, for these variables


def test_a_push_of_variables_names_the_first_mismatching_leaf() -> None:
    with varsync.connect(f"memory://tf-read-{uuid.uuid4().hex}") as store:
        store.create_table("policy", values(0))
        variables = tf.nest.map_structure(tf.Variable, values(0))
        variables["w03"] = tf.Variable(np.zeros((9, 3), np.float32))
        with pytest.raises(SignatureMismatchError, match=r"\['w03'\].*shape \(9, 3\)"):
            store.push(variables, "policy")
        assert store.version("policy") == 0  # nothing was written
