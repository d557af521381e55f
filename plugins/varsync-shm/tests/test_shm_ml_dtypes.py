"""bfloat16 and the float8 types (ml_dtypes) in shm:// segments: every bit pattern back
exactly, in segments read by copy and by mapping, named in the leaf index by name (their
``dtype.str``, ``"<V2"`` and ``"<V1"``, names none of them), in this process and in one
that imports ml_dtypes only when it reads the table."""

import json
import subprocess
import sys

import numpy as np
import pytest

import varsync
from varsync.backend import CorruptDataError, Spec
from varsync.testing.roundtrip_tests import ml_dtype_values
from varsync.testing.values import assert_bit_equal, every_bit_pattern
from varsync_shm import reading, segment
from varsync_shm.backend import ShmBackend

pytest.importorskip("ml_dtypes")

NAMES = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
)


def bits_of(array):
    return np.asarray(array).view(np.dtype(f"u{array.dtype.itemsize}"))


def test_the_backend_declares_all_six():
    assert ShmBackend.supported_ml_dtypes == NAMES


@pytest.mark.parametrize("copies", [1, 12], ids=["read", "mapped"])
def test_every_bit_pattern_round_trips(store_name, copies):
    values = {name: ml_dtype_values(name) for name in NAMES}
    values["tiled"] = {"bfloat16": np.tile(every_bit_pattern("bfloat16"), copies)}
    total = sum(leaf.nbytes for leaf in varsync.flatten(values))
    assert (total > reading.MAP_ABOVE) == (copies > 1)
    with varsync.connect(f"shm://{store_name}") as store:
        store.create_table("t", values)
        assert store.push(values, table="t") == 1
        pulled = store.pull("t")
        assert_bit_equal(pulled, values)
        for got, expected in zip(varsync.flatten(pulled), varsync.flatten(values)):
            np.testing.assert_array_equal(bits_of(got), bits_of(expected))


def test_the_index_names_ml_dtypes_by_name_and_numpy_dtypes_as_before():
    specs = [Spec((4,), name) for name in NAMES] + [Spec((2,), "float32"), Spec((), "bool")]
    layout = segment.plan(specs)
    _, _, _start, _, size, _count, index_len, _, _ = segment._HEADER.unpack_from(layout.head, 0)
    index = json.loads(layout.head[segment.HEADER_SIZE : segment.HEADER_SIZE + index_len])
    assert [entry[0] for entry in index] == list(NAMES) + ["<f4", "|b1"]
    parsed = segment.parse(layout.head + bytes(size - len(layout.head)), size, "test")
    assert [leaf.dtype for leaf in parsed.leaves] == [spec.dtype for spec in specs]


@pytest.mark.parametrize(
    ("stored", "written"),
    [(b'"bfloat16"', b'"<V2"    '), (b'"<f4"', b'">f4"'), (b'"bfloat16"', b'"float32x"')],
)
def test_an_index_naming_no_dtype_varsync_stores_is_corrupt(stored, written):
    layout = segment.plan([Spec((4,), "bfloat16"), Spec((2,), "float32")])
    assert layout.head.count(stored) == 1
    head = layout.head.replace(stored, written)
    with pytest.raises(CorruptDataError, match=r"malformed|does not fit"):
        segment.parse(head + bytes(layout.size - len(head)), layout.size, "test")


def test_another_process_reads_them_importing_ml_dtypes_only_then(store_name):
    values = {name: ml_dtype_values(name) for name in NAMES}
    url = f"shm://{store_name}"
    with varsync.connect(url) as store:
        store.create_table("t", values)
        store.push(values, table="t")
        script = "\n".join(
            [
                "import json, sys",
                "import varsync",
                f"with varsync.connect({url!r}) as store:",
                "    before = 'ml_dtypes' in sys.modules",
                "    pulled = store.pull('t')",
                "    out = {name: [leaf.dtype.name,",
                "                  leaf.reshape(-1).view('u%d' % leaf.itemsize).tolist()]",
                "           for name, leaf in ((n, pulled[n]['every_bit_pattern'])",
                "                              for n in pulled)}",
                "print(json.dumps([before, out]))",
            ]
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        before, seen = json.loads(done.stdout.splitlines()[-1])
        assert before is False
        for name in NAMES:
            expected = values[name]["every_bit_pattern"]
            assert seen[name] == [name, bits_of(expected).reshape(-1).tolist()]
