"""The names this module held before the suite was split by topic, for the imports that
use them; see :mod:`varsync.testing` for how to use the suite. The mixins live in
``table_tests``, ``roundtrip_tests``, ``validation_tests``, ``version_tests`` and
``concurrency_tests``, their fixtures and signatures in ``_base``, the value helpers in
``values``."""

from varsync.testing._base import BLOCKED_SECONDS, CONSISTENCY, SMALL, TableMaker
from varsync.testing._base import _Base as _Base
from varsync.testing._base import _wait_codes as _wait_codes
from varsync.testing.blocking import BlockingCall, code_of
from varsync.testing.concurrency_tests import ConcurrencyTests
from varsync.testing.concurrency_tests import _write_versions as _write_versions
from varsync.testing.conformance import ConformanceTests
from varsync.testing.roundtrip_tests import DTYPE_VALUES, Point, RoundTripTests
from varsync.testing.table_tests import TableTests
from varsync.testing.validation_tests import ValidationTests
from varsync.testing.values import assert_bit_equal, check_consistent, filled
from varsync.testing.version_tests import VersionTests

__all__ = [
    "TableTests",
    "RoundTripTests",
    "ValidationTests",
    "VersionTests",
    "ConcurrencyTests",
    "ConformanceTests",
    "SMALL",
    "CONSISTENCY",
    "DTYPE_VALUES",
    "BLOCKED_SECONDS",
    "TableMaker",
    "Point",
    "BlockingCall",
    "code_of",
    "filled",
    "check_consistent",
    "assert_bit_equal",
]
