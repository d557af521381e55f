"""Prometheus metrics (``connect(url, metrics=...)``, varsync/_metrics.py): off by default
and then not even imported; when on, the backend's calls counted and timed by a proxy
that leaves the core's behaviour unchanged (the conformance suite runs through it)."""

import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import varsync
from varsync._backends.memory import MemoryBackend
from varsync.testing import ConformanceTests

# tox.ini's tf and modern environments install the extra: there a missing one fails.
if os.environ.get("TOX_ENV_NAME") in ("tf", "modern"):
    import prometheus_client
else:
    prometheus_client = pytest.importorskip("prometheus_client")

SIGNATURE = {"w": varsync.Spec((256,), "float32"), "step": varsync.Spec((), "int64")}
NBYTES = 256 * 4 + 8


def values(step):
    return {"w": np.full(256, step, np.float32), "step": step}


def sample(registry, name, url_scheme, table, **labels):
    value = registry.get_sample_value(name, {"backend": url_scheme, "table": table, **labels})
    return 0.0 if value is None else value


@pytest.fixture
def registry():
    return prometheus_client.CollectorRegistry()


def memory_url():
    return f"memory://metrics-{uuid.uuid4().hex}"


# -- off by default ---------------------------------------------------------------------


def test_without_the_option_the_backend_is_not_wrapped():
    with varsync.connect(memory_url()) as store:
        assert type(store.backend) is MemoryBackend
    for off in (False, None, "false", "0"):
        with varsync.connect(memory_url(), metrics=off) as store:
            assert type(store.backend) is MemoryBackend


def test_using_varsync_without_metrics_imports_neither_prometheus_nor_rich():
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import varsync, varsync.cli
        with varsync.connect("memory://isolation") as store:
            store.create_table("t", {"w": np.zeros(2, np.float32)})
            store.push({"w": np.ones(2, np.float32)}, table="t")
            store.pull(table="t")
        loaded = [m for m in ("prometheus_client", "rich", "varsync._metrics") if m in sys.modules]
        assert not loaded, loaded
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_metrics_without_prometheus_client_names_the_extra_to_install():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if not installed
        import varsync
        try:
            varsync.connect("memory://missing", metrics=True)
        except varsync.MissingDependencyError as exc:
            print(exc)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'pip install "varsync[metrics]"' in result.stdout


def test_a_metrics_value_of_the_wrong_kind_is_a_configuration_error():
    with pytest.raises(varsync.ConfigurationError, match="CollectorRegistry"):
        varsync.connect(memory_url(), metrics=42)
    with pytest.raises(varsync.ConfigurationError, match="metrics"):
        varsync.connect(memory_url() + "?metrics=maybe")


# -- the proxy forwards what it does not measure ----------------------------------------


def test_the_metered_backend_shows_the_wrapped_backends_flags_details_and_name(registry):
    url = memory_url()
    with varsync.connect(url, metrics=registry) as store:
        backend = store.backend
        inner = backend.wrapped
        assert type(inner) is MemoryBackend and type(backend) is not MemoryBackend
        assert type(backend).__name__ == "MemoryBackend"  # messages read as unwrapped
        assert isinstance(backend, varsync.backend.Backend)
        for flag in [n for n in dir(MemoryBackend) if n.startswith("supports_")] + [
            "shared_across_processes", "persistent", "max_push_bytes", "supported_ml_dtypes",
            "url", "namespace", "timeout",
        ]:
            assert getattr(backend, flag) == getattr(inner, flag), flag
        store.create_table("t", SIGNATURE)
        assert store.table_info("t").details == backend.wrapped.details("t") | {
            "options": dict(inner.describe_options())
        }
        assert "MemoryBackend" in repr(backend)


