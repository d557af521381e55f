"""The PyTorch and JAX learner/actor examples work end to end, over shm:// and a real
redis-server, as processes: every actor sees increasing versions with the exact weights
the learner pushed as each, and ends on the last one; a failure exits non-zero. So does
the sharded FSDP2 example (gloo trainer ranks, an unsharded reader and two column-half
readers), also with a rank killed mid-version."""

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


def run_sharded(url, *args):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "sharded_fsdp.py"), "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=300,  # the example bounds each of its own waits by 60 s
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return done, done.stdout + done.stderr


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_sharded_fsdp_ranks_and_readers_sharded_another_way(backend, request):
    needs("torch", "the sharded FSDP example")
    done, output = run_sharded(example_url(backend, request), "--ranks", "2", "--steps", "3")
    assert done.returncode == 0, output
    for step in (1, 2, 3):
        assert f"rank 0: step {step} published as version {step}" in done.stdout, output
    for name in ("unsharded", "columns 0", "columns 1"):
        assert re.search(rf"reader {name}: \d+ versions, \d+\.\.3, weights exact", done.stdout), output
    assert "OK: every reader saw only whole versions, exact, and ended on version 3" in done.stdout


def test_sharded_fsdp_example_with_a_rank_killed_keeps_readers_on_the_last_version(request):
    needs("torch", "the sharded FSDP example")
    url = example_url("redis", request)
    done, output = run_sharded(url, "--ranks", "2", "--steps", "3", "--kill")
    assert done.returncode == 0, output
    assert "rank 0: step 3 not published, missing [1]" in done.stdout, output
    assert "ended on version 2" in done.stdout, output
