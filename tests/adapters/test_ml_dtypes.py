"""bfloat16 and the float8 types of ml_dtypes (issue 14, point 4): named in signatures by
their stable names, resolved without ml_dtypes imported by ``import varsync``, and stored
bit-exactly (every bit pattern, NaN payloads included) by memory://, redis:// and, for the
three TensorFlow has, reverb://. The shm plugin's own tests cover shm://.

Runs in the TensorFlow environment and in one without TensorFlow (the Reverb and
TensorFlow tests skip there)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any, Dict

import numpy as np
import pytest

import varsync
from varsync import _signature as sig
from varsync._spec import ML_DTYPE_NAMES, SUPPORTED_DTYPES, Spec, canonical_dtype
from varsync.testing.roundtrip_tests import ml_dtype_values
from varsync.testing.values import assert_bit_equal, every_bit_pattern

ml_dtypes = pytest.importorskip("ml_dtypes")

#: What TensorFlow 2.15 (so a Reverb table) has of them.
REVERB_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

def bits_of(array: np.ndarray) -> np.ndarray:
    """The array's bit patterns as unsigned ints of its width: NaNs compare equal."""
    return np.asarray(array).view(np.dtype(f"u{array.dtype.itemsize}"))


def assert_same_bits(got: Any, expected: Dict[str, Dict[str, np.ndarray]]) -> None:
    assert_bit_equal(got, expected)
    for name, leaves in expected.items():
        for key, leaf in leaves.items():
            np.testing.assert_array_equal(bits_of(got[name][key]), bits_of(leaf))


# ---------------------------------------------------------------------------------------
# names and specs


@pytest.mark.parametrize("name", ML_DTYPE_NAMES)
def test_the_type_its_numpy_dtype_and_its_name_are_one_dtype(name: str) -> None:
    kind = getattr(ml_dtypes, name)
    dtype = canonical_dtype(name)
    assert dtype == canonical_dtype(kind) == canonical_dtype(np.dtype(kind)) == np.dtype(kind)
    assert dtype.name == name  # what stored signatures say
    spec = Spec((3, 4), kind)
    assert spec == Spec((3, 4), name) and repr(spec) == f"Spec(shape=(3, 4), dtype={name})"
    assert spec.nbytes == 12 * dtype.itemsize and spec.size == 12


def test_the_names_are_the_ones_both_ml_dtypes_versions_have() -> None:
    assert ML_DTYPE_NAMES == (
        "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
    )
    assert [canonical_dtype(n).itemsize for n in ML_DTYPE_NAMES] == [2, 1, 1, 1, 1, 1]
    assert not set(ML_DTYPE_NAMES) & {d.name for d in SUPPORTED_DTYPES}  # numpy's own only


@pytest.mark.parametrize(
    "dtype", ["int4", "uint4", "float8_e4m3", "V2", object, "U3", "S4", np.dtype("M8[s]")]
)
def test_other_dtypes_are_refused_naming_every_accepted_one(dtype: Any) -> None:
    kind = getattr(ml_dtypes, str(dtype), None) if isinstance(dtype, str) else None
    for candidate in [dtype] + ([kind] if kind is not None else []):
        with pytest.raises(varsync.SignatureError) as caught:
            Spec((2,), candidate)
        message = str(caught.value)
        assert "expected one of" in message
        assert all(d.name in message for d in SUPPORTED_DTYPES)
        assert all(name in message for name in ML_DTYPE_NAMES)


def test_stored_signatures_name_the_dtypes_and_read_back() -> None:
    signature = {name: Spec((2,), name) for name in ML_DTYPE_NAMES}
    text = sig.to_json(signature)
    stored = json.loads(text)["structure"]["dict"]
    assert [(key, node["spec"]["dtype"]) for key, node in stored] == [
        (name, name) for name in sorted(ML_DTYPE_NAMES)
    ]
    assert sig.same_structure(sig.from_json(text), signature)


def test_float8_types_with_the_same_dtype_str_are_different_signatures() -> None:
    # Every float8 type's dtype.str is "<V1" (float8_e5m2's "<f1"): only names tell them apart.
    one_byte = [n for n in ML_DTYPE_NAMES if canonical_dtype(n).itemsize == 1]
    for a in one_byte:
        for b in one_byte:
            assert sig.same_structure({"w": Spec((2,), a)}, {"w": Spec((2,), b)}) == (a == b)


