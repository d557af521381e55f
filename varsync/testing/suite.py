"""Deprecated: the names this module held before the suite was split by topic.

Each still imports from here, with a :class:`DeprecationWarning` naming its new home;
they go in varsync 0.4. The mixins are in :mod:`varsync.testing`; the value helpers
(``filled``, ``check_consistent``, ``assert_bit_equal``) in :mod:`varsync.backend` (for
plugin authors) and :mod:`varsync.testing.values`; the rest in the modules below.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: Old name -> (module it lives in now, where to import it from instead).
_MOVED: dict[str, tuple] = {
    "TableTests": ("varsync.testing.table_tests", "varsync.testing"),
    "RoundTripTests": ("varsync.testing.roundtrip_tests", "varsync.testing"),
    "ValidationTests": ("varsync.testing.validation_tests", "varsync.testing"),
    "VersionTests": ("varsync.testing.version_tests", "varsync.testing"),
    "ConcurrencyTests": ("varsync.testing.concurrency_tests", "varsync.testing"),
    "ConformanceTests": ("varsync.testing.conformance", "varsync.testing"),
    "SMALL": ("varsync.testing._base", "varsync.testing._base"),
    "CONSISTENCY": ("varsync.testing._base", "varsync.testing._base"),
    "BLOCKED_SECONDS": ("varsync.testing._base", "varsync.testing._base"),
    "TableMaker": ("varsync.testing._base", "varsync.testing._base"),
    "DTYPE_VALUES": ("varsync.testing.roundtrip_tests", "varsync.testing.roundtrip_tests"),
    "Point": ("varsync.testing.roundtrip_tests", "varsync.testing.roundtrip_tests"),
    "BlockingCall": ("varsync.testing.blocking", "varsync.testing.blocking"),
    "code_of": ("varsync.testing.blocking", "varsync.testing.blocking"),
    "filled": ("varsync.testing.values", "varsync.backend"),
    "check_consistent": ("varsync.testing.values", "varsync.backend"),
    "assert_bit_equal": ("varsync.testing.values", "varsync.backend"),
    "_Base": ("varsync.testing._base", "varsync.testing._base"),
    "_wait_codes": ("varsync.testing._base", "varsync.testing._base"),
    "_write_versions": ("varsync.testing.concurrency_tests", "varsync.testing.concurrency_tests"),
}

__all__ = [name for name in _MOVED if not name.startswith("_")]


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home, instead = _MOVED[name]
    warnings.warn(
        f"varsync.testing.suite.{name} is deprecated and goes in varsync 0.4; import it "
        f"from {instead}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


def __dir__() -> Any:
    return sorted(__all__)
