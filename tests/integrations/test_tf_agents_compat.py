"""varsync.compat.tf_agents.ReverbVariableContainer, tested the way TF-Agents tests its own
class (same server, same nests, same errors), and interop with TF-Agents' real class in
both directions."""

from __future__ import annotations

import numpy as np
import pytest

reverb = pytest.importorskip("reverb")
tf = pytest.importorskip("tensorflow")

import varsync  # noqa: E402
from varsync.compat import tf_agents as compat  # noqa: E402

SIGNATURE = (
    tf.TensorSpec((), tf.int64),
    {"var1": (tf.TensorSpec((2,), tf.float64),), "var2": tf.TensorSpec((2, 1), tf.int32)},
)


def _server(table="variables", max_size=1, signature=SIGNATURE):
    """A server configured exactly as in TF-Agents' reverb_variable_container_test."""
    return reverb.Server(
        tables=[
            reverb.Table(
                name=table,
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                rate_limiter=reverb.rate_limiters.MinSize(1),
                max_size=max_size,
                max_times_sampled=0,
                signature=signature,
            )
        ]
    )


@pytest.fixture
def server():
    server = _server()
    yield server
    server.stop()


@pytest.fixture
def address(server):
    return f"localhost:{server.port}"


def nested_variables(step=0, var1=(1, 1), var2=((2,), (3,)), int_type=tf.int64, seq=tuple):
    return (
        tf.Variable(step, dtype=int_type, shape=()),
        {
            "var1": seq([tf.Variable(list(var1), dtype=tf.float64, shape=(2,))]),
            "var2": tf.Variable([list(r) for r in var2], dtype=tf.int32, shape=(2, 1)),
        },
    )


def zero_variables(int_type=tf.int64, seq=tuple):
    return nested_variables(-1, (0, 0), ((0,), (0,)), int_type=int_type, seq=seq)


def assert_in_server(address):
    client = reverb.Client(address)
    assert client.server_info()["variables"].current_size == 1
    content = next(iter(client.sample("variables", 1)))[0].data
    assert len(content) == 3
    np.testing.assert_array_equal(content[0], np.array(0, np.int64))
    np.testing.assert_allclose(content[1], np.array([1, 1], np.float64))
    np.testing.assert_array_equal(content[2], np.array([[2], [3]], np.int32))


