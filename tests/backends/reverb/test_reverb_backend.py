"""The Reverb backend against real Reverb servers: the conformance suite, TF-Agents-style
table validation, no hangs, the gRPC size limit, restarts and checkpoints."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

reverb = pytest.importorskip("reverb")
tf = pytest.importorskip("tensorflow")

import varsync  # noqa: E402
from varsync._backends.reverb import MAX_PUSH_BYTES  # noqa: E402
from varsync.reverb_server import serve, variables_table  # noqa: E402
from varsync.testing import ConformanceTests, FaultTests  # noqa: E402

SIGNATURE = {"w": np.zeros((3, 2), np.float32), "train_step": np.int64(0)}


def values(number: int) -> dict:
    return {"w": np.full((3, 2), number, np.float32), "train_step": np.int64(number)}


class TestReverbConformance(ConformanceTests):
    """Reverb tables are fixed at server start: each test gets a server with its tables."""

    # Open finding (issue 11, docs/guarantees.md "Soak with faults"): under interrupts, gRPC
    # sometimes opens connections it closes late, up to 10 sockets per 50 interrupted waits
    # and 33 per 132 interrupted pulls in full test runs, not yet explained. Counted, with
    # this larger bound, rather than not at all.
    LEAK_ALLOWANCE = 40
    # gRPC, under Reverb's client, cannot be used across fork: a forked child's first call
    # hangs, and the parent's next one may time out (docs/reverb.md: connect in the child).
    FORK_SAFE = False

    @pytest.fixture
    def server_address(self):
        """None: no proxy tests here. The server runs in this process, so its sockets and
        gRPC's pollers share the descriptor table the leak checks count; the class below
        runs the proxy tests against a server in another process."""
        return lambda url: None

    @pytest.fixture
    def connect_options(self):
        return {"timeout": 20}

    @pytest.fixture
    def url(self, reverb_servers):
        return reverb_servers({"unused": SIGNATURE}).url

    @pytest.fixture
    def servers(self):
        """url -> (server, its tables, when it was asked to start)."""
        return {}

    @pytest.fixture
    def make_tables(self, reverb_servers, servers):
        def make(tables):
            asked = time.monotonic()
            server = reverb_servers(dict(tables))
            servers[server.url] = (server, dict(tables), asked)
            return server.url

        return make

    @pytest.fixture
    def new_history(self, reverb_servers, servers):
        """The server restarted on its port without its data: each table's count starts
        again from 0, under a server run that started later."""

        def restart(url, table):
            server, tables, asked = servers[url]
            # A restart is told by the later start of the new run, which a run that
            # lived a few milliseconds would not show (real servers run far longer).
            time.sleep(max(0.0, asked + 0.05 - time.monotonic()))
            server.stop()
            servers[url] = (reverb_servers(tables, port=server.port), tables, time.monotonic())

        return restart


class TestReverbFaultsOnAServerInAChildProcess(FaultTests):
    """The suite's fault tests again, with each server in a child process, so that the
    SIGSTOP test can pause it (the conformance class's servers run in this process)."""

    LOST_REPLY_CALLS = 25
    # Open finding (issue 11, docs/guarantees.md "Soak with faults"): under interrupts, gRPC
    # sometimes opens connections it closes late, up to 10 sockets per 50 interrupted waits
    # and 33 per 132 interrupted pulls in full test runs, not yet explained. Counted, with
    # this larger bound, rather than not at all.
    LEAK_ALLOWANCE = 40

    @pytest.fixture
    def connect_options(self):
        return {"timeout": 20}

    @pytest.fixture
    def url(self, reverb_child_server):
        return reverb_child_server({"unused": SIGNATURE}).url

    @pytest.fixture
    def children(self):
        return {}

    @pytest.fixture
    def make_tables(self, reverb_child_server, children):
        def make(tables):
            server = reverb_child_server(dict(tables))
            children[server.url] = server.process.pid
            return server.url

        return make

    @pytest.fixture
    def server_pid(self, children):
        return children.__getitem__


def _raw_server(**table_options):
    options = dict(
        name="variables",
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        rate_limiter=reverb.rate_limiters.MinSize(1),
        max_size=1,
        max_times_sampled=0,
        signature=tf.TensorSpec((2,), tf.float32),
    )
    options.update(table_options)
    return reverb.Server([reverb.Table(**options)])


@pytest.mark.parametrize(
    "table_options, error, builtin, hint",
    [
        ({"max_size": 2}, varsync.TableConfigurationError, ValueError, "max_size=2"),
        ({"signature": None}, varsync.MissingSignatureError, TypeError, "no signature"),
        ({"max_times_sampled": 1}, varsync.TableConfigurationError, ValueError, "max_times_sampled=1"),
        (
            {"rate_limiter": reverb.rate_limiters.SampleToInsertRatio(1.0, 1, 2.0)},
            varsync.TableConfigurationError,
            ValueError,
            "rate limiter",
        ),
    ],
)
def test_misconfigured_tables_are_refused_with_how_to_configure_them(
    table_options, error, builtin, hint
):
    server = _raw_server(**table_options)
    try:
        with varsync.connect(f"reverb://localhost:{server.port}", timeout=10) as store:
            with pytest.raises(error) as caught:
                store.pull(timeout=1)
            assert isinstance(caught.value, builtin)
            assert hint in str(caught.value)
            assert "MinSize(1)" in str(caught.value) and f"localhost:{server.port}" in str(caught.value)
    finally:
        server.stop()


def test_missing_table_is_a_key_error_naming_the_tables_there(reverb_servers):
    server = reverb_servers({"other": SIGNATURE})
    with varsync.connect(server.url, timeout=10) as store:
        with pytest.raises(varsync.TableNotFoundError, match="'other'") as caught:
            store.version("variables")
        assert isinstance(caught.value, KeyError)


def test_create_table_explains_that_reverb_tables_are_fixed_at_server_start(reverb_servers):
    server = reverb_servers({"variables": SIGNATURE})
    with varsync.connect(server.url, timeout=10) as store:
        assert varsync.flatten(store.create_table("variables", SIGNATURE)) == varsync.flatten(
            varsync.signature_of(SIGNATURE)
        )
        with pytest.raises(varsync.TableNotFoundError, match="fixed when the server starts"):
            store.create_table("new", SIGNATURE)
        with pytest.raises(varsync.TableExistsError):
            store.create_table("variables", {"w": np.zeros(3)})


def test_connecting_to_a_port_nobody_listens_on_fails_at_once():
    server = _raw_server()
    port = server.port
    server.stop()
    started = time.monotonic()
    with pytest.raises(varsync.BackendConnectionError, match=f"localhost:{port}"):
        varsync.connect(f"reverb://localhost:{port}", timeout=20)
    assert time.monotonic() - started < 5


def test_pull_of_an_empty_table_raises_after_the_timeout_naming_the_server(reverb_servers):
    server = reverb_servers({"variables": SIGNATURE})
    with varsync.connect(server.url, timeout=10) as store:
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError, match=f"localhost:{server.port}"):
            store.pull(timeout=0.5)
        assert time.monotonic() - started < 5
        assert store.version() == 0


