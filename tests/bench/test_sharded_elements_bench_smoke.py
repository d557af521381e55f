"""The smoke run of the element-deltas-per-block benchmark (benchmarks/sharded_elements.py
--smoke): two rank processes push a tiny bf16 model to two sharded tables, one with
element deltas, one with changed blocks whole; a reader updates from each and ends on
the same bits."""

from __future__ import annotations

import pytest

pytest.importorskip("ml_dtypes")
pytest.importorskip("prometheus_client")

from benchmarks import sharded_elements  # noqa: E402
from benchmarks.servers import find_redis_server  # noqa: E402


def test_element_deltas_per_block_move_a_fraction_of_the_blocks(capsys) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    figures = sharded_elements.main(["--smoke"])["figures"]
    elements, blocks = figures["elements"], figures["blocks"]
    assert len(elements["rank_bytes"]) == len(blocks["rank_bytes"]) == 2
    # 1 % of the elements changed: patches (sent twice: catch-up and step), not blocks
    for mine, whole in zip(elements["rank_bytes"], blocks["rank_bytes"]):
        assert mine < 0.2 * whole
    for mine, whole in zip(elements["update_bytes"], blocks["update_bytes"]):
        assert mine < 0.2 * whole
    assert "| elements |" in capsys.readouterr().out
