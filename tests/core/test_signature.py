"""Specs and signatures: construction, examples, JSON form, and the checks made before
any write or in-place update."""

import collections
import collections.abc
import json
import pickle
import sys
import uuid

import numpy as np
import pytest

import varsync
from varsync import _signature as sig
from varsync._errors import CorruptDataError, SignatureError, SignatureMismatchError
from varsync._signature import Spec

Transition = collections.namedtuple("Transition", ["reward", "observation"])

ALLOWED_NAMES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]


def assert_same_signature(actual, expected):
    """Equal specs and identical container types (list vs tuple, namedtuple class)."""
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, collections.abc.Mapping):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_signature(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_signature(a, e)
    else:
        assert actual == expected


# ---------------------------------------------------------------------------------------
# Spec


def test_spec_normalises_shape_to_ints_and_dtype_to_native_numpy():
    spec = Spec([2, np.int64(3)], ">f4")
    assert spec.shape == (2, 3) and all(type(d) is int for d in spec.shape)
    assert spec.dtype == np.dtype(np.float32) and spec.dtype.isnative
    assert spec == Spec((2, 3), np.float32)
    assert hash(spec) == hash(Spec((2, 3), "float32"))
    assert spec.size == 6 and spec.nbytes == 24


@pytest.mark.parametrize("name", ALLOWED_NAMES)
def test_spec_accepts_every_supported_dtype(name):
    assert Spec((1,), name).dtype == np.dtype(name)


@pytest.mark.parametrize(
    "shape",
    [None, 3, (None, 3), (-1,), (2.5,), ("a",), (float("nan"),), (float("inf"),)],
    ids=["None", "scalar", "None-dim", "negative", "fractional", "str-dim", "nan", "inf"],
)
def test_spec_rejects_shapes_that_are_not_fully_defined(shape):
    with pytest.raises(SignatureError, match="not fully defined"):
        Spec(shape, np.float32)


@pytest.mark.parametrize(
    "dtype",
    [object, str, bytes, "datetime64[ns]", "timedelta64[s]", [("a", "f4")], "no-such-dtype"],
    ids=["object", "str", "bytes", "datetime", "timedelta", "structured", "unknown"],
)
def test_spec_rejects_unsupported_dtypes_naming_the_allowed_ones(dtype):
    with pytest.raises(SignatureError) as raised:
        Spec((2,), dtype)
    assert isinstance(raised.value, ValueError)
    for name in ALLOWED_NAMES:
        assert name in str(raised.value)


# ---------------------------------------------------------------------------------------
# signature_of


@pytest.mark.parametrize(
    "example, dtype",
    [(True, "bool"), (3, "int64"), (2.5, "float64"), (1 + 2j, "complex128")],
)
def test_signature_of_python_scalars_uses_numpys_default_dtypes(example, dtype):
    assert sig.signature_of(example) == Spec((), dtype)


@pytest.mark.parametrize(
    "example, expected",
    [
        (np.float32(1), Spec((), "float32")),
        (np.uint16(1), Spec((), "uint16")),
        (np.bool_(False), Spec((), "bool")),
        (np.zeros((2, 3), np.int8), Spec((2, 3), "int8")),
        (np.zeros((0, 4), np.complex64), Spec((0, 4), "complex64")),
        (np.zeros((3,), ">f8"), Spec((3,), "float64")),
        (np.zeros((2,), ">i4"), Spec((2,), "int32")),
    ],
    ids=["f32-scalar", "u16-scalar", "bool-scalar", "i8-array", "empty-array", "big-f8", "big-i4"],
)
def test_signature_of_numpy_values_takes_their_shape_and_native_dtype(example, expected):
    spec = sig.signature_of(example)
    assert spec == expected and spec.dtype.isnative


def test_signature_of_passes_specs_through_and_keeps_structure():
    spec = Spec((4,), "float32")
    example = collections.OrderedDict(
        [("z", [spec, (np.zeros(2), 1)]), ("a", Transition(reward=0.5, observation=spec))]
    )
    signature = sig.signature_of(example)
    assert type(signature) is dict and list(signature) == ["a", "z"]
    assert signature["z"][0] is spec
    assert_same_signature(
        signature,
        {
            "a": Transition(reward=Spec((), "float64"), observation=spec),
            "z": [spec, (Spec((2,), "float64"), Spec((), "int64"))],
        },
    )


@pytest.mark.parametrize(
    "example, path",
    [
        ({"a": [1, None]}, "['a'][1]"),
        ({"a": {"name": "text"}}, "['a']['name']"),
        ({"a": np.array(["x", "y"])}, "['a']"),
        ({"a": np.array([object(), 1])}, "['a']"),
        ({"a": (2**70,)}, "['a'][0]"),
        ({"a": np.array(["2020-01-01"], dtype="datetime64[D]")}, "['a']"),
    ],
    ids=["None", "str", "str-array", "object-array", "too-big-int", "datetime"],
)
def test_signature_of_rejects_non_numeric_leaves_naming_their_path(example, path):
    with pytest.raises(SignatureError) as raised:
        sig.signature_of(example)
    assert path in str(raised.value)


@pytest.mark.parametrize(
    "example",
    [{1: 0, "a": 0}, {1.5: 0}, {(1, 2): 0}, {True: 0}],
    ids=["mixed-unsortable", "float-key", "tuple-key", "bool-key"],
)
def test_signature_of_rejects_keys_that_cannot_be_stored(example):
    with pytest.raises(SignatureError):
        sig.signature_of({"outer": example})


def test_signature_of_accepts_int_keys_and_sorts_them():
    signature = sig.signature_of({10: 1.0, 2: 1.0})
    assert list(signature) == [2, 10]


# ---------------------------------------------------------------------------------------
# JSON form


def _rich_signature():
    return {  # keys in sorted order, as every signature varsync builds has them
        "by_index": {0: Spec((2, 2), "complex64"), 7: Spec((0,), "bool")},
        "dtypes": tuple(Spec((1,), name) for name in ALLOWED_NAMES),
        "empty": {},
        "policy": [Spec((64, 32), "float32"), Spec((32,), "float32")],
        "scalar": Spec((), "uint64"),
        "state": (Spec((), "int64"), Transition(reward=Spec((), "float64"), observation=[])),
    }


def test_json_round_trip_keeps_specs_container_types_and_int_keys():
    signature = _rich_signature()
    text = sig.to_json(signature)
    assert_same_signature(sig.from_json(text), signature)


def test_json_round_trip_of_a_hand_made_signature_sorts_its_keys():
    signature = {"z": Spec((), "int8"), "a": {"y": Spec((1,), "bool"), "b": Spec((), "int8")}}
    rebuilt = sig.from_json(sig.to_json(signature))
    assert list(rebuilt) == ["a", "z"] and list(rebuilt["a"]) == ["b", "y"]
    assert sig.same_structure(rebuilt, signature)


def test_json_form_is_plain_versioned_json():
    document = json.loads(sig.to_json(_rich_signature()))
    assert document["format"] == "varsync.signature"
    assert document["version"] == 1

    def plain(node):
        if isinstance(node, dict):
            return all(isinstance(k, str) and plain(v) for k, v in node.items())
        if isinstance(node, list):
            return all(plain(v) for v in node)
        return isinstance(node, (str, int, float, bool)) or node is None

    assert plain(document)


def test_json_round_trip_returns_the_users_namedtuple_class_from_an_imported_module():
    rebuilt = sig.from_json(sig.to_json({"t": Transition(Spec((), "float32"), Spec((2,), "int8"))}))
    assert type(rebuilt["t"]) is Transition
    assert rebuilt["t"].observation == Spec((2,), "int8")


def test_json_round_trip_of_an_unreachable_namedtuple_makes_one_class_with_its_fields():
    Local = collections.namedtuple("Local", ["b", "a"])  # not an attribute of any module
    text = sig.to_json(Local(Spec((), "int8"), Spec((), "int16")))
    first, second = sig.from_json(text), sig.from_json(text)
    assert type(first) is not Local
    assert type(first).__name__ == "Local" and type(first)._fields == ("b", "a")
    assert type(first) is type(second)
    assert first == (Spec((), "int8"), Spec((), "int16"))


def test_from_json_never_imports_the_module_a_namedtuple_names():
    module = "tabnanny"  # a stdlib module nothing here imports
    assert module not in sys.modules
    text = json.dumps(
        {
            "format": "varsync.signature",
            "version": 1,
            "structure": {
                "namedtuple": {
                    "name": "NannyNag",
                    "module": module,
                    "fields": ["x"],
                    "values": [{"spec": {"shape": [], "dtype": "int8"}}],
                }
            },
        }
    )
    rebuilt = sig.from_json(text)
    assert module not in sys.modules
    assert type(rebuilt).__name__ == "NannyNag" and rebuilt.x == Spec((), "int8")


def test_from_json_refuses_a_pickled_signature():
    with pytest.raises(CorruptDataError):
        sig.from_json(pickle.dumps(_rich_signature()))


def _document(structure, version=1, fmt="varsync.signature"):
    return json.dumps({"format": fmt, "version": version, "structure": structure})


SPEC_NODE = {"spec": {"shape": [2], "dtype": "float32"}}


@pytest.mark.parametrize("version", [3, 0, "1", "2", None, True])
def test_from_json_rejects_unknown_format_versions(version):
    with pytest.raises(CorruptDataError, match="version"):
        sig.from_json(_document(SPEC_NODE, version=version))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json at all",
        "{",
        "[" * 100_000,
        "null",
        "[]",
        '{"format": "something.else", "version": 1}',
        _document(SPEC_NODE, fmt="tfagents"),
        _document({"pickle": "gASVCAAAAAAAAAB9lC4="}),
        _document({"spec": {"shape": [-1], "dtype": "float32"}}),
        _document({"spec": {"shape": [2], "dtype": "object"}}),
        _document({"spec": {"shape": [2]}}),
        _document({"spec": SPEC_NODE["spec"], "list": []}),
        _document({"dict": [[True, SPEC_NODE]]}),
        _document({"dict": [["a"]]}),
        _document({"list": 5}),
        _document({"namedtuple": {"name": "1bad", "fields": ["x"], "values": [SPEC_NODE]}}),
        _document({"namedtuple": {"name": "T", "fields": ["x", "y"], "values": [SPEC_NODE]}}),
        _document(["not", "a", "node"]),
    ],
    ids=[
        "empty", "text", "truncated", "deeply-nested", "null", "array", "other-format",
        "tfagents-format", "pickle-node", "negative-dim", "object-dtype", "no-dtype",
        "two-kinds", "bool-key", "short-pair", "list-not-array", "bad-name", "short-fields",
        "node-not-object",
    ],
)
def test_from_json_rejects_garbage_with_corrupt_data_error(text):
    with pytest.raises(CorruptDataError):
        sig.from_json(text)