def test_calls_to_a_stopped_server_raise_connection_errors_within_the_timeout(reverb_servers):
    server = reverb_servers({"variables": SIGNATURE})
    store = varsync.connect(server.url, timeout=2)
    store.push(values(1))
    server.stop()
    for call in (store.version, lambda: store.push(values(2)), lambda: store.pull_if_newer(0)):
        started = time.monotonic()
        with pytest.raises(varsync.BackendConnectionError, match=f"localhost:{server.port}"):
            call()
        assert time.monotonic() - started < 10
    store.close()


def test_push_over_the_grpc_limit_is_refused_before_sending_and_the_process_lives(reverb_servers):
    # 2.4 GB of zeros: numpy asks the OS for untouched pages, so this costs no memory.
    huge = {"big": varsync.Spec((600_000_000,), "float32")}
    server = reverb_servers({"variables": huge})
    with varsync.connect(server.url, timeout=10) as store:
        with pytest.raises(varsync.ItemTooLargeError) as caught:
            store.push({"big": np.zeros(600_000_000, np.float32)})
        message = str(caught.value)
        assert "2400000000 bytes" in message and str(MAX_PUSH_BYTES) in message
        assert isinstance(caught.value, ValueError)
        assert store.version() == 0  # nothing was stored


def test_a_restarted_server_never_makes_a_reader_accept_an_older_value(reverb_servers):
    first = reverb_servers({"variables": SIGNATURE})
    port = first.port
    writer = varsync.connect(first.url, timeout=5)
    reader = varsync.connect(first.url, timeout=5)
    for number in (1, 2, 3):
        writer.push(values(number))
    held, _ = reader.pull_if_newer(0)
    assert held == 3
    first.stop()
    reverb_servers({"variables": SIGNATURE}, port=port)  # back, empty, on the same port
    assert writer.push(values(40)) == 1  # the writer carries on without reconnecting
    with pytest.raises(varsync.TableResetError, match="version 3"):
        reader.pull_if_newer(held)
    with pytest.raises(varsync.TableResetError):
        reader.wait_for(held, timeout=5)
    version, latest = reader.pull_if_newer(0)
    assert version == 1 and int(latest["train_step"]) == 40
    writer.close()
    reader.close()


