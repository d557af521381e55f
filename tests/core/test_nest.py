"""Nests: flatten and rebuild them in exactly tf.nest's order, without TensorFlow."""

import collections
import collections.abc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from varsync import _nest as nest

Pair = collections.namedtuple("Pair", ["first", "second"])
# Fields deliberately out of alphabetical order: namedtuples flatten in field order.
Step = collections.namedtuple("Step", ["reward", "observation", "action"])
Box = collections.namedtuple("Box", ["content"])


def assert_same_nest(actual, expected, same_leaf=lambda a, b: a is b):
    """Same container types, same mapping key order, and leaves that satisfy same_leaf."""
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, collections.abc.Mapping):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_nest(actual[key], expected[key], same_leaf)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_nest(a, e, same_leaf)
    else:
        assert same_leaf(actual, expected), (actual, expected)


# ---------------------------------------------------------------------------------------
# flatten order


def test_flatten_takes_dict_values_in_sorted_key_order():
    assert nest.flatten({"b": 1, "c": 2, "a": 0}) == [0, 1, 2]


def test_flatten_sorts_ordered_dict_keys_too():
    ordered = collections.OrderedDict([("z", 1), ("a", 2), ("m", 3)])
    assert nest.flatten(ordered) == [2, 3, 1]


def test_flatten_sorts_int_keys_numerically():
    assert nest.flatten({10: "ten", 2: "two", 1: "one"}) == ["one", "two", "ten"]


def test_flatten_keeps_list_tuple_and_namedtuple_field_order():
    value = [3, (2, 1), Step(reward=10, observation=20, action=30)]
    assert nest.flatten(value) == [3, 2, 1, 10, 20, 30]


def test_flatten_descends_depth_first():
    value = {"a": [1, {"y": 3, "x": 2}], "b": (4, [5, [6]])}
    assert nest.flatten(value) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("container", [[], (), {}, collections.OrderedDict(), [[], {}, ()]])
def test_empty_containers_have_no_leaves_and_rebuild_as_themselves(container):
    assert nest.flatten(container) == []
    assert_same_nest(nest.unflatten(container, []), container)


@pytest.mark.parametrize(
    "leaf",
    ["a string", b"bytes", None, 7, 2.5, np.float32(1.0), np.arange(6).reshape(2, 3), {1, 2}],
    ids=["str", "bytes", "None", "int", "float", "np-scalar", "np-array", "set"],
)
def test_strings_none_scalars_arrays_and_sets_are_leaves(leaf):
    assert nest.is_nested(leaf) is False
    flat = nest.flatten(leaf)
    assert len(flat) == 1 and flat[0] is leaf
    flat_in_list = nest.flatten([leaf, {"k": leaf}])
    assert len(flat_in_list) == 2 and all(x is leaf for x in flat_in_list)


def test_a_bare_leaf_rebuilds_as_the_single_new_leaf():
    replacement = object()
    assert nest.unflatten(np.zeros(3), [replacement]) is replacement


# ---------------------------------------------------------------------------------------
# unflatten


def test_unflatten_fills_dict_values_in_sorted_key_order():
    rebuilt = nest.unflatten({"b": None, "a": None}, [1, 2])
    assert rebuilt == {"a": 1, "b": 2}


def test_unflatten_of_ordered_dict_keeps_the_instances_own_key_order():
    ordered = collections.OrderedDict([("z", None), ("a", None), ("m", None)])
    rebuilt = nest.unflatten(ordered, ["for a", "for m", "for z"])
    assert type(rebuilt) is collections.OrderedDict
    assert list(rebuilt.items()) == [("z", "for z"), ("a", "for a"), ("m", "for m")]


def test_unflatten_of_defaultdict_keeps_its_type_and_default_factory():
    counts = collections.defaultdict(list, {"b": None, "a": None})
    rebuilt = nest.unflatten(counts, [1, 2])
    assert type(rebuilt) is collections.defaultdict
    assert rebuilt.default_factory is list
    assert dict(rebuilt) == {"a": 1, "b": 2}
    assert list(rebuilt) == ["b", "a"]


def test_unflatten_rebuilds_namedtuples_as_their_own_class():
    structure = [Step(reward=0, observation=Pair(0, 0), action=0)]
    rebuilt = nest.unflatten(structure, [1, 2, 3, 4])
    assert rebuilt == [Step(reward=1, observation=Pair(2, 3), action=4)]
    assert type(rebuilt[0]) is Step and type(rebuilt[0].observation) is Pair


def test_unflatten_keeps_lists_and_tuples_apart():
    rebuilt = nest.unflatten([(None,), [None]], ["a", "b"])
    assert_same_nest(rebuilt, [("a",), ["b"]], lambda a, b: a == b)


def test_unflatten_rejects_too_few_and_too_many_leaves():
    structure = {"a": [None, None], "b": None}
    with pytest.raises(ValueError, match="fewer leaves"):
        nest.unflatten(structure, [1, 2])
    with pytest.raises(ValueError, match="more leaves"):
        nest.unflatten(structure, [1, 2, 3, 4])


