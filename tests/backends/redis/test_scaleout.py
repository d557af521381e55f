"""Actors reading through a Redis replica on another simulated host: hosts are
network namespaces joined by links capped at 50 Mbit/s (tools/netns.py), a learner
pushes to the primary, two actor processes on the replica's host follow the replica with
``wait_for`` + ``pull_if_newer`` (tools/scaleout.py's actor role). Needs root."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tools import netns  # noqa: E402
from tools.scaleout import Actors, Learner  # noqa: E402

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"simulated hosts: {REASON}")

NBYTES = 10**6
PUSHES = 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_actors_on_a_replica_get_every_version_exactly_and_nothing_is_left(
    redis_binary: str,
) -> None:
    started: List[int] = []
    with netns.Network(["learner", "primary", "replica"], rate="50mbit") as net:
        primary = netns.start_redis(net, "primary", redis_binary)
        replica = netns.start_redis(net, "replica", redis_binary, replica_of=primary)
        netns.wait_replicas_up(net, [replica], redis_binary)
        learner = Learner(net, "learner", primary.url, NBYTES)
        pushed = {}  # version -> the value every element holds
        version, _, _ = learner.push(1000)
        pushed[version] = 1000
        actors = Actors(net, [("replica", replica.url)] * 2, check=True)
        actors.all_hold(version, 60)
        for value in range(1001, 1001 + PUSHES):
            version, _, _ = learner.push(value)
            pushed[version] = value
            actors.all_hold(version, 60)
        # the actors read from the replica only: the primary served no GET nor XREAD
        served = netns.info(net, primary, redis_binary, "commandstats")
        assert "cmdstat_get" not in served and "cmdstat_xread" not in served
        assert "cmdstat_get" in netns.info(net, replica, redis_binary, "commandstats")
        started = [p.pid for p in net.processes()]
        namespaces = net.namespaces()
        listed = netns.run_here(["ip", "netns", "list"])
        assert all(name in listed for name in namespaces)

    for got in actors.got:
        # every version, in order, each pulled whole and bit-exact (check_consistent in
        # the actor: every element of every leaf holds the value pushed with it)
        assert [(v, value) for v, value, _, _ in got] == sorted(pushed.items())
        # a wait_for on the replica woke only once the replica's head held that version
        assert [head for v, _, _, head in got[1:]] == [v for v, _, _, _ in got[1:]]
    listed = netns.run_here(["ip", "netns", "list"])
    assert not [name for name in namespaces if name in listed], listed
    assert netns.ours() == []
    assert len(started) == 5  # two redis-servers, the learner, two actors
    assert not [pid for pid in started if _alive(pid)]
