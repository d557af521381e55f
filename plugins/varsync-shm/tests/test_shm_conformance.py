"""varsync's conformance suite, run against shm:// exactly as any outside author runs it:
subclass ConformanceTests and give it the URL of a fresh, empty store (``store_name``, from
conftest.py, deletes the store's files afterwards)."""

import shutil
from urllib.parse import parse_qs, urlsplit

import pytest

from varsync.testing import ConformanceTests
from varsync_shm import layout


def _delete_table(url, table):
    """Delete one table's directory, as ``rm -r`` would: it starts a new history when it
    is created again."""
    namespace = parse_qs(urlsplit(url).query).get("namespace", [""])[0]
    directory = layout.namespace_path(layout.store_name_of(url.partition("?")[0]), namespace)
    shutil.rmtree(layout.table_path(directory, table))


class TestShmConformance(ConformanceTests):
    @pytest.fixture
    def url(self, store_name):
        return f"shm://{store_name}"

    @pytest.fixture
    def new_history(self):
        return _delete_table
