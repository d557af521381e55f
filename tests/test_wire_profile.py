"""The benchmark's profile of where a Redis transfer's time goes (issue 15.4): how py-spy's
samples are put in categories, and the CPU meter around a call."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import wire_profile  # noqa: E402

PULL = ("<module> (bench.py:1);pull (varsync/container.py:220);"
        "fetch_whole (varsync/backends/redis/leaves.py:212)")


def test_a_sample_goes_to_the_part_of_its_innermost_varsync_frame() -> None:
    lines = [
        PULL + ";on_connection (varsync/backends/redis/pool.py:90);"
        "receive_selected (varsync/backends/redis/wire.py:220);"
        "_take (varsync/backends/redis/wire.py:270);"
        "Wire.readinto (varsync/backends/redis/wire.py:384);"
        "Wire._recv_into (varsync/backends/redis/wire.py:348) 7",
        PULL + ";receive_selected (varsync/backends/redis/wire.py:230);"
        "_check (varsync/backends/redis/wire.py:279);"
        "checksum (varsync/backends/redis/wire.py:53) 3",
        PULL + " 2",  # np.empty, in C: the sample's innermost varsync frame is fetch_whole
        # below fetch_whole, but in none of the parts: not the allocation
        PULL + ";receive_selected (varsync/backends/redis/wire.py:215) 4",
        PULL + ";_recv_into (numpy/whatever.py:1) 1",  # a frame not of varsync: skipped
        "_receive (benchmarks/sweep.py:470) 5",  # another thread, not in varsync's call
        "malformed line",
    ]
    counts = wire_profile.categorize(lines)
    assert counts == {
        "socket receive (recv_into)": 7,
        "CRC-32 of the chunks": 3,
        "allocating the pulled arrays": 2 + 1,
        wire_profile.OTHER: 4,
        "elsewhere": 5,
    }


def test_the_meter_accounts_a_timed_sample_per_call_and_passes_its_seconds_on() -> None:
    meter = wire_profile.CpuMeter(server_pid=None, keys={("redis", "pull")})

    def busy() -> float:  # a timed sample of 2 calls, 25 ms of this process's CPU each
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:  # bounded: 50 ms of CPU in all
            pass
        return 0.025

    assert meter.sample(("redis", "pull"), busy, calls=2) == 0.025
    assert meter.sample(("redis", "push"), busy, calls=2) == 0.025  # not accounted
    assert list(meter.records) == [("redis", "pull")]
    (record,) = meter.records[("redis", "pull")]
    assert record["wall"] == 0.025
    assert 0.02 <= record["client_user"] + record["client_kernel"] <= 0.05
    assert record["server"] == 0.0
