"""TensorFlow values: tables from TensorSpecs and variables; pushing tensors and variables
(plain and tf.distribute); update() assigning into variables; import isolation."""

import collections
import subprocess
import sys
import uuid

import numpy as np
import pytest

import varsync
from varsync import SignatureError, SignatureMismatchError, Spec

tf = pytest.importorskip("tensorflow")

Transition = collections.namedtuple("Transition", ["reward", "observation"])

ALLOWED_NAMES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]

STRATEGIES = {
    "plain": None,
    "default-strategy": lambda: tf.distribute.get_strategy(),
    "one-device-cpu": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "mirrored": lambda: tf.distribute.MirroredStrategy(),
}


@pytest.fixture
def store():
    with varsync.connect(f"memory://test-tensorflow-{uuid.uuid4().hex}") as container:
        yield container


@pytest.fixture(params=list(STRATEGIES), ids=list(STRATEGIES))
def make_variable(request):
    """Makes tf.Variables plainly or inside the scope of a tf.distribute strategy."""
    factory = STRATEGIES[request.param]
    strategy = None if factory is None else factory()

    def make(initial):
        if strategy is None:
            return tf.Variable(initial)
        with strategy.scope():
            variable = tf.Variable(initial)
        if request.param == "mirrored":
            assert isinstance(variable, tf.distribute.DistributedValues)
        return variable

    return make


def variables_nest(make_variable):
    return {
        "policy": [
            make_variable(np.zeros((2, 3), np.float32)),
            make_variable(np.zeros((3,), np.float32)),
        ],
        "step": make_variable(np.int64(0)),
        "stats": Transition(reward=make_variable(0.0), observation=make_variable([False, False])),
    }


EXPECTED_SIGNATURE = {
    "policy": [Spec((2, 3), "float32"), Spec((3,), "float32")],
    "stats": Transition(reward=Spec((), "float32"), observation=Spec((2,), "bool")),
    "step": Spec((), "int64"),
}


def new_values(seed):
    return {
        "policy": [
            np.arange(6, dtype=np.float32).reshape(2, 3) + seed,
            np.array([1.5, 2.5, 3.5], np.float32) * seed,
        ],
        "step": np.int64(100 + seed),
        "stats": Transition(reward=np.float32(seed / 4), observation=np.array([True, seed % 2 == 0])),
    }


def assert_nest_values_equal(actual, expected):
    flat_actual, flat_expected = varsync.flatten(actual), varsync.flatten(expected)
    assert len(flat_actual) == len(flat_expected)
    for a, e in zip(flat_actual, flat_expected):
        a = a.numpy() if hasattr(a, "numpy") else a
        assert np.asarray(a).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(a, e)


# ---------------------------------------------------------------------------------------
# tables from TensorFlow specs and variables


def test_create_table_from_tensor_specs_gives_the_numpy_signature(store):
    signature = store.create_table(
        "t",
        {
            "policy": [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([3], tf.float32)],
            "step": tf.TensorSpec([], tf.int64),
            "stats": Transition(tf.TensorSpec((), tf.float32), tf.TensorSpec([2], tf.bool)),
        },
    )
    assert signature == EXPECTED_SIGNATURE
    assert type(signature["stats"]) is Transition


@pytest.mark.parametrize("name", ALLOWED_NAMES)
def test_tensor_spec_of_every_supported_dtype_makes_a_table_that_round_trips(store, name):
    store.create_table("t", {"x": tf.TensorSpec([2], tf.as_dtype(name))})
    assert store.signature("t") == {"x": Spec((2,), name)}
    value = np.array([1, 0]).astype(name)
    store.push({"x": tf.constant(value)}, table="t")
    pulled = store.pull("t")["x"]
    assert pulled.dtype == np.dtype(name)
    np.testing.assert_array_equal(pulled, value)


def test_create_table_from_variables_gives_the_numpy_signature(store, make_variable):
    signature = store.create_table("t", variables_nest(make_variable))
    assert signature == EXPECTED_SIGNATURE


