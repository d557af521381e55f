"""Element deltas in the core (varsync._patches): the writer's copies, chains and
give-up, in-place updates into numpy and torch, and the fallback to whole values when a
patch does not verify. On memory://, with element deltas turned on per table."""

from __future__ import annotations

import logging
import math
import uuid

import numpy as np
import pytest

import varsync
from varsync import _patches as patches_lib
from varsync._backends.base import LeafChain, PatchLink

SIGNATURE = {"w": varsync.Spec((256, 64), "float32"), "b": varsync.Spec((8,), "float32")}
B, W = 0, 1  # flat order: sorted keys


def _store(name: str = "") -> varsync.VariableContainer:
    container = varsync.connect(f"memory://patches-{name}{uuid.uuid4().hex}")
    container.create_table("t", SIGNATURE)
    container.configure_table("t", element_deltas=True)
    return container


def _values(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s.shape).astype(s.dtype) for k, s in SIGNATURE.items()}


def _nudged(values: dict[str, np.ndarray], share: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in values.items()}
    flat = out["w"].reshape(-1)
    flat[rng.choice(flat.size, int(share * flat.size), replace=False)] += 1
    return out


def _chains(container: varsync.VariableContainer, newer_than: int) -> list:
    specs = varsync.flatten(container.signature("t"))
    return list(container.backend.read_patches("t", newer_than, math.inf, specs).leaves or [])


def test_a_push_of_few_changes_writes_a_patch_and_keeps_a_copy() -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    written = store._written["t"]
    assert written.bases is not None
    assert written.bases.nbytes == values["w"].nbytes  # "b" is too small to keep
    store.push(_nudged(values, 0.01, 1), "t")
    b, w = _chains(store, 1)
    assert isinstance(w, LeafChain) and w.anchor is None and len(w.links) == 1
    assert len(w.links[0].data) < 0.05 * values["w"].nbytes
    assert b is None  # unchanged


def test_element_deltas_off_writes_whole_leaves_and_drops_the_copies() -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    store.push(_nudged(values, 0.01, 1), "t", element_deltas=False)
    assert store._written["t"].bases is None
    assert isinstance(_chains(store, 1)[W], np.ndarray)


def test_a_leaf_that_changes_everywhere_keeps_no_copy_for_a_while() -> None:
    store = _store()
    rng = np.random.default_rng(3)
    store.push(_values(), "t")
    kept = []
    for _ in range(12):
        store.push(_values(int(rng.integers(1 << 30))), "t")
        kept.append(store._written["t"].bases.values[W] is not None)
    assert kept.count(True) <= 3, kept  # copies after 2, then 4, then 8 pushes
    assert not any(isinstance(leaf, LeafChain) for leaf in _chains(store, 12))


def test_a_leaf_that_changes_everywhere_after_a_chain_keeps_no_copy() -> None:
    """The first push that changes every element of a patched leaf gives up at once:
    the writer does not copy the leaf it sends whole (a copy it would drop on the next
    push), as when the leaf had no chain."""
    store = varsync.connect(f"memory://patches-chain-{uuid.uuid4().hex}")
    shape = (64, 1024)  # over 4 x SAMPLE elements: sampled
    store.create_table("t", {"w": varsync.Spec(shape, "float32")})
    store.configure_table("t", element_deltas=True)
    rng = np.random.default_rng(8)
    values = {"w": rng.standard_normal(shape).astype(np.float32)}
    store.push(values, "t")
    for _ in range(3):
        values = {"w": values["w"].copy()}
        values["w"].reshape(-1)[rng.choice(values["w"].size, 50, replace=False)] += 1
        store.push(values, "t")
    bases = store._written["t"].bases
    assert bases.links[0] == 3 and bases.values[0] is not None  # a chain, on a copy
    store.push({"w": rng.standard_normal(shape).astype(np.float32)}, "t")
    assert bases.values[0] is None and bases.backoff[0] == 2  # given up: no copy
    assert isinstance(_chains(store, store.version("t") - 1)[0], np.ndarray)