def test_the_metered_backend_forwards_the_protocol_to_the_wrapped_one(registry):
    with varsync.connect(memory_url(), metrics=registry) as store:
        store.create_table("t", SIGNATURE)
        backend = store.backend
        assert store.version("t") == 0
        inner = backend.wrapped
        inner.head = lambda name, deadline: varsync.backend.Head(41, "e")  # on the wrapped
        assert store.version("t") == 41  # asked through the metered backend, every time
        assert isinstance(backend, varsync.backend.SupportsLeafVersions)
        assert isinstance(backend, varsync.backend.SupportsReaderRegistry)
        assert isinstance(backend, varsync.backend.SupportsBlockingWait)
        assert isinstance(backend, varsync.backend.SupportsLeafSubsets)
        assert isinstance(backend, varsync.backend.SupportsElementDeltas)


def test_closing_the_container_closes_the_wrapped_backend(registry):
    closed = []
    store = varsync.connect(memory_url(), metrics=registry)
    inner = store.backend.wrapped
    original = inner.close
    inner.close = lambda: (closed.append(True), original())[1]
    store.close()
    assert closed == [True]


# -- what is counted --------------------------------------------------------------------


def exercise(url, registry):
    """Pushes and pulls through a metered reader and writer; the expected counts."""
    with varsync.connect(url, metrics=registry) as writer, varsync.connect(
        url, metrics=registry
    ) as reader:
        writer.create_table("t", SIGNATURE)
        writer.push(values(1), table="t")
        assert reader.pull(table="t")["step"] == 1  # held nothing: no lag observed
        assert reader.pull_if_newer(1, table="t") is None  # nothing newer
        writer.push(values(2), table="t")
        writer.push(values(3), table="t")
        assert reader.pull_if_newer(1, table="t")[1]["step"] == 3  # 2 versions behind
        assert reader.wait_for(2, timeout=5, table="t") == 3


def check_counts(registry, scheme):
    def get(name, **labels):
        return sample(registry, name, scheme, "t", **labels)

    assert get("varsync_pushes_total") == 3
    assert get("varsync_bytes_pushed_total") == 3 * NBYTES
    assert get("varsync_push_seconds_count") == 3
    assert get("varsync_push_seconds_sum") > 0
    assert get("varsync_pulls_total") == 3
    assert get("varsync_pulls_unchanged_total") == 1
    assert get("varsync_bytes_pulled_total") == 2 * NBYTES
    assert get("varsync_pull_seconds_count") == 3
    assert get("varsync_pull_lag_versions_count") == 1
    assert get("varsync_pull_lag_versions_sum") == 2
    assert get("varsync_pull_lag_versions_bucket", le="1.0") == 0
    assert get("varsync_pull_lag_versions_bucket", le="2.0") == 1
    assert get("varsync_wait_seconds_count") == 1
    assert get("varsync_version") == 3
    assert get("varsync_errors_total", operation="push") == 0


def test_pushes_pulls_bytes_latency_and_lag_are_counted_on_memory(registry):
    exercise(memory_url(), registry)
    check_counts(registry, "memory")


def test_pushes_pulls_bytes_latency_and_lag_are_counted_on_a_real_redis_server(
    registry, redis_namespace
):
    exercise(redis_namespace(), registry)
    check_counts(registry, "redis")


def test_only_the_changed_leaves_count_as_bytes_on_a_backend_with_leaf_versions(registry):
    with varsync.connect(memory_url(), metrics=registry) as store:
        assert store.backend.supports_leaf_versions
        store.create_table("t", SIGNATURE)
        store.push(values(1), table="t")
        store.push({"w": np.full(256, 1, np.float32), "step": 2}, table="t")  # w unchanged
        assert sample(registry, "varsync_pushes_total", "memory", "t") == 2
        assert sample(registry, "varsync_bytes_pushed_total", "memory", "t") == NBYTES + 8