# ---------------------------------------------------------------------------------------
# same_structure


def test_same_structure_ignores_list_versus_tuple_and_mapping_order():
    a = {"b": [Spec((2,), "int8")], "a": (Spec((), "bool"),)}
    b = collections.OrderedDict([("a", [Spec((), "bool")]), ("b", (Spec((2,), "int8"),))])
    assert sig.same_structure(a, b)


@pytest.mark.parametrize(
    "other",
    [
        {"w": [Spec((2,), "int16")]},
        {"w": [Spec((3,), "int8")]},
        {"w": [Spec((2,), "int8"), Spec((2,), "int8")]},
        {"v": [Spec((2,), "int8")]},
        {"w": Spec((2,), "int8")},
    ],
    ids=["dtype", "shape", "length", "key", "nesting"],
)
def test_same_structure_compares_keys_dtypes_and_shapes_exactly(other):
    assert not sig.same_structure({"w": [Spec((2,), "int8")]}, other)


# ---------------------------------------------------------------------------------------
# flatten_values: checks before a push

SIGNATURE = {
    "optimizer": {"lr": Spec((), "float32"), "momentum": Spec((), "float32")},
    "policy": [
        Spec((2,), "float32"),
        Spec((2,), "float32"),
        Spec((2,), "float32"),
        Spec((2, 3), "float32"),
        Spec((), "int8"),
    ],
    "state": (Spec((), "int64"), Spec((2,), "float64")),
}


