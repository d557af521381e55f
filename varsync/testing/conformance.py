"""The whole conformance suite in one class: subclass it and define the ``url`` fixture."""

from varsync.testing.capability_tests import CapabilityTests
from varsync.testing.concurrency_tests import ConcurrencyTests
from varsync.testing.contract_tests import ContractTests
from varsync.testing.element_delta_tests import ElementDeltaTests
from varsync.testing.fault_tests import FaultTests
from varsync.testing.leaf_subset_tests import LeafSubsetTests
from varsync.testing.leaf_version_tests import LeafVersionTests
from varsync.testing.reader_tests import ReaderRegistryTests
from varsync.testing.roundtrip_tests import RoundTripTests
from varsync.testing.sharded_tests import ShardedTests
from varsync.testing.table_tests import TableTests
from varsync.testing.validation_tests import ValidationTests
from varsync.testing.version_tests import VersionTests

__all__ = ["ConformanceTests"]


class ConformanceTests(
    TableTests,
    RoundTripTests,
    ValidationTests,
    VersionTests,
    ConcurrencyTests,
    ContractTests,
    CapabilityTests,
    FaultTests,
    LeafVersionTests,
    ElementDeltaTests,
    LeafSubsetTests,
    ShardedTests,
    ReaderRegistryTests,
):
    """The whole suite. Subclass it and define the ``url`` fixture."""
