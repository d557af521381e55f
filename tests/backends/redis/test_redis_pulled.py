"""A Redis pull's large arrays in memory recycled from earlier pulls the caller let go of
(varsync/_backends/redis/pulled.py), against a real redis-server: memory is reused only
once nothing references it (the arrays, views of them, buffers exported from them), the
values are always the pulled ones, at most two pulls' buffers are kept, and
``reuse_pulled=0`` turns it off."""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

pytest.importorskip("redis")

import varsync  # noqa: E402
from varsync._backends.redis.pulled import REUSE_FROM, PulledMemory  # noqa: E402
from varsync._signature import Spec  # noqa: E402

LEAF = REUSE_FROM // 4  # float32 elements: one leaf of REUSE_FROM bytes


def nest(value: float) -> Dict[str, np.ndarray]:
    return {"large": np.full(LEAF, value, np.float32), "second": np.full(LEAF, -value, np.float32),
            "small": np.full(8, value, np.float32)}


def addresses(pulled: Dict[str, np.ndarray]) -> Dict[str, int]:
    return {name: array.ctypes.data for name, array in pulled.items()}


@pytest.fixture
def table(redis_namespace: Callable[..., str]) -> Any:
    def make(**options: Any) -> Any:
        store = varsync.connect(redis_namespace(**options))
        store.create_table("variables", nest(0.0))
        return store

    made: List[Any] = []
    yield lambda **options: made.append(make(**options)) or made[-1]
    for store in made:
        store.close()


def test_a_pull_let_go_of_lends_its_memory_to_the_next_one(table: Any) -> None:
    store = table()
    store.push(nest(1.0))
    first = store.pull()
    were = addresses(first)
    del first
    store.push(nest(2.0))
    second = store.pull()
    assert addresses(second)["large"] == were["large"]
    assert addresses(second)["second"] == were["second"]
    assert all(np.array_equal(second[k], v) for k, v in nest(2.0).items())
    assert second["large"].flags.writeable and second["large"].flags.c_contiguous


@pytest.mark.parametrize("hold", ["array", "view", "memoryview", "nest", "torch tensor"])
def test_memory_anything_still_references_is_never_written(table: Any, hold: str) -> None:
    def tensor(array: np.ndarray) -> Any:  # shares the array's memory
        return pytest.importorskip("torch").from_numpy(array)

    store = table()
    store.push(nest(1.0))
    first = store.pull()
    large = first["large"]
    held: Any = {"array": large, "view": large[5:], "memoryview": memoryview(large),
                 "nest": first}.get(hold)
    if hold == "torch tensor":
        held = tensor(large)
    del large

    def contents(value: Any) -> np.ndarray:
        if isinstance(value, dict):
            return value["large"]
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value)

    expected = contents(held).copy()
    were = addresses(first)["large"]
    del first
    gc.collect()
    for value in (2.0, 3.0):  # two more pulls: both must find it taken
        store.push(nest(value))
        pulled = store.pull()
        assert pulled["large"].ctypes.data != were
        assert all(np.array_equal(pulled[k], v) for k, v in nest(value).items())
    assert np.array_equal(contents(held), expected)


def test_in_a_pull_loop_one_more_pull_s_memory_is_kept(table: Any) -> None:
    store = table()
    params = None
    seen = set()
    for value in range(1, 7):
        store.push(nest(float(value)))
        params = store.pull()  # the previous pull is let go of after this one
        assert all(np.array_equal(params[k], v) for k, v in nest(float(value)).items())
        seen.add(addresses(params)["large"])
    assert len(seen) == 2  # two sets of buffers take turns
    assert len(store.backend.reader.fetch.pulled) <= 4  # two leaves' buffers of two pulls


def test_buffers_of_pulls_the_caller_keeps_are_not_kept_past_two_pulls(table: Any) -> None:
    store = table()
    history = []
    for value in range(1, 8):
        store.push(nest(float(value)))
        history.append(store.pull())
        assert len(store.backend.reader.fetch.pulled) <= 4
    for value, pulled in enumerate(history, 1):
        assert all(np.array_equal(pulled[k], v) for k, v in nest(float(value)).items())
    store.close()
    assert len(store.backend.reader.fetch.pulled) == 0


def test_reuse_pulled_0_makes_every_array_new(table: Any) -> None:
    store = table(reuse_pulled=0)
    assert store._backend.describe_options()["reuse_pulled"] is False
    store.push(nest(1.0))
    for _ in range(3):
        pulled = store.pull()
        assert all(np.array_equal(pulled[k], v) for k, v in nest(1.0).items())
        assert pulled["large"].flags.owndata  # np.empty's own memory
        del pulled
    assert len(store.backend.reader.fetch.pulled) == 0


def test_a_bad_reuse_pulled_is_refused_by_name(redis_namespace: Callable[..., str]) -> None:
    with pytest.raises(varsync.ConfigurationError, match="reuse_pulled='sometimes'"):
        varsync.connect(redis_namespace(reuse_pulled="sometimes"))


def test_leaves_pulled_alone_never_write_a_held_pull(table: Any) -> None:
    store = table()
    store.push(nest(1.0))
    held = store.pull()
    update = nest(1.0)
    update["large"][:] = 5.0  # one leaf changed: the newer version shares the others
    store.push(update)
    got = store.pull_if_newer(1)
    assert got is not None and got[0] == 2
    newer = got[1]
    assert all(np.array_equal(newer[k], v) for k, v in update.items())
    assert all(np.array_equal(held[k], v) for k, v in nest(1.0).items())


def test_the_pool_alone_hands_out_exactly_the_specs_shapes_and_dtypes() -> None:
    memory = PulledMemory()
    specs = [Spec((REUSE_FROM // 8,), np.float64), Spec((2, REUSE_FROM // 4), np.int16),
             Spec((3,), np.int32), Spec((0,), np.float32)]
    arrays, fresh = memory.arrays(specs)
    assert [(a.shape, a.dtype) for a in arrays] == [(s.shape, s.dtype) for s in specs]
    assert len(fresh) == 4 and len(memory) == 2
    del arrays, fresh
    only, fresh = memory.arrays(specs, indices=[1])
    assert only[0] is None and only[2] is None and only[1] is not None
    assert fresh == []  # the second spec's buffer was let go of: reused, not new
