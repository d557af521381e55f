"""Fresh stores for the tests, and a check that none is left in /dev/shm.

Store names carry this session's token, so concurrent test runs on one host never
touch each other's stores.
"""

import os
import shutil
import uuid

import pytest
from shm_helpers import CONTEXT

import varsync_shm

SESSION = uuid.uuid4().hex[:8]


@pytest.fixture
def store_name():
    """The name of a fresh store, deleted with all its files after the test."""
    name = f"test-{SESSION}-{uuid.uuid4().hex}"
    yield name
    varsync_shm.remove_store(name)


@pytest.fixture
def children():
    """Start child processes; any still alive at teardown is killed."""
    started = []

    def start(target, *args):
        child = CONTEXT.Process(target=target, args=args, daemon=True)
        child.start()
        started.append(child)
        return child

    yield start
    for child in started:
        if child.is_alive():
            child.kill()
        child.join(30)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_dev_shm():
    """Fail the run if a test of this session left a store under /dev/shm (and remove it)."""
    yield
    root = varsync_shm.DEFAULT_ROOT
    leaked = sorted(
        entry for entry in os.listdir(root) if entry.startswith(f"varsync-shm.test-{SESSION}-")
    )
    for entry in leaked:
        shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    assert not leaked, f"tests left these stores in {root}: {leaked}"
