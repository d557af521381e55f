"""Proof of the redis backend's atomic publish: one writer and several readers, each in a
process of its own, against a real redis-server. Every nest the writer pushes holds one
number in every element of every leaf; a reader that ever sees two numbers in one pull
has seen a torn read. Bounded in pushes and in time (a few seconds)."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import varsync
from fixtures.redis import command_calls

pytest.importorskip("redis")

NEST = {
    "policy": [varsync.Spec((512, 512), "float32"), varsync.Spec((1000,), "float64")],
    "normaliser": {"mean": varsync.Spec((64,), "float32"), "count": varsync.Spec((), "int64")},
    "train_step": varsync.Spec((), "int64"),
}
# 5.2 MB: with recycle_from=4 MiB every push overwrites the spare version's chunks in place
LARGE_NEST = {"policy": [varsync.Spec((1024, 1280), "float32")], "train_step": varsync.Spec((), "int64")}
NESTS = {"small": NEST, "large": LARGE_NEST}
PUSHES = 300
WRITE_SECONDS = 4.0
READ_SECONDS = 20.0


def filled(number: int, nest: str = "small") -> Any:
    return varsync._nest.map_structure(lambda s: np.full(s.shape, number, s.dtype), NESTS[nest])


def numbers_in(values: Any) -> List[int]:
    return sorted({int(x) for leaf in varsync.flatten(values) for x in np.unique(leaf)})


def write(url: str, nest: str, go: Any, last: Any, first_reads: Any, readers: int) -> None:
    """Push up to PUSHES versions for WRITE_SECONDS, and on until every reader has read
    once and three more versions are out (bounded): a reader process that a loaded
    machine starts late still sees the writer move on, instead of finding the last
    version at its first read."""
    with varsync.connect(url) as store:
        go.wait(30)
        started = time.monotonic()
        version = after = 0
        for number in itertools.count(1):
            version = store.push(filled(number, nest))
            after = after + 1 if first_reads.value >= readers else 0
            written = number >= PUSHES or time.monotonic() > started + WRITE_SECONDS
            if (written and after >= 3) or time.monotonic() > started + WRITE_SECONDS + 10:
                break
        last.value = version


def read(url: str, mode: str, go: Any, last: Any, report: Any, first_reads: Any) -> None:
    outcome: Dict[str, Any] = {"mode": mode, "reads": 0, "torn": [], "errors": [], "seen": 0}
    try:
        with varsync.connect(url, timeout=10) as store:
            held = 0
            go.wait(30)
            deadline = time.monotonic() + READ_SECONDS
            while time.monotonic() < deadline:
                if last.value and held >= last.value:
                    break
                if mode == "wait":
                    try:
                        store.wait_for(held, timeout=0.5)
                    except varsync.PullTimeoutError:
                        continue
                got = store.pull_if_newer(held)
                if got is None:
                    continue
                version, values = got
                numbers = numbers_in(values)
                outcome["reads"] += 1
                if outcome["reads"] == 1:
                    with first_reads.get_lock():
                        first_reads.value += 1
                if len(numbers) != 1 or numbers[0] != version:
                    outcome["torn"].append((version, numbers[:5]))
                if version <= held:
                    outcome["errors"].append(f"version went from {held} to {version}")
                held = version
            outcome["seen"] = held
            outcome["restarts"] = store.table_info().details["pulls_restarted"]
    except Exception as exc:  # reported to the test
        outcome["errors"].append(f"{type(exc).__name__}: {exc}")
    report.put(outcome)


@pytest.mark.parametrize(
    "nest, options",
    [("small", {"chunk_size": 65536, "keep": 0}), ("small", {"keep": 1}),
     ("large", {"chunk_size": 1 << 20, "keep": 0, "recycle_from": 4 << 20})],
    ids=["64KiB-chunks-keep0", "default-chunks-keep1", "recycled-1MiB-chunks-keep0"],
)
def test_readers_in_other_processes_never_see_a_torn_nest(
    redis_namespace: Any, nest: str, options: Any
) -> None:
    url = redis_namespace(**options)
    with varsync.connect(url) as store:
        store.create_table("variables", NESTS[nest])
    overwrites_before = _setrange_calls(url)

    context = multiprocessing.get_context("spawn")
    go, last, report = context.Event(), context.Value("q", 0), context.Queue()
    first_reads = context.Value("i", 0)
    modes = ["poll", "poll", "wait"]
    processes = [
        context.Process(target=read, args=(url, m, go, last, report, first_reads)) for m in modes
    ]
    processes.append(
        context.Process(target=write, args=(url, nest, go, last, first_reads, len(modes)))
    )
    outcomes: List[Dict[str, Any]] = []
    try:
        for process in processes:
            process.start()
        go.set()
        deadline = time.monotonic() + READ_SECONDS + 30
        while len(outcomes) < len(modes) and time.monotonic() < deadline:
            try:
                outcomes.append(report.get(timeout=1))
            except queue.Empty:
                pass
        for process in processes:
            process.join(max(0.1, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)

    assert len(outcomes) == len(modes), f"only {len(outcomes)} readers reported"
    assert processes[-1].exitcode == 0, f"the writer exited with {processes[-1].exitcode}"
    final = last.value
    assert final >= 10, f"the writer published only {final} versions"
    for outcome in outcomes:
        assert outcome["errors"] == [], outcome
        assert outcome["torn"] == [], f"torn reads: {outcome}"
        assert outcome["seen"] == final, outcome
    if options.get("keep", 1) >= 1:  # with keep=0 a reader may starve until the writer stops
        assert all(o["reads"] >= 2 for o in outcomes), outcomes
    if nest == "large":  # the pushes overwrote recycled chunks (6 per version) in place
        assert _setrange_calls(url) - overwrites_before >= 6 * (final - 3)


def _setrange_calls(url: str) -> int:
    import redis

    with redis.Redis.from_url(url.split("?")[0]) as client:
        return command_calls(client).get("setrange", 0)