def good_values():
    return {
        "optimizer": {"lr": np.float32(0.1), "momentum": np.float32(0.9)},
        "policy": [
            np.zeros(2, np.float32),
            np.ones(2, np.float32),
            np.full(2, 2, np.float32),
            np.arange(6, dtype=np.float32).reshape(2, 3),
            np.int8(-3),
        ],
        "state": (7, np.array([0.5, 1.5])),
    }


def with_policy(index, value):
    values = good_values()
    values["policy"][index] = value
    return values


def without(key, inside=None):
    values = good_values()
    del (values[inside] if inside else values)[key]
    return values


MISMATCHES = [
    # (values, path of the first difference, fragments of expected and got)
    (without("state"), "<root>", ["'optimizer', 'policy', 'state'", "missing ['state']"]),
    (without("momentum", inside="optimizer"), "['optimizer']", ["'lr', 'momentum'", "missing ['momentum']"]),
    ({**good_values(), "extra": 1}, "<root>", ["'optimizer', 'policy', 'state'", "unexpected ['extra']"]),
    (with_policy(3, np.zeros((2, 3), np.float64)), "['policy'][3]", ["float32 of shape (2, 3)", "float64"]),
    (with_policy(3, np.zeros((3, 2), np.float32)), "['policy'][3]", ["float32 of shape (2, 3)", "(3, 2)"]),
    (with_policy(3, [[0.0] * 3] * 2), "['policy'][3]", ["float32 of shape (2, 3)", "list"]),
    (with_policy(3, np.full((2, 3), None)), "['policy'][3]", ["float32 of shape (2, 3)", "object"]),
    (with_policy(1, "0.0"), "['policy'][1]", ["float32 of shape (2,)", "str"]),
    (with_policy(1, np.array(["a", "b"])), "['policy'][1]", ["float32 of shape (2,)", "<U1"]),
    (with_policy(1, None), "['policy'][1]", ["float32 of shape (2,)", "None"]),
    (with_policy(4, 1.0), "['policy'][4]", ["int8 of shape ()", "float 1.0"]),
    (with_policy(4, 300), "['policy'][4]", ["int8 of shape ()", "300"]),
    (with_policy(4, -129), "['policy'][4]", ["int8 of shape ()", "-129"]),
    (with_policy(4, True), "['policy'][4]", ["int8 of shape ()", "bool True"]),
    (with_policy(4, np.int16(1)), "['policy'][4]", ["int8 of shape ()", "int16"]),
    (with_policy(0, 1.0), "['policy'][0]", ["float32 of shape (2,)", "Python float"]),
    ({**good_values(), "policy": good_values()["policy"][:4]}, "['policy']", ["5 items", "4 items"]),
    ({**good_values(), "policy": np.zeros(5)}, "['policy']", ["5 items", "array"]),
    ({**good_values(), "optimizer": [0.1, 0.9]}, "['optimizer']", ["'lr', 'momentum'", "list"]),
    ({**good_values(), "state": (7, {"x": 1.0})}, "['state'][1]", ["float64 of shape (2,)", "dict"]),
    ({**good_values(), "optimizer": {"lr": 1e300, "momentum": np.float32(0)}}, "['optimizer']['lr']", ["float32", "1e+300"]),
    ([1, 2], "<root>", ["'optimizer', 'policy', 'state'", "list"]),
]


