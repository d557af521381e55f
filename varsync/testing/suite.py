"""The conformance tests themselves; see :mod:`varsync.testing` for how to use them."""

from __future__ import annotations

import collections
import multiprocessing
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping

import numpy as np
import pytest

import varsync
from varsync import nest as nest_lib
from varsync.config import resolve
from varsync.registry import backend_class
from varsync.testing.blocking import BlockingCall, code_of
from varsync.testing.values import assert_bit_equal, check_consistent, filled

Point = collections.namedtuple("Point", ["x", "y"])

#: Every dtype a TF-Agents user pushes, with values that stress bit-exactness.
DTYPE_VALUES: Dict[str, List[Any]] = {
    "bool": [True, False, True],
    "int8": [-128, 127, 0, -1],
    "int16": [-32768, 32767, 0, -1],
    "int32": [-(2**31), 2**31 - 1, 0, -1],
    "int64": [-(2**63), 2**63 - 1, 0, -1],
    "uint8": [0, 255, 1, 128],
    "uint16": [0, 65535, 1, 32768],
    "uint32": [0, 2**32 - 1, 1, 2**31],
    "uint64": [0, 2**64 - 1, 1, 2**63],
    "float16": [0.0, -0.0, np.inf, -np.inf, np.nan, 6.0e-8, 65504.0],
    "float32": [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0e-45, 3.4e38],
    "float64": [0.0, -0.0, np.inf, -np.inf, np.nan, 5.0e-324, 1.7e308],
    "complex64": [0j, complex(np.nan, -0.0), complex(np.inf, 1.0e-45), 1 + 2j],
    "complex128": [0j, complex(-0.0, np.nan), complex(5.0e-324, -np.inf), 1 - 2j],
}

TableMaker = Callable[[Mapping[str, Any]], str]

#: How long a waiter must stay blocked, with nothing pushed, before a test pushes: a wait
#: that returns without a push (at once, or after a poll) shows itself meanwhile.
BLOCKED_SECONDS = 0.2


def _wait_codes(container: Any) -> List[Any]:
    """The code of the container's backend's ``wait``: a thread running it is waiting.
    (A ``wait`` without Python code: the container's calls that make it, instead.)"""
    code = code_of(type(container.backend).wait)
    if code is not None:
        return [code]
    return [code_of(varsync.VariableContainer.wait_for), code_of(varsync.VariableContainer._pull_flat)]


class _Base:
    """Fixtures shared by the mixins; ``url`` is the one a backend author must give."""

    # On the class, so the tests of every subclass carry the marker too.
    pytestmark = [pytest.mark.varsync_conformance]

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError(
            "a conformance test class must define a `url` fixture returning the URL of a "
            "fresh, empty namespace of the backend under test"
        )

    @pytest.fixture
    def connect_options(self) -> Dict[str, Any]:
        return {}

    @pytest.fixture
    def backend_cls(self, url: str, connect_options: Dict[str, Any]) -> type:
        return backend_class(resolve(url, dict(connect_options)).scheme)

    @pytest.fixture
    def connect(
        self, connect_options: Dict[str, Any]
    ) -> Iterator[Callable[..., varsync.VariableContainer]]:
        """``connect(url, **more_options)``: a container, closed at teardown."""
        made: List[varsync.VariableContainer] = []

        def _connect(url: str, **more: Any) -> varsync.VariableContainer:
            container = varsync.connect(url, **{**connect_options, **more})
            made.append(container)
            return container

        yield _connect
        for container in made:
            container.close()

    @pytest.fixture
    def make_tables(self, url: str, connect: Callable[..., Any], backend_cls: type) -> TableMaker:
        """``make({name: signature}) -> url`` with those tables created there."""

        def make(tables: Mapping[str, Any]) -> str:
            if not backend_cls.supports_create_table:
                raise NotImplementedError(
                    f"{backend_cls.__name__} cannot create tables from a client: override "
                    "the `make_tables` fixture to provide them"
                )
            container = connect(url)
            for name, signature in tables.items():
                container.create_table(name, signature)
            return url

        return make

    @pytest.fixture
    def store(self, make_tables: TableMaker, connect: Callable[..., Any]) -> varsync.VariableContainer:
        """A container with table ``variables`` holding a small mixed nest."""
        return connect(make_tables({"variables": SMALL}))


SMALL = {
    "policy": [varsync.Spec((3, 2), "float32"), varsync.Spec((2,), "float32")],
    "train_step": varsync.Spec((), "int64"),
}


