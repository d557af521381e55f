"""Hostile or corrupt stored data: each case is a clear error (CorruptDataError, naming
where), never an out-of-bounds read, a crash, a hang or silently wrong arrays; and nothing
varsync reads is ever unpickled.

Cases already covered in tests/backends/redis/test_redis_backend.py (a chunk changed in place, replaced
by foreign bytes or deleted; a malformed head layout, version, format or signature;
foreign keys where a head belongs) and in plugins/varsync-shm/tests (a segment with a
foreign magic, a missing segment, a ``current`` link to something else) are not
repeated; these are the rest.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import struct
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pytest

import varsync

ROOT = Path(__file__).resolve().parents[2]
VALUES = {"w": np.arange(40_000, dtype=np.float32)}  # 160 KB: 3 chunks of 64 KiB in Redis
SIGNATURE_FUTURE = json.dumps({
    "format": "varsync.signature", "version": 99,  # a version no varsync writes yet
    "structure": {"dict": [["w", {"spec": {"dtype": "float32", "shape": [40000]}}]]},
})


class Payload:
    """Unpickling this object creates the file ``path``: proof that something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def payloads(marker: Path) -> Dict[str, bytes]:
    """Ways to store a pickle: raw (binary and text protocol), and inside a .npy file of
    an object array (what ``np.load(..., allow_pickle=True)`` would run)."""
    npy = io.BytesIO()
    np.save(npy, np.array([Payload(str(marker))], dtype=object), allow_pickle=True)
    return {
        "pickle": pickle.dumps(Payload(str(marker)), protocol=pickle.HIGHEST_PROTOCOL),
        "pickle-protocol-0": pickle.dumps(Payload(str(marker)), protocol=0),
        "npy": npy.getvalue(),
    }


def test_the_planted_payloads_do_run_when_unpickled(tmp_path: Path) -> None:
    """The control: these payloads are live, so their marker's absence below means
    that nothing unpickled them."""
    for name, payload in payloads(tmp_path / "proof").items():
        proof = tmp_path / "proof"
        if name == "npy":
            np.load(io.BytesIO(payload), allow_pickle=True)
        else:
            pickle.loads(payload)
        assert proof.exists(), name
        proof.unlink()


def every_call(store: Any, values: Any = None, table: str = "variables"
               ) -> List[Tuple[str, Callable[[], Any]]]:
    """Everything a reader and a writer do with a table (pushing ``values``)."""
    values = VALUES if values is None else values
    return [
        ("tables", store.tables),
        ("signature", lambda: store.signature(table)),
        ("table_info", lambda: store.table_info(table)),
        ("version", lambda: store.version(table)),
        ("pull", lambda: store.pull(table, timeout=0.2)),
        ("pull_if_newer", lambda: store.pull_if_newer(0, table, timeout=0.2)),
        ("wait_for", lambda: store.wait_for(store.version(table), table, timeout=0.1)),
        ("push", lambda: store.push(values, table=table)),
        ("create_table", lambda: store.create_table(table, values)),
    ]


def outcomes(calls: List[Tuple[str, Callable[[], Any]]]) -> Dict[str, Any]:
    """Each call's result or varsync error; any other exception fails the test."""
    seen: Dict[str, Any] = {}
    for name, call in calls:
        try:
            seen[name] = call()
        except varsync.VarsyncError as exc:
            seen[name] = exc
    return seen


def assert_no_wrong_arrays(seen: Dict[str, Any]) -> None:
    """A pull either failed or returned exactly what was pushed."""
    for name in ("pull", "pull_if_newer"):
        got = seen.get(name)
        if got is None or isinstance(got, Exception):
            continue
        values = got[1] if name == "pull_if_newer" else got
        assert np.array_equal(values["w"], VALUES["w"]), f"{name} returned wrong arrays"


# -- Redis ------------------------------------------------------------------------------------------


@pytest.fixture
def redis_table(redis_servers: Any) -> Iterator[Tuple[str, Any]]:
    """A server of the test's own with table ``variables`` at version 1 (3 chunks of 64
    KiB), and its admin client."""
    server = redis_servers()
    url = server.url + "?chunk_size=65536"
    with varsync.connect(url) as store:
        store.create_table("variables", VALUES)
        store.push(VALUES)
    with server.client() as admin:
        yield url, admin


