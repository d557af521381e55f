"""The element-delta benchmark's smoke run (benchmarks/element_sync.py --smoke): a tiny
model trained two steps, synced through patched and whole tables on memory:// and
redis://, every value checked bit for bit by the benchmark itself."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks import element_sync  # noqa: E402
from benchmarks.servers import find_redis_server  # noqa: E402


def test_the_element_sync_benchmark_runs_and_checks_every_value(capsys) -> None:
    backends = "memory,redis" if find_redis_server() else "memory"
    element_sync.main(["--smoke", "--steps", "2", "--backends", backends])
    out = capsys.readouterr().out
    assert out.count("| 1e-06 | 2 | patched |") == len(backends.split(","))
    assert "every element changed, push patched / twin" in out
