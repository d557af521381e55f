"""From connect(url, **options) to a container: URL resolution, options, redaction."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

import varsync
from varsync._config import DEFAULT_URL, ENV_URL, redact


def _store() -> str:
    return f"memory://{uuid.uuid4().hex}"


# -- which URL -------------------------------------------------------------------------


def test_connect_without_url_uses_VARSYNC_URL(monkeypatch):
    url = _store()
    monkeypatch.setenv(ENV_URL, url)

    with varsync.connect() as from_env, varsync.connect(url) as explicit:
        assert from_env.backend.url == url
        from_env.create_table("variables", {"step": np.int64(0)})
        from_env.push({"step": np.int64(3)})
        assert explicit.pull()["step"] == 3


@pytest.mark.parametrize("env", [None, ""], ids=["unset", "empty"])
def test_connect_without_url_or_VARSYNC_URL_uses_the_embedded_default(monkeypatch, env):
    if env is None:
        monkeypatch.delenv(ENV_URL, raising=False)
    else:
        monkeypatch.setenv(ENV_URL, env)

    with varsync.connect() as store:
        assert DEFAULT_URL == "memory://default"
        assert store.backend.url == "memory://default"
        assert type(store.backend).__name__ == "MemoryBackend"


def test_an_explicit_url_wins_over_VARSYNC_URL(monkeypatch):
    monkeypatch.setenv(ENV_URL, _store())
    url = _store()

    with varsync.connect(url) as store:
        assert store.backend.url == url


# -- options ---------------------------------------------------------------------------


def test_query_string_options_reach_the_container_and_backend():
    name = uuid.uuid4().hex

    with varsync.connect(f"memory://{name}?timeout=2&namespace=a") as store:
        assert store.timeout == 2.0
        assert store.backend.timeout == 2.0
        assert store.backend.namespace == "a"
        assert store.backend.url == f"memory://{name}"
        assert store.backend.store_name == name


def test_keyword_arguments_override_the_query_string():
    url = _store() + "?timeout=2&namespace=a"

    with varsync.connect(url, timeout=5, namespace="b") as store:
        assert store.timeout == 5.0
        assert store.backend.namespace == "b"


def test_the_default_timeout_is_thirty_seconds():
    with varsync.connect(_store()) as store:
        assert store.timeout == 30.0


@pytest.mark.parametrize("query", ["none", "None", "inf", "infinity", "forever"])
def test_a_query_timeout_of_none_means_no_bound(query):
    with varsync.connect(f"{_store()}?timeout={query}") as store:
        assert store.timeout is None
        assert store.backend.timeout is None


@pytest.mark.parametrize("value", [None, math.inf, "none", float("inf")])
def test_a_keyword_timeout_of_none_or_infinity_means_no_bound(value):
    with varsync.connect(f"{_store()}?timeout=2", timeout=value) as store:
        assert store.timeout is None


@pytest.mark.parametrize("value, seconds", [("0.5", 0.5), ("2.5", 2.5), (3, 3.0), (0.25, 0.25)])
def test_a_finite_timeout_becomes_float_seconds(value, seconds):
    with varsync.connect(_store(), timeout=value) as store:
        assert store.timeout == seconds
        assert isinstance(store.timeout, float)


@pytest.mark.parametrize("given", [{"timeout": 0}, {"timeout": 0.0}, {"timeout": "0"}, {}])
def test_a_container_timeout_of_zero_is_refused_at_connect_saying_what_to_pass(given):
    """Issue 36: a container's timeout bounds every request, and none answers in 0 s:
    on Redis every pull of a full table timed out, where memory:// answered. Refused on
    every backend alike, naming what to pass instead (a call's timeout=0 stays)."""
    url = _store() + ("" if given else "?timeout=0")
    with pytest.raises(varsync.ConfigurationError, match="timeout=0") as caught:
        varsync.connect(url, **given)
    assert "positive number of seconds" in str(caught.value)
    assert "pull(timeout=0)" in str(caught.value)


@pytest.mark.parametrize("query", ["-1", "nan", "soon", "", "1s"])
def test_an_invalid_query_timeout_is_a_configuration_error_naming_it(query):
    with pytest.raises(varsync.ConfigurationError, match="timeout") as caught:
        varsync.connect(f"{_store()}?timeout={query}")

    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("value", [-0.5, -math.inf, float("nan"), "soon", True, [1], object()])
def test_an_invalid_keyword_timeout_is_a_configuration_error_naming_it(value):
    with pytest.raises(varsync.ConfigurationError, match="timeout"):
        varsync.connect(_store(), timeout=value)


def test_an_option_repeated_in_the_query_string_is_an_error():
    with pytest.raises(varsync.ConfigurationError, match="'namespace' appears twice"):
        varsync.connect(f"{_store()}?namespace=a&namespace=b")


def test_a_query_field_without_a_value_is_an_error():
    with pytest.raises(varsync.ConfigurationError, match="cannot parse"):
        varsync.connect(f"{_store()}?timeout")


@pytest.mark.parametrize(
    "url", ["memory", "localhost:6379", "memory:/default", "", 42, b"memory://x"]
)
def test_a_url_without_a_scheme_is_an_error_showing_an_example(url):
    with pytest.raises(varsync.ConfigurationError) as caught:
        varsync.connect(url)

    assert "memory://default" in str(caught.value)
    assert "scheme://" in str(caught.value)


@pytest.mark.parametrize(
    "url, options",
    [("{store}?colour=red", {}), ("{store}", {"colour": "red"})],
    ids=["query", "keyword"],
)
def test_an_option_the_backend_does_not_know_is_an_error_naming_it(url, options):
    with pytest.raises(varsync.ConfigurationError, match="colour"):
        varsync.connect(url.format(store=_store()), **options)


def test_a_namespace_that_is_not_a_string_is_an_error():
    with pytest.raises(varsync.ConfigurationError, match="namespace"):
        varsync.connect(_store(), namespace=3)


# -- namespaces ------------------------------------------------------------------------


def test_namespaces_isolate_tables_on_the_same_store():
    url = _store()
    with varsync.connect(f"{url}?namespace=a") as a, varsync.connect(url, namespace="b") as b:
        a.create_table("only_in_a", {"x": np.zeros(2)})

        assert a.tables() == ["only_in_a"]
        assert b.tables() == []
        with pytest.raises(varsync.TableNotFoundError, match="namespace 'b'"):
            b.pull("only_in_a")


def test_each_namespace_can_have_its_own_table_of_the_same_name():
    url = _store()
    with varsync.connect(url, namespace="a") as a, varsync.connect(url, namespace="b") as b:
        a.create_table("variables", {"w": np.zeros((2, 3), np.float32)})
        b.create_table("variables", {"step": np.int64(0)})

        a.push({"w": np.ones((2, 3), np.float32)})

        assert b.version() == 0
        b.push({"step": np.int64(9)})
        b.push({"step": np.int64(10)})
        assert a.version() == 1
        np.testing.assert_array_equal(a.pull()["w"], np.ones((2, 3), np.float32))
        assert b.pull()["step"] == 10
        assert a.signature() != b.signature()


def test_the_default_namespace_is_separate_from_named_ones():
    url = _store()
    with varsync.connect(url) as default, varsync.connect(url, namespace="a") as named:
        default.create_table("variables", {"x": np.zeros(1)})

        assert named.tables() == []
        assert default.backend.namespace == ""


# -- passwords -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:secret@Host.Example/0", "rediss://user:***@Host.Example/0"),
        ("redis://user:secret@[::1]:6379/0", "redis://user:***@[::1]:6379/0"),
        ("redis://user:secret@host:badport/0", "redis://user:***@host:badport/0"),
        ("redis://user:p@ss:secret@host/0", "redis://user:***@host/0"),
    ],
)
def test_redact_hides_the_password_and_keeps_the_rest(url, shown):
    assert redact(url) == shown
    assert "secret" not in redact(url)