def test_create_table_from_eager_tensors_gives_their_shapes_and_dtypes(store):
    signature = store.create_table("t", {"a": tf.zeros([4, 1], tf.float16), "b": tf.constant(3)})
    assert signature == {"a": Spec((4, 1), "float16"), "b": Spec((), "int32")}


@pytest.mark.parametrize(
    "spec",
    [tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec(None, tf.float32)],
    ids=["unknown-dim", "unknown-rank"],
)
def test_tensor_spec_with_unknown_shape_gives_signature_error_naming_the_path(store, spec):
    with pytest.raises(SignatureError, match=r"\['policy'\]\[1\].*not fully defined"):
        store.create_table("t", {"policy": [tf.TensorSpec([2], tf.float32), spec]})
    assert store.tables() == []


@pytest.mark.parametrize(
    "example",
    [tf.TensorSpec([2], tf.string), tf.constant(["a", "b"]), tf.Variable(["a", "b"]), tf.TensorSpec([2], tf.qint8)],
    ids=["string-spec", "string-tensor", "string-variable", "qint8-spec"],
)
def test_unsupported_tensorflow_dtypes_cannot_make_a_table(store, example):
    with pytest.raises(SignatureError) as raised:
        store.create_table("t", {"x": example})
    message = str(raised.value)
    assert "['x']" in message
    for name in ALLOWED_NAMES:
        assert name in message
    assert store.tables() == []


# ---------------------------------------------------------------------------------------
# pushing TensorFlow values


def test_push_variables_and_eager_tensors_then_pull_gives_their_values(store):
    store.create_table("t", EXPECTED_SIGNATURE)
    expected = new_values(3)
    mixed = {
        "policy": [tf.Variable(expected["policy"][0]), tf.constant(expected["policy"][1])],
        "step": tf.constant(expected["step"]),
        "stats": Transition(
            reward=tf.Variable(expected["stats"].reward),
            observation=tf.constant(expected["stats"].observation),
        ),
    }
    assert store.push(mixed, table="t") == 1
    pulled = store.pull("t")
    assert type(pulled["stats"]) is Transition
    assert_nest_values_equal(pulled, expected)


def test_push_variables_pushes_their_current_values(store, make_variable):
    variables = variables_nest(make_variable)
    store.create_table("t", variables)
    expected = new_values(5)
    for variable, value in zip(varsync.flatten(variables), varsync.flatten(expected)):
        variable.assign(value)
    assert store.push(variables, table="t") == 1
    assert_nest_values_equal(store.pull("t"), expected)


def test_push_accepts_a_list_of_tensors_where_the_signature_has_a_tuple(store):
    store.create_table("t", (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32)))
    store.push([tf.constant([1.0, 2.0]), tf.constant(7)], table="t")
    first, second = store.pull("t")
    np.testing.assert_array_equal(first, [1.0, 2.0])
    assert second == 7


def test_push_of_a_tensor_spec_as_a_value_is_a_mismatch_and_keeps_previous_value(store):
    store.create_table("t", {"w": tf.TensorSpec([2], tf.float32)})
    store.push({"w": tf.constant([1.0, 2.0])}, table="t")
    with pytest.raises(SignatureMismatchError, match=r"\['w'\].*spec, not a value"):
        store.push({"w": tf.TensorSpec([2], tf.float32)}, table="t")
    assert store.version("t") == 1
    np.testing.assert_array_equal(store.pull("t")["w"], [1.0, 2.0])


@pytest.mark.parametrize(
    "value",
    [tf.constant(["a", "b"]), tf.Variable(["a", "b"])],
    ids=["string-tensor", "string-variable"],
)
def test_push_of_a_string_tensor_names_the_path_and_the_string_dtype(store, value):
    store.create_table("t", {"w": tf.TensorSpec([2], tf.float32)})
    with pytest.raises(SignatureMismatchError) as raised:
        store.push({"w": value}, table="t")
    message = str(raised.value)
    assert "['w']" in message and "expected float32 of shape (2,)" in message
    assert "string" in message
    assert store.version("t") == 0