class TableTests(_Base):
    """Tables: creation, listing, info, unknown names."""

    def test_created_table_is_listed_with_its_signature(self, store: Any) -> None:
        assert "variables" in store.tables()
        info = store.table_info("variables")
        assert info.name == "variables"
        assert info.version == 0
        assert info.nbytes == 3 * 2 * 4 + 2 * 4 + 8
        assert varsync.flatten(info.signature) == varsync.flatten(SMALL)

    @pytest.fixture
    def created_by_client(self, url: str, connect: Any, backend_cls: type) -> Any:
        """A container with table ``t`` created by ``create_table`` (skips where clients
        cannot create tables)."""
        if not backend_cls.supports_create_table:
            pytest.skip("backend cannot create tables from a client")
        container = connect(url)
        container.create_table("t", SMALL)
        return container

    def test_create_table_again_with_same_signature_is_a_no_op(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 3), table="t")
        again = connect(url).create_table("t", {"train_step": np.int64(0), "policy": (
            np.zeros((3, 2), np.float32), np.zeros(2, np.float32))})
        assert varsync.flatten(again) == varsync.flatten(SMALL)
        assert container.version("t") == 1

    def test_create_table_with_another_signature_is_refused(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 5), table="t")
        with pytest.raises(varsync.TableExistsError):
            connect(url).create_table("t", {"train_step": varsync.Spec((), "int32")})
        assert container.version("t") == 1
        assert_bit_equal(connect(url).pull("t"), filled(SMALL, 5))

    def test_unknown_table_raises_key_error_naming_existing_tables(self, store: Any) -> None:
        for call in (
            lambda: store.pull("missing", timeout=1),
            lambda: store.push(filled(SMALL, 1), table="missing"),
            lambda: store.version("missing"),
            lambda: store.pull_if_newer(0, "missing"),
            lambda: store.table_info("missing"),
        ):
            with pytest.raises(varsync.TableNotFoundError) as caught:
                call()
            assert isinstance(caught.value, KeyError)
            assert "missing" in str(caught.value) and "variables" in str(caught.value)

    def test_tables_are_independent(self, make_tables: TableMaker, connect: Any) -> None:
        container = connect(make_tables({"a": SMALL, "b": {"x": varsync.Spec((4,), "int32")}}))
        assert container.push(filled(SMALL, 1), table="a") == 1
        assert container.push(filled(SMALL, 2), table="a") == 2
        assert container.version("b") == 0
        assert container.push({"x": np.arange(4, dtype=np.int32)}, table="b") == 1
        assert container.version("a") == 2
        assert_bit_equal(container.pull("a"), filled(SMALL, 2))
        assert_bit_equal(container.pull("b"), {"x": np.arange(4, dtype=np.int32)})


