"""What each backend of the soak runs on: a URL, a way to measure the server's memory, and
a stop. The servers are the benchmarks' (benchmarks/servers.py): a Reverb server in a child
process, a redis-server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, Callable

from benchmarks.servers import ReverbProcess, running_redis_server

SERVER_LIFETIME = 24 * 3600.0  # seconds a Reverb server lives if nobody stops it


class Server:
    """What one backend runs on: a URL, a way to measure the server's memory, a stop."""

    def __init__(self, backend: str, signature: Any) -> None:
        self.backend = backend
        self.memory: Callable[[], int] = lambda: 0
        self.memory_name = "-"
        self.address: tuple[str, int] | None = None  # (host, port) of a server, for proxies
        self.store_path = ""  # shm: the store's directory
        self._stack = contextlib.ExitStack()
        try:
            self._start(backend, signature)
        except BaseException:
            self._stack.close()
            raise

    def _start(self, backend: str, signature: Any) -> None:
        if backend == "memory":
            self.url = f"memory://soak-{uuid.uuid4().hex}"
        elif backend == "shm":
            import varsync_shm

            name = f"soak-{uuid.uuid4().hex}"
            self.url = f"shm://{name}"
            path = self.store_path = varsync_shm.store_path(name)
            self._stack.callback(varsync_shm.remove_store, name)
            self.memory = lambda: tree_kib(path)
            self.memory_name = "/dev/shm"
        elif backend == "redis":
            server = self._stack.enter_context(running_redis_server())
            self.url = server.url
            self.address = ("127.0.0.1", server.port)
            self.memory = lambda: rss_kib(server.pid)
            self.memory_name = "redis-server"
        else:
            reverb = ReverbProcess({"soak": {"variables": signature}}, SERVER_LIFETIME)
            self._stack.callback(reverb.stop)
            pid, addresses = reverb.wait()
            address = addresses["soak"]
            self.url = f"reverb://{address}"
            self.address = ("127.0.0.1", int(address.rpartition(":")[2]))
            self.memory = lambda: rss_kib(pid)
            self.memory_name = "reverb server"

    def stop(self) -> None:
        self._stack.close()


def tree_kib(path: str) -> int:
    """KiB allocated by the files under ``path`` (tmpfs pages, not sizes)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_blocks * 512
    return total // 1024


def rss_kib(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), in KiB."""
    with open(f"/proc/{pid or 'self'}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