def test_a_read_of_chosen_leaves_counts_their_bytes_only(registry):
    with varsync.connect(memory_url(), metrics=registry) as store:
        store.create_table("t", SIGNATURE)
        store.push(values(1), table="t")
        specs = varsync.flatten(SIGNATURE)
        answer = store.backend.read_leaf_subset("t", [0], 0, float("inf"), specs)  # step
        assert int(answer.arrays[0]) == 1 and answer.arrays[1] is None
        assert sample(registry, "varsync_pulls_total", "memory", "t") == 1
        assert sample(registry, "varsync_bytes_pulled_total", "memory", "t") == 8
        with pytest.raises(varsync.ConfigurationError, match="leaf index 2"):
            store.backend.read_leaf_subset("t", [2], 0, float("inf"), specs)
        assert sample(registry, "varsync_errors_total", "memory", "t", operation="pull") == 1


def test_a_push_that_drops_its_version_is_counted_and_leaves_the_version_gauge(registry):
    """The TF-Agents drop-in's pushes (``write_unversioned``): counted and timed as any
    push; the version gauge keeps the last version a call was told."""
    with varsync.connect(memory_url(), metrics=registry) as store:
        store.create_table("t", SIGNATURE)
        store.configure_table("t", skip_unchanged=False)  # whole writes: write_unversioned
        store.push(values(1), table="t")
        store._push_unversioned(values(2), table="t")
        assert store.version("t") == 2
    assert sample(registry, "varsync_pushes_total", "memory", "t") == 2
    assert sample(registry, "varsync_bytes_pushed_total", "memory", "t") == 2 * NBYTES
    assert sample(registry, "varsync_push_seconds_count", "memory", "t") == 2
    assert sample(registry, "varsync_version", "memory", "t") == 1


def test_a_wait_that_times_out_is_timed_and_counted_as_an_error(registry):
    with varsync.connect(memory_url(), metrics=registry) as store:
        store.create_table("t", SIGNATURE)
        store.push(values(1), table="t")
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0.05, table="t")
    assert sample(registry, "varsync_wait_seconds_count", "memory", "t") == 1
    assert sample(registry, "varsync_wait_seconds_sum", "memory", "t") >= 0.05
    assert sample(registry, "varsync_errors_total", "memory", "t", operation="wait") == 1


def test_a_refused_push_is_not_counted(registry):
    with varsync.connect(memory_url(), metrics=registry) as store:
        store.create_table("t", SIGNATURE)
        with pytest.raises(varsync.SignatureMismatchError):
            store.push({"w": np.zeros(3, np.float32), "step": 1}, table="t")
    assert sample(registry, "varsync_pushes_total", "memory", "t") == 0


def test_tables_are_labelled_apart_and_containers_share_one_registrys_metrics(registry):
    url = memory_url()
    with varsync.connect(url, metrics=registry) as a, varsync.connect(
        url, metrics=registry
    ) as b:
        a.create_table("one", SIGNATURE)
        b.create_table("two", SIGNATURE)
        a.push(values(1), table="one")
        b.push(values(1), table="two")
        b.push(values(2), table="two")
    assert sample(registry, "varsync_pushes_total", "memory", "one") == 1
    assert sample(registry, "varsync_pushes_total", "memory", "two") == 2


def test_metrics_true_and_the_url_option_use_the_default_registry():
    table = f"t{uuid.uuid4().hex}"
    default = prometheus_client.REGISTRY
    with varsync.connect(memory_url(), metrics=True) as a, varsync.connect(
        memory_url() + "?metrics=true"
    ) as b:
        for store in (a, b):
            store.create_table(table, SIGNATURE)
            store.push(values(1), table=table)
    assert sample(default, "varsync_pushes_total", "memory", table) == 2


# -- the core behaves as unwrapped: the whole conformance suite through the proxy --------


# (memory:// declares every ability the proxy forwards: leaf versions, the reader registry;
# the Redis counts above show a real server through it.)
class TestMeteredMemoryConformance(ConformanceTests):
    @pytest.fixture
    def url(self):
        # In the URL, not connect_options: the suite's child processes get it too.
        return f"memory://metered-conformance-{uuid.uuid4().hex}?metrics=true"