def test_import_varsync_imports_no_ml_dtypes_until_a_table_holds_one() -> None:
    script = "\n".join(
        [
            "import sys, json",
            "import numpy as np",
            "import varsync",
            "with varsync.connect('memory://lazy') as store:",
            "    store.create_table('t', {'w': np.zeros(2, np.float32), 'step': 0})",
            "    store.push({'w': np.ones(2, np.float32), 'step': 1}, table='t')",
            "    before = 'ml_dtypes' in sys.modules",
            "    # a stored signature naming bfloat16, read without ml_dtypes imported first",
            "    from varsync._signature import from_json",
            "    spec = from_json(json.dumps({'format': 'varsync.signature',",
            "        'version': 1, 'structure': {'spec': {'shape': [2], 'dtype': 'bfloat16'}}}))",
            "print(json.dumps([before, spec.dtype.name, 'ml_dtypes' in sys.modules]))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [False, "bfloat16", True]


def test_every_bit_pattern_holds_each_pattern_once() -> None:
    for name in ML_DTYPE_NAMES:
        bits = bits_of(every_bit_pattern(name))
        assert bits.tolist() == list(range(2 ** (8 * canonical_dtype(name).itemsize)))
    with pytest.raises(ValueError):
        every_bit_pattern("float32")


# ---------------------------------------------------------------------------------------
# round trips: memory:// and redis://


@pytest.fixture(params=["memory", "redis"])
def url(request: Any) -> str:
    if request.param == "memory":
        return f"memory://ml-dtypes-{uuid.uuid4().hex}"
    pytest.importorskip("redis")
    made: str = request.getfixturevalue("redis_namespace")(chunk_size=4096)  # many chunks
    return made


@pytest.mark.parametrize("name", ML_DTYPE_NAMES)
def test_every_bit_pattern_round_trips_and_updates_in_place(url: str, name: str) -> None:
    values = {name: ml_dtype_values(name)}
    with varsync.connect(url) as store:
        store.create_table("t", values)
        assert store.push(values, table="t") == 1
        assert_same_bits(store.pull("t"), values)
        targets = {name: {k: np.zeros(v.shape, v.dtype) for k, v in values[name].items()}}
        originals = varsync.flatten(targets)
        assert store.update(targets, table="t") == 1
        assert all(a is b for a, b in zip(varsync.flatten(targets), originals))
        assert_same_bits(targets, values)


def test_a_table_of_every_ml_dtype_and_numpy_dtypes_round_trips(url: str) -> None:
    values: Dict[str, Any] = {name: ml_dtype_values(name) for name in ML_DTYPE_NAMES}
    values["plain"] = {"w": np.linspace(-1, 1, 5, dtype=np.float32), "step": np.int64(7)}
    with varsync.connect(url) as store:
        store.create_table("t", values)
        store.push(values, table="t")
        assert_bit_equal(store.pull("t"), values)
        with varsync.connect(url) as other:  # the signature as stored, read afresh
            assert sig.same_structure(other.signature("t"), sig.signature_of(values))


def test_a_python_float_fits_a_zero_d_bfloat16_leaf_unless_too_large(url: str) -> None:
    with varsync.connect(url) as store:
        store.create_table("t", {"lr": Spec((), "bfloat16")})
        store.push({"lr": 0.5}, table="t")
        pulled = store.pull("t")["lr"]
        assert pulled.dtype == canonical_dtype("bfloat16") and float(pulled) == 0.5
        with pytest.raises(varsync.SignatureMismatchError, match="too large for bfloat16"):
            store.push({"lr": 1e300}, table="t")
        with pytest.raises(varsync.SignatureMismatchError):
            store.push({"lr": np.float32(0.5)}, table="t")  # an array keeps its dtype
        assert store.version("t") == 1


@pytest.mark.parametrize(
    "bad", [np.array(["ab", "cd"]), np.array([object(), None]), np.zeros(2, np.complex64)]
)
def test_values_of_other_dtypes_into_a_bfloat16_leaf_are_refused(url: str, bad: Any) -> None:
    with varsync.connect(url) as store:
        store.create_table("t", {"w": Spec((2,), "bfloat16")})
        with pytest.raises(varsync.SignatureMismatchError, match=r"expected bfloat16"):
            store.push({"w": bad}, table="t")
        assert store.version("t") == 0


# ---------------------------------------------------------------------------------------
# TensorFlow values


def test_tensorflow_bfloat16_and_float8_variables_push_and_update() -> None:
    tf = pytest.importorskip("tensorflow")
    b16 = every_bit_pattern("bfloat16")[::7].copy()
    f8 = every_bit_pattern("float8_e5m2")
    variables = {"w": tf.Variable(tf.constant(b16)), "f8": tf.Variable(tf.constant(f8))}
    assert variables["w"].dtype == tf.bfloat16
    with varsync.connect(f"memory://ml-dtypes-{uuid.uuid4().hex}") as store:
        store.create_table("t", variables)
        assert store.signature("t") == {"f8": Spec(f8.shape, "float8_e5m2"),
                                        "w": Spec(b16.shape, "bfloat16")}
        store.push(variables, table="t")
        targets = {
            "w": tf.Variable(tf.zeros(b16.shape, tf.bfloat16)),
            "f8": tf.Variable(tf.constant(np.zeros(f8.shape, f8.dtype))),
        }
        assert store.update(targets, table="t") == 1
        np.testing.assert_array_equal(bits_of(targets["w"].numpy()), bits_of(b16))
        np.testing.assert_array_equal(bits_of(targets["f8"].numpy()), bits_of(f8))


# ---------------------------------------------------------------------------------------
# reverb://


def test_reverb_tables_hold_the_three_tensorflow_has_natively(reverb_servers: Any) -> None:
    from varsync._backends.reverb import ReverbBackend

    assert ReverbBackend.supported_ml_dtypes == REVERB_DTYPES
    tf = pytest.importorskip("tensorflow")
    reverb = pytest.importorskip("reverb")
    values: Dict[str, Any] = {name: ml_dtype_values(name) for name in REVERB_DTYPES}
    values["plain"] = {"w": np.arange(3, dtype=np.float32)}
    server = reverb_servers({"t": values})
    # The server's signature is what TF-Agents sees: the dtypes themselves, not bit views.
    stored = reverb.Client(server.address).server_info()["t"].signature
    assert stored["bfloat16"]["every_bit_pattern"].dtype == tf.bfloat16
    assert stored["float8_e4m3fn"]["zero_d"].dtype == tf.dtypes.experimental.float8_e4m3fn
    assert stored["float8_e5m2"]["empty"].dtype == tf.dtypes.experimental.float8_e5m2
    with varsync.connect(server.url, timeout=20) as store:
        assert sig.same_structure(store.signature("t"), sig.signature_of(values))
        assert store.push(values, table="t") == 1
        assert store.push(values, table="t") == 2  # the same client again
        assert_bit_equal(store.pull("t"), values)
        for name in REVERB_DTYPES:
            np.testing.assert_array_equal(
                bits_of(store.pull("t")[name]["every_bit_pattern"]),
                bits_of(values[name]["every_bit_pattern"]),
            )


@pytest.mark.parametrize("name", [n for n in ML_DTYPE_NAMES if n not in REVERB_DTYPES])
def test_reverb_refuses_the_float8_types_tensorflow_lacks(reverb_servers: Any, name: str) -> None:
    with pytest.raises(varsync.SignatureError) as caught:
        reverb_servers({"t": {"w": Spec((2,), name), "step": Spec((), "int64")}})
    message = str(caught.value)
    assert f"['w'] is {name}" in message
    assert "redis://" in message and "shm://" in message and "view(np.uint8)" in message


def test_tf_agents_reads_what_varsync_pushes_and_the_other_way(reverb_servers: Any) -> None:
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tf_agents")
    from tf_agents.experimental.distributed.reverb_variable_container import (
        ReverbVariableContainer,
    )

    b16, f8 = every_bit_pattern("bfloat16")[::5].copy(), every_bit_pattern("float8_e4m3fn")
    variables = {"w": tf.Variable(tf.constant(b16)), "f8": tf.Variable(tf.constant(f8))}
    server = reverb_servers({"t": variables})
    theirs = ReverbVariableContainer(server.address, table_names=["t"])
    with varsync.connect(server.url, timeout=20) as store:
        store.push(variables, table="t")
        pulled = theirs.pull("t")
        np.testing.assert_array_equal(bits_of(pulled["w"].numpy()), bits_of(b16))
        np.testing.assert_array_equal(bits_of(pulled["f8"].numpy()), bits_of(f8))
        theirs.push({"w": tf.constant(b16[::-1].copy()), "f8": tf.constant(f8[::-1].copy())}, "t")
        assert_bit_equal(store.pull("t"), {"f8": f8[::-1], "w": b16[::-1]})
