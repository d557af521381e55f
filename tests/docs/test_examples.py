"""The examples users copy (and `make demo` runs) work end to end and exit 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *args, timeout=180):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_memory_learner_and_actor_threads_end_on_the_last_version():
    done = run_example("learner_actors.py", "--seconds", "2", "--actors", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: every actor ends on the last version" in done.stdout
    assert "polls skipped as unchanged" in done.stdout


def test_reverb_demo_learner_and_actor_processes_end_on_the_last_version():
    pytest.importorskip("reverb")
    done = run_example("reverb_learner_actors.py", "--seconds", "4", "--actors", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: every actor ends on the last version" in done.stdout
    assert "learner  pushed version" in done.stdout and "now acts with version" in done.stdout