@pytest.mark.parametrize(
    "values, path, fragments",
    MISMATCHES,
    ids=[
        "missing-key", "missing-nested-key", "extra-key", "wrong-dtype", "wrong-shape",
        "list-for-array", "object-array", "str", "str-array", "None", "float-into-int",
        "above-int8", "below-int8", "bool-into-int", "numpy-int16-into-int8",
        "scalar-for-array", "short-list", "array-for-list", "list-for-dict", "dict-for-array",
        "float-overflows-float32", "list-for-root-dict",
    ],
)
def test_flatten_values_names_the_path_expected_and_got_of_a_mismatch(values, path, fragments):
    with pytest.raises(SignatureMismatchError) as raised:
        sig.flatten_values(SIGNATURE, values)
    assert isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert f" {path}" in message
    assert "expected" in message and "got" in message
    for fragment in fragments:
        assert fragment in message


def test_flatten_values_reports_the_first_difference_in_flatten_order():
    values = good_values()
    values["policy"][1] = np.zeros(2, np.float64)
    values["state"] = (7, None)
    with pytest.raises(SignatureMismatchError) as raised:
        sig.flatten_values(SIGNATURE, values)
    assert "['policy'][1]" in str(raised.value) and "['state']" not in str(raised.value)


def test_flatten_values_returns_leaves_in_signature_order_with_exact_dtypes():
    values = good_values()
    arrays = sig.flatten_values(SIGNATURE, values)
    specs = sig.flat_specs(SIGNATURE)
    assert len(arrays) == len(specs) == 9
    for array, spec in zip(arrays, specs):
        assert isinstance(array, np.ndarray)
        assert array.dtype == spec.dtype and array.shape == spec.shape
    assert arrays[0] == np.float32(0.1) and arrays[1] == np.float32(0.9)  # lr, momentum
    assert arrays[7] == 7 and arrays[7].dtype == np.int64  # a Python int takes the spec's dtype


