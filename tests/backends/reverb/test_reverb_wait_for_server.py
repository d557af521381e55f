"""``connect("reverb://...", wait_for_server=...)``: clients that start before their server."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("reverb")

import varsync  # noqa: E402

EXAMPLE = {"w": np.zeros(3, np.float32)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_by_default_connect_fails_at_once_and_says_how_to_wait():
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(varsync.BackendConnectionError, match="wait_for_server=<seconds>"):
        varsync.connect(f"reverb://localhost:{port}")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("how", ["query", "keyword"])
def test_wait_for_server_waits_for_a_server_started_later(caplog, reverb_servers, how):
    caplog.set_level("WARNING")
    port = _free_port()
    url = f"reverb://localhost:{port}"
    options = {"wait_for_server": 60}
    if how == "query":
        url, options = f"{url}?wait_for_server=60", {}
    connected: list = []
    thread = threading.Thread(target=lambda: connected.append(varsync.connect(url, **options)),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(f"localhost:{port}" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline and thread.is_alive(), "no waiting log line"
        time.sleep(0.02)
    reverb_servers({"variables": EXAMPLE}, port=port)
    thread.join(60)
    assert connected, "connect did not return"
    with connected[0] as store:
        assert store.push({"w": np.ones(3, np.float32)}) == 1
        assert store.table_info().details["options"]["wait_for_server"] == 60


def test_wait_for_server_gives_up_after_its_bound_naming_address_and_bound():
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"localhost:{port}.*wait_for_server=0\.5"):
        varsync.connect(f"reverb://localhost:{port}?wait_for_server=0.5")
    assert 0.5 <= time.monotonic() - started < 10


@pytest.mark.parametrize(
    "value, parsed",
    [("true", None), ("forever", None), (True, None), (None, None), ("false", 0.0),
     (False, 0.0), ("0", 0.0), ("2.5", 2.5), (7, 7.0)],
)
def test_wait_for_server_values(reverb_servers, value, parsed):
    server = reverb_servers({"variables": EXAMPLE})
    with varsync.connect(server.url, wait_for_server=value) as store:
        assert store.backend.describe_options()["wait_for_server"] == parsed


@pytest.mark.parametrize("value", ["soon", "-1", -3, "nan"])
def test_a_wait_for_server_that_is_not_a_wait_is_refused_naming_it(value):
    with pytest.raises(varsync.ConfigurationError, match="wait_for_server"):
        varsync.connect(f"reverb://localhost:{_free_port()}", wait_for_server=value)
