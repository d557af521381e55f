"""Bad input, property-based (hypothesis), across backends.

- Random signatures (nests of dicts with str or int keys, lists, tuples and namedtuples,
  with leaves of every supported dtype and shapes including 0-d and zero-size) and random
  values for them, whose bits include NaNs with payloads (quiet, signalling, negative),
  infinities, signed zeros, subnormals and the extremes: every one round-trips bit-exactly,
  in the signature's structure.
- Mutations of those values (another dtype, supported or not; another shape; None, text,
  a nest where a leaf belongs; a Python scalar the leaf cannot hold; a key or an item
  missing or added; a container of the other kind; a leaf where a container belongs):
  every one is rejected with SignatureMismatchError, and nothing is stored — the table
  keeps its version and its bytes.
- Malformed URLs and options, for every backend's URL form: a ConfigurationError that
  names what is wrong, never another exception, never a connection attempt.

Examples are derandomized, so each run tries the same inputs (the counts are in
docs/guarantees.md); every backend gets a store of its own, emptied afterwards.
"""

from __future__ import annotations

import collections
import uuid
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import varsync
from varsync._config import parse_timeout, resolve
from varsync._signature import SUPPORTED_DTYPES, Spec
from varsync.backend import assert_bit_equal

Pair = collections.namedtuple("Pair", ["first", "second"])
Triple = collections.namedtuple("Triple", ["x", "y", "z"])

#: Bit patterns worth trying in every float: zeros of both signs, infinities, quiet and
#: signalling NaNs with and without payloads and of both signs, the smallest and largest
#: subnormals, the smallest normal and the largest finite number.
SPECIAL_BITS: Dict[str, List[int]] = {
    "float16": [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7E55, 0xFDFF,
                0x0001, 0x03FF, 0x8001, 0x0400, 0x7BFF],
    "float32": [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                0x7F800001, 0x7FC12345, 0xFFBFFFFF, 0x00000001, 0x007FFFFF, 0x80000001,
                0x00800000, 0x7F7FFFFF],
    "float64": [0, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
                0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
                0x7FF8DEADBEEF0001, 0xFFF7FFFFFFFFFFFF, 1, 0x000FFFFFFFFFFFFF,
                0x8000000000000001, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF],
}
#: dtypes no table can hold; a leaf of one is always a mismatch.
UNSUPPORTED = [np.dtype("datetime64[s]"), np.dtype("timedelta64[ms]"), np.dtype("<U3"),
               np.dtype("S2"), np.dtype(object), np.dtype("V4"), np.dtype(np.longdouble),
               np.dtype([("a", "<i4")])]

HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
          HealthCheck.data_too_large, HealthCheck.large_base_example]


def examples(count: int) -> Any:
    return settings(max_examples=count, deadline=None, derandomize=True, database=None,
                    suppress_health_check=HEALTH)


def run_all(property_test: Callable[..., None], count: int) -> None:
    """Run a hypothesis property and check that it tried ``count`` examples (the figures
    docs/guarantees.md states)."""
    tried = [0]
    inner = property_test.hypothesis.inner_test  # type: ignore[attr-defined]

    def counted(*args: Any, **kwargs: Any) -> None:
        tried[0] += 1
        inner(*args, **kwargs)

    property_test.hypothesis.inner_test = counted  # type: ignore[attr-defined]
    property_test()
    assert tried[0] >= count, f"hypothesis ran {tried[0]} examples, fewer than {count}"


# -- strategies --------------------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
specs = st.builds(Spec, shapes, st.sampled_from(SUPPORTED_DTYPES))
text_keys = st.text(max_size=6)


def signatures(int_keys: bool = True) -> Any:
    """Nests of specs: what ``create_table`` takes (``int_keys=False``: as Reverb
    stores them, with str keys only)."""

    def extend(children: Any) -> Any:
        options = [
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.dictionaries(text_keys, children, max_size=3),
            st.builds(Pair, children, children),
            st.builds(Triple, children, children, children),
        ]
        if int_keys:
            options.append(st.dictionaries(st.integers(-5, 5), children, max_size=3))
        return st.one_of(options)

    return st.recursive(specs, extend, max_leaves=8)


