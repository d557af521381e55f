"""PyTorch values: modules, state_dicts and nests of tensors, over memory://, redis:// and
shm:// (docs/pytorch.md). PyTorch exists only in the modern environment."""

from __future__ import annotations

import collections
import uuid
from typing import Any, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is installed only in the modern environment")

import varsync  # noqa: E402
from varsync._adapters.torch import ADAPTER  # noqa: E402


class Net(torch.nn.Module):
    """Registration order differs from sorted order, and BatchNorm brings buffers
    (running statistics, an int64 counter)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layer2 = torch.nn.Linear(4, width)
        self.norm = torch.nn.BatchNorm1d(width)
        self.layer10 = torch.nn.Linear(width, 3)
        self.head = torch.nn.Linear(3, 1, bias=False)

    def forward(self, x: Any) -> Any:
        return self.head(self.layer10(self.norm(self.layer2(x))))


def filled(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in module.state_dict().values():
            if tensor.dtype.is_floating_point:
                tensor.copy_(torch.randn(tensor.shape, generator=generator))
            else:
                tensor.fill_(seed)
    return module


def assert_same_state(a: Any, b: Any) -> None:
    left, right = dict(a), dict(b)
    assert list(left) == list(right)
    for key in left:
        x, y = left[key], right[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x.cpu().view(-1).view(torch.uint8), y.cpu().view(-1).view(torch.uint8)), key


@pytest.fixture(params=["memory", "redis", "shm"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    kind = request.param
    if kind == "memory":
        yield f"memory://torch-{uuid.uuid4().hex}"
    elif kind == "redis":
        pytest.importorskip("redis", reason="redis-py is not installed")
        yield request.getfixturevalue("redis_namespace")()
    else:
        pytest.importorskip("varsync_shm", reason="the shm plugin is not installed")
        yield f"shm://torch-{uuid.uuid4().hex[:12]}?root={tmp_path}"


@pytest.fixture
def store(url: str) -> Iterator[varsync.VariableContainer]:
    with varsync.connect(url, timeout=10) as container:
        yield container


def test_a_module_is_its_state_dict_in_state_dict_order(store: varsync.VariableContainer) -> None:
    net = filled(Net(), 1)
    signature = store.create_table("policy", net)
    assert list(signature) == list(net.state_dict())  # layer2 before layer10: not sorted
    assert "norm.running_mean" in signature and "norm.num_batches_tracked" in signature
    assert signature["norm.num_batches_tracked"] == varsync.Spec((), np.int64)
    assert store.push(net, "policy") == 1
    pulled = store.pull("policy")
    assert isinstance(pulled, collections.OrderedDict)
    assert list(pulled) == list(net.state_dict())
    for key, tensor in net.state_dict().items():
        np.testing.assert_array_equal(pulled[key], tensor.numpy())


def test_update_assigns_in_place_and_keeps_parameters(store: varsync.VariableContainer) -> None:
    learner, actor = filled(Net(), 1), filled(Net(), 2)
    store.create_table("policy", learner)
    store.push(learner, "policy")
    params = {name: (p, p.data_ptr(), p.requires_grad) for name, p in actor.named_parameters()}
    actor.head.weight.requires_grad_(False)  # a frozen parameter stays frozen
    params["head.weight"] = (actor.head.weight, actor.head.weight.data_ptr(), False)
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
    assert store.update(actor, "policy") == 1
    assert_same_state(actor.state_dict(), learner.state_dict())
    for name, parameter in actor.named_parameters():
        same, pointer, requires_grad = params[name]
        assert parameter is same and isinstance(parameter, torch.nn.Parameter)
        assert parameter.data_ptr() == pointer and parameter.requires_grad is requires_grad
    assert actor.layer2.weight.grad is None
    actor(torch.randn(5, 4)).sum().backward()  # the graph still reaches the parameters
    optimizer.step()


def test_update_refuses_a_mismatch_before_assigning_anything(
    store: varsync.VariableContainer,
) -> None:
    learner = filled(Net(), 1)
    store.create_table("policy", learner)
    store.push(learner, "policy")
    wrong = filled(Net(), 2)
    wrong.head = torch.nn.Linear(3, 2, bias=False)  # last in flat order
    before = {k: v.clone() for k, v in wrong.state_dict().items()}
    with pytest.raises(varsync.SignatureMismatchError, match=r"\['head.weight'\].*shape \(2, 3\)"):
        store.update(wrong, "policy")
    assert_same_state(wrong.state_dict(), before)
    half = filled(Net(), 3).half()
    with pytest.raises(varsync.SignatureMismatchError, match="float32.*float16"):
        store.update(half, "policy")
    with pytest.raises(varsync.SignatureMismatchError, match="missing"):
        store.push(torch.nn.Linear(4, 8), "policy")


def test_pull_like_a_module_returns_its_state_dict_and_leaves_it_alone(
    store: varsync.VariableContainer,
) -> None:
    learner, actor = filled(Net(), 1), filled(Net(), 2)
    before = {k: v.clone() for k, v in actor.state_dict().items()}
    store.create_table("policy", learner)
    store.push(learner, "policy")
    state = store.pull("policy", like=actor)
    assert isinstance(state, collections.OrderedDict) and list(state) == list(before)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert_same_state(state, learner.state_dict())
    assert_same_state(actor.state_dict(), before)  # like= only says what to return
    actor.load_state_dict(state)
    assert_same_state(actor.state_dict(), learner.state_dict())
    newer = store.pull_if_newer(0, "policy", like=learner.state_dict())
    assert newer is not None and newer[0] == 1
    assert_same_state(newer[1], learner.state_dict())
    assert store.pull_if_newer(1, "policy", like=actor) is None


def test_pulled_tensors_never_write_into_the_store(store: varsync.VariableContainer) -> None:
    values = {"w": torch.arange(6, dtype=torch.float32)}
    store.create_table("t", values)
    store.push(values, "t")
    first = store.pull("t", like=values)
    first["w"].add_(100)  # a tensor the caller owns
    np.testing.assert_array_equal(store.pull("t")["w"], np.arange(6, dtype=np.float32))


def test_a_nest_of_tensors_round_trips_with_plain_dicts_sorted(
    store: varsync.VariableContainer,
) -> None:
    Pair = collections.namedtuple("Pair", ["weight", "bias"])
    values = {
        "b": [torch.ones(2, 3), torch.zeros(3, dtype=torch.int32)],
        "a": Pair(torch.full((2,), 7.0, dtype=torch.float64), torch.tensor(True)),
        "step": torch.tensor(5),
    }
    signature = store.create_table("nest", values)
    assert list(signature) == ["a", "b", "step"]
    store.push(values, "nest")
    back = store.pull("nest", like=values)
    assert isinstance(back["a"], Pair) and isinstance(back["b"], list)
    for got, want in zip(varsync.flatten(back), varsync.flatten(values)):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert torch.equal(got, want)


def test_gradients_views_and_transposes_push_their_values(store: varsync.VariableContainer) -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    values = {"t": base.t(), "g": torch.ones(2, requires_grad=True) * 3, "s": base[1, ::2]}
    store.create_table("views", values)
    store.push(values, "views")
    back = store.pull("views")
    np.testing.assert_array_equal(back["t"], base.t().numpy())
    np.testing.assert_array_equal(back["g"], [3.0, 3.0])
    np.testing.assert_array_equal(back["s"], [4.0, 6.0])


def test_a_cpu_tensor_is_read_without_a_copy() -> None:
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        tensor = torch.zeros(4, 5, dtype=dtype, requires_grad=dtype.is_floating_point)
        array = ADAPTER.to_numpy(tensor)
        assert array.ctypes.data == tensor.data_ptr(), dtype
        assert array.shape == (4, 5)
    import ml_dtypes

    assert ADAPTER.to_numpy(torch.zeros(2, dtype=torch.bfloat16)).dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize(
    "name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
)
def test_bfloat16_and_float8_tensors_round_trip_bit_exactly(
    store: varsync.VariableContainer, name: str
) -> None:
    dtype = getattr(torch, name)
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8 if dtype.itemsize == 1 else torch.int16)
    if dtype.itemsize == 2:
        bits = torch.arange(-32768, 32768, 97, dtype=torch.int32).to(torch.int16)
    values = {"w": bits.view(dtype)}  # every bit pattern, NaNs included
    store.create_table(name, values)
    assert str(store.signature(name)["w"].dtype) == name
    store.push(values, name)
    target = {"w": torch.zeros_like(values["w"])}
    store.update(target, name)
    assert torch.equal(target["w"].view(bits.dtype), bits)
    back = store.pull(name, like=values)["w"]
    assert back.dtype == dtype and torch.equal(back.view(bits.dtype), bits)


def test_meta_tensors_are_specs() -> None:
    with torch.device("meta"):
        skeleton = Net()
    name = f"memory://meta-{uuid.uuid4().hex}"
    with varsync.connect(name) as store:
        signature = store.create_table("policy", skeleton)
        assert signature["layer10.weight"] == varsync.Spec((3, 8), np.float32)
        with pytest.raises(varsync.SignatureMismatchError, match="meta device is a spec"):
            store.push(skeleton, "policy")
        store.push(filled(Net(), 4), "policy")
        actor = Net()
        store.update(actor, "policy")
        assert_same_state(actor.state_dict(), filled(Net(), 4).state_dict())


def test_a_reader_without_torch_gets_the_same_keys_in_the_same_order(tmp_path: Any) -> None:
    """The signature holds the state_dict's order (format version 2), so numpy alone
    rebuilds it: run the reader where torch was never imported."""
    import subprocess
    import sys

    store_name = f"torch-{uuid.uuid4().hex[:12]}"
    pytest.importorskip("varsync_shm", reason="the shm plugin is not installed")
    url = f"shm://{store_name}?root={tmp_path}"
    net = filled(Net(), 6)
    with varsync.connect(url) as store:
        store.create_table("policy", net)
        store.push(net, "policy")
    reader = (
        "import sys, varsync\n"
        f"s = varsync.connect({url!r}).pull('policy')\n"
        "assert 'torch' not in sys.modules\n"
        "print(type(s).__name__, ','.join(s), float(s['layer10.bias'].sum()))\n"
    )
    done = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kind, keys, total = done.stdout.split()
    assert kind == "OrderedDict" and keys.split(",") == list(net.state_dict())
    assert float(total) == pytest.approx(float(net.layer10.bias.detach().sum()))


def test_a_mismatched_like_is_refused_before_anything_is_fetched(
    store: varsync.VariableContainer,
) -> None:
    store.create_table("policy", Net())
    with pytest.raises(varsync.SignatureMismatchError, match="missing"):
        store.pull("policy", like=torch.nn.Linear(2, 2), timeout=0)




def test_autograd_sees_an_update_as_an_in_place_change(store: varsync.VariableContainer) -> None:
    """update writes CPU tensors through numpy, then bumps their version counters as
    copy_ would: a graph that saved the old values refuses to backpropagate."""
    learner, actor = filled(Net(), 1), filled(Net(), 2)
    store.create_table("policy", learner)
    store.push(learner, "policy")
    weight = actor.layer2.weight
    before = weight._version
    loss = (weight * weight).sum()  # saves weight for backward
    store.update(actor, "policy")
    assert weight._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_dtype_numpy_lacks_is_refused_naming_it() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # complex32 is "experimental"
        half_complex = torch.zeros(2, dtype=torch.complex32)
    with pytest.raises(varsync.SignatureError, match=r"\['x'\].*torch.complex32 has no numpy"):
        varsync.signature_of({"x": half_complex})


def test_a_large_update_split_over_threads_assigns_every_tensor_exactly(
    store: varsync.VariableContainer,
) -> None:
    """Above 4 MB the copies run on up to torch.get_num_threads() threads: every tensor,
    large and small, still ends exactly as pushed."""
    sizes = [3_000_000, 1, 700_000, 5, 250_000, 0, 2_000_000]
    learner = {f"t{i}": torch.randn(n) for i, n in enumerate(sizes)}
    learner["steps"] = torch.arange(7)
    store.create_table("big", learner)
    store.push(learner, "big")
    actor = {k: torch.zeros_like(v) for k, v in learner.items()}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        store.update(actor, "big")
    finally:
        torch.set_num_threads(threads)
    for key, tensor in learner.items():
        assert torch.equal(actor[key], tensor), key