def test_after_a_wait_a_sample_decides_whether_a_copy_is_kept_again() -> None:
    """A large leaf that keeps changing everywhere keeps samples, never a copy, once its
    first patch gave up; when its changes become few, the sample lets a copy be kept
    and the push after that is a patch."""
    store = varsync.connect(f"memory://patches-sample-{uuid.uuid4().hex}")
    shape = (64, 1024)  # 65536 elements: over 4 x SAMPLE, so sampled
    store.create_table("t", {"w": varsync.Spec(shape, "float32")})
    store.configure_table("t", element_deltas=True)
    rng = np.random.default_rng(5)

    def fresh() -> dict[str, np.ndarray]:
        return {"w": rng.standard_normal(shape).astype(np.float32)}

    store.push(fresh(), "t")
    copies, samples = [], []
    for _ in range(20):
        store.push(fresh(), "t")
        bases = store._written["t"].bases
        copies.append(bases.values[0] is not None)
        samples.append(bases.samples[0] is not None)
    assert not any(copies), copies  # no copy after the give-up
    assert samples.count(True) >= 2, samples  # a sample at the end of each wait
    values = fresh()
    kinds = []
    for _ in range(40):
        values = {"w": values["w"].copy()}
        values["w"].reshape(-1)[rng.choice(values["w"].size, 50, replace=False)] += 1
        store.push(values, "t")
        leaf = _chains(store, store.version("t") - 1)[0]
        kinds.append("patch" if isinstance(leaf, LeafChain) else "whole")
    first = kinds.index("patch")
    # the rest of a wait (16 pushes at most by now), the sample's push, the copy's push
    assert first <= 20, kinds
    assert kinds[first : first + 5] == ["patch"] * 5, kinds  # patches from then on
    pulled = varsync.connect(store.backend.url).pull("t")
    assert np.array_equal(pulled["w"].view(np.uint32), values["w"].view(np.uint32))


def test_a_chain_is_bounded_then_the_leaf_goes_whole() -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    for step in range(patches_lib.MAX_CHAIN + 1):
        values = _nudged(values, 0.001, step)
        store.push(values, "t")
    version = patches_lib.MAX_CHAIN + 2
    assert store.version("t") == version
    bases = store._written["t"].bases
    assert bases.links[W] == 0  # the 17th change went whole
    w = _chains(store, version - 1)[W]
    assert isinstance(w, np.ndarray)  # a whole write: no link to the reader's version


def test_update_patches_a_torch_module_in_place_and_bumps_its_version() -> None:
    torch = pytest.importorskip("torch")
    store = _store()
    module = torch.nn.Linear(64, 256, bias=False)
    extra = torch.nn.Parameter(torch.zeros(8))
    module.register_parameter("b", extra)
    values = _values()
    store.push(values, "t")
    targets = {"w": module.weight, "b": module.b}
    store.update(targets, "t")
    pointer, counter = module.weight.data_ptr(), module.weight._version
    values = _nudged(values, 0.01, 2)
    store.push(values, "t")
    assert store.update(targets, "t") == 2
    assert module.weight.data_ptr() == pointer
    assert module.weight._version > counter
    np.testing.assert_array_equal(module.weight.detach().numpy(), values["w"])


def test_pull_if_newer_given_held_leaves_the_held_nest_alone() -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    version, held = store.pull_if_newer(0, "t")
    before = held["w"].copy()
    changed = _nudged(values, 0.01, 4)
    store.push(changed, "t")
    version, got = store.pull_if_newer(version, "t", held=held)
    np.testing.assert_array_equal(got["w"], changed["w"])
    np.testing.assert_array_equal(held["w"], before)


