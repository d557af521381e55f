"""The PyTorch and JAX learner/actor examples work end to end, over shm:// and a real
redis-server, as processes: every actor sees increasing versions with the exact weights
the learner pushed as each, and ends on the last one; a failure exits non-zero."""

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACTORS = 2


def needs(module, what):
    # "needs <module>" is the reason conftest.py reports as an absent engine
    return pytest.importorskip(module, reason=f"{what} needs {module}")


def run_example(name, url, *args, actors=ACTORS):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--url", url, "--actors", str(actors), *args],
        capture_output=True,
        text=True,
        timeout=300,  # the examples bound each of their own waits by 60 s
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return done, done.stdout + done.stderr


@pytest.fixture
def shm_url():
    shm = needs("varsync_shm", "the shm:// runs")
    store = f"test-examples-{uuid.uuid4().hex[:12]}"
    yield f"shm://{store}"
    shm.remove_store(store)


def example_url(backend, request):
    """A fresh store: a shm:// store of the test's own, or a namespace of its own on the
    session's real redis-server (tests/fixtures/redis.py), both removed afterwards."""
    if backend == "shm":
        return request.getfixturevalue("shm_url")
    return request.getfixturevalue("redis_namespace")()


def check_success(done, output, steps, exact):
    assert done.returncode == 0, output
    assert f"learner pushed versions 1..{steps} ({steps} SGD steps" in done.stdout, output
    lines = re.findall(rf"actor-\d: (\d+) \w+, versions (\d+)\.\.(\d+), .*increasing, {exact}$",
                       done.stdout, re.MULTILINE)
    assert len(lines) == ACTORS, output
    for count, first, last in lines:
        assert 1 <= int(count) <= steps and 1 <= int(first) and int(last) == steps, output
    assert "OK: every actor saw increasing versions" in done.stdout, output
    assert "FAILED" not in done.stdout and "ERROR" not in done.stdout, output


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_torch_learner_and_actor_processes(backend, request):
    needs("torch", "the PyTorch example")
    url = example_url(backend, request)
    done, output = run_example("torch_learner_actors.py", url, "--steps", "30")
    check_success(done, output, 30, "weights exact")


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_jax_learner_and_actor_processes(backend, request):
    needs("jax", "the JAX example")
    url = example_url(backend, request)
    done, output = run_example("jax_learner_actors.py", url, "--steps", "30")
    check_success(done, output, 30, "parameters exact")
    assert "polls skipped as unchanged" in done.stdout, output


def test_torch_example_fails_when_the_actors_cannot_see_the_learners_table():
    # memory:// is one process's own: the actor finds no table, and the run must say so
    needs("torch", "the PyTorch example")
    url = f"memory://{uuid.uuid4().hex}"
    done, output = run_example("torch_learner_actors.py", url, "--steps", "3", actors=1)
    assert done.returncode == 1, output
    assert "actor-0: 0 updates, versions none" in done.stdout, output
    assert "ERROR TableNotFoundError" in done.stdout, output
    assert done.stdout.rstrip().endswith("FAILED"), output
