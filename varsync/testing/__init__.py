"""The varsync conformance suite: the behaviour every backend must show.

Subclass :class:`ConformanceTests` in a test module and give it one fixture, ``url``, a
URL for a fresh, empty namespace of your backend::

    import uuid
    import pytest
    from varsync.testing import ConformanceTests

    class TestMyBackend(ConformanceTests):
        @pytest.fixture
        def url(self):
            return f"mine://localhost:1234?namespace=test-{uuid.uuid4().hex}"

Run pytest: every test of the suite runs against your backend. Tests of abilities your
backend does not declare (its ``supports_*`` / ``shared_across_processes`` flags) skip.

Optional fixtures to override:

- ``connect_options``: keyword arguments for every ``varsync.connect`` call;
- ``make_tables``: a function ``make(tables) -> url`` that brings tables ``{name:
  signature}`` into being and returns the URL to connect to; override it when clients
  cannot create tables (as with Reverb, whose tables are fixed when the server starts).
- ``server_pid``, ``server_address``, ``url_via``, ``new_history``, ``restart_server``:
  how to pause, reach through a proxy, lose or restart the store's server (``None``, or
  no address, skips the tests that need it); see docs/conformance.md.

The mixins (:class:`TableTests`, :class:`RoundTripTests`, ...) can also be used alone.
The suite is registered as a pytest plugin (entry point ``pytest11``), so nothing else
is needed in ``conftest.py``.
"""

from varsync.testing.capability_tests import CapabilityTests
from varsync.testing.concurrency_tests import ConcurrencyTests
from varsync.testing.conformance import ConformanceTests
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

__all__ = [
    "ConformanceTests",
    "TableTests",
    "RoundTripTests",
    "ValidationTests",
    "VersionTests",
    "ConcurrencyTests",
    "ContractTests",
    "CapabilityTests",
    "FaultTests",
    "LeafVersionTests",
    "ElementDeltaTests",
    "LeafSubsetTests",
    "ShardedTests",
    "ReaderRegistryTests",
]