class RoundTripTests(_Base):
    """Values come back bit-exact, in the signature's structure."""

    def test_every_supported_dtype_round_trips_bit_exactly(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {name: np.array(items, dtype=name) for name, items in DTYPE_VALUES.items()}
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_scalars_zero_d_and_zero_size_arrays_round_trip(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {
            "python_int": 7,
            "python_float": 0.5,
            "python_bool": True,
            "numpy_scalar": np.float32(2.5),
            "zero_d": np.array(-3, dtype=np.int16),
            "empty": np.zeros((0,), np.float32),
            "empty_2d": np.zeros((3, 0), np.int64),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_python_scalars_take_the_table_dtype(self, store: Any) -> None:
        values = {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)], "train_step": 12}
        store.push(values)
        pulled = store.pull()
        assert pulled["train_step"].dtype == np.int64 and int(pulled["train_step"]) == 12

    def test_non_contiguous_and_big_endian_inputs_round_trip(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        base = np.arange(48, dtype=np.float64).reshape(6, 8)
        values = {
            "strided": base[::2, ::3],
            "transposed": base.T,
            "fortran": np.asfortranarray(base),
            "big_endian": np.arange(5, dtype=">i4"),
            "big_endian_float": np.linspace(-1, 1, 7).astype(">f8"),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        pulled = container.pull()
        assert_bit_equal(pulled, values)
        assert all(leaf.dtype.isnative for leaf in varsync.flatten(pulled))

    def test_nested_structure_comes_back_in_the_signature_structure(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        values = {
            "b": [np.zeros(2, np.float32), (np.int32(1), np.ones((1, 1), np.float64))],
            "a": {"z": np.uint8(3), "y": Point(x=np.float32(1), y=[np.int64(2)])},
            "c": (),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        pulled = container.pull()
        assert isinstance(pulled, dict) and sorted(pulled) == ["a", "b", "c"]
        assert isinstance(pulled["b"], list) and isinstance(pulled["b"][1], tuple)
        point = pulled["a"]["y"]
        assert type(point).__name__ == "Point" and point._fields == ("x", "y")
        assert isinstance(point.y, list)
        assert pulled["c"] == ()
        assert_bit_equal(pulled, values)

    def test_list_and_tuple_are_interchangeable_in_pushes(self, store: Any) -> None:
        as_tuple = {"policy": (np.ones((3, 2), np.float32), np.ones(2, np.float32)), "train_step": 1}
        store.push(as_tuple)
        pulled = store.pull()
        assert isinstance(pulled["policy"], list)  # the signature's type, not the push's
        assert_bit_equal(pulled["policy"], [np.ones((3, 2), np.float32), np.ones(2, np.float32)])

    def test_changing_pushed_arrays_afterwards_does_not_change_the_table(self, store: Any) -> None:
        values = filled(SMALL, 4)
        store.push(values)
        values["policy"][0][...] = -1
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_changing_pulled_arrays_does_not_change_the_table(self, store: Any) -> None:
        store.push(filled(SMALL, 4))
        for leaf in varsync.flatten(store.pull()):
            if leaf.flags.writeable:
                leaf[...] = 9
            else:
                with pytest.raises(ValueError):
                    leaf[...] = 9
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_unlocking_a_pulled_arrays_base_does_not_change_the_table(self, store: Any) -> None:
        store.push(filled(SMALL, 4))
        for leaf in varsync.flatten(store.pull()):
            array: Any = leaf
            while isinstance(array, np.ndarray):  # the leaf, then every array it views
                try:
                    array.flags.writeable = True
                except ValueError:
                    pass  # refused: as it should be for memory the store shares
                if array.flags.writeable:
                    array.reshape(-1).view(np.uint8)[...] = 0x5A
                array = array.base
        assert_bit_equal(store.pull(), filled(SMALL, 4))

    def test_update_assigns_in_place_into_numpy_arrays(self, store: Any) -> None:
        store.push(filled(SMALL, 6))
        targets = filled(SMALL, 0)
        originals = varsync.flatten(targets)
        assert store.update(targets) == 1
        assert all(a is b for a, b in zip(varsync.flatten(targets), originals))
        assert_bit_equal(targets, filled(SMALL, 6))

    def test_update_checks_every_variable_before_assigning_any(self, store: Any) -> None:
        store.push(filled(SMALL, 6))
        targets = filled(SMALL, 0)
        targets["train_step"] = np.zeros((), np.int32)  # wrong dtype, last in flat order
        with pytest.raises(varsync.SignatureMismatchError):
            store.update(targets)
        assert not targets["policy"][0].any() and not targets["policy"][1].any()

    def test_large_nest_round_trips(self, make_tables: TableMaker, connect: Any) -> None:
        rng = np.random.default_rng(0)
        values = {
            "big": rng.standard_normal((1024, 2048)).astype(np.float32),  # 8 MiB
            "small": rng.integers(0, 100, size=7),
        }
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)

    def test_many_variables_round_trip(self, make_tables: TableMaker, connect: Any) -> None:
        values = {f"layer_{i:03d}": np.full((i % 7 + 1,), i, np.float32) for i in range(500)}
        container = connect(make_tables({"variables": values}))
        container.push(values)
        assert_bit_equal(container.pull(), values)


class ValidationTests(_Base):
    """A push that does not match the signature raises and changes nothing."""

    BAD_PUSHES = {
        "wrong dtype": {"policy": [np.ones((3, 2), np.float64), np.ones(2, np.float32)], "train_step": 1},
        "wrong shape": {"policy": [np.ones((2, 3), np.float32), np.ones(2, np.float32)], "train_step": 1},
        "missing key": {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)]},
        "extra key": {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)], "train_step": 1, "x": 1},
        "short list": {"policy": [np.ones((3, 2), np.float32)], "train_step": 1},
        "object array": {"policy": [np.ones((3, 2), np.float32), np.array([None, 1], dtype=object)], "train_step": 1},
        "ragged list": {"policy": [np.ones((3, 2), np.float32), [[1.0], [2.0, 3.0]]], "train_step": 1},
        "string": {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)], "train_step": "1"},
        "float into int": {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)], "train_step": 1.5},
        "None": {"policy": [np.ones((3, 2), np.float32), None], "train_step": 1},
    }

    @pytest.mark.parametrize("case", sorted(BAD_PUSHES))
    def test_rejected_push_leaves_the_table_unchanged(self, store: Any, case: str) -> None:
        store.push(filled(SMALL, 1))
        with pytest.raises(varsync.SignatureMismatchError) as caught:
            store.push(self.BAD_PUSHES[case])
        assert isinstance(caught.value, ValueError)
        assert store.version() == 1
        assert_bit_equal(store.pull(), filled(SMALL, 1))

    def test_mismatch_message_names_the_path_and_both_sides(self, store: Any) -> None:
        with pytest.raises(varsync.SignatureMismatchError) as caught:
            store.push(self.BAD_PUSHES["wrong dtype"])
        message = str(caught.value)
        assert "['policy'][0]" in message
        assert "float32" in message and "float64" in message
        assert store.version() == 0