HEAD = "varsync::variables:head"


def _chunk(admin: Any, index: int) -> str:
    return f"varsync::variables:d:{admin.hget(HEAD, 'data').decode()}:{index}"


REDIS_DAMAGE: Dict[str, Tuple[Callable[[Any], None], str]] = {
    # what is done to the stored table, and what the error says
    "chunk with bytes appended": (lambda a: a.append(_chunk(a, 0), b"extra"), "holds"),
    "chunk cut in half": (lambda a: a.set(_chunk(a, 1), a.get(_chunk(a, 1))[: 30_000]), "holds"),
    "chunk of another index in its place": (
        lambda a: a.set(_chunk(a, 0), a.get(_chunk(a, 1))), "not the chunk the head names"),
    "chunk header claiming another length": (
        lambda a: a.setrange(_chunk(a, 0), 16, struct.pack("<I", 10)), "not the chunk"),
    "data token that is not hex": (lambda a: a.hset(HEAD, "data", "not-hex!"), "not a token"),
    "epoch that varsync would not write": (lambda a: a.hset(HEAD, "epoch", "\u00e9poque"), "epoch"),
    "data token of the wrong length": (lambda a: a.hset(HEAD, "data", "abcd"), "not a token"),
    "layout claiming more bytes than the signature": (
        lambda a: a.hset(HEAD, "layout", "320000:65472:5"), "its signature needs"),
    "layout claiming another chunk size": (
        lambda a: a.hset(HEAD, "layout", "160000:40000:4"), "holds"),
    "signature claiming larger shapes": (
        lambda a: a.hset(HEAD, "sig", a.hget(HEAD, "sig").replace(b"40000", b"50000")),
        "its signature needs"),
    "signature claiming another dtype": (
        lambda a: a.hset(HEAD, "sig", a.hget(HEAD, "sig").replace(b"float32", b"float64")),
        "its signature needs"),
    "signature record of a future format version": (
        lambda a: a.hset(HEAD, "sig", SIGNATURE_FUTURE), "format version 99"),
    "version beyond 2**53": (lambda a: a.hset(HEAD, "version", str(2**53 + 1)), "version"),
    "version that is not digits": (lambda a: a.hset(HEAD, "version", " 1"), "version"),
    "stream key of another type": (
        lambda a: (a.delete("varsync::variables:events"),
                   a.set("varsync::variables:events", "x")), "another kind of value"),
}


@pytest.mark.parametrize("damage", sorted(REDIS_DAMAGE))
def test_damaged_redis_data_is_corrupt_data_never_wrong_arrays(
    redis_table: Tuple[str, Any], damage: str
) -> None:
    url, admin = redis_table
    change, message = REDIS_DAMAGE[damage]
    change(admin)
    with varsync.connect(url, timeout=5) as store:  # a reader that connects afterwards
        seen = outcomes(every_call(store))
    errors = {name: e for name, e in seen.items() if isinstance(e, Exception)
              and not (name == "wait_for" and isinstance(e, varsync.PullTimeoutError))}
    assert any(message in str(e) for e in errors.values()), errors
    # Besides CorruptDataError: a changed signature record also refuses the old values.
    expected = (varsync.CorruptDataError, varsync.SignatureMismatchError, varsync.TableExistsError)
    assert all(isinstance(e, expected) for e in errors.values()), errors
    assert_no_wrong_arrays(seen)


def test_a_reader_connected_before_the_signature_record_changed_keeps_its_signature(
    redis_table: Tuple[str, Any],
) -> None:
    url, admin = redis_table
    with varsync.connect(url, timeout=5) as store:
        assert np.array_equal(store.pull()["w"], VALUES["w"])
        admin.hset(HEAD, "sig", admin.hget(HEAD, "sig").replace(b"float32", b"int32"))
        assert np.array_equal(store.pull()["w"], VALUES["w"])  # read with what it knew