def _bits_dtype(dtype: np.dtype) -> Tuple[np.dtype, str, int]:
    """The unsigned dtype whose bit patterns make up ``dtype``'s elements, the name of
    the float those patterns are (or ``""``), and patterns per element."""
    if dtype.kind == "c":
        part = np.dtype(f"f{dtype.itemsize // 2}")
        return np.dtype(f"u{part.itemsize}"), part.name, 2
    return np.dtype(f"u{dtype.itemsize}"), dtype.name if dtype.kind == "f" else "", 1


def arrays_for(spec: Spec) -> Any:
    """Arrays of ``spec``, drawn as raw bit patterns: every NaN payload, subnormal and
    signed zero is possible, the special ones are drawn often."""
    if spec.dtype.kind == "b":
        return hnp.arrays(np.bool_, spec.shape)
    bits, float_name, per_element = _bits_dtype(spec.dtype)
    element: Any = st.integers(0, 2 ** (8 * bits.itemsize) - 1)
    if float_name:
        element = st.one_of(element, st.sampled_from(SPECIAL_BITS[float_name]))
    raw = hnp.arrays(bits, spec.shape + ((per_element,) if per_element > 1 else ()),
                     elements=element)
    return raw.map(lambda a: np.ascontiguousarray(a).view(spec.dtype).reshape(spec.shape))


def values_for(draw: Any, signature: Any) -> Any:
    """A value of ``signature``; lists and tuples are swapped at random (both accepted)."""
    if isinstance(signature, Spec):
        return draw(arrays_for(signature))
    if isinstance(signature, dict):
        return {k: values_for(draw, v) for k, v in signature.items()}
    items = [values_for(draw, v) for v in signature]
    if hasattr(signature, "_fields"):
        return type(signature)(*items)
    if draw(st.booleans()):
        return items if isinstance(signature, tuple) else tuple(items)
    return type(signature)(items)


def structure_of(nest: Any) -> Any:
    """The containers of a nest (types, keys, namedtuple names and fields), leaves aside."""
    if isinstance(nest, dict):
        return ("dict", [(k, structure_of(v)) for k, v in sorted(nest.items())])
    if hasattr(nest, "_fields"):
        return (type(nest).__name__, tuple(nest._fields), [structure_of(v) for v in nest])
    if isinstance(nest, (list, tuple)):
        return (type(nest).__name__, [structure_of(v) for v in nest])
    return "leaf"


# -- mutations ---------------------------------------------------------------------------------------

Path = Tuple[Any, ...]


def nodes(signature: Any, path: Path = ()) -> Iterator[Tuple[Path, Any]]:
    yield path, signature
    if isinstance(signature, dict):
        for key, child in signature.items():
            yield from nodes(child, path + (key,))
    elif not isinstance(signature, Spec):
        for index, child in enumerate(signature):
            yield from nodes(child, path + (index,))


