"""varsync's conformance suite, run against shm:// exactly as any outside author runs it:
subclass ConformanceTests and give it the URL of a fresh, empty store (``store_name``, from
conftest.py, deletes the store's files afterwards)."""

import pytest

from varsync.testing import ConformanceTests


class TestShmConformance(ConformanceTests):
    @pytest.fixture
    def url(self, store_name):
        return f"shm://{store_name}"
