"""The large-pull benchmark (benchmarks/redis_pull.py) at a tiny size: every contender
timed, every stage reported, and the wire's functions put back after its stage timers."""

from __future__ import annotations

import pytest

from benchmarks import redis_pull
from benchmarks.servers import find_redis_server
from varsync._backends.redis import wire


@pytest.mark.skipif(find_redis_server() is None, reason="no redis-server")
def test_the_pull_benchmark_reports_every_contender_and_stage(capsys) -> None:
    checksum, flush = wire.checksum, wire.Wire.flush
    redis_pull.main(["--mb", "4", "--leaves", "2", "--rounds", "2", "--profiled", "1"])
    out = capsys.readouterr().out
    for contender in ("tcp loopback", "pull, memory reused", "pull, new memory"):
        assert f"| {contender} |" in out
    for stage in (*redis_pull.STAGES, "other"):
        assert f"  {stage} " in out
    assert (wire.checksum, wire.Wire.flush) == (checksum, flush)