def test_map_structure_applies_a_function_leafwise_keeping_structure():
    doubled = nest.map_structure(lambda x, y: x + y, {"b": [1, 2], "a": 3}, {"b": [10, 20], "a": 30})
    assert doubled == {"a": 33, "b": [11, 22]}


# ---------------------------------------------------------------------------------------
# attrs classes


def test_attrs_instances_flatten_in_field_order_and_rebuild_as_their_class():
    attrs = pytest.importorskip("attrs")

    @attrs.define
    class Transition:
        zeta: object
        alpha: object

    value = Transition(zeta=np.ones(2), alpha={"y": 2, "x": 1})
    assert nest.is_nested(value)
    flat = nest.flatten(value)
    assert flat[0] is value.zeta and flat[1:] == [1, 2]
    paths = [nest.format_path(path) for path, _ in nest.flatten_with_paths(value)]
    assert paths == [".zeta", ".alpha['x']", ".alpha['y']"]
    rebuilt = nest.unflatten(value, ["z", "x", "y"])
    assert type(rebuilt) is Transition
    assert rebuilt.zeta == "z" and rebuilt.alpha == {"x": "x", "y": "y"}


# ---------------------------------------------------------------------------------------
# paths


def test_flatten_with_paths_names_keys_indices_and_fields():
    value = {
        "policy": [0, 1, 2, np.zeros(2)],
        "state": Pair(first="f", second=("s",)),
        "by_int": {3: "int"},
    }
    got = [(nest.format_path(path), leaf) for path, leaf in nest.flatten_with_paths(value)]
    assert [path for path, _ in got] == [
        "['by_int'][3]",
        "['policy'][0]",
        "['policy'][1]",
        "['policy'][2]",
        "['policy'][3]",
        "['state'].first",
        "['state'].second[0]",
    ]
    assert [leaf for _, leaf in got][:4] == ["int", 0, 1, 2]


def test_flatten_with_paths_leaves_match_flatten():
    value = {"b": [np.ones(1), (2, 3)], "a": Step(4, 5, 6)}
    assert [leaf for _, leaf in nest.flatten_with_paths(value)] == nest.flatten(value)


@pytest.mark.parametrize(
    "path, text",
    [
        ((), "<root>"),
        ((("key", "policy"), ("index", 3)), "['policy'][3]"),
        ((("key", 7),), "[7]"),
        ((("field", "observation"), ("key", "pixels")), ".observation['pixels']"),
        ((("index", 0), ("field", "first"), ("index", 2)), "[0].first[2]"),
    ],
)
def test_format_path_reads_like_python_indexing(path, text):
    assert nest.format_path(path) == text


def test_a_leaf_alone_has_the_empty_path():
    assert nest.flatten_with_paths(5) == [((), 5)]


# ---------------------------------------------------------------------------------------
# unsortable keys


@pytest.mark.parametrize(
    "mapping",
    [{1: "a", "b": 2}, {(1, 2): 0, "x": 1}, {None: 0, 1: 1}],
    ids=["int-and-str", "tuple-and-str", "None-and-int"],
)
def test_unsortable_keys_give_a_type_error_naming_the_key_types(mapping):
    kinds = {type(k).__name__ for k in mapping}
    for operation in (nest.flatten, nest.flatten_with_paths, lambda m: nest.unflatten(m, [1, 2])):
        with pytest.raises(TypeError, match="keys that sort") as raised:
            operation({"outer": mapping})
        for kind in kinds:
            assert kind in str(raised.value)


# ---------------------------------------------------------------------------------------
# properties on random nests

leaves = st.one_of(
    st.integers(),
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.int64, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    ),
)


def _containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), children, max_size=4),
        # an OrderedDict whose own key order is not the sorted order
        st.dictionaries(st.text(max_size=4), children, max_size=4).map(
            lambda d: collections.OrderedDict(reversed(list(d.items())))
        ),
        st.builds(Pair, children, children),
        st.builds(Step, children, children, children),
        st.builds(Box, children),
    )


nests = st.recursive(leaves, _containers, max_leaves=25)

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


@PROPERTY_SETTINGS
@given(nests)
def test_flatten_then_unflatten_rebuilds_an_equal_nest(value):
    rebuilt = nest.unflatten(value, nest.flatten(value))
    assert_same_nest(rebuilt, value)


@PROPERTY_SETTINGS
@given(nests)
def test_each_flattened_path_leads_to_its_leaf(value):
    def follow(node, path):
        for kind, item in path:
            node = getattr(node, item) if kind == "field" else node[item]
        return node

    for path, leaf in nest.flatten_with_paths(value):
        assert follow(value, path) is leaf


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@PROPERTY_SETTINGS
@given(value=nests)
def test_flatten_agrees_with_tf_nest_flatten_leaf_by_leaf(tf, value):
    ours = nest.flatten(value)
    theirs = tf.nest.flatten(value)
    assert len(ours) == len(theirs)
    assert all(a is b for a, b in zip(ours, theirs))


@PROPERTY_SETTINGS
@given(value=nests)
def test_unflatten_agrees_with_tf_nest_pack_sequence_as(tf, value):
    new_leaves = [object() for _ in tf.nest.flatten(value)]
    assert_same_nest(nest.unflatten(value, new_leaves), tf.nest.pack_sequence_as(value, new_leaves))