class VersionTests(_Base):
    """Versions, change detection and bounded waits."""

    def test_versions_start_at_zero_and_increase_by_push(self, store: Any) -> None:
        assert store.version() == 0
        seen = [store.push(filled(SMALL, i)) for i in range(1, 6)]
        assert seen == [1, 2, 3, 4, 5]
        assert store.version() == 5

    def test_pull_if_newer_returns_only_newer_values(self, store: Any) -> None:
        assert store.pull_if_newer(0) is None
        store.push(filled(SMALL, 1))
        version, values = store.pull_if_newer(0)
        assert version == 1
        assert_bit_equal(values, filled(SMALL, 1))
        assert store.pull_if_newer(1) is None
        store.push(filled(SMALL, 2))
        version, values = store.pull_if_newer(1)
        assert version == 2
        assert_bit_equal(values, filled(SMALL, 2))

    def test_a_version_above_the_tables_is_reported_as_a_reset_not_waited_on(
        self, store: Any
    ) -> None:
        store.push(filled(SMALL, 1))
        for call in (lambda: store.pull_if_newer(7), lambda: store.wait_for(7, timeout=20)):
            with pytest.raises(varsync.TableResetError, match="version 1"):
                call()
        assert store.pull_if_newer(0)[0] == 1

    def test_pull_of_an_empty_table_times_out(self, store: Any) -> None:
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError) as caught:
            store.pull(timeout=0.3)
        assert isinstance(caught.value, TimeoutError)
        assert time.monotonic() - started < 10  # bounded: it did not hang

    def test_timeout_zero_means_do_not_wait_for_a_push(self, store: Any) -> None:
        for call in (lambda: store.pull(timeout=0), lambda: store.wait_for(0, timeout=0)):
            started = time.monotonic()
            with pytest.raises(varsync.PullTimeoutError):
                call()
            assert time.monotonic() - started < 5
        store.push(filled(SMALL, 2))
        assert_bit_equal(store.pull(timeout=0), filled(SMALL, 2))
        version, values = store.pull_if_newer(0, timeout=0)
        assert version == 1
        assert_bit_equal(values, filled(SMALL, 2))
        assert store.pull_if_newer(1, timeout=0) is None
        assert store.wait_for(0, timeout=0) == 1
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0)
        targets = filled(SMALL, 0)
        assert store.update(targets, timeout=0) == 1
        assert_bit_equal(targets, filled(SMALL, 2))

    def test_wait_for_times_out_when_nothing_is_pushed(self, store: Any) -> None:
        store.push(filled(SMALL, 1))
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0.3)
        assert store.wait_for(0, timeout=0.3) == 1

    def test_wait_for_wakes_when_another_container_pushes(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        writer.push(filled(SMALL, 1))
        waiter = BlockingCall(lambda: reader.wait_for(1, timeout=20), "wait_for(1)")
        # Push only once the waiter is known to be waiting: inside the backend's wait,
        # and still there a while later (a wait that does not block returns meanwhile).
        waiter.wait_until_inside(_wait_codes(reader))
        waiter.assert_still_blocked(BLOCKED_SECONDS)
        assert writer.push(filled(SMALL, 2)) == 2
        assert waiter.result() == 2

    def test_pull_waits_for_the_first_push(self, make_tables: TableMaker, connect: Any) -> None:
        url = make_tables({"variables": SMALL})
        reader, writer = connect(url), connect(url)
        waiter = BlockingCall(lambda: reader.pull(timeout=20), "pull() of an empty table")
        waiter.wait_until_inside(_wait_codes(reader))
        waiter.assert_still_blocked(BLOCKED_SECONDS)
        writer.push(filled(SMALL, 3))
        assert_bit_equal(waiter.result(), filled(SMALL, 3))

    def test_two_containers_see_each_others_pushes(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": SMALL})
        a, b = connect(url), connect(url)
        assert a.push(filled(SMALL, 1)) == 1
        assert b.version() == 1
        assert b.push(filled(SMALL, 2)) == 2
        version, values = a.pull_if_newer(1)
        assert version == 2
        assert_bit_equal(values, filled(SMALL, 2))


CONSISTENCY = {
    "a": varsync.Spec((256, 64), "float32"),
    "b": [varsync.Spec((1000,), "float32"), varsync.Spec((3, 3), "float64")],
    "step": varsync.Spec((), "int64"),
}


def _write_versions(url: str, options: Dict[str, Any], table: str, start: int, count: int) -> None:
    """Child process: push ``count`` consistent nests (the numbers after ``start``)."""
    with varsync.connect(url, **options) as container:
        for number in range(start + 1, start + count + 1):
            container.push(filled(CONSISTENCY, number), table=table)


class ConcurrencyTests(_Base):
    """Readers never observe a mix of two versions while a writer pushes."""

    PUSHES = 150
    READERS = 3

    def _read_until(self, container: Any, stop: threading.Event, problems: List[str]) -> int:
        """Pull every new version until ``stop`` is set and nothing newer is left; return
        the last version seen (0 if none was)."""
        last_version, reads = 0, 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and reads < 10_000:
            finished = stop.is_set()
            got = container.pull_if_newer(last_version)
            if got is not None:
                version, values = got
                reads += 1
                if version <= last_version:
                    problems.append(f"version went from {last_version} to {version}")
                number = check_consistent(values)
                if number < version:  # push n made version n: never an older value as newer
                    problems.append(f"version {version} came with the value of push {number}")
                last_version = version
            elif finished:
                break
        if reads == 0:
            problems.append("a reader saw no version at all while the writer pushed")
        return last_version

    def _run_readers(self, url: str, connect: Any, writer: Callable[[], None]) -> List[str]:
        """Run :attr:`READERS` reader threads while ``writer()`` pushes; the problems they
        saw, including a reader whose last version is not the table's final one."""
        problems: List[str] = []
        last_seen: List[int] = []
        stop = threading.Event()
        readers = [
            threading.Thread(target=self._guard, args=(connect(url), stop, problems, last_seen))
            for _ in range(self.READERS)
        ]
        for thread in readers:
            thread.start()
        try:
            writer()
        finally:
            stop.set()
            for thread in readers:
                thread.join(90)
        assert not any(t.is_alive() for t in readers), "a reader did not finish"
        final = connect(url).version()
        problems += [
            f"a reader's last version was {seen}, not the table's final {final}"
            for seen in last_seen if seen != final
        ]
        return problems

    def _guard(
        self, container: Any, stop: threading.Event, problems: List[str], last_seen: List[int]
    ) -> None:
        try:
            last_seen.append(self._read_until(container, stop, problems))
        except AssertionError as exc:
            problems.append(str(exc))
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")

    def test_readers_never_see_a_mix_of_two_versions(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        writer = connect(url)

        def write() -> None:
            for number in range(1, self.PUSHES + 1):
                writer.push(filled(CONSISTENCY, number))

        assert self._run_readers(url, connect, write) == []
        assert check_consistent(writer.pull()) == self.PUSHES

    def test_readers_never_see_a_mix_while_another_process_writes(
        self, make_tables: TableMaker, connect: Any, connect_options: Dict[str, Any],
        backend_cls: type,
    ) -> None:
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        url = make_tables({"variables": CONSISTENCY})
        context = multiprocessing.get_context("spawn")

        def write() -> None:
            child = context.Process(
                target=_write_versions,
                args=(url, dict(connect_options), "variables", 0, self.PUSHES),
            )
            child.start()
            child.join(120)
            if child.is_alive():
                child.kill()
                child.join()
            assert child.exitcode == 0, f"writer process exited with {child.exitcode}"

        assert self._run_readers(url, connect, write) == []
        assert check_consistent(connect(url).pull()) == self.PUSHES


def __getattr__(name: str) -> Any:
    # ConformanceTests moved to varsync.testing.conformance (it gathers this module's
    # mixins and the fault tests); this name keeps old imports working.
    if name == "ConformanceTests":
        from varsync.testing.conformance import ConformanceTests

        return ConformanceTests
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