@pytest.mark.parametrize(
    "value, fragment",
    [
        (tf.constant([1.0, 2.0], tf.float64), "float64"),
        (tf.constant([1.0, 2.0, 3.0]), "(3,)"),
        (tf.Variable([1, 2]), "int32"),
    ],
    ids=["wrong-dtype", "wrong-shape", "int-variable"],
)
def test_push_rejects_wrong_tensorflow_dtype_or_shape_and_keeps_previous_value(store, value, fragment):
    store.create_table("t", {"w": tf.TensorSpec([2], tf.float32)})
    store.push({"w": np.array([1.0, 2.0], np.float32)}, table="t")
    with pytest.raises(SignatureMismatchError, match=r"\['w'\]") as raised:
        store.push({"w": value}, table="t")
    assert fragment in str(raised.value)
    assert store.version("t") == 1
    np.testing.assert_array_equal(store.pull("t")["w"], [1.0, 2.0])


# ---------------------------------------------------------------------------------------
# update() into variables


def test_update_assigns_pulled_values_into_variables(store, make_variable):
    store.create_table("t", EXPECTED_SIGNATURE)
    store.push(new_values(1), table="t")
    version = store.push(new_values(2), table="t")
    variables = variables_nest(make_variable)
    assert store.update(variables, table="t") == version
    assert_nest_values_equal(variables, new_values(2))


def test_update_assigns_into_a_mix_of_variables_and_numpy_arrays(store):
    store.create_table("t", {"a": tf.TensorSpec([2], tf.float32), "b": tf.TensorSpec([], tf.int64)})
    store.push({"a": np.array([4.0, 5.0], np.float32), "b": np.int64(9)}, table="t")
    a, b = tf.Variable([0.0, 0.0]), np.zeros((), np.int64)
    store.update({"a": a, "b": b}, table="t")
    np.testing.assert_array_equal(a.numpy(), [4.0, 5.0])
    assert b == 9


@pytest.mark.parametrize(
    "bad_target, fragment",
    [
        (tf.constant([0.0, 0.0]), "cannot be assigned in place"),
        (tf.Variable([0.0, 0.0], dtype=tf.float64), "float64"),
        (tf.Variable([0.0, 0.0, 0.0]), "(3,)"),
    ],
    ids=["eager-tensor", "wrong-dtype-variable", "wrong-shape-variable"],
)
def test_update_rejects_a_bad_target_before_assigning_any_variable(store, bad_target, fragment):
    store.create_table("t", {"a": tf.TensorSpec([2], tf.float32), "b": tf.TensorSpec([2], tf.float32)})
    store.push({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, table="t")
    good = tf.Variable([0.0, 0.0])
    with pytest.raises(SignatureMismatchError, match=r"\['b'\]") as raised:
        store.update({"a": good, "b": bad_target}, table="t")
    assert fragment in str(raised.value)
    np.testing.assert_array_equal(good.numpy(), [0.0, 0.0])


# ---------------------------------------------------------------------------------------
# import isolation


def test_importing_and_using_varsync_imports_no_tensorflow_reverb_or_redis():
    script = "\n".join(
        [
            "import sys",
            "import numpy as np",
            "import varsync",
            "with varsync.connect('memory://isolation') as store:",
            "    store.create_table('t', {'w': np.zeros(2, np.float32), 'step': 0})",
            "    store.push({'w': np.ones(2, np.float32), 'step': 1}, table='t')",
            "    assert store.pull('t')['step'] == 1",
            "loaded = sorted(m for m in ('tensorflow', 'keras', 'reverb', 'redis') if m in sys.modules)",
            "assert not loaded, loaded",
        ]
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr



def test_a_variable_read_for_a_push_is_a_view_that_later_assignments_leave_intact(make_variable):
    # Pushes read variables through views of their buffers, not copies; that is sound
    # only because TensorFlow gives a variable a new buffer when it is assigned while
    # another reference to the old one is alive.
    from varsync._adapters.tensorflow import ADAPTER

    original = np.arange(100_000, dtype=np.float32)
    variable = make_variable(original)
    view = ADAPTER.to_numpy(variable)
    variable.assign_add(tf.ones([100_000]))
    variable.assign(tf.zeros([100_000]))
    np.testing.assert_array_equal(view, original)
    np.testing.assert_array_equal(ADAPTER.to_numpy(variable), np.zeros(100_000, np.float32))