def test_flatten_values_accepts_a_list_where_the_signature_has_a_tuple_and_vice_versa():
    values = good_values()
    values["state"] = list(values["state"])
    values["policy"] = tuple(values["policy"])
    assert len(sig.flatten_values(SIGNATURE, values)) == 9


@pytest.mark.parametrize(
    "dtype, value",
    [("float32", 3), ("float64", 3), ("uint8", 255), ("int64", -(2**63)), ("complex64", 2.5), ("bool", False)],
)
def test_python_scalars_take_the_dtype_of_a_table_that_holds_them(dtype, value):
    (array,) = sig.flatten_values([Spec((), dtype)], [value])
    assert array.dtype == np.dtype(dtype) and array == value


@pytest.mark.parametrize(
    "dtype, value",
    [("float16", 100_000), ("float32", 1e300), ("float64", 10**400), ("complex64", 1e300 + 0j)],
)
def test_python_scalars_too_large_for_the_table_are_a_mismatch_not_inf(dtype, value):
    with pytest.raises(SignatureMismatchError, match=f"expected {dtype} of shape"):
        sig.flatten_values({"x": Spec((), dtype)}, {"x": value})


def test_big_endian_and_non_contiguous_values_come_back_native_and_c_contiguous():
    signature = [Spec((3, 2), "float32"), Spec((4,), "int32")]
    big_endian = np.arange(6, dtype=">f4").reshape(3, 2)
    strided = np.arange(8, dtype=np.int32)[::2]
    transposed_big = np.arange(6, dtype=">f4").reshape(2, 3).T
    for first in (big_endian, transposed_big):
        out = sig.flatten_values(signature, [first, strided])
        for got, given in zip(out, [first, strided]):
            assert got.dtype.isnative and got.flags.c_contiguous
            assert got.dtype == np.dtype(given.dtype.name)
            np.testing.assert_array_equal(got, given)


def test_flatten_values_follows_sorted_key_order_for_a_hand_made_signature():
    signature = {"w": Spec((2,), "float32"), "b": Spec((), "int8")}
    w, b = np.ones(2, np.float32), np.int8(3)
    arrays = sig.flatten_values(signature, {"w": w, "b": b})
    assert [a.dtype.name for a in arrays] == ["int8", "float32"]
    assert [s.dtype.name for s in sig.flat_specs(signature)] == ["int8", "float32"]


def test_already_conforming_arrays_are_not_copied():
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    step = np.array(4, np.int64)
    out = sig.flatten_values({"w": Spec((2, 3), "float32"), "step": Spec((), "int64")}, {"w": weights, "step": step})
    assert np.shares_memory(out[0], step) and np.shares_memory(out[1], weights)