def test_a_checkpointed_server_restarted_from_its_checkpoint_serves_the_last_version(
    reverb_servers, tmp_path
):
    first = reverb_servers({"variables": SIGNATURE}, checkpoint_dir=str(tmp_path))
    port = first.port
    with varsync.connect(first.url, timeout=5) as store:
        for number in (1, 2):
            store.push(values(number))
        first.checkpoint()
        first.stop()
        reverb_servers({"variables": SIGNATURE}, port=port, checkpoint_dir=str(tmp_path))
        assert store.version() == 2
        np.testing.assert_array_equal(store.pull()["w"], values(2)["w"])
        assert store.push(values(3)) == 3


def test_containers_in_this_process_use_a_server_in_another_process(reverb_child_server):
    server = reverb_child_server({"variables": SIGNATURE})
    with varsync.connect(server.url, timeout=10) as writer, varsync.connect(
        server.url, timeout=10
    ) as reader:
        assert writer.push(values(5)) == 1
        version, got = reader.pull_if_newer(0)
        assert version == 1 and int(got["train_step"]) == 5
        assert reader.wait_for(0, timeout=5) == 1


def test_namespaces_select_prefixed_server_tables(reverb_servers):
    server = reverb_servers({"team-a/variables": SIGNATURE, "team-b/variables": SIGNATURE})
    with varsync.connect(server.url, namespace="team-a", timeout=10) as a, varsync.connect(
        server.url, namespace="team-b", timeout=10
    ) as b:
        assert a.tables() == ["variables"] and b.tables() == ["variables"]
        a.push(values(1))
        assert a.version() == 1 and b.version() == 0


def test_tensorflow_variables_push_and_update_through_reverb(reverb_servers):
    server = reverb_servers({"variables": {"w": tf.TensorSpec((3, 2), tf.float32), "train_step": tf.TensorSpec((), tf.int64)}})
    with varsync.connect(server.url, timeout=10) as store:
        source = {"w": tf.Variable(tf.fill((3, 2), 7.0)), "train_step": tf.Variable(7, dtype=tf.int64)}
        assert store.push(source) == 1
        target = {"w": tf.Variable(tf.zeros((3, 2))), "train_step": tf.Variable(0, dtype=tf.int64)}
        assert store.update(target) == 1
        np.testing.assert_array_equal(target["w"].numpy(), np.full((3, 2), 7.0, np.float32))
        assert int(target["train_step"].numpy()) == 7