def assert_updated(variables):
    flat = tf.nest.flatten(variables)
    assert flat[0].numpy() == 0 and flat[0].dtype == tf.int64
    np.testing.assert_allclose(flat[1].numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(flat[2].numpy(), [[2], [3]])


# -- the constructor's errors, as in TF-Agents ------------------------------------------


@pytest.mark.parametrize(
    "server_options, error",
    [({"table": "no_variables_table"}, KeyError), ({"signature": None}, TypeError), ({"max_size": 2}, ValueError)],
)
def test_constructor_raises_like_tf_agents(server_options, error):
    bad = _server(**server_options)
    try:
        with pytest.raises(error):
            compat.ReverbVariableContainer(f"localhost:{bad.port}")
    finally:
        bad.stop()


def test_constants_match_tf_agents():
    assert (compat.DEFAULT_TABLE, compat.TRAIN_STEP_KEY, compat.POLICY_KEY) == (
        "variables",
        "train_step",
        "policy_variables",
    )


# -- push / pull / update ----------------------------------------------------------------


@pytest.mark.parametrize("seq", [tuple, list])
def test_push_stores_the_flat_values_in_the_server(address, seq):
    compat.ReverbVariableContainer(address).push(nested_variables(seq=seq))
    assert_in_server(address)


def test_push_returns_none_and_pull_returns_tensors_in_the_signature_structure(address):
    container = compat.ReverbVariableContainer(address)
    assert container.push(nested_variables()) is None
    pulled = container.pull()
    tf.nest.assert_same_structure(pulled, SIGNATURE)
    assert all(isinstance(t, tf.Tensor) for t in tf.nest.flatten(pulled))
    np.testing.assert_array_equal(pulled[1]["var2"].numpy(), [[2], [3]])


def test_push_raises_key_error_on_unknown_table(address):
    with pytest.raises(KeyError):
        compat.ReverbVariableContainer(address).push(tf.Variable(1), "unknown_table")


@pytest.mark.parametrize(
    "values",
    [lambda: tf.Variable(1), lambda: zero_variables(int_type=tf.int32)],
    ids=["structure", "dtype"],
)
def test_push_raises_invalid_argument_on_mismatch_and_stores_nothing(address, values):
    container = compat.ReverbVariableContainer(address)
    with pytest.raises(tf.errors.InvalidArgumentError):
        container.push(values())
    assert reverb.Client(address).server_info()["variables"].current_size == 0


@pytest.mark.parametrize("seq", [tuple, list])
def test_update_assigns_the_pulled_values(address, seq):
    compat.ReverbVariableContainer(address).push(nested_variables())
    variables = zero_variables(seq=seq)
    assert compat.ReverbVariableContainer(address).update(variables) is None
    assert_updated(variables)


def test_update_raises_key_error_on_unknown_table(address):
    with pytest.raises(KeyError):
        compat.ReverbVariableContainer(address).update(tf.Variable(1), "unknown_table")


@pytest.mark.parametrize(
    "variables",
    [lambda: tf.Variable(1), lambda: zero_variables(int_type=tf.int32)],
    ids=["structure", "dtype"],
)
def test_update_raises_value_error_on_mismatch(address, variables):
    container = compat.ReverbVariableContainer(address)
    container.push(nested_variables())
    with pytest.raises(ValueError):
        container.update(variables())


def test_pull_raises_key_error_on_unknown_table(address):
    with pytest.raises(KeyError):
        compat.ReverbVariableContainer(address).pull("unknown_table")


def test_pull_and_update_of_an_empty_table_raise_timeout_after_wait_for_push(address):
    container = compat.ReverbVariableContainer(address, wait_for_push=0.5)
    with pytest.raises(TimeoutError, match="wait_for_push"):
        container.pull()
    with pytest.raises(TimeoutError, match="still empty"):
        container.update(zero_variables())


STRATEGIES = {
    "default": lambda: tf.distribute.get_strategy(),
    "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "mirrored": lambda: tf.distribute.MirroredStrategy(("/cpu:0", "/cpu:1")),
}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_push_and_update_under_distribute_strategy(address, strategy):
    if strategy == "mirrored" and len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("TensorFlow started before two logical CPUs could be configured")
    with STRATEGIES[strategy]().scope():
        variables = nested_variables()
        targets = zero_variables()
    container = compat.ReverbVariableContainer(address)
    container.push(variables)
    assert_in_server(address)
    container.update(targets)
    assert_updated(targets)


# -- interop with TF-Agents' own class ------------------------------------------------


@pytest.fixture
def tf_agents_container():
    module = pytest.importorskip("tf_agents.experimental.distributed.reverb_variable_container")
    return module.ReverbVariableContainer


def test_what_tf_agents_pushes_varsync_pulls(address, tf_agents_container):
    tf_agents_container(address).push(nested_variables(step=7))
    with varsync.connect(f"reverb://{address}", timeout=10) as store:
        version, values = store.pull_if_newer(0)
        assert version == 1
        assert int(values[0]) == 7 and values[0].dtype == np.int64
        np.testing.assert_array_equal(values[1]["var2"], [[2], [3]])
        assert isinstance(values[1]["var1"], tuple)
    pulled = compat.ReverbVariableContainer(address).pull()
    assert int(pulled[0].numpy()) == 7


def test_what_varsync_pushes_tf_agents_pulls_and_updates(address, tf_agents_container):
    with varsync.connect(f"reverb://{address}", timeout=10) as store:
        assert store.push(
            (np.int64(0), {"var1": [np.array([1.0, 1.0])], "var2": np.array([[2], [3]], np.int32)})
        ) == 1
    original = tf_agents_container(address)
    pulled = original.pull()
    np.testing.assert_allclose(pulled[1]["var1"][0].numpy(), [1.0, 1.0])
    variables = zero_variables()
    original.update(variables)
    assert_updated(variables)


def test_versions_count_tf_agents_pushes_too(address, tf_agents_container):
    original = tf_agents_container(address)
    with varsync.connect(f"reverb://{address}", timeout=10) as store:
        original.push(nested_variables(step=1))
        assert store.version() == 1
        assert store.push((2, {"var1": (np.ones(2),), "var2": np.zeros((2, 1), np.int32)})) == 2
        original.push(nested_variables(step=3))
        assert store.wait_for(2, timeout=5) == 3
        assert int(store.pull()[0]) == 3


def test_pulled_tensors_are_independent_of_each_other_and_of_later_pushes():
    # Large pulled arrays become tensors without a copy: each pull's memory must be its own.
    from varsync.reverb_server import serve

    server = serve({"big": {"w": tf.TensorSpec([300, 400], tf.float32)}})
    try:
        container = compat.ReverbVariableContainer(f"localhost:{server.port}", table_names=("big",))
        container.push({"w": tf.fill([300, 400], 1.0)}, "big")
        first = container.pull("big")["w"]
        container.push({"w": tf.fill([300, 400], 2.0)}, "big")
        second = container.pull("big")["w"]
        assert float(tf.reduce_min(first)) == float(tf.reduce_max(first)) == 1.0
        assert float(tf.reduce_min(second)) == float(tf.reduce_max(second)) == 2.0
        assert float(tf.reduce_sum(first + second)) == 3.0 * 300 * 400
    finally:
        server.stop()


# -- waits that distributed programs started in any order rely on ---------------------

VARIABLES = {"train_step": tf.TensorSpec((), tf.int64)}


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _wait_until(condition, timeout=60.0, what="condition"):
    """Poll ``condition`` until true; fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _logged(caplog, text):
    return lambda: any(text in record.getMessage() for record in caplog.records)


class _Call:
    """``fn()`` on a thread: its result or error once joined."""

    def __init__(self, fn):
        import threading

        self.result = self.error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def join(self, timeout=60.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def test_constructor_waits_for_a_server_that_starts_later_logging_its_address(
    caplog, reverb_servers
):
    caplog.set_level("WARNING")
    port = _free_port()
    call = _Call(lambda: compat.ReverbVariableContainer(f"localhost:{port}"))
    _wait_until(_logged(caplog, f"waiting for the Reverb server at localhost:{port}"),
                what="the waiting log line")
    reverb_servers({"variables": VARIABLES}, port=port)
    container = call.join()
    container.push({"train_step": tf.constant(3, tf.int64)})
    assert int(container.pull()["train_step"]) == 3


def test_constructor_with_a_wait_bound_raises_connection_error_naming_the_address():
    port = _free_port()
    with pytest.raises(ConnectionError, match=rf"localhost:{port}.*wait_for_server=0\.3"):
        compat.ReverbVariableContainer(f"localhost:{port}", wait_for_server=0.3)
    with pytest.raises(ConnectionError, match="wait_for_server=<seconds>"):
        compat.ReverbVariableContainer(f"localhost:{port}", wait_for_server=0)


def test_pull_and_update_of_an_empty_table_wait_for_the_first_push(caplog, address):
    caplog.set_level("WARNING")
    reader = compat.ReverbVariableContainer(address)
    pulled = _Call(lambda: reader.pull())
    _wait_until(_logged(caplog, "waiting for a push to the empty table 'variables'"),
                what="the waiting log line")
    variables = zero_variables()
    updated = _Call(lambda: compat.ReverbVariableContainer(address).update(variables))
    compat.ReverbVariableContainer(address).push(nested_variables())
    assert int(pulled.join()[0]) == 0
    updated.join()
    assert_updated(variables)


def test_a_push_landing_just_after_a_read_found_the_table_empty_is_taken(monkeypatch, address):
    """The race a full run hit: the reader's read finds the table empty, a push lands,
    and the reader then sees a value there. That is a wait that ended, not a slow
    transfer: update takes the push instead of raising the empty read's timeout."""
    reader = compat.ReverbVariableContainer(address)
    real_update, pushed = reader.container.update, []

    def update_then_push(*args, **kwargs):
        try:
            return real_update(*args, **kwargs)
        except varsync.PullTimeoutError:
            if not pushed:  # between the empty read and the reader's look at the version
                compat.ReverbVariableContainer(address).push(nested_variables())
                pushed.append(True)
            raise

    monkeypatch.setattr(reader.container, "update", update_then_push)
    variables = zero_variables()
    reader.update(variables)
    assert pushed
    assert_updated(variables)


def test_a_reader_whose_server_restarts_waits_for_it_and_then_for_a_push(
    caplog, reverb_child_server
):
    caplog.set_level("WARNING")
    server = reverb_child_server({"variables": VARIABLES})
    address = f"localhost:{server.port}"
    reader = compat.ReverbVariableContainer(address, timeout=2)
    compat.ReverbVariableContainer(address).push({"train_step": tf.constant(1, tf.int64)})
    assert int(reader.pull()["train_step"]) == 1
    server.stop()
    pulled = _Call(lambda: reader.pull())
    _wait_until(_logged(caplog, f"waiting for the Reverb server at {address}"),
                what="the reader waiting for its server")
    reverb_child_server({"variables": VARIABLES}, port=server.port)
    _wait_until(_logged(caplog, "waiting for a push to the empty table"),
                what="the reader waiting for a push")
    compat.ReverbVariableContainer(address).push({"train_step": tf.constant(7, tf.int64)})
    assert int(pulled.join()["train_step"]) == 7


def test_push_raises_connection_error_while_the_server_is_down_and_works_after_restart(
    reverb_child_server,
):
    server = reverb_child_server({"variables": VARIABLES})
    # A request to a stopped server fails after the timeout (TF-Agents': at once).
    writer = compat.ReverbVariableContainer(f"localhost:{server.port}", timeout=2)
    writer.push({"train_step": tf.constant(1, tf.int64)})
    server.stop()
    with pytest.raises(ConnectionError):
        writer.push({"train_step": tf.constant(2, tf.int64)})
    reverb_child_server({"variables": VARIABLES}, port=server.port)
    writer.push({"train_step": tf.constant(3, tf.int64)})
    # The sample op's gRPC channel may still be in its reconnect backoff, which can
    # outlast a 2 s timeout (docs/reverb.md): one timed-out pull is allowed, not two.
    try:
        pulled = writer.pull()
    except varsync.PullTimeoutError:
        pulled = writer.pull()
    assert int(pulled["train_step"]) == 3


@pytest.mark.parametrize("value", ["soon", -1, "nan"])
def test_a_wait_that_is_not_seconds_or_a_boolean_is_a_configuration_error(address, value):
    with pytest.raises(varsync.ConfigurationError, match="wait_for_push"):
        compat.ReverbVariableContainer(address, wait_for_push=value)