def test_foreign_keys_under_the_prefix_that_no_table_names_are_left_alone(
    redis_table: Tuple[str, Any],
) -> None:
    url, admin = redis_table
    admin.set("varsync::variables:d:0123456789abcdef:0", b"VSC1" + bytes(100))
    admin.set("varsync::someone-elses", "x")
    admin.hset("varsync::variables:headx", "fmt", "1")
    with varsync.connect(url, timeout=5) as store:
        assert store.push(VALUES) == 2
        assert np.array_equal(store.pull()["w"], VALUES["w"])
        assert store.tables() == ["variables"]
    assert admin.get("varsync::someone-elses") == b"x"


def test_nothing_varsync_reads_from_redis_is_unpickled(
    redis_table: Tuple[str, Any], tmp_path: Path
) -> None:
    url, admin = redis_table
    marker = tmp_path / "unpickled"
    original = {k: v for k, v in admin.hgetall(HEAD).items()}
    chunks = [_chunk(admin, i) for i in range(3)]
    saved = {k: admin.get(k) for k in chunks}
    places: Dict[str, Callable[[bytes], Any]] = {
        "chunk": lambda p: admin.set(chunks[0], p),
        "chunk of the same length": lambda p: admin.set(chunks[2], p.ljust(len(saved[chunks[2]]), b".")),
        "signature": lambda p: admin.hset(HEAD, "sig", p),
        "layout": lambda p: admin.hset(HEAD, "layout", p),
        "data token": lambda p: admin.hset(HEAD, "data", p),
        "epoch": lambda p: admin.hset(HEAD, "epoch", p),
        "retained": lambda p: admin.hset(HEAD, "retained", p),
        "table set": lambda p: admin.sadd("varsync::tables", p),
        "stream": lambda p: admin.xadd("varsync::variables:events", {"v": p}),
        "a key of its own": lambda p: admin.set("varsync::variables:d:payload:0", p),
    }
    tried = 0
    for place, plant in places.items():
        for kind, payload in payloads(marker).items():
            plant(payload)
            with varsync.connect(url, timeout=5) as store:
                outcomes(every_call(store))
            assert not marker.exists(), f"a pickle planted in the {place} ({kind}) ran"
            tried += 1
            admin.delete(HEAD)  # back to the table as it was, for the next place
            admin.hset(HEAD, mapping=original)
            for key, value in saved.items():
                admin.set(key, value)
            admin.srem("varsync::tables", payload)
    assert tried == len(places) * 3


# -- shm ----------------------------------------------------------------------------------------------

SHM_BIG = {"a": varsync.Spec((512, 1024), "float32")}  # 2 MiB: pulls map the segment
SHM_HEADER = struct.Struct("<8sIIQQII24x")


@pytest.fixture
def shm_table() -> Iterator[Tuple[str, Path]]:
    """Table ``variables`` at version 1, mapped by pulls; its url and directory."""
    varsync_shm = pytest.importorskip("varsync_shm")
    name = f"hostile-{uuid.uuid4().hex}"
    url = f"shm://{name}"
    with varsync.connect(url) as store:
        store.create_table("variables", SHM_BIG)
        store.push({"a": np.ones((512, 1024), np.float32)})
        table = Path(store.table_info().details["path"])
    yield url, table
    varsync_shm.remove_store(name)


def _with_header(data: bytes, **fields: int) -> bytes:
    names = ["magic", "layout", "start", "version", "total", "count", "index_length"]
    values = dict(zip(names, SHM_HEADER.unpack_from(data)))
    values.update(fields)
    return SHM_HEADER.pack(*(values[n] for n in names)) + data[SHM_HEADER.size:]


def _with_index(data: bytes, index: Any) -> bytes:
    """``data`` with its leaf index replaced (and the header's index length to match)."""
    start = SHM_HEADER.unpack_from(data)[2]
    text = index if isinstance(index, bytes) else json.dumps(index).encode()
    assert SHM_HEADER.size + len(text) <= start, "the new index must fit"
    body = text + bytes(start - SHM_HEADER.size - len(text))
    return _with_header(data[:SHM_HEADER.size] + body + data[start:], index_length=len(text))