def test_table_info_reports_the_server_table(reverb_servers):
    server = reverb_servers({"variables": SIGNATURE})
    with varsync.connect(server.url, timeout=10) as store:
        store.push(values(1))
        info = store.table_info()
        assert info.version == 1 and info.nbytes == 3 * 2 * 4 + 8
        assert info.details["address"] == f"localhost:{server.port}"
        assert info.details["current_size"] == 1


def test_server_tables_are_configured_like_tf_agents_tables():
    table = variables_table("variables", SIGNATURE)
    info = table.info
    assert info.max_size == 1 and info.max_times_sampled == 0
    assert info.rate_limiter_info.min_size_to_sample == 1
    assert info.sampler_options.uniform and info.remover_options.fifo


def test_serve_refuses_int_dict_keys_reverb_cannot_store():
    with pytest.raises(varsync.SignatureError, match="str keys"):
        serve({"variables": {1: np.zeros(2)}})


def test_ordered_mappings_and_empty_nodes_are_refused_with_what_to_do_instead():
    """A PyTorch state_dict's order or a JAX None cannot live in a tf.nest structure:
    refused by serve and by create_table on a running server, never silently reordered."""
    from varsync._nest import EMPTY, Ordered

    state_dict = Ordered([("layer2.weight", varsync.Spec((2,), np.float32)),
                          ("layer10.weight", varsync.Spec((2,), np.float32))])
    with pytest.raises(varsync.SignatureError, match=r"<root> keeps its own key order.*dict\("):
        serve({"variables": state_dict})
    with pytest.raises(varsync.SignatureError, match=r"\['b'\] is None in a JAX pytree"):
        serve({"variables": {"a": np.zeros(2), "b": EMPTY}})
    with serve({"variables": SIGNATURE}) as server, varsync.connect(
        f"reverb://localhost:{server.port}", timeout=10
    ) as store:
        with pytest.raises(varsync.SignatureError, match="keeps its own key order"):
            store.create_table("variables", {"policy": state_dict})
        assert store.version("variables") == 0


def _sampling_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("varsync-reverb-sample-")]