@pytest.mark.parametrize(
    "url", ["redis://host:6379/0", "redis://user@host:6379/0", "memory://default"]
)
def test_redact_leaves_a_url_without_password_unchanged(url):
    assert redact(url) == url


def test_repr_of_a_container_never_shows_the_password():
    name = uuid.uuid4().hex
    store = varsync.connect(f"memory://user:secret@{name}", namespace="a")

    open_repr = repr(store)
    store.close()
    closed_repr = repr(store)

    assert "secret" not in open_repr
    assert "secret" not in closed_repr
    assert "***" in open_repr
    assert name in open_repr


def test_errors_about_a_url_never_show_the_password():
    with pytest.raises(varsync.ConfigurationError) as repeated:
        varsync.connect("memory://user:secret@host?namespace=a&namespace=b")
    with varsync.connect(f"memory://user:secret@{uuid.uuid4().hex}") as store:
        with pytest.raises(varsync.TableNotFoundError) as missing:
            store.pull("missing")

    for caught in (repeated, missing):
        assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    "url, options, what",
    [("memory://store\udc80", {}, "the URL"), ("memory://a", {"namespace": "team\ud800"}, "namespace"),
     ("redis://user:s3cret@localhost:6379/0?namespace=\udcff", {}, "the URL")],
)
def test_lone_surrogates_in_urls_and_namespaces_are_configuration_errors(url, options, what):
    with pytest.raises(varsync.ConfigurationError, match=f"{what} .*lone surrogate") as caught:
        varsync.connect(url, **options)
    assert "s3cret" not in str(caught.value)


def test_a_table_name_with_a_lone_surrogate_is_a_configuration_error():
    with varsync.connect("memory://surrogates") as store:
        for call in (lambda: store.create_table("t\udc80", {"x": 1}), lambda: store.pull("\ud800")):
            with pytest.raises(varsync.ConfigurationError, match="table name .*lone surrogate"):
                call()


@pytest.mark.parametrize("url", ["x:///a/b", "x:///a/b?password=secret&k=2", "file:///tmp/store"])
def test_redact_keeps_the_slashes_of_a_url_without_host(url):
    shown = varsync._config.redact(url)
    assert shown.startswith(url.split("://")[0] + ":///") and "secret" not in shown