def test_a_patch_that_does_not_verify_falls_back_to_the_whole_value(caplog) -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    targets = {k: np.zeros_like(v) for k, v in values.items()}
    store.update(targets, "t")
    version, held = store.pull_if_newer(0, "t")
    changed = _nudged(values, 0.01, 5)
    store.push(changed, "t")
    table = store.backend._table("t")  # tamper with the stored link: a flipped value byte
    current, arrays, leaf_versions, links = table.value
    link = links[W][-1]
    data = bytearray(link.data)
    data[-1] ^= 0xFF
    tampered = list(links)
    tampered[W] = (*links[W][:-1], PatchLink(link.base, link.version, bytes(data)))
    table.value = (current, arrays, leaf_versions, tampered)
    with caplog.at_level(logging.WARNING, logger="varsync.patches"):
        assert store.update(targets, "t") == 2
        got = store.pull_if_newer(version, "t", held=held)
    np.testing.assert_array_equal(targets["w"], changed["w"])
    assert got is not None
    np.testing.assert_array_equal(got[1]["w"], changed["w"])
    assert sum("pulling it whole" in r.message or "updating it whole" in r.message
               for r in caplog.records) == 2


def test_a_chain_that_does_not_join_up_is_refused() -> None:
    link = PatchLink(3, 5, b"")
    with pytest.raises(varsync.CorruptDataError, match="reader holds version 2"):
        patches_lib.check_chain("leaf", LeafChain(None, 0, [link]), 2, 5)
    gap = [PatchLink(1, 2, b""), PatchLink(3, 4, b"")]
    with pytest.raises(varsync.CorruptDataError, match="do not join up"):
        patches_lib.check_chain("leaf", LeafChain(None, 0, gap), 1, 4)
    with pytest.raises(varsync.CorruptDataError, match="end at version 2"):
        patches_lib.check_chain("leaf", LeafChain(None, 0, gap[:1]), 1, 3)
    with pytest.raises(varsync.CorruptDataError, match="anchor is version 2"):
        patches_lib.check_chain("leaf", LeafChain(np.zeros(2), 2, [link]), 0, 5)


def test_push_leaves_forgets_the_copy_of_the_leaves_it_wrote() -> None:
    store = _store()
    values = _values()
    store.push(values, "t")
    store.push_leaves({"w": values["w"] + 1}, "t")
    assert store._written["t"].bases.values[W] is None
    values = {"w": values["w"] + 1, "b": values["b"]}
    store.push(_nudged(values, 0.01, 6), "t")  # whole: no copy to diff against
    assert isinstance(_chains(store, 2)[W], np.ndarray)
    store.push(_nudged(values, 0.02, 7), "t")  # a copy again: a patch
    assert isinstance(_chains(store, 3)[W], LeafChain)


def test_torch_assign_elements_writes_only_the_changed_elements() -> None:
    torch = pytest.importorskip("torch")
    from varsync._adapters.torch import ADAPTER

    target = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    value = target.clone().view(torch.int16).numpy().copy()
    value.reshape(-1)[[1, 7]] = 99
    pointer, counter = target.data_ptr(), target._version
    import ml_dtypes

    ADAPTER.assign_elements(target, np.array([1, 7]), value.view(ml_dtypes.bfloat16))
    assert target.data_ptr() == pointer and target._version > counter
    np.testing.assert_array_equal(target.view(torch.int16).numpy(), value)
    strided = torch.zeros(4, 3).t()  # not contiguous: assigned whole
    whole = np.arange(12, dtype=np.float32).reshape(3, 4)
    ADAPTER.assign_elements(strided, np.array([0]), whole)
    np.testing.assert_array_equal(strided.numpy(), whole)


def test_update_writes_only_the_changed_elements_into_tf_variables() -> None:
    tf = pytest.importorskip("tensorflow")
    store = _store("tf")
    values = _values()
    store.push(values, "t")
    variables = {k: tf.Variable(np.zeros_like(v)) for k, v in values.items()}
    store.update(variables, "t")
    changed = _nudged(values, 0.01, 8)
    store.push(changed, "t")
    handle = variables["w"].handle
    assert store.update(variables, "t") == 2
    assert variables["w"].handle is handle
    np.testing.assert_array_equal(variables["w"].numpy(), changed["w"])
    np.testing.assert_array_equal(variables["b"].numpy(), changed["b"])
