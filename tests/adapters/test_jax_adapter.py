"""JAX values: pytrees of jax.Array leaves over memory://, redis:// and shm://
(docs/jax.md). JAX exists only in the modern environment."""

from __future__ import annotations

import collections
import dataclasses
import uuid
from typing import Any, Iterator

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is installed only in the modern and py313 environments")
jnp = pytest.importorskip("jax.numpy")

import varsync  # noqa: E402

Pair = collections.namedtuple("Pair", ["mu", "nu"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    kernel: Any
    bias: Any


def tree(seed: int = 0) -> Any:
    """Dict keys out of order, an OrderedDict out of order (JAX keeps its order), None
    leaves, a namedtuple, a registered dataclass, every leaf distinct."""
    key = jax.random.PRNGKey(seed)
    k = jax.random.split(key, 6)
    return {
        "zeta": Layer(jax.random.normal(k[0], (3, 4)), jax.random.normal(k[1], (4,))),
        "alpha": [jax.random.normal(k[2], (2,)), None, (jnp.arange(3, dtype=jnp.int32) + seed,)],
        "ordered": collections.OrderedDict(
            [("z", jax.random.normal(k[3], (1,))), ("a", jax.random.normal(k[4], (2, 2)))]
        ),
        "moments": Pair(jnp.zeros(5) + seed, jax.random.normal(k[5], (5,)).astype(jnp.bfloat16)),
    }


@pytest.fixture(params=["memory", "redis", "shm"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[varsync.VariableContainer]:
    if request.param == "memory":
        url = f"memory://jax-{uuid.uuid4().hex}"
    elif request.param == "redis":
        pytest.importorskip("redis", reason="redis-py is not installed")
        url = request.getfixturevalue("redis_namespace")()
    else:
        pytest.importorskip("varsync_shm", reason="the shm plugin is not installed")
        url = f"shm://jax-{uuid.uuid4().hex[:12]}?root={tmp_path}"
    with varsync.connect(url, timeout=10) as container:
        yield container


def bits(leaf: Any) -> bytes:
    return np.asarray(leaf).tobytes()


def test_the_flat_order_is_jax_tree_util_order(store: varsync.VariableContainer) -> None:
    params = tree(1)
    store.create_table("params", params)
    store.push(params, "params")
    flat_specs = varsync.flatten(store.signature("params"))
    leaves = jax.tree_util.tree_leaves(params)
    assert [(s.shape, s.dtype) for s in flat_specs] == [(x.shape, np.dtype(x.dtype)) for x in leaves]
    pulled = jax.tree_util.tree_leaves(store.pull("params"))  # None: no leaf, as in JAX
    assert [bits(x) for x in pulled] == [bits(x) for x in leaves]


def test_pull_like_a_tree_returns_that_pytree_with_jax_arrays(
    store: varsync.VariableContainer,
) -> None:
    store.create_table("params", tree(1))
    store.push(tree(2), "params")
    got = store.pull("params", like=tree(1))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(tree(1))
    assert isinstance(got["zeta"], Layer) and got["alpha"][1] is None
    for leaf, want in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(tree(2))):
        assert isinstance(leaf, jax.Array) and leaf.dtype == want.dtype
        assert bits(leaf) == bits(want)
    assert store.pull_if_newer(1, "params", like=tree(0)) is None
    newer = store.pull_if_newer(0, "params", like=tree(0))
    assert newer is not None and newer[0] == 1


def test_a_reader_without_the_treedef_rebuilds_the_structure(
    store: varsync.VariableContainer,
) -> None:
    store.create_table("params", tree(1))
    store.push(tree(3), "params")
    plain = store.pull("params")
    assert sorted(plain) == ["alpha", "moments", "ordered", "zeta"]
    assert plain["alpha"][1] is None and isinstance(plain["alpha"][2], tuple)
    assert isinstance(plain["ordered"], collections.OrderedDict)
    assert list(plain["ordered"]) == ["z", "a"]
    assert isinstance(plain["moments"], Pair)  # the user's namedtuple, imported here
    layer = plain["zeta"]  # a dataclass: a namedtuple of its name and fields
    assert type(layer).__name__ == "Layer" and layer._fields == ("kernel", "bias")
    np.testing.assert_array_equal(layer.kernel, np.asarray(tree(3)["zeta"].kernel))
    assert plain["moments"].nu.dtype.name == "bfloat16"


def test_update_says_jax_arrays_are_immutable(store: varsync.VariableContainer) -> None:
    store.create_table("params", tree(1))
    store.push(tree(1), "params")
    with pytest.raises(varsync.SignatureMismatchError, match="JAX arrays are immutable.*like="):
        store.update(tree(1), "params")


def test_specs_from_shape_dtype_structs_and_mismatches(store: varsync.VariableContainer) -> None:
    specs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree(0))
    store.create_table("params", specs)
    with pytest.raises(varsync.SignatureMismatchError, match="is a spec"):
        store.push(specs, "params")
    wrong = tree(0)
    wrong["alpha"][0] = jnp.zeros(3)
    with pytest.raises(varsync.SignatureMismatchError, match=r"\['alpha'\]\[0\].*shape \(3,\)"):
        store.push(wrong, "params")
    assert store.version("params") == 0
    wrong = tree(0)
    wrong["alpha"][1] = jnp.zeros(1)  # a leaf where the table has None
    with pytest.raises(varsync.SignatureMismatchError, match=r"\['alpha'\]\[1\].*expected None"):
        store.pull("params", like=wrong, timeout=0)


def test_flax_nnx_state_and_optax_state_round_trip(store: varsync.VariableContainer) -> None:
    nnx = pytest.importorskip("flax.nnx", reason="flax is not installed")
    optax = pytest.importorskip("optax", reason="optax is not installed")

    class Model(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.linear = nnx.Linear(3, 2, rngs=rngs)
            self.norm = nnx.BatchNorm(2, rngs=rngs)

    learner, actor = Model(nnx.Rngs(0)), Model(nnx.Rngs(1))
    store.create_table("model", nnx.state(learner))
    store.push(nnx.state(learner), "model")
    nnx.update(actor, store.pull("model", like=nnx.state(actor)))
    for mine, theirs in zip(
        jax.tree_util.tree_leaves(nnx.state(actor)), jax.tree_util.tree_leaves(nnx.state(learner))
    ):
        assert bits(mine) == bits(theirs)

    params = nnx.state(learner, nnx.Param)
    opt_state = optax.adam(1e-3).init(params)
    store.create_table("opt", opt_state)
    store.push(opt_state, "opt")
    back = store.pull("opt", like=opt_state)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(opt_state)


def test_pulled_leaves_keep_the_like_leaves_placement(store: varsync.VariableContainer) -> None:
    """Uncommitted like leaves give uncommitted arrays (a jitted function compiled for the
    tree it held needs no new compilation); committed ones are placed where they are."""
    params = {"w": jnp.ones((8, 4)), "b": jax.device_put(jnp.zeros(4), jax.devices()[0])}
    assert not params["w"].committed and params["b"].committed
    store.create_table("params", params)
    store.push(params, "params")
    total = jax.jit(lambda t: t["w"].sum() + t["b"].sum())
    total(params)
    compiled = total._cache_size()
    pulled = store.pull("params", like=params)
    assert not pulled["w"].committed and pulled["b"].committed
    assert pulled["b"].sharding == params["b"].sharding
    assert float(total(pulled)) == 32.0 and total._cache_size() == compiled


def test_a_structure_checked_once_is_still_checked_when_it_changes(
    store: varsync.VariableContainer,
) -> None:
    store.create_table("params", tree(1))
    store.push(tree(2), "params")
    for _ in range(3):  # the first pull checks tree(1)'s treedef; the others reuse it
        got = store.pull("params", like=tree(1))
        assert bits(got["zeta"].kernel) == bits(tree(2)["zeta"].kernel)
    other = tree(1)
    other["extra"] = jnp.zeros(1)
    with pytest.raises(varsync.SignatureMismatchError, match="unexpected \\['extra'\\]"):
        store.pull("params", like=other)
