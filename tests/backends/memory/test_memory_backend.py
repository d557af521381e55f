"""The memory backend: the conformance suite, run exactly as a third party would, plus
what is particular to an in-process store."""

import uuid

import numpy as np
import pytest

import varsync
from varsync import _nest as nest_lib
from varsync.testing import ConformanceTests


class TestMemoryConformance(ConformanceTests):
    @pytest.fixture
    def url(self):
        return f"memory://conformance-{uuid.uuid4().hex}"


def test_containers_naming_the_same_store_share_it():
    name = f"memory://shared-{uuid.uuid4().hex}"
    with varsync.connect(name) as a, varsync.connect(name) as b:
        a.create_table("variables", {"w": np.zeros(3, np.float32)})
        assert b.push({"w": np.ones(3, np.float32)}) == 1
        np.testing.assert_array_equal(a.pull()["w"], np.ones(3, np.float32))


def test_stores_with_different_names_are_separate():
    with varsync.connect(f"memory://{uuid.uuid4().hex}") as a, varsync.connect(
        f"memory://{uuid.uuid4().hex}"
    ) as b:
        a.create_table("variables", {"w": np.zeros(3, np.float32)})
        assert b.tables() == []


def test_pulled_arrays_are_read_only_views_that_cannot_be_made_writable():
    with varsync.connect(f"memory://{uuid.uuid4().hex}") as store:
        store.create_table("variables", {"w": np.zeros(3, np.float32)})
        store.push({"w": np.arange(3, dtype=np.float32)})
        pulled = store.pull()["w"]
        assert not pulled.flags.writeable
        with pytest.raises(ValueError):
            pulled.flags.writeable = True
        np.testing.assert_array_equal(store.pull()["w"], np.arange(3, dtype=np.float32))


def test_memory_url_without_a_store_name_is_a_configuration_error():
    with pytest.raises(varsync.ConfigurationError, match="memory://<name>"):
        varsync.connect("memory://")


def test_closed_container_refuses_calls_and_close_is_idempotent():
    store = varsync.connect(f"memory://{uuid.uuid4().hex}")
    store.create_table("variables", {"w": np.zeros(1)})
    store.close()
    store.close()
    with pytest.raises(varsync.ConfigurationError, match="closed"):
        store.push({"w": np.zeros(1)})


def test_push_leaves_walks_the_signature_once_not_once_per_path(monkeypatch):
    # issue 36: each path was found by listing the whole signature again, so k paths
    # into n leaves cost O(n k); every walk of a nest lists its nodes' children
    policy = {f"w{i:03d}": np.zeros(4, np.float32) for i in range(400)}
    names = sorted(policy)[::2]
    with varsync.connect(f"memory://{uuid.uuid4().hex}") as store:
        store.create_table("variables", {"policy": policy, "step": np.zeros((), np.int64)})
        store.push({"policy": policy, "step": np.zeros((), np.int64)})
        listed = []
        children = nest_lib.children

        def counted(value):
            found = children(value)
            listed.append(len(found))
            return found

        monkeypatch.setattr(nest_lib, "children", counted)
        assert store.push_leaves({("policy", n): np.ones(4, np.float32) for n in names}) == 2
        monkeypatch.undo()
        assert sum(listed) <= 2 * (len(policy) + 2), f"{sum(listed)} children listed"
        pulled = store.pull()["policy"]
    for name in policy:
        np.testing.assert_array_equal(pulled[name], np.full(4, name in names, np.float32))
