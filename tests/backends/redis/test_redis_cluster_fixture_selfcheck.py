"""The self-check of tests/fixtures/redis_cluster.py: a real local Redis Cluster forms with
the slots split evenly, a slot migrates key batch by key batch with every key readable on
exactly one of the two nodes at each step (the source plainly, the target after ASKING),
the old owner answers MOVED afterwards, and no process outlives the cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

import pytest
from fixtures.redis_cluster import (  # noqa: F401  (redis_cluster: a fixture)
    LocalCluster,
    myself_in,
    node_id,
    redis_cluster,
    slot_of,
)

redis = pytest.importorskip("redis")

TAGGED = [f"{{t}}:{index}" for index in range(200)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _write_to_owners(cluster: LocalCluster, values: Dict[str, str]) -> None:
    """SET each key on the primary that owns it, with a plain (not cluster) client."""
    owners: Dict[int, int] = {}  # by slot
    by_owner: Dict[int, Dict[str, str]] = {}
    for key, value in values.items():
        slot = slot_of(key)
        if slot not in owners:
            owners[slot] = cluster.owner_of_slot(slot).port
        by_owner.setdefault(owners[slot], {})[key] = value
    for node in cluster.nodes:
        with node.client() as client:
            for key, value in by_owner.get(node.port, {}).items():
                assert client.set(key, value)


def test_a_slot_migrates_batch_by_batch_and_no_process_outlives_the_cluster(
    redis_binary: str, tmp_path: Path
) -> None:
    with LocalCluster(redis_binary, tmp_path, replicas_per_primary=1) as cluster:
        processes = [node.process for node in cluster.all_nodes]
        slot = slot_of("{t}")
        source = cluster.owner_of("{t}")
        target = next(node for node in cluster.nodes if node is not source)
        tagged = {key: f"value-{key}" for key in TAGGED}
        others = {
            key: f"value-{key}"
            for key in (f"other:{index}" for index in range(50))
            if slot_of(key) != slot
        }
        _write_to_owners(cluster, {**tagged, **others})
        on_target_counts: List[int] = []

        def between() -> None:
            with source.client() as plain, target.client() as asking:
                reads = plain.pipeline(transaction=False)
                imports = asking.pipeline(transaction=False)
                for key in TAGGED:
                    reads.get(key)
                    imports.execute_command("ASKING")
                    imports.get(key)
                on_source = reads.execute(raise_on_error=False)
                on_target = imports.execute()[1::2]
            for key, here, there in zip(TAGGED, on_source, on_target):
                if isinstance(here, redis.exceptions.AskError):
                    assert (here.slot_id, here.port) == (slot, target.port)
                    assert there == tagged[key].encode(), key
                else:
                    assert (here, there) == (tagged[key].encode(), None), key
            on_target_counts.append(sum(value is not None for value in on_target))

        cluster.migrate_slot(slot, target, batch=7, between=between)

        assert on_target_counts == [min(7 * step, 200) for step in range(1, 30)]
        assert cluster.owner_of("{t}") is target
        with target.client() as client:
            assert client.mget(TAGGED) == [tagged[key].encode() for key in TAGGED]
            assert client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 200
        with source.client() as client:
            assert client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            with pytest.raises(redis.exceptions.MovedError) as moved:
                client.get(TAGGED[0])
        assert (moved.value.slot_id, moved.value.host, moved.value.port) == (
            slot, "127.0.0.1", target.port
        )
        for key, value in others.items():
            with cluster.owner_of(key).client() as client:
                assert client.get(key) == value.encode(), key
        for primary in cluster.nodes:
            (replica,) = cluster.replicas_of(primary)
            with replica.client() as client:
                link = client.info("replication")
            assert (link["role"], link["master_port"]) == ("slave", primary.port)
    assert all(process is not None and process.poll() is not None for process in processes)
    assert all(_gone(process.pid) for process in processes if process is not None)
    assert all(node.pid is None for node in cluster.all_nodes)


def test_the_cluster_fixture_addresses_ids_owners_and_a_slot_held_half_migrated(
    redis_cluster: LocalCluster,  # noqa: F811  (the fixture imported above)
) -> None:
    cluster = redis_cluster
    ports = [node.port for node in cluster.nodes]
    assert cluster.seeds == ",".join(f"127.0.0.1:{port}" for port in ports)
    assert cluster.url() == f"redis+cluster://{cluster.seeds}"
    assert cluster.url(namespace="n 1") == f"redis+cluster://{cluster.seeds}?namespace=n+1"
    slots = cluster.expected_slots()
    assert [(first, port) for first, _, port, _ in slots][0] == (0, ports[0])
    assert [port for _, _, port, _ in slots] == ports
    assert [last - first + 1 for first, last, _, _ in slots] == [5461, 5462, 5461]
    for node in cluster.nodes:
        assert cluster.reported_slots(node) == slots
        with node.client() as client:
            nodes_text = client.execute_command("CLUSTER", "NODES").decode()
        assert myself_in(nodes_text) == node_id(node)

    key = "{h}:0"
    source = cluster.owner_of(key)
    target = next(node for node in cluster.nodes if node is not source)
    keys = [f"{{h}}:{index}" for index in range(3)]
    _write_to_owners(cluster, {k: k for k in keys})
    for node in cluster.nodes:
        if node is not source:
            with node.client() as client, pytest.raises(redis.exceptions.MovedError):
                client.get(key)

    migration = cluster.begin_migration(slot_of(key), target)
    assert migration.move_keys(1) == 1
    assert migration.remaining() == 2
    with source.client() as client, pytest.raises(redis.exceptions.AskError) as ask:
        client.set("{h}:new", "new")  # a key the source lacks: the target takes it
    assert not isinstance(ask.value, redis.exceptions.MovedError)
    assert ask.value.port == target.port
    with target.client(single_connection_client=True) as client:
        with pytest.raises(redis.exceptions.MovedError):
            client.set("{h}:new", "new")  # not without ASKING
        client.execute_command("ASKING")
        assert client.set("{h}:new", "new")
    assert cluster.owner_of(key) is source  # until finish()

    migration.finish()
    assert cluster.owner_of(key) is target
    with target.client() as client:
        assert client.mget(keys + ["{h}:new"]) == [k.encode() for k in keys] + [b"new"]
    with pytest.raises(ValueError, match="already on"):
        cluster.begin_migration(slot_of(key), target)

