"""Real Reverb servers for the tests: in this process, or in a child process.

Reverb listens on every interface; ``make test`` runs the tests in a network namespace
whose only interface is loopback (see ``scripts/loopback-only``).
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import pytest

try:
    import tensorflow as tf

    # Two logical CPUs, before TensorFlow starts, so MirroredStrategy can mirror across
    # two devices as in TF-Agents' own tests.
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
except ImportError:  # the reverb extra is not installed: reverb tests skip
    tf = None
except RuntimeError:  # TensorFlow was already initialised by an earlier import
    pass

__all__ = ["reverb_servers", "reverb_child_server", "serve_in_child"]


@pytest.fixture
def reverb_servers() -> Iterator[Callable[..., Any]]:
    """``start(tables, **serve_options)``: an in-process Reverb server, stopped at teardown."""
    pytest.importorskip("reverb")
    from varsync.reverb_server import serve

    started: List[Any] = []

    def start(tables: Mapping[str, Any], **options: Any) -> Any:
        server = serve(tables, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _serve_until_told(tables: Dict[str, Any], port: int, ready: Any, stop: Any) -> None:
    from varsync.reverb_server import serve

    with serve(tables, port=port) as server:
        ready.put(server.port)
        stop.wait(600)  # bounded: the parent always sets it; 10 minutes at most


class ChildServer:
    """A Reverb server in a child process."""

    def __init__(self, tables: Dict[str, Any], port: int = 0) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready = context.Queue()
        self._stop = context.Event()
        self.process = context.Process(
            target=_serve_until_told, args=(tables, port, self._ready, self._stop), daemon=True
        )
        self.process.start()
        self.port: int = self._ready.get(timeout=120)
        self.url = f"reverb://localhost:{self.port}"

    def stop(self) -> None:
        if self.process.is_alive():
            self._stop.set()
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def serve_in_child(tables: Dict[str, Any], port: int = 0) -> ChildServer:
    return ChildServer(tables, port)


@pytest.fixture
def reverb_child_server() -> Iterator[Callable[..., ChildServer]]:
    """``start(tables, port=0)``: a Reverb server in a child process, stopped at teardown."""
    pytest.importorskip("reverb")
    started: List[ChildServer] = []

    def start(tables: Dict[str, Any], port: int = 0) -> ChildServer:
        server = serve_in_child(tables, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
