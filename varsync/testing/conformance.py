"""The whole conformance suite in one class: subclass it and define the ``url`` fixture."""

from varsync.testing.capability_tests import CapabilityTests
from varsync.testing.contract_tests import ContractTests
from varsync.testing.fault_tests import FaultTests
from varsync.testing.suite import (
    ConcurrencyTests,
    RoundTripTests,
    TableTests,
    ValidationTests,
    VersionTests,
)

__all__ = ["ConformanceTests"]


class ConformanceTests(
    TableTests, RoundTripTests, ValidationTests, VersionTests, ConcurrencyTests,
    ContractTests, CapabilityTests, FaultTests,
):
    """The whole suite. Subclass it and define the ``url`` fixture."""