def replaced(nest: Any, path: Path, new: Any) -> Any:
    """``nest`` with the node at ``path`` replaced by ``new`` (the rest shared)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(nest, dict):
        return {**nest, head: replaced(nest[head], rest, new)}
    items = list(nest)
    items[head] = replaced(items[head], rest, new)
    if hasattr(nest, "_fields"):
        return type(nest)(*items)
    return type(nest)(items)


def value_at(nest: Any, path: Path) -> Any:
    for step in path:
        nest = nest[step]
    return nest


def _python_scalar_it_cannot_hold(draw: Any, spec: Spec) -> Any:
    if spec.shape != ():
        return draw(st.sampled_from([1, 1.5, True, 1j]))  # a scalar for an array
    kind = spec.dtype.kind
    choices: List[Any] = []
    if kind in "iub":
        choices.append(draw(st.floats(allow_nan=True)))  # a float into an int or bool
    if kind in "iufc":
        choices.append(draw(st.booleans()))  # a bool into a number
    if kind != "c":
        choices.append(complex(draw(st.floats()), 1.0))  # a complex into a real
    if kind == "b":
        choices.append(draw(st.integers()))  # an int into a bool
    if kind in "iu":
        info = np.iinfo(spec.dtype)
        choices.append(draw(st.one_of(st.integers(max_value=int(info.min) - 1),
                                      st.integers(min_value=int(info.max) + 1))))
    return draw(st.sampled_from(choices))


def pick(draw: Any, items: List[Any]) -> Any:
    """One of ``items``, about evenly (``sampled_from`` favours the first ones)."""
    return items[draw(st.integers(0, 2**16)) % len(items)]


def mutation(draw: Any, signature: Any, values: Any) -> Tuple[str, Any]:
    """A (description, mutated values) pair the signature does not accept."""
    every = list(nodes(signature))
    leaves = [(p, n) for p, n in every if isinstance(n, Spec)]
    containers = [(p, n) for p, n in every if not isinstance(n, Spec)]
    pool = leaves if leaves and (not containers or pick(draw, [True, False])) else containers
    path, node = pick(draw, pool)
    where = f"at {list(path)}"
    if isinstance(node, Spec):
        kind = pick(draw, ["shape", "python scalar", "dtype", "nest", "unsupported dtype",
                           "None", "text", "object array"])
        if kind == "dtype":
            other = draw(st.sampled_from([d for d in SUPPORTED_DTYPES if d != node.dtype]))
            new: Any = np.zeros(node.shape, other)
        elif kind == "unsupported dtype":
            new = np.zeros(node.shape, draw(st.sampled_from(UNSUPPORTED)))
        elif kind == "shape":
            shape = draw(shapes.filter(lambda s: s != node.shape))
            new = np.zeros(shape, node.dtype)
        elif kind == "None":
            new = None
        elif kind == "text":
            new = draw(st.sampled_from(["1", b"1", "nan"]))
        elif kind == "nest":
            new = draw(st.sampled_from([[value_at(values, path)], {"x": value_at(values, path)},
                                        (), []]))
        elif kind == "python scalar":
            new = _python_scalar_it_cannot_hold(draw, node)
        else:
            new = np.empty(node.shape, object)
        return f"{kind} {where}", replaced(values, path, new)
    here = value_at(values, path)
    if isinstance(node, dict):
        kinds = (["drop a key"] if node else []) + ["a list instead", "add a key", "a leaf instead"]
        kind = pick(draw, kinds)
        if kind == "drop a key":
            key = draw(st.sampled_from(sorted(node)))
            new = {k: v for k, v in here.items() if k != key}
        elif kind == "add a key":
            if node and isinstance(next(iter(node)), int):
                extra: Any = max(node) + 1
            else:
                extra = draw(text_keys.filter(lambda k: k not in node))
            new = {**here, extra: np.zeros(2)}
        elif kind == "a list instead":
            new = [here[k] for k in sorted(node)]
        else:
            new = np.zeros(len(node))
    else:
        kinds = (["drop an item"] if len(node) else []) + ["a dict instead", "a leaf instead", "add an item"]
        kind = pick(draw, kinds)
        items = list(here)
        if kind == "drop an item":
            new = tuple(items[:-1])
        elif kind == "add an item":
            new = tuple(items + [np.zeros(2)])
        elif kind == "a dict instead":
            new = {str(i): item for i, item in enumerate(items)}
        else:
            new = np.zeros(len(items))
    return f"{kind} {where}", replaced(values, path, new)


# -- the properties, per backend ------------------------------------------------------------------------


def check_round_trip(store: Any, table: str, signature: Any, values: Any) -> None:
    created = store.create_table(table, signature)
    assert structure_of(created) == structure_of(signature)
    assert store.push(values, table=table) == 1
    pulled = store.pull(table)
    assert structure_of(pulled) == structure_of(signature)
    assert_bit_equal(pulled, values)


def check_rejected(store: Any, table: str, signature: Any, values: Any, bad: Tuple[str, Any]) -> None:
    what, mutated = bad
    store.create_table(table, signature)
    store.push(values, table=table)
    with pytest.raises(varsync.SignatureMismatchError, match="structure differs|value at") as caught:
        store.push(mutated, table=table)
    assert isinstance(caught.value, ValueError), what
    assert store.version(table) == 1, f"{what}: the rejected push was stored"
    assert_bit_equal(store.pull(table), values)


@pytest.fixture
def memory_store() -> Iterator[Any]:
    with varsync.connect(f"memory://bad-input-{uuid.uuid4().hex}", timeout=10) as store:
        yield store


@pytest.fixture
def redis_store(redis_namespace: Any) -> Iterator[Any]:
    with varsync.connect(redis_namespace(chunk_size=4096), timeout=10) as store:
        yield store  # 4 KiB chunks: values span chunks, chunks span leaves


@pytest.fixture
def shm_store() -> Iterator[Any]:
    varsync_shm = pytest.importorskip("varsync_shm")
    name = f"bad-input-{uuid.uuid4().hex}"
    with varsync.connect(f"shm://{name}", timeout=10) as store:
        yield store
    varsync_shm.remove_store(name)


STORES = {"memory": (200, "memory_store"), "redis": (80, "redis_store"), "shm": (80, "shm_store")}


def _each_store(test: Callable[..., None]) -> Any:
    return pytest.mark.parametrize("backend", sorted(STORES))(test)


@_each_store
def test_every_valid_value_round_trips_bit_exactly(backend: str, request: Any) -> None:
    count, fixture = STORES[backend]
    store = request.getfixturevalue(fixture)

    @examples(count)
    @given(st.data())
    def round_trip(data: Any) -> None:
        signature = data.draw(signatures())
        values = values_for(data.draw, signature)
        check_round_trip(store, f"t-{uuid.uuid4().hex}", signature, values)

    run_all(round_trip, count)


@_each_store
def test_every_mismatch_is_rejected_and_nothing_is_stored(backend: str, request: Any) -> None:
    count, fixture = STORES[backend]
    store = request.getfixturevalue(fixture)

    @examples(count)
    @given(st.data())
    def rejected(data: Any) -> None:
        signature = data.draw(signatures())
        values = values_for(data.draw, signature)
        bad = mutation(data.draw, signature, values)
        check_rejected(store, f"t-{uuid.uuid4().hex}", signature, values, bad)

    run_all(rejected, count)


def test_reverb_round_trips_valid_values_and_rejects_mismatches(reverb_servers: Any) -> None:
    """Reverb tables are fixed at server start: a server per example (a few ms each)."""

    @examples(40)
    @given(st.data())
    def both(data: Any) -> None:
        signature = data.draw(signatures(int_keys=False).filter(
            lambda s: len(varsync.flatten(s)) > 0))  # Reverb cannot store an item of no data
        values = values_for(data.draw, signature)
        bad = mutation(data.draw, signature, values)
        server = reverb_servers({"a": signature, "b": signature})
        try:
            with varsync.connect(server.url, timeout=10) as store:
                check_round_trip(store, "a", signature, values)
                check_rejected(store, "b", signature, values, bad)
        finally:
            server.stop()

    run_all(both, 40)


def test_a_reverb_table_without_leaves_is_refused_when_served() -> None:
    pytest.importorskip("reverb")
    from varsync.reverb_server import serve

    for signature in ({}, [], {"a": {}, "b": ((),)}):
        with pytest.raises(varsync.SignatureError, match="leaf"):
            serve({"variables": signature})


# -- malformed URLs and options -------------------------------------------------------------------------

BAD_URLS = [
    # every URL
    ("", {}, "not a varsync URL"),
    ("localhost:6379", {}, "scheme://"),
    ("://x", {}, "no scheme"),
    ("memory://x?timeout=soon", {}, "timeout='soon'"),
    ("memory://x?timeout=-1", {}, "negative"),
    ("memory://x?timeout=nan", {}, "timeout"),
    ("memory://x", {"timeout": [1]}, "timeout"),
    ("memory://x?namespace=a&namespace=b", {}, "appears twice"),
    ("memory://x?timeout", {}, "cannot parse"),
    ("memory://x?a=1&&b=2", {}, "cannot parse"),
    ("memory://x", {"namespace": 3}, "namespace must be a str"),
    ("nosuch://x", {}, "installed schemes"),
    # memory://
    ("memory://", {}, "memory://<name>"),
    ("memory://x?colour=red", {}, "colour"),
    # shm://
    ("shm://", {}, "shm://<store>"),
    ("shm://x?root=/no/such/dir", {}, "not a directory"),
    ("shm://x", {"root": 5}, "must be a directory name"),
    ("shm://x?colour=red", {}, "colour"),
    ("shm://" + "x" * 300, {}, "too long"),
    # reverb://
    ("reverb://localhost", {}, "reverb://host:port"),
    ("reverb://:8000", {}, "reverb://host:port"),
    ("reverb://localhost:port", {}, "reverb://host:port"),
    ("reverb://localhost:70000", {}, "reverb://host:port"),
    ("reverb://localhost:0", {}, "reverb://host:port"),
    ("reverb://localhost:8000/variables", {}, "reverb://host:port"),
    ("reverb://[::1", {}, "cannot parse"),
    ("reverb://localhost:8000?chunk_size=1", {}, "chunk_size"),
    # redis:// and rediss://
    ("redis://localhost:port/0", {}, "malformed port"),
    ("redis://localhost:70000/0", {}, "malformed port"),
    ("redis://localhost:0/0", {}, "port"),
    ("redis://[::1/0", {}, "cannot parse"),
    ("redis://localhost/zero", {}, "db='zero'"),
    ("redis://localhost/-1", {}, "db='-1'"),
    ("redis://localhost/0/1", {}, "db="),
    ("redis://localhost/3", {"db": 4}, "database 3 and the db option 4"),
    ("redis://localhost/0", {"db": True}, "db=True"),
    ("redis://localhost/0?chunk_size=12", {}, "chunk_size"),
    ("redis://localhost/0?chunk_size=1.5e6", {}, "chunk_size"),
    ("redis://localhost/0?chunk_size=1073741824", {}, "chunk_size"),
    ("redis://localhost/0?keep=-1", {}, "keep"),
    ("redis://localhost/0?keep=101", {}, "keep"),
    ("redis://localhost/0?retries=many", {}, "retries"),
    ("redis://localhost/0?connect_timeout=soon", {}, "connect_timeout"),
    ("redis://localhost/0?socket_timeout=-2", {}, "socket_timeout"),
    ("redis://localhost/0?prefix=", {}, "prefix"),
    ("redis://localhost/0", {"prefix": None}, "prefix"),
    ("redis://localhost/0?colour=red", {}, "colour"),
    ("redis://localhost/0?ssl_ca_certs=/ca.pem", {}, "rediss://"),
    ("rediss://localhost/0?ssl_check_hostname=perhaps", {}, "ssl_check_hostname"),
    ("rediss://localhost/0?ssl_cert_reqs=sometimes", {}, "ssl_cert_reqs"),
]


#: What each scheme's backend imports; where it is missing, connect says so first
#: (MissingDependencyError) and the URL is never parsed.
ENGINE_OF_SCHEME = {"reverb": "reverb", "redis": "redis", "rediss": "redis", "shm": "varsync_shm"}


@pytest.mark.parametrize("url, options, message", BAD_URLS)
def test_malformed_urls_and_options_are_configuration_errors_naming_the_problem(
    url: str, options: Dict[str, Any], message: str
) -> None:
    engine = ENGINE_OF_SCHEME.get(url.partition("://")[0])
    if engine is not None:
        pytest.importorskip(engine, reason=f"{url.partition('://')[0]}:// needs {engine}")
    with pytest.raises(varsync.ConfigurationError) as caught:
        varsync.connect(url, **options)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@examples(300)
@given(st.text(max_size=40), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
def test_any_text_is_a_url_or_a_configuration_error(text: str, options: Dict[str, str]) -> None:
    for url in (text, f"memory://{text}", f"redis://{text}", f"reverb://{text}"):
        try:
            settings_ = resolve(url, dict(options))
        except varsync.ConfigurationError:
            continue
        assert settings_.scheme and "?" not in settings_.url


@pytest.mark.parametrize("option", ["db", "chunk_size", "keep", "retries", "recycle_from",
                                    "connect_timeout", "socket_timeout", "prefix", "timeout"])
def test_any_value_of_a_redis_option_is_used_or_refused_clearly(option: str) -> None:
    """Against a port nobody listens on: the option is refused (ConfigurationError), or
    accepted and the connection then refused (BackendConnectionError). Nothing else."""
    from fixtures.redis import dead_url

    dead = dead_url()

    @examples(60)
    @given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.booleans(), st.none()))
    def one(value: Any) -> None:
        options = {option: value}
        if option != "timeout":
            options["timeout"] = 1
        try:
            varsync.connect(dead, **options).close()
        except (varsync.ConfigurationError, varsync.BackendConnectionError):
            pass

    run_all(one, 60)


timeouts = st.one_of(
    st.floats(), st.integers(), st.text(max_size=8),
    st.sampled_from(["inf", "none", "1e400", "-0", "0", "2147483648", "nan", "1_0"]),
    # the edges of what sockets, threads and Reverb (whole ms and s in C ints) can count
    st.sampled_from([2**31 / 1000, 2**31 / 1000 + 0.001, 2**31 - 1, 2**31, 2**63, 1e-9]),
)


@pytest.mark.parametrize("backend", ["memory", "redis", "reverb", "shm"])
def test_any_timeout_is_used_or_refused_clearly(backend: str, request: Any) -> None:
    """Every value of ``timeout`` is refused with ConfigurationError, or bounds the calls:
    they succeed, or (under a second: too short to transfer anything) raise the error of a
    bound that ran out, PullTimeoutError or, for a server that did not answer in time,
    BackendConnectionError. Huge ones, beyond what sockets and threads can count, mean
    no bound."""
    signature = {"w": Spec((3,), "float32")}
    if backend == "memory":
        url = f"memory://timeouts-{uuid.uuid4().hex}"
    elif backend == "redis":
        url = request.getfixturevalue("redis_namespace")()
    elif backend == "shm":
        varsync_shm = pytest.importorskip("varsync_shm")
        name = f"timeouts-{uuid.uuid4().hex}"
        request.addfinalizer(lambda: varsync_shm.remove_store(name))
        url = f"shm://{name}"
    else:
        url = request.getfixturevalue("reverb_servers")({"variables": signature}).url

    @examples(40)
    @given(timeouts)
    def one(value: Any) -> None:
        try:
            store = varsync.connect(url, timeout=value)
        except varsync.ConfigurationError:
            return
        seconds = parse_timeout(value, "timeout")
        with store:
            try:
                store.create_table("variables", signature)
                version = store.push({"w": np.ones(3, np.float32)})
                assert store.pull_if_newer(0, timeout=value)[0] == version
                assert store.wait_for(version - 1, timeout=value) == version
            except (varsync.PullTimeoutError, varsync.BackendConnectionError):
                assert seconds is not None and seconds < 1
                return
            with pytest.raises(varsync.PullTimeoutError):
                store.wait_for(version, timeout=0)

    run_all(one, 40)