SHM_DAMAGE: Dict[str, Tuple[Callable[[Path, bytes], None], str]] = {
    "segment truncated": (lambda p, d: p.write_bytes(d[: len(d) // 2]), "the file has"),
    "segment of a newer layout": (lambda p, d: p.write_bytes(_with_header(d, layout=3)), "layout 3"),
    "header claiming a larger file": (
        lambda p, d: p.write_bytes(_with_header(d, total=2**63)), "the file has"),
    "header claiming a huge index": (
        lambda p, d: p.write_bytes(_with_header(d, index_length=2**32 - 1)), "index"),
    "header naming another version": (
        lambda p, d: p.write_bytes(_with_header(d, version=7)), "no stable segment"),
    "index that is not JSON": (lambda p, d: p.write_bytes(_with_index(d, b"[[")), "malformed"),
    "index naming an object dtype": (
        lambda p, d: p.write_bytes(_with_index(d, [["|O", [512, 1024], 128]])), "does not fit"),
    "index naming a non-native dtype": (
        lambda p, d: p.write_bytes(_with_index(d, [[">f4", [512, 1024], 128]])), "does not fit"),
    "index naming a leaf past the end": (
        lambda p, d: p.write_bytes(_with_index(d, [["<f4", [512, 1025], 128]])), "does not fit"),
    "index naming a huge shape": (
        lambda p, d: p.write_bytes(_with_index(d, [["<f4", [2**40, 2**40], 128]])), "does not fit"),
    "index naming a negative dimension": (
        lambda p, d: p.write_bytes(_with_index(d, [["<f4", [-512, 1024], 128]])), "does not fit"),
    "index with a leaf count other than the header's": (
        lambda p, d: p.write_bytes(_with_index(d, [["<f4", [4], 128], ["<f4", [4], 192]])),
        "leaves"),
    "index claiming another shape of the same size": (
        lambda p, d: p.write_bytes(_with_index(d, [["<f4", [1024, 512], 128]])), "signature says"),
    "index claiming another dtype of the same size": (
        lambda p, d: p.write_bytes(_with_index(d, [["<i4", [512, 1024], 128]])), "signature says"),
    "a directory in the segment's place": (
        lambda p, d: (p.unlink(), p.mkdir()), "not a regular file"),
    "a FIFO in the segment's place": (
        lambda p, d: (p.unlink(), os.mkfifo(p)), "not a regular file"),
    "signature record of a future format version": (
        lambda p, d: (p.parent / "signature.json").write_text(SIGNATURE_FUTURE), "format version 99"),
    "signature record that is not text": (
        lambda p, d: (p.parent / "signature.json").write_bytes(b"\xff\xfe\x00"), "not text"),
    "signature record that is a directory": (
        lambda p, d: ((p.parent / "signature.json").unlink(), (p.parent / "signature.json").mkdir()),
        "not a regular file"),
}


@pytest.mark.parametrize("damage", sorted(SHM_DAMAGE))
def test_damaged_shm_files_are_corrupt_data_never_wrong_arrays_nor_a_hang(
    shm_table: Tuple[str, Path], damage: str
) -> None:
    url, table = shm_table
    change, message = SHM_DAMAGE[damage]
    segment = table / "seg-1"
    change(segment, segment.read_bytes())
    with varsync.connect(url, timeout=5) as store:
        seen = outcomes([c for c in every_call(store) if c[0] in ("pull", "pull_if_newer")])
    assert all(isinstance(e, varsync.CorruptDataError) for e in seen.values()), seen
    assert all(message in str(e) for e in seen.values()), seen


def test_nothing_varsync_reads_from_shm_files_is_unpickled(
    shm_table: Tuple[str, Path], tmp_path: Path
) -> None:
    url, table = shm_table
    marker = tmp_path / "unpickled"
    segment = table / "seg-1"
    original_segment = segment.read_bytes()
    original_signature = (table / "signature.json").read_bytes()
    places: Dict[str, Callable[[bytes], Any]] = {
        "segment": lambda p: segment.write_bytes(p),
        "segment of the same size": lambda p: segment.write_bytes(
            p.ljust(len(original_segment), b".")),
        "leaf index": lambda p: segment.write_bytes(_with_index(original_segment, p[:60])),
        "signature record": lambda p: (table / "signature.json").write_bytes(p),
    }
    values = {"a": np.ones((512, 1024), np.float32)}
    for place, plant in places.items():
        for kind, payload in payloads(marker).items():
            plant(payload)
            with varsync.connect(url, timeout=5) as store:
                outcomes(every_call(store, values))
            assert not marker.exists(), f"a pickle planted in the {place} ({kind}) ran"
            for leftover in table.iterdir():  # back to the table as it was
                if leftover.name.startswith(("seg-", "spare-", ".fill-")):
                    leftover.unlink()
            segment.write_bytes(original_segment)
            (table / "current").unlink()
            (table / "current").symlink_to("seg-1")
            (table / "signature.json").write_bytes(original_signature)


# -- memory and Reverb ---------------------------------------------------------------------------------


def test_a_memory_table_whose_signature_record_is_of_a_future_format_version_is_corrupt_data() -> None:
    from varsync._backends import memory

    name = f"hostile-{uuid.uuid4().hex}"
    with varsync.connect(f"memory://{name}") as store:
        store.create_table("variables", VALUES)
        store.push(VALUES)
        memory._STORES[name].tables[("", "variables")].signature = SIGNATURE_FUTURE  # planted
    with varsync.connect(f"memory://{name}") as store:
        for call in (store.pull, store.version, lambda: store.push(VALUES)):
            with pytest.raises(varsync.CorruptDataError, match="upgrade varsync"):
                call()


def test_a_reverb_table_of_strings_holding_a_pickle_is_refused_and_never_unpickled(
    tmp_path: Path,
) -> None:
    reverb = pytest.importorskip("reverb")
    tf = pytest.importorskip("tensorflow")
    marker = tmp_path / "unpickled"
    server = reverb.Server([reverb.Table(
        "variables", reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_size=1,
        rate_limiter=reverb.rate_limiters.MinSize(1), max_times_sampled=0,
        signature={"w": tf.TensorSpec((), tf.string)},
    )])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert([np.array(payloads(marker)["pickle"], dtype=object)], {"variables": 1.0})
        with varsync.connect(f"reverb://localhost:{server.port}", timeout=5) as store:
            seen = outcomes(every_call(store)[1:7])
        assert all(isinstance(e, varsync.SignatureError) for e in seen.values()), seen
        assert not marker.exists()
    finally:
        server.stop()


# -- by construction ------------------------------------------------------------------------------------

UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve",
              "jsonpickle"}


def _sources() -> List[Path]:
    return sorted((ROOT / "varsync").rglob("*.py")) + sorted(
        (ROOT / "plugins" / "varsync-shm" / "varsync_shm").rglob("*.py"))


def test_no_varsync_module_can_unpickle() -> None:
    """No module of varsync or of the shm plugin imports an unpickler, calls ``eval`` or
    ``np.load`` without ``allow_pickle=False`` (the one call, in the CLI, reads a user's
    spec file): stored bytes become arrays only as raw bytes with dtypes from the
    signature (and, in shm, a checked JSON index)."""
    sources = _sources()
    assert len(sources) > 20
    found = []
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, a.name) for a in node.names if a.name.split(".")[0] in UNPICKLERS]
            elif isinstance(node, ast.ImportFrom):
                if (node.module or "").split(".")[0] in UNPICKLERS:
                    found.append((path, node.module))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base, name = node.func.value, node.func.attr
                if name not in ("load", "loads") or not isinstance(base, ast.Name):
                    continue
                refused = any(k.arg == "allow_pickle" and isinstance(k.value, ast.Constant)
                              and k.value.value is False for k in node.keywords)
                if base.id in UNPICKLERS or (base.id in ("np", "numpy") and not refused):
                    found.append((path, f"{base.id}.{name}"))
            elif isinstance(node, ast.Name) and node.id in ("eval", "exec"):
                found.append((path, node.id))
    assert found == []