# ---------------------------------------------------------------------------------------
# flatten_targets and assign: in-place updates


def test_flatten_targets_returns_writable_arrays_in_order_and_assign_fills_them():
    signature = {"b": Spec((2,), "float32"), "a": Spec((), "int64")}
    a, b = np.zeros((), np.int64), np.zeros(2, np.float32)
    targets = sig.flatten_targets(signature, {"b": b, "a": a})
    assert targets[0] is a and targets[1] is b
    sig.assign(targets[0], np.array(5, np.int64))
    sig.assign(targets[1], np.array([1.5, 2.5], np.float32))
    assert a == 5
    np.testing.assert_array_equal(b, [1.5, 2.5])


def test_assign_into_a_big_endian_target_keeps_the_values():
    target = np.zeros(3, ">f8")
    (checked,) = sig.flatten_targets([Spec((3,), "float64")], [target])
    sig.assign(checked, np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(target, [1.0, 2.0, 3.0])


def _read_only(shape, dtype):
    array = np.zeros(shape, dtype)
    array.flags.writeable = False
    return array


@pytest.mark.parametrize(
    "target, fragment",
    [
        (_read_only(2, np.float32), "read-only"),
        (np.zeros(2, np.float64), "float64"),
        (np.zeros(3, np.float32), "(3,)"),
        ([0.0, 0.0], "list"),
        ((0.0, 0.0), "tuple"),
        (1.0, "cannot be assigned in place"),
        (None, "cannot be assigned in place"),
    ],
    ids=["read-only", "wrong-dtype", "wrong-shape", "list", "tuple", "python-float", "None"],
)
def test_flatten_targets_rejects_what_cannot_receive_a_value_in_place(target, fragment):
    with pytest.raises(SignatureMismatchError) as raised:
        sig.flatten_targets({"w": [Spec((), "int8"), Spec((2,), "float32")]}, {"w": [np.zeros((), np.int8), target]})
    assert "['w'][1]" in str(raised.value) and fragment in str(raised.value)


@pytest.fixture
def store():
    with varsync.connect(f"memory://test-signature-{uuid.uuid4().hex}") as container:
        yield container


@pytest.mark.parametrize(
    "bad_target",
    [_read_only(2, np.float32), np.zeros(2, np.float64)],
    ids=["read-only", "wrong-dtype"],
)
def test_update_rejects_a_bad_target_before_assigning_any(store, bad_target):
    store.create_table("t", {"a": Spec((2,), "float32"), "b": Spec((2,), "float32")})
    store.push({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, table="t")
    good = np.zeros(2, np.float32)
    with pytest.raises(SignatureMismatchError, match=r"\['b'\]"):
        store.update({"a": good, "b": bad_target}, table="t")
    np.testing.assert_array_equal(good, [0.0, 0.0])


def test_push_rejects_wrong_dtype_and_keeps_previous_value(store):
    store.create_table("t", {"w": Spec((2,), "float32")})
    assert store.push({"w": np.array([1.0, 2.0], np.float32)}, table="t") == 1
    with pytest.raises(SignatureMismatchError, match=r"\['w'\]"):
        store.push({"w": np.array([3.0, 4.0], np.float64)}, table="t")
    assert store.version("t") == 1
    np.testing.assert_array_equal(store.pull("t")["w"], [1.0, 2.0])


@pytest.mark.parametrize(
    "dtype, value, becomes",
    [("float32", 16777217, 16777216.0), ("float16", 2049, 2048.0), ("float64", 2**53 + 1, 2.0**53),
     ("complex64", 16777217, 16777216.0)],
)
def test_a_python_int_a_float_leaf_cannot_hold_exactly_is_refused_not_rounded(dtype, value, becomes):
    signature = {"x": Spec((), dtype)}
    with pytest.raises(SignatureMismatchError, match=rf"{value}.*cannot hold exactly.*{becomes!r}"):
        sig.flatten_values(signature, {"x": value})
    (held,) = sig.flatten_values(signature, {"x": value - 1})  # exactly representable: accepted
    assert int(held.real) == value - 1