def _all_exit(threads: list, seconds: float = 10.0) -> bool:
    """Whether every one of ``threads`` ends within ``seconds`` (joined, not polled)."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def test_pulls_reuse_warm_sampling_threads_and_close_stops_them(reverb_servers):
    import threading

    server = reverb_servers({"variables": SIGNATURE})
    assert _all_exit(_sampling_threads())  # none left by earlier tests
    store = varsync.connect(server.url, timeout=20)
    store.push(values(7))
    for _ in range(10):
        assert store.pull()["train_step"] == 7
    assert len(_sampling_threads()) == 1  # one thread served ten pulls in a row

    pulled, start = [], threading.Barrier(4)

    def pull() -> None:
        start.wait()
        pulled.append(int(store.pull()["train_step"]))

    readers = [threading.Thread(target=pull) for _ in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(30)
    assert pulled == [7, 7, 7, 7]
    workers = _sampling_threads()
    assert 1 <= len(workers) <= 4
    store.close()
    assert _all_exit(workers)


def test_a_pull_never_returns_the_sample_a_kept_sampler_took_before_it(reverb_servers):
    """A kept sampler samples one item ahead, right after the pull that used it. A reset
    and a push again replace the item under the same count (the server's counts start
    over): the next pull must get the new item, never the one taken ahead."""
    import reverb

    server = reverb_servers({"variables": SIGNATURE})
    admin = reverb.Client(f"localhost:{server.port}")
    with varsync.connect(server.url, timeout=20) as store:
        assert store.push(values(1)) == 1
        assert store.pull()["train_step"] == 1  # its sampler is kept, one sample ahead
        deadline = time.monotonic() + 10
        while _samples_taken(admin) < 2:  # the pull's and the one taken ahead
            assert time.monotonic() < deadline, "the kept sampler took no sample ahead"
            time.sleep(0.01)
        admin.reset("variables")
        assert store.push(values(2)) == 1  # counted from 1 again
        for _ in range(3):
            assert store.pull()["train_step"] == 2


def test_tables_whose_names_hold_one_another_keep_their_own_versions(reverb_servers):
    """A version check decodes only the infos whose bytes hold the table's name: "v"
    is in every blob here, "v2" in one; each table must still read its own."""
    server = reverb_servers({"v": SIGNATURE, "v2": SIGNATURE, "variables": SIGNATURE})
    with varsync.connect(server.url, timeout=20) as store:
        for _ in range(3):
            store.push(values(2), "v2")
        store.push(values(1), "v")
        assert (store.version("v"), store.version("v2"), store.version("variables")) == (1, 3, 0)
        assert store.pull("v")["train_step"] == 1 and store.pull("v2")["train_step"] == 2


def _samples_taken(admin: Any) -> int:
    return int(admin.server_info()["variables"].rate_limiter_info.sample_stats.completed)


def test_a_sample_that_overruns_its_timeout_is_abandoned_and_never_reused(reverb_servers):
    server = reverb_servers({"variables": SIGNATURE})
    assert _all_exit(_sampling_threads())  # none left by earlier tests
    store = varsync.connect(server.url, timeout=20)
    backend = store._backend
    # Sampling an empty table blocks in Reverb: the situation of a server that restarted
    # empty between the version check and the sample.
    started = time.monotonic()
    with pytest.raises(varsync.PullTimeoutError, match="abandoned"):
        backend._sample(backend._checked_info("variables"), time.monotonic() + 0.3)
    assert time.monotonic() - started < 5
    assert backend._idle_workers == []  # the blocked thread is not handed out again
    abandoned = _sampling_threads()
    assert len(abandoned) == 1
    store.push(values(3))  # the abandoned sample gets this item, and its thread exits
    assert store.pull()["train_step"] == 3
    assert _all_exit(abandoned)
    workers = _sampling_threads()
    assert len(workers) == 1 and workers[0] is not abandoned[0]  # the pull's new worker
    store.close()
    assert _all_exit(workers)


def test_a_server_restarted_on_the_same_port_with_another_signature_serves_new_containers(
    reverb_servers,
):
    # Reverb's sample op checks dtypes against signatures its client cached on first use;
    # a table changed behind the same address must not meet a stale check.
    first = reverb_servers({"variables": SIGNATURE})
    port = first.port
    with varsync.connect(first.url, timeout=10) as store:
        store.push(values(1))
        assert int(store.pull()["train_step"]) == 1
    first.stop()
    changed = {"w": np.zeros((4,), np.float64), "train_step": np.int32(0)}
    second = reverb_servers({"variables": changed}, port=port)
    with varsync.connect(second.url, timeout=10) as store:
        store.push({"w": np.arange(4.0), "train_step": np.int32(9)})
        pulled = store.pull()
        np.testing.assert_array_equal(pulled["w"], np.arange(4.0))
        assert pulled["train_step"].dtype == np.int32 and int(pulled["train_step"]) == 9


def _counting_server_info(store, monkeypatch) -> list:
    """Record each server-info request the store's backend makes (the real requests)."""
    backend = store.backend
    calls: list = []
    real = backend._info_blobs  # where every server-info request is made

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(backend, "_info_blobs", counted)
    return calls


