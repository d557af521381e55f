"""The 0.2-compatibility door: "A backend written to the 0.2 protocol keeps working
unchanged for one release through an adapter applied once at registration (with a
DeprecationWarning naming what to change), not through signature inspection on the hot
path."

The 0.2 references of the mutation tests (``tests/conformance/mutants/legacy_reference*.py``, the code
of ``tests/conformance/mutants/reference*.py`` before protocol 1) pass the whole conformance suite
through the adapter, registered as a plugin registers them (``mutants.plugin``); the
registry warns once per class and hands out the adapter; a 0.1-style backend (``read``
without ``specs``) works; and a protocol-1 class that declares an ability wrongly is
refused where it is registered or defined.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import test_suite_catches_broken_backends as mutation
from mutants.plugin import LEGACY_LEAF_REFERENCE_SCHEME, LEGACY_REFERENCE_SCHEME
from mutants.reference import SqliteStore
from mutants.reference_leaves import SqliteLeafStore, start_new_history

import varsync
from varsync.backend import (
    Backend,
    BackendRegistry,
    ConfigurationError,
    SupportsBlockingWait,
    SupportsLeafSubsets,
    SupportsLeafVersions,
)
from varsync._backends.base import reads_leaf_subsets
from varsync._backends.legacy import LegacyBackend
from varsync._container import VariableContainer

#: What the registry's warning must name: the renamed method and the new answers.
WHAT_TO_CHANGE = r"rename version\(name\) to head\(name, deadline\) returning Head"


# -- the whole suite, through the adapter ---------------------------------------------------

#: The suite's tests a 0.2 backend fails through the adapter, named rather than hidden. The
#: two-histories test asks the backend itself, after the store lost the table, for a head
#: whose epoch is the new history's: a 0.2 backend cannot say (``version()`` names no
#: epoch, and the adapter takes it from ``history_of``, the history of the old backend's
#: last answer: ``None`` for ``vsqlite-legacy://``, which has none, the old epoch for
#: ``vsqlite-leaves-legacy://`` until a read moves it). What a user sees, the container's
#: answers across the two histories, is right:
#: :func:`test_a_legacy_reader_across_two_histories_gets_the_new_one_whole` shows it.
LEGACY_GAPS = ["test_a_reader_never_assembles_leaves_from_two_histories"]


def test_the_legacy_reference_passes_the_whole_suite_through_the_adapter(
    tmp_path: Path,
) -> None:
    skipped = mutation.passes_the_whole_suite(tmp_path, LEGACY_REFERENCE_SCHEME, LEGACY_GAPS)
    assert skipped == sorted(
        mutation.ENGINE_SKIPS + mutation.READER_REGISTRY_SKIPS + mutation.LEAF_VERSION_SKIPS
        + mutation.ELEMENT_DELTA_SKIPS + mutation.SHARDED_SKIPS + mutation.LEAF_SUBSET_SKIPS
    )


def test_the_legacy_leaf_reference_passes_the_whole_suite_through_the_adapter(
    tmp_path: Path,
) -> None:
    skipped = mutation.passes_the_whole_suite(
        tmp_path, LEGACY_LEAF_REFERENCE_SCHEME, LEGACY_GAPS
    )
    assert skipped == sorted(
        mutation.ENGINE_SKIPS + mutation.READER_REGISTRY_SKIPS + mutation.ELEMENT_DELTA_SKIPS
        + mutation.LEAF_SUBSET_SKIPS
        + ["test_leaf_versions_without_the_ability_is_a_clear_error"]
    )


@pytest.mark.parametrize(
    "target",
    ["mutants.legacy_reference:SqliteBackend", "mutants.legacy_reference_leaves:SqliteLeafBackend"],
)
def test_a_legacy_reader_across_two_histories_gets_the_new_one_whole(
    legacy_modules: Tuple[Any, Any], tmp_path: Path, target: str
) -> None:
    """The container-level half of the suite's two-histories test, through the adapter:
    a reader holding version 1 (and variables updated to it) of a table the store then
    lost, made again and pushed past 1, gets the new history's value, never leaves of
    both."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = _registered(target)
    url = f"vsqlite-legacy://{tmp_path / 'store.db'}"
    signature = {"a": np.zeros(4, np.int64), "b": [np.zeros(3, np.int32), np.zeros(2)]}

    def filled(*numbers: int) -> Dict[str, Any]:
        a, b0, b1 = numbers
        return {"a": np.full(4, a), "b": [np.full(3, b0, np.int32), np.full(2, float(b1))]}

    def numbers(values: Any) -> List[int]:
        return [int(np.unique(leaf)[0]) for leaf in varsync.flatten(values)]

    reader, writer = (
        VariableContainer(cls(url, timeout=10, namespace=""), timeout=10) for _ in range(2)
    )
    try:
        reader.create_table("variables", signature)
        reader.push(filled(1, 1, 1))
        version, held = reader.pull_if_newer(0)
        targets = filled(0, 0, 0)
        reader.update(targets)
        start_new_history(url, "variables")
        writer.create_table("variables", signature)
        writer.push(filled(5, 5, 5))
        for k in range(6, 9):
            writer.push_leaves({("a",): np.full(4, k)})
        try:
            answer = reader.pull_if_newer(version, held=held)
        except varsync.TableResetError:
            answer = reader.pull_if_newer(0)
        assert answer is not None and numbers(answer[1]) == [8, 5, 5]
        assert reader.update(targets) == 4
        assert numbers(targets) == [8, 5, 5]
    finally:
        reader.close()
        writer.close()


