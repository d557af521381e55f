"""The sharded benchmark's smoke run (benchmarks/sharded.py --smoke): two rank processes
per contender, each set its own, push a tiny bf16 model, sharded and gathered to rank 0,
over a redis-server of its own; then readers of 1/2 and 1/4 of it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

from benchmarks import sharded  # noqa: E402
from benchmarks.servers import find_redis_server  # noqa: E402


def test_the_sharded_benchmark_runs_both_contenders_and_the_readers(capsys) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    results = sharded.main(["--smoke"])
    trainers = results[2]["trainers"]
    assert len(trainers["sharded"]["seconds"]) == len(trainers["gather"]["seconds"]) == 1
    # every rank's record; each sharded rank hands Redis its half, the gather's rank 0 all
    sharded_ranks, gather_ranks = trainers["sharded"]["ranks"], trainers["gather"]["ranks"]
    assert sorted(sharded_ranks) == sorted(gather_ranks) == [0, 1]
    rows, cols = sharded.leaf_shape(sharded.MiB, 4)  # --smoke: 1 MiB in 4 leaves
    model = rows * cols * 2 * 4
    assert all(model // 2 <= r["sent"][0] < model for r in sharded_ranks.values())
    assert gather_ranks[0]["sent"][0] >= model > gather_ranks[1]["sent"][0] == 0
    readers = results[2]["readers"]
    whole = readers["sharded 1/1"]["out_bytes"][0]
    assert readers["sharded 1/2"]["out_bytes"][0] < 0.6 * whole
    assert "| 2 | sharded |" in capsys.readouterr().out