@pytest.mark.parametrize("size", [16, 8_000_000], ids=["pybind-sampler", "tensorflow-op"])
def test_a_pull_of_a_varsync_push_asks_for_the_count_once(reverb_servers, monkeypatch, size):
    """A varsync push labels its item with the version it expects (its priority), so a
    pull that samples it needs no second look at the count; both samplers read it."""
    from varsync._backends.reverb.sampling import PYBIND_MAX_BYTES
    from varsync._backends.reverb.tables import LABEL_FRACTION

    signature = {"w": np.zeros(size // 4, np.float32), "train_step": np.int64(0)}
    assert (size <= PYBIND_MAX_BYTES) == (size == 16)
    server = reverb_servers({"variables": signature})
    with varsync.connect(server.url, timeout=20) as store:
        for step in (1, 2, 3):
            version = store.push({"w": np.full(size // 4, step, np.float32), "train_step": step})
        calls = _counting_server_info(store, monkeypatch)
        got, pulled = store.pull_if_newer(version - 1)
        assert (got, int(pulled["train_step"]), float(pulled["w"][-1])) == (3, 3, 3.0)
        assert len(calls) == 1
        pybind = reverb.Client(f"localhost:{server.port}")
        assert next(pybind.sample("variables"))[0].info.priority == 3 + LABEL_FRACTION


def test_a_push_that_drops_its_version_asks_for_the_count_once(reverb_servers, monkeypatch):
    """The TF-Agents drop-in's push returns no version, so it skips the count read after
    the insert that only numbers a push (one request of two); its item is labelled from
    the count read before, as every push's is, so a pull of it still asks once."""
    from varsync._backends.reverb.tables import LABEL_FRACTION
    from varsync.compat.tf_agents import ReverbVariableContainer

    server = reverb_servers({"variables": SIGNATURE})
    dropin = ReverbVariableContainer(f"localhost:{server.port}", table_names=["variables"])
    with dropin.container, varsync.connect(server.url, timeout=20) as store:
        assert store.push(values(1)) == 1
        numbered = _counting_server_info(store, monkeypatch)
        assert store.push(values(2)) == 2
        assert len(numbered) == 2
        dropped = _counting_server_info(dropin.container, monkeypatch)
        for step in (3, 4):
            assert dropin.push(values(step), "variables") is None
        assert len(dropped) == 2
        reads = _counting_server_info(store, monkeypatch)
        got, pulled = store.pull_if_newer(2)
        assert (got, int(pulled["train_step"])) == (4, 4)
        assert len(reads) == 1
        pybind = reverb.Client(f"localhost:{server.port}")
        assert next(pybind.sample("variables"))[0].info.priority == 4 + LABEL_FRACTION
        assert store.push(values(5)) == 5


def test_a_pull_of_an_unlabelled_item_checks_the_count_again(reverb_servers, monkeypatch):
    """TF-Agents' container pushes with priority 1.0: no label, so the pull reads the
    count before and after its sample, as before labels, and still gets the version."""
    from tf_agents.experimental.distributed.reverb_variable_container import (
        ReverbVariableContainer,
    )

    server = reverb_servers({"variables": SIGNATURE})
    theirs = ReverbVariableContainer(f"localhost:{server.port}", table_names=["variables"])
    with varsync.connect(server.url, timeout=20) as store:
        store.push(values(1))
        for step in (2, 3):
            theirs.push(tf.nest.map_structure(tf.Variable, values(step)), "variables")
        calls = _counting_server_info(store, monkeypatch)
        got, pulled = store.pull_if_newer(1)
        assert (got, int(pulled["train_step"])) == (3, 3)
        assert len(calls) == 2


def test_labels_name_versions_only_with_their_fraction():
    from varsync._backends.reverb.tables import label_of, labelled_version

    assert [labelled_version(label_of(v)) for v in (1, 2, 10**9, 2**50)] == [1, 2, 10**9, 2**50]
    assert [labelled_version(p) for p in (1.0, 0.0, 0.25, 3.5, 3.2500001, -2.75)] == [-1] * 6


def test_version_checks_right_after_a_cut_connection_go_through(reverb_child_server):
    """A cut connection fails the next requests at once ("Socket closed", "Transport
    closed") until gRPC has reconnected: the idempotent server-info request behind every
    version check is asked again within the call's bound, so none of them fails. (With
    no retry the first check fails on "Socket closed". A fresh-clone CI run once saw a
    pull fail twice in a row with one retry; not reproduced here, hence up to 4 tries.)"""
    from varsync.testing.faults import Proxy

    server = reverb_child_server({"variables": SIGNATURE})
    with Proxy("127.0.0.1", int(server.url.rsplit(":", 1)[1])) as proxy:
        writer = varsync.connect(server.url, timeout=20)
        reader = varsync.connect(f"reverb://127.0.0.1:{proxy.port}", timeout=20)
        try:
            for number in range(1, 21):
                writer.push(values(number))
                proxy.drop_connections()
                assert reader.version() == number
                got = reader.pull_if_newer(number - 1, timeout=20)
                assert got is not None and got[0] == number
        finally:
            writer.close()
            reader.close()


# -- server runs as epochs (versions.ServerRuns), on a clock of the test's own -----------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _runs(monkeypatch):
    from varsync._backends.reverb import versions

    clock = _Clock()
    monkeypatch.setattr(versions.time, "monotonic", clock)
    runs = versions.ServerRuns("localhost:1")

    def answer(started: float, asked: float, took: float = 0.0005, settle: bool = True):
        """The epoch of an answer of the run whose worker ``started`` then, asked for at
        ``asked``, arriving ``took`` later, computed by the server half way."""
        from types import SimpleNamespace

        age_ms = int((asked + took / 2 - started) * 1000)  # Reverb reports whole ms
        worker = SimpleNamespace(
            running_ms=age_ms,
            sleeping_ms=0,
            sampling_ms=0,
            inserting_ms=0,
            waiting_for_sampling_ms=0,
            waiting_for_inserts_ms=0,
        )
        clock.now = asked + took
        info = SimpleNamespace(name="variables", table_worker_time=worker)
        return runs.epoch(info, asked, settle=settle)

    return answer


def test_answers_of_one_server_run_share_its_epoch_however_slow_or_late(monkeypatch):
    answer = _runs(monkeypatch)
    first = answer(started=10.0, asked=100.0)
    assert answer(started=10.0, asked=100.5) == first
    assert answer(started=10.0, asked=101.0, took=3.0) == first  # a slow answer
    assert answer(started=10.0, asked=200.0) == first
    assert "localhost:1" in str(first)


def test_a_server_run_that_started_later_is_another_epoch_and_a_late_answer_keeps_its_own(
    monkeypatch,
):
    answer = _runs(monkeypatch)
    old = answer(started=10.0, asked=100.0)
    new = answer(started=100.2, asked=100.3)  # restarted: its worker started 90 s later
    assert new != old
    assert answer(started=100.2, asked=100.4) == new
    # An answer of the old run that arrives now (asked before the restart) is the old
    # run's, not a third one: the runs are facts about the server, not about the caller.
    assert answer(started=10.0, asked=100.1, took=0.25) == old
    assert answer(started=100.2, asked=101.0) == new


def test_a_restart_a_few_milliseconds_later_is_told_apart(monkeypatch):
    answer = _runs(monkeypatch)
    old = answer(started=100.0, asked=100.03)
    assert answer(started=100.04, asked=100.05) != old


def test_an_answer_that_fits_two_runs_is_asked_again_then_taken_for_the_later(monkeypatch):
    answer = _runs(monkeypatch)
    old = answer(started=100.0, asked=100.3)
    new = answer(started=100.5, asked=100.6)
    # Asked at 100.45 (old run, age 0.45) and arriving 1 s later: it fits both runs.
    assert answer(started=100.0, asked=100.45, took=1.0, settle=False) is None
    assert answer(started=100.0, asked=100.45, took=1.0) == new
    assert answer(started=100.0, asked=100.49) == old


def test_clocks_drifting_apart_over_a_long_run_keep_one_epoch(monkeypatch):
    """The server's clock runs 100 ppm slow against the client's: over a day its worker's
    start seems to move by 8.6 s, by a millisecond between two looks 10 s apart."""
    answer = _runs(monkeypatch)
    first = answer(started=0.0, asked=10.0)
    for look in range(2, 8641):
        asked = look * 10.0
        assert answer(started=asked * 1e-4, asked=asked) == first, asked