# -- registration -------------------------------------------------------------------------


def _registered(target: str) -> type:
    """The class a fresh registry hands out for ``target`` (``"module:Class"``)."""
    registry = BackendRegistry()
    registry.add("old", target)
    return registry.backend_class("old")


@pytest.fixture
def legacy_modules() -> Tuple[Any, Any]:
    """The 0.2 references' modules, imported (their deprecated imports warn here, not
    in the tests of the registry's warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mutants import legacy_reference, legacy_reference_leaves
    return legacy_reference, legacy_reference_leaves


@pytest.mark.parametrize(
    ("target", "abilities"),
    [
        ("mutants.legacy_reference:SqliteBackend", ()),
        ("mutants.legacy_reference_leaves:SqliteLeafBackend", (SupportsLeafVersions,)),
    ],
)
def test_registering_a_0_2_backend_warns_once_and_hands_out_the_adapter(
    legacy_modules: Tuple[Any, Any], target: str, abilities: Tuple[type, ...]
) -> None:
    module = legacy_modules[0] if "leaves" not in target else legacy_modules[1]
    old = getattr(module, target.partition(":")[2])
    registry = BackendRegistry()
    registry.add("old", target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls = registry.backend_class("old")
        assert registry.backend_class("old") is cls  # adapted once, the second call too
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in deprecations]
    message = str(deprecations[0].message)
    assert target in message and "0.2 Backend protocol" in message
    assert re.search(WHAT_TO_CHANGE, message), message
    for rest in ("history_of/version_within", "SupportsLeafVersions", "absolute deadline"):
        assert rest in message, message
    assert issubclass(cls, LegacyBackend) and issubclass(cls, Backend)
    assert cls.legacy_class is old
    assert cls is not old and not issubclass(cls, old)
    for ability in (SupportsLeafVersions, SupportsBlockingWait, SupportsLeafSubsets):
        assert issubclass(cls, ability) == (ability in abilities)
    assert cls.supports_leaf_versions == old.supports_leaf_versions
    assert not cls.supports_leaf_subsets  # an ability of protocol 1 only
    assert (cls.shared_across_processes, cls.persistent, cls.max_push_bytes) == (
        True, True, 16 * 2**20
    )


def test_the_adapter_inspects_no_signature_on_calls(
    legacy_modules: Tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = _registered("mutants.legacy_reference_leaves:SqliteLeafBackend")

    def no_inspection(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.signature called after registration")

    monkeypatch.setattr(inspect, "signature", no_inspection)
    container = VariableContainer(
        cls(f"vsqlite-leaves-legacy://{tmp_path / 'store.db'}", timeout=10, namespace=""),
        timeout=10,
    )
    try:
        container.create_table("variables", {"a": np.zeros(3), "b": np.zeros(2, np.int32)})
        container.push({"a": np.ones(3), "b": np.full(2, 2, np.int32)})
        version, held = container.pull_if_newer(0)
        container.push_leaves({("a",): np.full(3, 3.0)})
        version, values = container.pull_if_newer(version, held=held)
        assert version == 2
        assert values["a"].tolist() == [3.0] * 3 and values["b"].tolist() == [2, 2]
        assert container.wait_for(1, timeout=1) == 2
        assert container.leaf_versions()[0] == 2
    finally:
        container.close()


# -- a 0.1-style backend -----------------------------------------------------------------


class FirstProtocolBackend:
    """A backend of the 0.1 protocol, in memory: ``read(name, newer_than, timeout)``
    without ``specs``, no ``Backend`` base class, no epochs at all."""

    def __init__(self, url: str, *, timeout: Optional[float], namespace: str) -> None:
        self.url, self.timeout, self.namespace = url, timeout, namespace
        self.reads: List[Tuple[str, int, Optional[float]]] = []
        self._tables: Dict[str, Tuple[str, int, Optional[List[np.ndarray]]]] = {}

    def create_table(self, name: str, signature: str, specs: Sequence[Any]) -> str:
        return self._tables.setdefault(name, (signature, 0, None))[0]

    def signature(self, name: str) -> Optional[str]:
        table = self._tables.get(name)
        return None if table is None else table[0]

    def tables(self) -> List[str]:
        return sorted(self._tables)

    def version(self, name: str) -> int:
        return self._tables[name][1]

    def write(self, name: str, arrays: Sequence[np.ndarray], specs: Sequence[Any]) -> int:
        signature, version, _ = self._tables[name]
        self._tables[name] = (signature, version + 1, [np.array(a) for a in arrays])
        return version + 1

    def read(
        self, name: str, newer_than: int, timeout: Optional[float]
    ) -> Tuple[int, Optional[List[np.ndarray]]]:
        self.reads.append((name, newer_than, timeout))
        _, version, arrays = self._tables[name]
        return (version, None) if version <= newer_than else (version, arrays)


def test_a_first_protocol_backend_without_specs_in_read_works() -> None:
    with pytest.warns(DeprecationWarning, match=WHAT_TO_CHANGE):
        cls = _registered(f"{__name__}:FirstProtocolBackend")
    assert issubclass(cls, LegacyBackend) and not cls._read_takes_specs
    container = VariableContainer(cls("old://first", timeout=5, namespace=""), timeout=5)
    try:
        container.create_table("variables", {"w": np.zeros(4, np.float32)})
        assert container.version() == 0
        assert container.push({"w": np.arange(4, dtype=np.float32)}) == 1
        assert container.pull()["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert container.pull_if_newer(1) is None
        assert container.push({"w": np.ones(4, np.float32)}) == 2
        version, values = container.pull_if_newer(1, timeout=2)
        assert (version, values["w"].tolist()) == (2, [1.0] * 4)
        assert container.wait_for(1, timeout=1) == 2
        with pytest.raises(varsync.PullTimeoutError):
            container.wait_for(2, timeout=0.2)
        reads = container.backend.legacy.reads
        assert reads and all(isinstance(t, float) and t <= 5 for _, _, t in reads)
    finally:
        container.close()


# -- protocol-1 classes that declare an ability wrongly ---------------------------------


class HalfLeaves(SqliteStore, SupportsLeafVersions):
    """Subclasses the ability but implements only one of its three methods."""

    def leaf_versions(self, name: str, deadline: float) -> Tuple[Any, List[int]]:
        return self.head(name, deadline), []


def test_an_ability_declared_without_its_methods_is_refused_at_registration() -> None:
    with pytest.raises(ConfigurationError) as caught:
        _registered(f"{__name__}:HalfLeaves")
    message = str(caught.value)
    assert "declares methods it does not implement" in message
    assert "SupportsLeafVersions: read_leaves, write_leaves" in message
    assert "leaf_versions" not in message.partition("SupportsLeafVersions:")[2]


class HalfSubsets(SqliteStore, SupportsLeafSubsets):
    """Declares reads of chosen leaves with the methods of leaf versions but without its
    own (never made: registration refuses it)."""

    write_leaves = SqliteLeafStore.write_leaves
    read_leaves = SqliteLeafStore.read_leaves
    leaf_versions = SqliteLeafStore.leaf_versions


def test_an_ability_extending_another_names_its_own_missing_method() -> None:
    with pytest.raises(ConfigurationError) as caught:
        _registered(f"{__name__}:HalfSubsets")
    message = str(caught.value)
    assert "SupportsLeafSubsets: read_leaf_subset" in message
    assert "SupportsLeafVersions" not in message


def test_reads_leaf_subsets_says_whether_a_backend_has_the_ability(tmp_path: Path) -> None:
    assert reads_leaf_subsets(varsync.connect("memory://subsets").backend)
    url = f"vsqlite://{tmp_path / 'store.db'}"
    assert not reads_leaf_subsets(SqliteStore(url, timeout=10, namespace=""))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = _registered("mutants.legacy_reference_leaves:SqliteLeafBackend")
    legacy = cls(f"vsqlite-leaves-legacy://{tmp_path / 'old.db'}", timeout=10, namespace="")
    try:
        assert legacy.supports_leaf_versions and not reads_leaf_subsets(legacy)
    finally:
        legacy.close()


def test_a_supports_flag_without_the_ability_type_raises() -> None:
    with pytest.raises(
        ConfigurationError, match=r"subclass varsync\.backend\.SupportsLeafVersions"
    ):

        class ClaimsLeaves(SqliteStore):
            supports_leaf_versions = True

    with pytest.raises(
        ConfigurationError, match=r"do not subclass varsync\.backend\.SupportsBlockingWait"
    ):

        class DeniesBlocking(SqliteStore, SupportsBlockingWait):
            supports_blocking_wait = False

            def block(self, name: str, newer_than: int, deadline: float) -> None:
                return None


def test_a_protocol_1_backend_is_registered_as_it_is_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        cls = _registered("mutants.reference_leaves:SqliteLeafBackend")
    from mutants.reference_leaves import SqliteLeafBackend

    assert cls is SqliteLeafBackend
    assert cls.supports_leaf_versions and not cls.supports_blocking_wait
